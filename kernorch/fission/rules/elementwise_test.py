"""Each elementwise rule: the primitives it emits, and numerical equality with onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernorch.testing import fission_and_compare, primitive_names, random_array, single_op_model

X = random_array((2, 3, 4))
Y = random_array((3, 4), seed=1)
POSITIVE = np.abs(X) + 0.1

CASES = [
    # (op, inputs, attrs, constants, expected primitives)
    ("Relu", {"x": X}, {}, {}, ["relu"]),
    ("Sigmoid", {"x": X}, {}, {}, ["sigmoid"]),
    ("Tanh", {"x": X}, {}, {}, ["tanh"]),
    ("Erf", {"x": X}, {}, {}, ["erf"]),
    ("Exp", {"x": X}, {}, {}, ["exp"]),
    ("Log", {"x": POSITIVE}, {}, {}, ["log"]),
    ("Sqrt", {"x": POSITIVE}, {}, {}, ["sqrt"]),
    ("Abs", {"x": X}, {}, {}, ["abs"]),
    ("Neg", {"x": X}, {}, {}, ["neg"]),
    ("Reciprocal", {"x": POSITIVE}, {}, {}, ["reciprocal"]),
    ("Add", {"x": X, "y": Y}, {}, {}, ["add"]),
    ("Sub", {"x": X, "y": Y}, {}, {}, ["sub"]),
    ("Mul", {"x": X, "y": Y}, {}, {}, ["mul"]),
    ("Div", {"x": X, "y": Y + 3}, {}, {}, ["div"]),
    ("Pow", {"x": POSITIVE, "y": Y}, {}, {}, ["pow"]),
    ("Max", {"x": X, "y": Y, "z": -Y}, {}, {}, ["max", "max"]),
    ("Min", {"x": X, "y": Y}, {}, {}, ["min"]),
    ("Sum", {"x": X, "y": Y, "z": Y}, {}, {}, ["add", "add"]),
    ("Mean", {"x": X, "y": Y}, {}, {}, ["add", "div"]),
    ("Equal", {"x": np.round(X), "y": np.round(Y)}, {}, {}, ["equal"]),
    ("Greater", {"x": X, "y": Y}, {}, {}, ["greater"]),
    ("Where", {"c": X > 0, "x": X, "y": Y}, {}, {}, ["where"]),
    ("Cast", {"x": X * 10}, {"to": 7}, {}, ["cast"]),
    ("Clip", {"x": X}, {}, {"lo": np.array(-0.5, np.float32), "hi": np.array(0.5, np.float32)}, ["max", "min"]),
    ("LeakyRelu", {"x": X}, {"alpha": 0.2}, {}, ["less", "mul", "where"]),
    ("PRelu", {"x": X}, {}, {"slope": np.array([0.1, 0.2, 0.3, 0.4], np.float32)}, ["less", "mul", "where"]),
    ("Elu", {"x": X}, {"alpha": 0.7}, {}, ["exp", "sub", "mul", "less", "where"]),
    ("Selu", {"x": X}, {}, {}, ["exp", "sub", "mul", "less_equal", "where", "mul"]),
    ("HardSigmoid", {"x": X * 4}, {"alpha": 0.25, "beta": 0.4}, {}, ["mul", "add", "max", "min"]),
    ("HardSwish", {"x": X * 4}, {}, {}, ["mul", "add", "max", "min", "mul"]),
    ("Softplus", {"x": X * 30}, {}, {}, ["relu", "abs", "neg", "exp", "log1p", "add"]),
    ("Softsign", {"x": X}, {}, {}, ["abs", "add", "div"]),
    ("Mod", {"x": np.array([-7, 7, -7, 7, 6, 0], np.int32), "y": np.array([3, -3, -3, 3, 3, 5], np.int32)}, {}, {},
     ["fmod", "less", "less", "xor", "equal", "not", "and", "add", "where"]),
    ("Mod", {"x": X * 5, "y": Y + 3.5}, {"fmod": 1}, {}, ["fmod"]),
]


@pytest.mark.parametrize("op, inputs, attrs, constants, expected", CASES, ids=[c[0] for c in CASES])
def test_rule(op: str, inputs: dict, attrs: dict, constants: dict, expected: list[str]) -> None:
    model = single_op_model(op, inputs, attrs, constants)
    graph = fission_and_compare(model, inputs)
    assert primitive_names(graph) == expected


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(approximate: str) -> None:
    from kernorch.fission import fission
    from kernorch.frontend import import_model
    from kernorch.runtime import run_reference

    # onnxruntime 1.31 implements Gelu-20; compare against the formula itself as well.
    model = single_op_model("Gelu", {"x": X}, {"approximate": approximate}, opset=20)
    graph = fission_and_compare(model, {"x": X})
    assert "erf" in primitive_names(graph) if approximate == "none" else "tanh" in primitive_names(graph)
    x64 = X.astype(np.float64)
    if approximate == "none":
        from math import erf, sqrt

        expected = 0.5 * x64 * (1 + np.vectorize(erf)(x64 / sqrt(2)))
    else:
        expected = 0.5 * x64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64**3)))
    got = run_reference(fission(import_model(model)), {"x": X})["out0"]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_integer_div_truncates_toward_zero() -> None:
    a = np.array([7, -7, 7, -7, 0], dtype=np.int64)
    b = np.array([2, 2, -2, -2, 3], dtype=np.int64)
    graph = fission_and_compare(single_op_model("Div", {"a": a, "b": b}), {"a": a, "b": b})
    assert primitive_names(graph) == ["div"]


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    shape=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    broadcast_mask=st.lists(st.booleans(), min_size=4, max_size=4),
    op=st.sampled_from(["Add", "Sub", "Mul", "Max"]),
)
def test_binary_broadcasting(shape: list[int], broadcast_mask: list[bool], op: str) -> None:
    other = [1 if masked else d for d, masked in zip(shape, broadcast_mask, strict=False)]
    a, b = random_array(shape, seed=2), random_array(other, seed=3)
    graph = fission_and_compare(single_op_model(op, {"a": a, "b": b}), {"a": a, "b": b})
    assert len(graph.nodes) == 1
