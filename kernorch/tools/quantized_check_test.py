"""How check and bench judge a quantized model: outputs counted in quantization steps, the tolerance widened to
twice the spread between onnxruntime's own int8 and float runs (a given one kept), a peer's error reported and not
held against it."""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from kernorch.devtools.mutate import here
from kernorch.tools.bench import tolerance
from kernorch.tools.check import QUANTIZED_RTOL, check_model
from kernorch.tools.quantized_check import SPREAD_FACTOR, output_steps, step_counts, widened


def _quantized_output_model() -> onnx.ModelProto:
    """A QDQ MatMul whose output is quantized and dequantized again (its graph output moves in steps of 0.25)."""
    rng = np.random.default_rng(1)
    constants: dict[str, np.ndarray] = {
        "w": rng.integers(-100, 100, (16, 8)).astype(np.int8), "ws": np.asarray(0.01, np.float32),
        "xs": np.asarray(0.05, np.float32), "xz": np.asarray(0, np.int8),
        "ys": np.asarray(0.25, np.float32), "yz": np.asarray(-3, np.int8)}  # fmt: skip
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws"], ["wd"]),
             helper.make_node("MatMul", ["xd", "wd"], ["p"]),
             helper.make_node("QuantizeLinear", ["p", "ys", "yz"], ["pq"]),
             helper.make_node("DequantizeLinear", ["pq", "ys", "yz"], ["y"])]  # fmt: skip
    graph = helper.make_graph(nodes, "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
                              [numpy_helper.from_array(v, k) for k, v in constants.items()])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_output_steps_are_the_last_dequantizers_scale() -> None:
    assert output_steps(_quantized_output_model()) == {"y": 0.25}


def test_step_counts() -> None:
    """Differences a float rounding away from whole steps count as those steps."""
    expected = np.array([0.0, 0.2500001, 0.5, -1.0, np.nan], np.float32)
    actual = np.array([1e-8, 0.5, 0.0, -1.0, 1.0], np.float32)
    counts = step_counts(actual, expected, 0.25)
    assert (counts.equal, counts.one, counts.more) == (2, 1, 2)  # NaN against a number: further than any step
    assert "2 of 5 elements equal" in counts.describe()


def test_check_reports_steps_and_spread() -> None:
    report, _ = check_model(_quantized_output_model(), compiled=True)
    assert report.passed and report.spread is not None
    assert report.rtol == max(QUANTIZED_RTOL, SPREAD_FACTOR * report.spread)
    assert report.steps["y"].more == 0
    text = "\n".join(report.lines())
    assert "one step (0.25) apart" in text and "onnxruntime's own int8 and float" in text


def test_a_given_tolerance_is_kept() -> None:
    report, _ = check_model(_quantized_output_model(), rtol=1e-9)
    assert report.rtol == 1e-9


def test_the_tolerance_widens_to_twice_the_spread() -> None:
    assert widened(2e-2, 0.05) == SPREAD_FACTOR * 0.05 == 0.1
    assert widened(2e-2, 0.001) == 2e-2


def test_bench_holds_kernorch_and_reports_peers_on_a_quantized_model() -> None:
    assert tolerance("kernorch", "fp32", quantized_model=True, spread=0.05) == SPREAD_FACTOR * 0.05
    assert tolerance("kernorch", "fp32", quantized_model=True, spread=0.0) == QUANTIZED_RTOL
    assert math.isinf(tolerance("openvino", "fp32", quantized_model=True))
    assert tolerance("openvino", "fp32") == 1e-4


MUTANTS = [
    here("the tolerance not widened by the spread", "return max(rtol, SPREAD_FACTOR * spread)", "return rtol"),
    here("steps counted unrounded", "steps = np.rint(np.abs(", "steps = (np.abs("),
]  # fmt: skip
