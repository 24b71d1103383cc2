"""Each QOperator expansion means what onnxruntime's kernel computes: the expanded model (standard operators, run by
onnxruntime without its fusions) agrees with the QOperator node (onnxruntime's contrib kernel) to one step, and the
rounding arbiter judges a QOperator model's quantizers through it."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kernorch.devtools.mutate import here
from kernorch.testing import onnxruntime_saturates
from kernorch.tools.check import run_onnxruntime, worst_relative
from kernorch.tools.qoperator_expansion import CONTRIB, EXPANSIONS, expanded
from kernorch.tools.rounding_arbiter import _Model, arbitrate

SHAPE = [1, 4, 6, 6]


def _constants() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {
        "as": np.asarray(0.05, np.float32), "az": np.asarray(120, np.uint8),
        "bs": np.asarray(0.03, np.float32), "bz": np.asarray(131, np.uint8),
        "ys": np.asarray(0.07, np.float32), "yz": np.asarray(125, np.uint8),
        "ys2": np.asarray(1 / 256, np.float32), "yz2": np.asarray(0, np.uint8),  # a softmax's [0, 1)
        "w": rng.integers(-100, 100, (3, 4, 3, 3)).astype(np.int8),
        "ws": np.asarray([0.011, 0.02, 0.017], np.float32), "wz": np.zeros(3, np.int8),
        "bias": rng.integers(-800, 800, (3,)).astype(np.int32),
        "m": rng.integers(0, 255, (6, 5)).astype(np.uint8),
        "g": rng.integers(-100, 100, (5, 6)).astype(np.int8), "gs": np.asarray([0.01, 0.02, 0.03, 0.015, 0.025],
                                                                            np.float32),
        "gz": np.zeros(5, np.int8), "gbias": rng.integers(-500, 500, (5,)).astype(np.int32),
    }  # fmt: skip


CASES: dict[str, tuple[onnx.NodeProto, list[int]]] = {
    "QLinearConv": (helper.make_node("QLinearConv", ["a", "as", "az", "w", "ws", "wz", "ys", "yz", "bias"], ["y"],
                                     pads=[1, 1, 1, 1]), [1, 3, 6, 6]),
    "QLinearMatMul": (helper.make_node("QLinearMatMul", ["a", "as", "az", "m", "bs", "bz", "ys", "yz"], ["y"]),
                      [1, 4, 6, 5]),
    "QLinearAdd": (helper.make_node("QLinearAdd", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"],
                                    domain=CONTRIB), SHAPE),
    "QLinearMul": (helper.make_node("QLinearMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"],
                                    domain=CONTRIB), SHAPE),
    "QLinearSigmoid": (helper.make_node("QLinearSigmoid", ["a", "as", "az", "ys", "yz"], ["y"], domain=CONTRIB),
                       SHAPE),
    "QLinearLeakyRelu": (helper.make_node("QLinearLeakyRelu", ["a", "as", "az", "ys", "yz"], ["y"], alpha=0.2,
                                          domain=CONTRIB), SHAPE),
    "QLinearConcat": (helper.make_node("QLinearConcat", ["ys", "yz", "a", "as", "az", "b", "bs", "bz"], ["y"],
                                       axis=1, domain=CONTRIB), [1, 8, 6, 6]),
    "QLinearSoftmax": (helper.make_node("QLinearSoftmax", ["a", "as", "az", "ys2", "yz2"], ["y"], axis=-1, opset=13,
                                        domain=CONTRIB), SHAPE),
    "QGemm": (helper.make_node("QGemm", ["a2", "as", "az", "g", "gs", "gz", "gbias", "ys", "yz"], ["y"], alpha=0.5,
                               transB=1, domain=CONTRIB), [6, 5]),
}  # fmt: skip


def _model(op: str) -> onnx.ModelProto:
    node, shape = CASES[op]
    graph = helper.make_graph(
        [node], op, [helper.make_tensor_value_info(v, TensorProto.UINT8, SHAPE) for v in ("a", "b")]
        + [helper.make_tensor_value_info("a2", TensorProto.UINT8, [6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, shape)],
        [numpy_helper.from_array(v, k) for k, v in _constants().items() if k in node.input])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(CONTRIB, 1)],
                             ir_version=8)  # fmt: skip


def _feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(8)
    return {**{v: rng.integers(0, 256, SHAPE).astype(np.uint8) for v in ("a", "b")},
            "a2": rng.integers(0, 256, (6, 6)).astype(np.uint8)}


def test_every_expansion_has_a_case() -> None:
    assert {op for _, op in EXPANSIONS} | {"QGemm"} == set(CASES)


@pytest.mark.parametrize("op", sorted(CASES))
def test_the_expansion_means_what_onnxruntime_computes(op: str) -> None:
    model = _model(op)
    feeds = {k: v for k, v in _feeds().items() if k in CASES[op][0].input}
    model.graph.ClearField("input")
    model.graph.input.extend(helper.make_tensor_value_info(v, TensorProto.UINT8, feeds[v].shape) for v in feeds)
    if onnxruntime_saturates(model, feeds):
        pytest.skip(f"onnxruntime's {op} adds byte products in a saturating int16 on this CPU (no VNNI)")
    kernel = run_onnxruntime(model, feeds, threads=1)["y"].astype(np.int32)
    meant = run_onnxruntime(expanded(model), feeds, threads=1, optimized=False)["y"].astype(np.int32)
    assert [n.op_type for n in expanded(model).graph.node][-1] == "QuantizeLinear"
    assert np.abs(kernel - meant).max() <= 1 and np.mean(kernel == meant) > 0.95, (op, np.abs(kernel - meant).max())


def test_a_qoperator_model_is_arbitrated() -> None:
    """onnxruntime's QLinearAdd one step off at an element no tie: kernorch's (the expansion's exact rounding)
    is right; moved in kernorch's run instead, it is wrong."""
    proto = _model("QLinearAdd")
    model = _Model(proto)
    assert [q.output[0] for q in model.quantizers] == ["y"]
    feeds = _feeds()
    a = (feeds["a"].astype(np.float64) - 120) * 0.05
    b = (feeds["b"].astype(np.float64) - 131) * 0.03
    steps = ((a + b) / 0.07).reshape(-1)
    element = int(np.argmin(np.abs(np.abs(steps % 1 - 0.5) - 0.25) + (np.abs(steps) > 100)))

    def exact(proto: onnx.ModelProto, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if "y" in inputs:
            return {"y": inputs["y"]}
        return {"y": np.clip(np.rint(steps) + 125, 0, 255).astype(np.uint8).reshape(SHAPE)}

    def moved(proto: onnx.ModelProto, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        result = exact(proto, inputs)
        if "y" not in inputs:
            result["y"] = result["y"].copy()
            result["y"].reshape(-1)[element] += 1
        return result

    right = arbitrate(proto, feeds, exact(proto, feeds), 0.0, exact, moved, worst_relative)
    assert right.explained and right.divergences[0].exact == 1, right.lines()
    wrong = arbitrate(proto, feeds, moved(proto, feeds), 0.0, moved, exact, worst_relative)
    assert not wrong.explained and wrong.divergences[0].exact == 0


def test_a_softmax_of_an_older_opset_along_an_inner_axis_is_left_as_it_is() -> None:
    """QLinearSoftmax with opset 11 along axis 1 of a 4-d map means Softmax-11 (the dims from axis 1 flattened into
    one), not Softmax-13 along axis 1: not expanded (its quantizer is left unjudged); along the last axis it is."""
    node, shape = CASES["QLinearSoftmax"]
    for axis, written in ((1, False), (-1, True)):
        older = helper.make_node("QLinearSoftmax", list(node.input), ["y"], axis=axis, opset=11, domain=CONTRIB)
        model = _model("QLinearSoftmax")
        model.graph.node[0].CopyFrom(older)
        assert ([n.op_type for n in expanded(model).graph.node][-1] == "QuantizeLinear") == written


MUTANTS = [
    here("a QLinearSoftmax of an older opset expanded along its inner axis as Softmax-13's",
         'return int(attributes.get("opset", 13)) >= 13 or int(attributes.get("axis", -1)) == -1',
         "return True", file="kernorch/tools/qoperator_expansion.py"),
    here("a convolution's bias not scaled", 'helper.make_node("Mul", [floated, scales], [f"{fresh}/bias"])',
         'helper.make_node("Identity", [floated], [f"{fresh}/bias"])'),
    here("the weights' scales along the wrong axis", 'nodes[-1].attribute.append(helper.make_attribute("axis", 0))',
         'nodes[-1].attribute.append(helper.make_attribute("axis", 1))'),
    here("a QGemm's bias not scaled by alpha", "[result], alpha=alpha, beta=alpha,",
         "[result], alpha=alpha, beta=1.0,"),
    here("a QGemm's weight scales along the rows", "[b], axis=0 if trans_b else 1)", "[b], axis=1 if trans_b else 0)"),
    here("concat's triples read from the first input", "tuple((i, i + 1, i + 2) for i in range(2, len(inputs), 3))",
         "tuple((i, i + 1, i + 2) for i in range(0, len(inputs) - 2, 3))"),
]  # fmt: skip
