"""The padding proof, rule by rule: what it accepts is exact under onnxruntime (the padded run's first rows equal
the unpadded run's), and what it refuses names the primitive and the reason."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kernorch.devtools.mutate import here
from kernorch.frontend import input_signature
from kernorch.shapes import prove_paddable
from kernorch.tools.check import run_onnxruntime

RNG = np.random.default_rng(11)


def _model(nodes: list[onnx.NodeProto], x_shape: list[str | int | None], y_shape: list[str | int | None],
           constants: dict[str, np.ndarray], x_type: int = TensorProto.FLOAT) -> onnx.ModelProto:  # fmt: skip
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", x_type, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
                              [numpy_helper.from_array(v, k) for k, v in constants.items()])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _int64(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


EXACT = {
    "transpose_relu_transpose": _model(
        [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]), helper.make_node("Relu", ["t"], ["r"]),
         helper.make_node("Transpose", ["r"], ["y"], perm=[1, 0])], ["b", 4], ["b", 4], {}),
    "embedding_then_mean_over_tokens": _model(
        [helper.make_node("Gather", ["table", "x"], ["e"], axis=0),
         helper.make_node("ReduceMean", ["e"], ["y"], axes=[1], keepdims=0)], ["b", 3], ["b", 8],
        {"table": RNG.standard_normal((20, 8)).astype(np.float32)}, TensorProto.INT64),
    "class_token_expanded_to_the_batch": _model(
        [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Slice", ["s", "zero", "one"], ["b"]),
         helper.make_node("Concat", ["b", "one_one_eight"], ["target"], axis=0),
         helper.make_node("Expand", ["cls", "target"], ["c"]),
         helper.make_node("Concat", ["c", "x"], ["y"], axis=1)], ["b", 3, 8], ["b", 4, 8],
        {"cls": RNG.standard_normal((1, 1, 8)).astype(np.float32), "zero": _int64(0), "one": _int64(1),
         "one_one_eight": _int64(1, 8)}),
    "linear_layer_on_rows": _model(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Softmax", ["m"], ["y"], axis=-1)],
        ["b", 5, 4], ["b", 5, 6], {"w": RNG.standard_normal((4, 6)).astype(np.float32)}),
}  # fmt: skip

REFUSED = {
    "sum_over_the_batch": (_model([helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)], ["b", 4],
                                  [1, 4], {"axes": _int64(0)}), "reduce_sum .*reduces over the padded axis"),
    "softmax_over_the_batch": (_model([helper.make_node("Softmax", ["x"], ["y"], axis=0)], ["b", 4], ["b", 4], {}),
                               "reduces over the padded axis"),
    "flatten_everything": (_model([helper.make_node("Reshape", ["x", "flat"], ["y"])], ["b", 4], [None],
                                  {"flat": _int64(-1)}), "reshape .*merges or splits the padded axis"),
    "rows_times_rows": (_model([helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
                                helper.make_node("MatMul", ["t", "x"], ["y"])], ["b", 4], [4, 4], {}),
                        "matmul .*contracts over the padded axis"),
}  # fmt: skip


def _feeds(model: onnx.ModelProto, batch: int) -> dict[str, np.ndarray]:
    x = model.graph.input[0]
    dims = [batch if d.dim_param else d.dim_value for d in x.type.tensor_type.shape.dim]
    if x.type.tensor_type.elem_type == TensorProto.INT64:
        return {"x": RNG.integers(0, 20, dims).astype(np.int64)}
    return {"x": RNG.standard_normal(dims).astype(np.float32)}


@pytest.mark.parametrize("name", sorted(EXACT))
def test_what_the_proof_accepts_is_exact_under_onnxruntime(name: str) -> None:
    model = EXACT[name]
    data = model.SerializeToString()
    proof = prove_paddable(data, input_signature(data), ["b"], {"b": 8}, {"b": 3})
    assert proof.exact, proof.reason
    feeds = _feeds(model, 3)
    padded = {k: np.pad(v, [(0, 5)] + [(0, 0)] * (v.ndim - 1), mode="edge") for k, v in feeds.items()}
    expected = run_onnxruntime(model, feeds)["y"]
    through_the_bucket = run_onnxruntime(model, padded)["y"]
    axis = proof.output_axes["b"]["y"]
    assert axis == 0
    np.testing.assert_allclose(through_the_bucket[:3], expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_what_the_proof_refuses_names_the_primitive_and_why(name: str) -> None:
    model, reason = REFUSED[name]
    data = model.SerializeToString()
    proof = prove_paddable(data, input_signature(data), ["b"], {"b": 8}, {"b": 3})
    assert not proof.exact
    assert re.search(reason, proof.reason), proof.reason


def test_two_dims_padded_at_once_are_each_proven_apart() -> None:
    """Elementwise work on x[b, c] pads along both; a softmax over c keeps b paddable but not both."""
    relu = _model([helper.make_node("Relu", ["x"], ["y"])], ["b", "c"], ["b", "c"], {}).SerializeToString()
    proof = prove_paddable(relu, input_signature(relu), ["b", "c"], {"b": 8, "c": 8}, {"b": 3, "c": 5})
    assert proof.exact and proof.output_axes == {"b": {"y": 0}, "c": {"y": 1}}
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    assert np.array_equal(proof.run(_Reference(relu), {"x": x})["y"], np.maximum(x, 0))
    softmax = _model([helper.make_node("Softmax", ["x"], ["y"], axis=1)], ["b", "c"], ["b", "c"], {})
    data = softmax.SerializeToString()
    assert prove_paddable(data, input_signature(data), ["b"], {"b": 8, "c": 8}, {"b": 3, "c": 8}).exact
    both = prove_paddable(data, input_signature(data), ["b", "c"], {"b": 8, "c": 8}, {"b": 3, "c": 5})
    assert not both.exact and "reduces over the padded axis" in both.reason


class _Reference:
    """A plan stand-in that runs the model through onnxruntime (the proof's `run` only calls `.run(feeds)`)."""

    def __init__(self, model: bytes) -> None:
        self.model = onnx.load_from_string(model)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return run_onnxruntime(self.model, feeds)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("shapes: padding proof ignores a reduction over the padded axis",
         'if first in attr("axes"):',
         'if first in attr("axes") and False:'),
]  # fmt: skip
