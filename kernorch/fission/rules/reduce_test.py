"""Reduction and pooling rules: primitives emitted and equality with onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from kernorch.testing import fission_and_compare, primitive_names, random_array, single_op_model

X = random_array((2, 3, 7, 6))
AXES = {"axes": np.array([1, -1], dtype=np.int64)}

CASES = [
    ("ReduceSum", {"keepdims": 1}, AXES, 13, ["reduce_sum"]),
    ("ReduceSum", {"keepdims": 0}, AXES, 13, ["reduce_sum", "reshape"]),
    ("ReduceMean", {}, AXES, 18, ["reduce_sum", "div"]),
    ("ReduceMax", {"keepdims": 0}, AXES, 18, ["reduce_max", "reshape"]),
    ("ReduceMin", {}, AXES, 18, ["reduce_min"]),
    ("ReduceProd", {}, AXES, 18, ["reduce_prod"]),
    ("ReduceL2", {}, AXES, 18, ["mul", "reduce_sum", "sqrt"]),
    ("ReduceLogSumExp", {}, AXES, 18, ["reduce_max", "abs", "equal", "where", "sub", "exp", "reduce_sum", "log",
                                       "add"]),
    # noop_with_empty_axes without axes: the reduction skipped, the elementwise part kept
    ("ReduceSum", {"noop_with_empty_axes": 1}, {}, 13, ["identity"]),
    ("ReduceSumSquare", {"noop_with_empty_axes": 1}, {}, 18, ["mul"]),
    ("ReduceL1", {"noop_with_empty_axes": 1, "keepdims": 0}, {}, 18, ["abs"]),
    ("ReduceL2", {"noop_with_empty_axes": 1}, {}, 18, ["mul", "sqrt"]),
    ("ReduceLogSum", {"noop_with_empty_axes": 1}, {}, 18, ["log"]),
    ("ReduceLogSumExp", {"noop_with_empty_axes": 1}, {}, 18, ["identity"]),
    ("ReduceMean", {"axes": [2, 3], "keepdims": 0}, {}, 17, ["reduce_sum", "div", "reshape"]),
    ("GlobalAveragePool", {}, {}, 17, ["reduce_sum", "div"]),
    ("GlobalMaxPool", {}, {}, 17, ["reduce_max"]),
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, {}, 17, ["window_max"]),
    ("MaxPool", {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1, "dilations": [1, 2]}, {}, 17,
     ["window_max"]),
    ("MaxPool", {"kernel_shape": [2, 2], "auto_pad": "SAME_UPPER", "strides": [2, 2]}, {}, 17, ["window_max"]),
    ("AveragePool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, {}, 17, ["window_sum", "div"]),
    ("AveragePool", {"kernel_shape": [3, 3], "pads": [1, 0, 2, 1], "count_include_pad": 1, "strides": [2, 1]},
     {}, 17, ["window_sum", "div"]),
    ("AveragePool", {"kernel_shape": [3, 3], "ceil_mode": 1, "strides": [2, 2]}, {}, 17, ["window_sum", "div"]),
]


@pytest.mark.parametrize("op, attrs, constants, opset, expected", CASES, ids=[c[0] for c in CASES])
def test_rule(op: str, attrs: dict, constants: dict, opset: int, expected: list[str]) -> None:
    model = single_op_model(op, {"x": X}, attrs, constants, opset=opset)
    graph = fission_and_compare(model, {"x": X})
    assert primitive_names(graph) == expected
