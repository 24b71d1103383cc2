"""A convolution's geometry as oneDNN takes it: dilations (oneDNN counts the gaps, ONNX the step), strides and
asymmetric pads, in both layouts, run by oneDNN itself (enough output channels that no kernel of kernorch's own
takes it) and compared with onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kernorch.codegen.backends import ONEDNN
from kernorch.codegen.library import describe_library_call
from kernorch.codegen.library.onednn import reference_rejection
from kernorch.devtools.mutate import here
from kernorch.testing import cpu_compile, random_array
from kernorch.tools.check import run_onnxruntime


def _conv(dilations: tuple[int, int], strides: tuple[int, int], pads: tuple[int, int, int, int]) -> onnx.ModelProto:
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], dilations=list(dilations), strides=list(strides),
                              pads=list(pads))]  # fmt: skip
    initializers = [numpy_helper.from_array(random_array((24, 16, 3, 3), seed=1) * 0.2, "w"),
                    numpy_helper.from_array(random_array((24,), seed=2), "b")]  # fmt: skip
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 16, 13, 17))]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    graph = helper.make_graph(nodes, "dilated", inputs, outputs, initializers)
    return onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.mark.parametrize("layout", ["nchw", "channels-last"])
@pytest.mark.parametrize(("dilations", "strides", "pads"),
                         [((2, 3), (1, 1), (2, 3, 2, 3)), ((2, 1), (2, 3), (1, 0, 2, 1))])
def test_a_dilated_conv_in_onednn_matches_onnxruntime(
        dilations: tuple[int, int], strides: tuple[int, int], pads: tuple[int, int, int, int], layout: str) -> None:
    model = _conv(dilations, strides, pads)
    compiled = cpu_compile(model, cost="analytic", device="cpu-nominal", layout=layout, rewrite=False)
    assert ONEDNN in compiled.executor.backends, compiled.executor.backends
    x = random_array((1, 16, 13, 17), seed=3)
    expected = run_onnxruntime(model, {"x": x})["y"]
    np.testing.assert_allclose(compiled.run({"x": x})["y"], expected, rtol=1e-4, atol=1e-4)


def _linear_layer(rows_sliced: bool, per_row: bool) -> onnx.ModelProto:
    """A linear layer on a [1, 7, 7, 48] map (swin's and ConvNeXt's MLPs), with a bias, a residual of the output's
    shape and a per-channel scale, or with `per_row` a per-row one (a layer norm's 1/σ moved past the matmul);
    with `rows_sliced` its input is a slice of a wider map, so its rows are not one axis in memory."""
    width = 9 if rows_sliced else 7
    nodes = [helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["xs"]),
             helper.make_node("MatMul", ["xs", "w"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["mb"]),
             helper.make_node("Add", ["mb", "r"], ["mr"]),
             helper.make_node("Mul", ["mr", "s"], ["y"])]  # fmt: skip
    initializers = [numpy_helper.from_array(random_array((48, 96), seed=1) * 0.2, "w"),
                    numpy_helper.from_array(random_array((96,), seed=2), "b"),
                    numpy_helper.from_array(np.array([0], np.int64), "starts"),
                    numpy_helper.from_array(np.array([7], np.int64), "ends"),
                    numpy_helper.from_array(np.array([2], np.int64), "axes")]  # fmt: skip
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 7, width, 48)),
              helper.make_tensor_value_info("r", TensorProto.FLOAT, (1, 7, 7, 96)),
              helper.make_tensor_value_info("s", TensorProto.FLOAT, (1, 7, 7, 1) if per_row else (96,))]  # fmt: skip
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    graph = helper.make_graph(nodes, "linear_layer", inputs, outputs, initializers)
    return onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("rows_sliced", [False, True])
def test_a_linear_layer_on_a_map_is_one_2d_matmul_where_its_rows_are_one_axis(rows_sliced: bool,
                                                                              per_row: bool) -> None:
    """2-D where the rows are one axis; 3-D [1, rows, K] when a post-op has a value per row: oneDNN 3.2 takes that
    (mask 1 on a 2-D matmul, mask 6 on a 4-D one) only in its reference matmul, 1000x slower (call.py:
    rows_merged)."""
    model = _linear_layer(rows_sliced, per_row)
    compiled = cpu_compile(model, cost="analytic", device="cpu-nominal", rewrite=False)
    calls = [describe_library_call(k) for k in compiled.kernels if any(n.prim == "matmul" for n in k.primitives)]
    assert len(calls) == 1
    call = calls[0]
    scaled = any(t is not None and t.dims[-1] == 1 for _, t in call.post_ops)
    assert scaled == per_row, call.post_ops  # the per-row scale is the call's post-op
    assert reference_rejection(call) is None  # never a call oneDNN runs by its reference matmul
    if rows_sliced and not per_row:  # rows 9 · 48 floats apart every 7 rows: 4-D
        assert call.src.dims == (1, 7, 7, 48) and call.weights.dims == (1, 1, 48, 96), call
    elif per_row:  # the per-row scale as [1, 49, 1]: mask 2 of a 3-D product (a sliced source copied first: 4-D,
        # the scale is mask 6, oneDNN's reference matmul)
        assert (call.src.dims, call.weights.dims, call.dst.dims) == ((1, 49, 48), (1, 48, 96), (1, 49, 96)), call
        assert all(len(t.dims) == 3 for _, t in call.post_ops if t is not None), call.post_ops
    else:  # one [49, 48] x [48, 96] product; every tensor of the epilogue reshaped alike
        assert (call.src.dims, call.weights.dims, call.dst.dims) == ((49, 48), (48, 96), (49, 96)), call
        assert all(len(t.dims) == 2 for _, t in call.post_ops if t is not None), call.post_ops
        assert call.bias is None or call.bias.dims == (1, 96)
    feeds = {"x": random_array((1, 7, 9 if rows_sliced else 7, 48), seed=3), "r": random_array((1, 7, 7, 96), seed=4),
             "s": random_array((1, 7, 7, 1) if per_row else (96,), seed=5)}  # fmt: skip
    expected = run_onnxruntime(model, feeds)["y"]
    np.testing.assert_allclose(compiled.run(feeds)["y"], expected, rtol=1e-4, atol=1e-4)


# The mutants of the code this file tests, each a one-line change a real bug could make and that these tests must
# catch (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("dilation passed as is",
         'tuple(int(d) - 1 for d in attrs["dilations"])',
         'tuple(int(d) for d in attrs["dilations"])',
         tests=("kernorch/codegen/library/call_test.py",
                "tests/test_conformance.py::test_compiled_path_passes_what_the_reference_passes")),
    here("a linear layer on a map stays a 4-D oneDNN matmul",
         'return rows_merged(described) if described.op == "matmul" else described',
         "return described"),
    here("a per-row post-op merges a matmul's rows into oneDNN's reference path",
         "per_row = columns > 1 and any(",
         "per_row = columns < 0 and any("),
]  # fmt: skip
