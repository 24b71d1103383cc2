"""The C of every post-op a direct kernel applies (library/post_ops.py), against oneDNN's eltwise and binary
definitions evaluated in float64."""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable

import numpy as np
import pytest

from kernorch.codegen.c.prelude import PRELUDE
from kernorch.codegen.library.call import Tensor
from kernorch.codegen.library.epilogue import Binary, Eltwise
from kernorch.codegen.library.post_ops import (
    VECTOR_SELECT,
    post_op_statements,
    post_ops_rejection,
    vector_epilogue,
    vector_operand,
    vector_post_op_statements,
)
from kernorch.codegen.program.compiler import compile_source, load_library
from kernorch.devtools.mutate import here


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


VECTOR_CASES = [op for op, _ in CASES if vector_post_op_statements(((op, None),), ["t"]) is not None]


def test_vector_forms_cover_the_cheap_post_ops() -> None:
    """relu, clip, hardswish, linear, add ... in registers; the transcendentals, max and min stay scalar."""
    assert {op.alg for op in VECTOR_CASES} == {"relu", "clip", "hardswish", "hardsigmoid", "abs", "square", "linear",
                                              "add", "sub", "mul", "div"}  # fmt: skip


@pytest.mark.parametrize("op", VECTOR_CASES, ids=[op.describe() for op in VECTOR_CASES])
def test_vector_form_equals_the_scalar_statement_bit_for_bit(op: Eltwise | Binary) -> None:
    """On 8-float vectors the same values as the scalar statement, NaN, ±inf, ±0 and subnormals included."""
    (scalar,) = post_op_statements(((op, None),), ["t[i]"])
    vector = vector_post_op_statements(((op, None),), ["*(const ko_v8u *)(t + i)"])
    assert vector is not None
    source = PRELUDE + """
typedef float ko_v8 __attribute__((vector_size(32)));
typedef float ko_v8u __attribute__((vector_size(32), aligned(4)));
""" + VECTOR_SELECT + f"""
void scalar(const float *x, const float *t, float *y, long n) {{
    for (long i = 0; i < n; i++) {{ float v = x[i]; {scalar} y[i] = v; }}
}}
void vector(const float *x, const float *t, float *y, long n) {{
    for (long i = 0; i < n; i += 8) {{ ko_v8 v = *(const ko_v8u *)(x + i); {" ".join(vector)} *(ko_v8u *)(y + i) = v; }}
}}
"""
    library = load_library(compile_source(source))
    edges = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-40, 3.0, -3.0, 6.0, 1e30, -1e30, 0.5, -0.5]
    x = np.concatenate([np.linspace(-12, 12, 4801), edges]).astype(np.float32)
    x = np.concatenate([x, np.zeros(-len(x) % 8, np.float32)])
    t = np.random.default_rng(0).uniform(-2.0, 2.0, x.shape).astype(np.float32)
    t[4801:4801 + len(edges)] = np.array(edges[::-1], np.float32)  # the operand's edges meet the input's
    expected, actual = np.empty_like(x), np.empty_like(x)
    library.scalar(*(ctypes.c_void_p(a.ctypes.data) for a in (x, t, expected)), ctypes.c_long(len(x)))
    library.vector(*(ctypes.c_void_p(a.ctypes.data) for a in (x, t, actual)), ctypes.c_long(len(x)))
    np.testing.assert_array_equal(actual.view(np.uint32), expected.view(np.uint32))



def test_vector_operands_load_contiguous_channels_and_splat_a_broadcast_refuse_the_rest() -> None:
    """A residual channels-last (8 channels loaded), a per-channel scale (its pixels broadcast), a map of the pixels
    (one value for every channel), and an NCHW operand, whose channels are no vector: the epilogue then stays a
    loop over the stored outputs (the kernels' tests run the first three against onnxruntime)."""
    residual = Tensor(4, (2, 16, 5, 7), (560, 1, 112, 16))
    assert vector_operand(0, residual, "n", "c", "y", "x") == \
        "*(const ko_v8u *)(t0 + (long)(n) * 560 + (long)(y) * 112 + (long)(x) * 16 + c)"  # fmt: skip
    scale = Tensor(5, (1, 16, 1, 1), (16, 1, 16, 16))
    assert vector_operand(1, scale, "n", "c", "y", "x") == \
        "*(const ko_v8u *)(t1 + (long)(n) * 0 + (long)(y) * 0 + (long)(x) * 0 + c)"  # fmt: skip
    pixels = Tensor(6, (1, 1, 5, 7), (35, 35, 7, 1))
    assert vector_operand(2, pixels, "n", "c", "y", "x") == \
        "((ko_v8){0} + t2[(long)(n) * 0 + (long)(y) * 7 + (long)(x) * 1])"  # fmt: skip
    planar = Tensor(7, (2, 16, 5, 7), (560, 35, 7, 1))
    assert vector_operand(3, planar, "n", "c", "y", "x") is None
    relu_then_add = ((Eltwise("relu"), None), (Binary("add", "r"), planar))
    assert vector_epilogue(relu_then_add, "n", "c", "y", "x") is None
    assert vector_epilogue(((Binary("add", "r"), residual),), "n", "c", "y", "x") is not None

# The mutants of the code this file tests (`make mutate`: kernorch/devtools/mutate.py collects them)
MUTANTS = [
    here("the vector relu turns NaN into 0",
         'else f"v = KO_SELECT8((v > 0.0f) | (v != v), v, {zero});"),',
         'else f"v = KO_SELECT8(v > 0.0f, v, {zero});"),'),
    here("the vector clip swaps its bounds",
         '"clip": f"v = KO_SELECT8(v < {a}, {zero} + {a}, KO_SELECT8(v > {b}, {zero} + {b}, v));",',
         '"clip": f"v = KO_SELECT8(v < {a}, {zero} + {b}, KO_SELECT8(v > {b}, {zero} + {a}, v));",'),
    here("the vector select takes y where the comparison holds",
         '#define KO_SELECT8(m, x, y) ((ko_v8)(((m) & (ko_i8)(x)) | (~(m) & (ko_i8)(y))))',
         '#define KO_SELECT8(m, x, y) ((ko_v8)(((m) & (ko_i8)(y)) | (~(m) & (ko_i8)(x))))'),
    here("an operand whose channels are not contiguous is loaded as a vector",
         "    if strides[1] != 1:\n        return None\n", "    if False:\n        return None\n"),
]  # fmt: skip
