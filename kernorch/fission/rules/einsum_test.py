"""Einsum: the primitives each equation becomes, and equality with onnxruntime (reference and compiled)."""

from __future__ import annotations

import numpy as np
import pytest

import kernorch
from kernorch.testing import fission_and_compare, primitive_names, random_array, single_op_model
from kernorch.tools.check import run_onnxruntime

A = random_array((2, 3, 4))
B = random_array((2, 4, 5), seed=1)
S = random_array((4, 4), seed=2)
V = random_array((4,), seed=3)

CASES = [
    # (equation, operands, expected primitives)
    ("bij,bjk->bik", [A, B], ["matmul"]),
    ("bij,bjk->bki", [A, B], ["matmul", "transpose"]),
    ("bij,bkj->bik", [A, random_array((2, 5, 4), seed=4)], ["transpose", "matmul"]),
    ("ij->ji", [S], ["transpose"]),
    ("ii->i", [S], ["mul", "reduce_sum", "reshape"]),
    ("ii", [S], ["mul", "reduce_sum", "reshape", "reduce_sum", "reshape"]),
    ("bij->b", [A], ["reduce_sum", "reshape"]),
    ("i,i", [V, V], ["reshape", "reshape", "matmul", "reshape"]),
    ("i,j->ij", [V, random_array((3,), seed=5)], ["reshape", "reshape", "matmul", "reshape"]),
    ("...ij,...jk", [A, B], ["matmul"]),
    ("bij,bjk,bkl->bil", [A, B, random_array((2, 5, 2), seed=6)], ["matmul", "matmul"]),
]


@pytest.mark.parametrize("equation, operands, expected", CASES, ids=[c[0] for c in CASES])
def test_rule(equation: str, operands: list[np.ndarray], expected: list[str]) -> None:
    inputs = {f"x{i}": a for i, a in enumerate(operands)}
    model = single_op_model("Einsum", inputs, {"equation": equation}, opset=13)
    graph = fission_and_compare(model, inputs, rtol=1e-5, atol=1e-5)
    assert primitive_names(graph) == expected
    compiled = kernorch.compile(model, cost="analytic", device="cpu-nominal").run(inputs)
    (reference,) = run_onnxruntime(model, inputs).values()
    np.testing.assert_allclose(compiled["out0"], reference, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("equation", ["ij,jk", "i->ii", "ij,jk->iz"])
def test_bad_equations_are_refused(equation: str) -> None:
    from kernorch.errors import UnsupportedOperator
    from kernorch.fission import fission
    from kernorch.frontend import import_model

    model = single_op_model("Einsum", {"x": S}, {"equation": "ij->ij"}, opset=13)
    model.graph.node[0].attribute[0].s = equation.encode()
    with pytest.raises(UnsupportedOperator, match="equation"):
        fission(import_model(model), strict=True)
