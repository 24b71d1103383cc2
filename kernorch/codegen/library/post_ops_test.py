"""The C of every post-op a direct kernel applies (library/post_ops.py), against oneDNN's eltwise and binary
definitions evaluated in float64."""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable

import numpy as np
import pytest

from kernorch.codegen.c.prelude import PRELUDE
from kernorch.codegen.library.epilogue import Binary, Eltwise
from kernorch.codegen.library.post_ops import post_op_statements, post_ops_rejection
from kernorch.codegen.program.compiler import compile_source, load_library


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


# (post-op, its float64 definition: oneDNN's eltwise formulas; t is a binary post-op's operand)
CASES: list[tuple[Eltwise | Binary, Callable[[np.ndarray, np.ndarray], np.ndarray]]] = [
    (Eltwise("relu"), lambda x, t: np.maximum(x, 0.0)),
    (Eltwise("relu", 0.1), lambda x, t: np.where(x > 0, x, 0.1 * x)),
    (Eltwise("clip", 0.0, 6.0), lambda x, t: np.clip(x, 0.0, 6.0)),
    (Eltwise("hardswish", 1 / 6, 0.5), lambda x, t: x * np.clip(x / 6 + 0.5, 0.0, 1.0)),
    (Eltwise("hardsigmoid", 0.2, 0.5), lambda x, t: np.clip(0.2 * x + 0.5, 0.0, 1.0)),
    (Eltwise("logistic"), lambda x, t: _sigmoid(x)),
    (Eltwise("swish", 1.0), lambda x, t: x * _sigmoid(x)),
    (Eltwise("swish", 1.702), lambda x, t: x * _sigmoid(1.702 * x)),
    (Eltwise("gelu_tanh"), lambda x, t: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))),
    (Eltwise("gelu_erf"), lambda x, t: 0.5 * x * (1 + _erf(x / math.sqrt(2)))),
    (Eltwise("tanh"), lambda x, t: np.tanh(x)),
    (Eltwise("exp"), lambda x, t: np.exp(x)),
    (Eltwise("abs"), lambda x, t: np.abs(x)),
    (Eltwise("square"), lambda x, t: x * x),
    (Eltwise("linear", -2.5, 0.75), lambda x, t: -2.5 * x + 0.75),
    (Eltwise("elu", 0.7), lambda x, t: np.where(x > 0, x, 0.7 * (np.exp(x) - 1))),
    (Binary("add", "t"), lambda x, t: x + t),
    (Binary("sub", "t"), lambda x, t: x - t),
    (Binary("mul", "t"), lambda x, t: x * t),
    (Binary("div", "t"), lambda x, t: x / t),
    (Binary("max", "t"), lambda x, t: np.maximum(x, t)),
    (Binary("min", "t"), lambda x, t: np.minimum(x, t)),
]


@pytest.mark.parametrize("case", range(len(CASES)), ids=[op.describe() for op, _ in CASES])
def test_post_op_statement_computes_onednn_formula(case: int) -> None:
    op, reference = CASES[case]
    (statement,) = post_op_statements(((op, None),), ["t[i]"])
    source = PRELUDE + f"""
void apply(const float *x, const float *t, float *y, long n) {{
    for (long i = 0; i < n; i++) {{ float v = x[i]; {statement} y[i] = v; }}
}}
"""
    library = load_library(compile_source(source))
    x = np.concatenate([np.linspace(-12, 12, 4801), [0.0, -0.0, 1e-6, -1e-6, 3.0, -3.0]]).astype(np.float32)
    t = np.random.default_rng(0).uniform(0.5, 2.0, x.shape).astype(np.float32)
    y = np.empty_like(x)
    library.apply(*(ctypes.c_void_p(a.ctypes.data) for a in (x, t, y)), ctypes.c_long(len(x)))
    expected = reference(x.astype(np.float64), t.astype(np.float64))
    np.testing.assert_allclose(y, expected, rtol=2e-6, atol=1e-6)


def test_post_ops_without_c_are_named() -> None:
    assert post_ops_rejection(((Eltwise("swish", 1.0), None), (Binary("add", "r"), None))) is None
    assert post_ops_rejection(((Eltwise("relu"), None), (Eltwise("soft_relu", 1.0), None))) == \
        "no C for the soft_relu post-op"  # fmt: skip


def test_binary_operands_are_used_in_order() -> None:
    ops = ((Binary("mul", "s"), None), (Eltwise("relu"), None), (Binary("add", "r"), None))
    assert post_op_statements(ops, ["S", "R"]) == ["v = v * S;", "v = (v > 0.0f || v != v) ? v : 0.0f;", "v = v + R;"]
