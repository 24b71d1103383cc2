"""Index-driven rules (ArgMax/ArgMin, TopK, CumSum, Trilu, OneHot, GatherND, ScatterND): the primitives each
emits and equality with onnxruntime, through the reference interpreter and the compiled plan."""

from __future__ import annotations

import numpy as np
import pytest

import kernorch
from kernorch.errors import KernorchError
from kernorch.testing import fission_and_compare, primitive_names, random_array, single_op_model
from kernorch.tools.check import run_onnxruntime

X = random_array((3, 5, 4))
TIES = np.array([[1, 3, 3, 0], [2, 2, 2, 2], [np.nan, 1, np.nan, 5]], np.float32)
INDICES = np.array([[0, 1], [2, -1], [1, 0]], np.int64)

CASES = [
    # (op, inputs, attrs, constants, opset, expected primitives)
    ("ArgMax", {"x": X}, {"axis": 1}, {}, 13, ["reduce_max", "equal", "equal", "not", "or", "where", "reduce_min"]),
    ("ArgMin", {"x": TIES}, {"axis": 1, "keepdims": 0}, {}, 13,
     ["reduce_min", "equal", "equal", "not", "or", "where", "reduce_min", "reshape"]),
    ("ArgMax", {"x": TIES[:2]}, {"axis": -1, "select_last_index": 1}, {}, 13,
     ["reduce_max", "equal", "equal", "not", "or", "where", "reduce_max"]),
    ("ArgMax", {"x": (X * 3).astype(np.int32)}, {"axis": 0}, {}, 13, ["reduce_max", "equal", "where", "reduce_min"]),
    ("TopK", {"x": X}, {"axis": 1}, {"k": np.array([3], np.int64)}, 11, ["top_k"]),
    ("TopK", {"x": TIES}, {"largest": 0}, {"k": np.array([2], np.int64)}, 11, ["top_k"]),
    ("CumSum", {"x": X}, {}, {"axis": np.array(1, np.int64)}, 14, ["cumsum"]),
    ("CumSum", {"x": X}, {"exclusive": 1, "reverse": 1}, {"axis": np.array(-1, np.int32)}, 14, ["cumsum"]),
    ("Trilu", {"x": X}, {}, {"k": np.array(1, np.int64)}, 14, ["where"]),
    ("Trilu", {"x": X}, {"upper": 0}, {"k": np.array(-1, np.int64)}, 14, ["where"]),
    ("OneHot", {"i": np.array([[1, -1], [7, 0]], np.int64)}, {"axis": 1},
     {"depth": np.array(4, np.int64), "values": np.array([-2, 5], np.float32)}, 11,
     ["less", "add", "where", "reshape", "equal", "where"]),
    ("GatherND", {"x": X, "i": INDICES}, {}, {}, 13,
     ["reshape", "slice", "reshape", "less", "add", "where", "mul", "slice", "reshape", "less", "add", "where",
      "add", "gather"]),
    ("GatherND", {"x": X, "i": np.array([[1], [-2], [0]], np.int64)}, {"batch_dims": 1}, {}, 13,
     ["reshape", "slice", "reshape", "less", "add", "where", "add", "gather"]),
    ("ScatterND", {"x": X, "i": np.array([[0, 1], [2, 3]], np.int64), "u": random_array((2, 4), seed=3)},
     {"reduction": "add"}, {}, 16, ["scatter_nd"]),
]


@pytest.mark.parametrize("op, inputs, attrs, constants, opset, expected", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])  # fmt: skip
def test_rule(op: str, inputs: dict, attrs: dict, constants: dict, opset: int, expected: list[str]) -> None:
    outputs = 2 if op == "TopK" else 1
    model = single_op_model(op, inputs, attrs, constants, outputs=outputs, opset=opset)
    graph = fission_and_compare(model, inputs)
    assert primitive_names(graph) == expected
    compiled = kernorch.compile(model, cost="analytic", device="cpu-nominal").run(inputs)
    for name, reference in run_onnxruntime(model, inputs).items():
        np.testing.assert_allclose(compiled[name], reference, rtol=1e-5, atol=1e-6, err_msg=name)


def test_an_index_out_of_range_is_an_error_not_garbage() -> None:
    model = single_op_model("GatherND", {"x": X, "i": np.array([[3, 0]], np.int64)}, opset=13)
    compiled = kernorch.compile(model, cost="analytic", device="cpu-nominal")
    with pytest.raises(KernorchError, match="out of range"):
        compiled.run({"x": X, "i": np.array([[3, 0]], np.int64)})
