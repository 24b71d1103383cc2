"""Triton for the values of a loop description: one spelling per elementwise primitive, cast and literal.

The C spellings (codegen/c/expr.py) follow onnxruntime on x86; these follow the same results on a GPU and in
Triton's interpreter, which share no math library with it: so the functions neither has exactly
(`tanh`, `log1p`, round half to even, NaN-propagating max/min, float-to-integer conversion out of range) are
written from operations both evaluate alike, and division and square root are the IEEE-rounded ones
(`div_rn`, `sqrt_rn`: Triton's `/` and `sqrt` are approximate on NVIDIA GPUs). A primitive with no exact
spelling raises NotGeneratable, so its kernel is left to another backend, never run approximately.
"""

from __future__ import annotations

import struct

import numpy as np

from kernorch.codegen.loops import NotGeneratable
from kernorch.ir.primitives import BOOLEAN_RESULTS, REDUCTIONS
from kernorch.ir.primitives import reduction_identity as identity_value

TL_TYPES = {"float32": "tl.float32", "float64": "tl.float64", "int32": "tl.int32", "int64": "tl.int64",
            "bool": "tl.int1"}  # fmt: skip
FLOATS = ("float32", "float64")
INT_LIMITS = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}

# Helpers every kernel module starts with: what neither the GPU nor the interpreter has as one exact call.
PRELUDE = '''import triton
import triton.language as tl


@triton.jit
def ko_max(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def ko_min(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def ko_imax(a, b):
    return tl.maximum(a, b)


@triton.jit
def ko_imin(a, b):
    return tl.minimum(a, b)


@triton.jit
def ko_mul(a, b):
    return a * b


@triton.jit
def ko_tanh(x):
    # tanh from one exp of -2|x| (never overflows); a series near 0, where 1 - e^-2|x| cancels
    ax = tl.abs(x)
    t = tl.exp(-2.0 * ax)
    far = tl.div_rn(1.0 - t, 1.0 + t)
    x2 = x * x
    near = x * (1.0 - x2 * (0.3333333333333333 - x2 * 0.13333333333333333))
    return tl.where(ax < 0.04, near, tl.where(x < 0, -far, far))


@triton.jit
def ko_log1p(x):
    # log(1 + x) corrected by the rounding of 1 + x (Goldberg): exact to an ulp for small x
    u = 1.0 + x
    d = u - 1.0
    corrected = tl.log(u) * tl.div_rn(x, tl.where(d == 0.0, 1.0, d))
    return tl.where(d == 0.0, x, tl.where(((u - u) != 0) & (u > 0), u, corrected))


@triton.jit
def ko_rint(x):
    # round half to even: floor(x + 1/2), one lower where that was a tie rounded up to an odd number
    r = tl.floor(x + 0.5)
    odd = (r - 2.0 * tl.floor(r * 0.5)) == 1.0
    r = tl.where(((r - x) == 0.5) & odd, r - 1.0, r)
    r = tl.where(r == 0, x * 0, r)  # a zero keeps the sign of x (-0.4 rounds to -0)
    return tl.where(tl.abs(x) >= 4503599627370496.0, x, r)


@triton.jit
def ko_sign(x):
    return tl.where(x > 0, 1, tl.where(x < 0, -1, 0)).to(x.dtype) + tl.where(x != x, x, 0)


@triton.jit
def ko_relu(x):
    return tl.where((x > 0) | (x != x), x, 0).to(x.dtype)


@triton.jit
def ko_pow(a, b):
    # in float64: exp(b log|a|), with the signs and edge cases of C's pow
    inf = tl.full([], 0x7FF0000000000000, tl.int64).to(tl.float64, bitcast=True)
    # both operands at the shape of both (a constant exponent is a scalar): no mixed-shape masks below
    x = tl.where(b == b, a, a).to(tl.float64)
    y = tl.where(a == a, b, b).to(tl.float64)
    ax = tl.abs(x)
    p = tl.exp(y * tl.log(tl.where(ax == 0.0, 1.0, ax)))
    p = tl.where(ax == 0.0, tl.where(y > 0, 0.0, tl.where(y == 0, 1.0, tl.where(y < 0, inf, y))), p)
    whole = tl.floor(y) == y
    odd = whole & ((y - 2.0 * tl.floor(y * 0.5)) == 1.0)
    # a negative base: its sign with an odd integer exponent, NaN with a fractional one (but -inf: +inf or +0)
    p = tl.where(x < 0, tl.where(whole, tl.where(odd, -p, p), tl.where(ax == inf, p, inf - inf)), p)
    p = tl.where((x == 0) & odd & ((1.0 / x) < 0), -p, p)  # -0 to an odd power keeps its sign
    p = tl.where((x == -1.0) & (tl.abs(y) == inf), 1.0, p)
    p = tl.where(y == 0, 1.0, tl.where(x == 1.0, 1.0, p))
    return p.to(a.dtype)
'''


def literal(value: object, dtype: str) -> str:
    """A typed scalar of `dtype` (NaN and the infinities by their bits: no literal spells them in Triton)."""
    if dtype in FLOATS:
        number = float(value)  # type: ignore[arg-type]
        if np.isfinite(number):
            return f"tl.full([], {number!r}, {TL_TYPES[dtype]})"
        bits = struct.unpack("<i", struct.pack("<f", number))[0] if dtype == "float32" else \
            struct.unpack("<q", struct.pack("<d", number))[0]  # fmt: skip
        integer = "tl.int32" if dtype == "float32" else "tl.int64"
        return f"tl.full([], {bits}, {integer}).to({TL_TYPES[dtype]}, bitcast=True)"
    if dtype == "bool":
        return f"tl.full([], {int(bool(value))}, tl.int1)"
    return f"tl.full([], {int(value)}, {TL_TYPES[dtype]})"  # type: ignore[call-overload]


def value_dtype(prim: str, dtype: str) -> str:
    """The dtype an elementwise primitive of `dtype` operands produces."""
    return "bool" if prim in BOOLEAN_RESULTS else dtype


def unary(prim: str, dtype: str, a: str) -> str:
    is_float = dtype in FLOATS
    if prim in ("exp", "log", "log1p", "sqrt", "reciprocal", "sin", "cos", "tanh", "erf", "sigmoid", "floor",
                "ceil", "round") and not is_float:  # fmt: skip
        raise NotGeneratable(f"{prim} of {dtype} is not generated in Triton")
    table = {
        "neg": f"(0 - {a})" if not is_float else f"(-{a})",
        "abs": f"tl.abs({a})",
        "exp": f"tl.exp({a})", "log": f"tl.log({a})", "log1p": f"ko_log1p({a})",
        "sqrt": f"tl.sqrt_rn({a})", "reciprocal": f"tl.div_rn(tl.full([], 1, {TL_TYPES[dtype]}), {a})",
        "sin": f"tl.sin({a})", "cos": f"tl.cos({a})", "tanh": f"ko_tanh({a})", "erf": f"tl.erf({a})",
        "sigmoid": f"tl.div_rn(tl.full([], 1, {TL_TYPES[dtype]}), 1 + tl.exp(-{a}))",
        "relu": f"ko_relu({a})", "floor": f"tl.floor({a})", "ceil": f"tl.ceil({a})", "round": f"ko_rint({a})",
        "sign": f"ko_sign({a})", "not": f"({a} == 0)",
    }  # fmt: skip
    if prim not in table:
        raise NotGeneratable(f"{prim} is not generated in Triton")
    return table[prim]


def binary(prim: str, dtype: str, a: str, b: str, error: list[str]) -> str:
    """`a prim b`; an integer division or remainder by zero appends the condition that sets the kernel's error
    flag to `error` (the call is refused, as in C)."""
    is_float = dtype in FLOATS
    if prim in ("div", "fmod") and not is_float:
        error.append(f"({b} == 0)")
        safe = f"tl.where({b} == 0, 1, {b})"
        if prim == "div":  # b = -1 negates (INT_MIN / -1 wraps, as on x86 with the prelude's ko_idiv)
            return f"tl.where({b} == -1, 0 - {a}, {a} // {safe})"
        return f"tl.where({b} == -1, 0, {a} % {safe})"
    if prim == "fmod":
        raise NotGeneratable("float fmod has no exact Triton spelling")
    if prim == "pow" and not is_float:
        raise NotGeneratable("integer pow is not generated in Triton")
    table = {
        "add": f"({a} + {b})", "sub": f"({a} - {b})", "mul": f"({a} * {b})",
        "div": f"tl.div_rn({a}, {b})", "pow": f"ko_pow({a}, {b})",
        "max": f"ko_max({a}, {b})" if is_float else f"tl.maximum({a}, {b})",
        "min": f"ko_min({a}, {b})" if is_float else f"tl.minimum({a}, {b})",
        "equal": f"({a} == {b})", "less": f"({a} < {b})", "greater": f"({a} > {b})",
        "less_equal": f"({a} <= {b})", "greater_equal": f"({a} >= {b})",
        "and": f"(({a} != 0) & ({b} != 0))", "or": f"(({a} != 0) | ({b} != 0))", "xor": f"(({a} != 0) ^ ({b} != 0))",
    }  # fmt: skip
    if prim not in table:
        raise NotGeneratable(f"{prim} is not generated in Triton")
    return table[prim]


def quaternary(prim: str, x: str, offset: str, low: str, high: str) -> str:
    """The four-operand primitive (float32): saturating_round, QuantizeLinear's integer step (a NaN compares
    false: low)."""
    if prim != "saturating_round":
        raise NotGeneratable(f"{prim} is not generated in Triton")
    shifted = f"(ko_rint({x}) + {offset})"
    above = f"tl.where({shifted} > {low}, {shifted}, {low})"
    return f"tl.where({above} < {high}, {above}, {high})"


def cast(value: str, source: str, target: str) -> str:
    """ONNX Cast: to bool anything non-zero (NaN too) is true; a float out of an integer's range (or NaN) becomes
    the integer's minimum, as x86 and onnxruntime give (a GPU would saturate)."""
    if source == target:
        return value
    if target == "bool":
        return f"({value} != 0)"
    if source in FLOATS and target in INT_LIMITS:
        low, high = INT_LIMITS[target]
        bad = f"(({value} != {value}) | ({value} >= {float(-low)!r}) | ({value} < {float(low)!r}))"
        return (f"tl.where({bad}, tl.full([], {low}, {TL_TYPES[target]}), "
                f"tl.where({bad}, 0, {value}).to({TL_TYPES[target]}))")  # fmt: skip
    return f"{value}.to({TL_TYPES[target]})"


def reduction_identity(prim: str, dtype: str) -> str:
    """The accumulator's initial value: ir/primitives.py's identity of the reduction, as a typed scalar."""
    if dtype == "bool":
        raise NotGeneratable("a reduction of booleans is not generated in Triton")
    if prim not in REDUCTIONS:
        raise NotGeneratable(f"reduction {prim} is not generated in Triton")
    return literal(identity_value(prim, dtype), dtype)


def combine(prim: str, dtype: str, acc: str, value: str) -> str:
    """One step of a reduction."""
    if prim == "reduce_sum":
        return f"{acc} + {value}"
    if prim == "reduce_prod":
        return f"{acc} * {value}"
    if dtype in FLOATS:
        return f"{'ko_max' if prim == 'reduce_max' else 'ko_min'}({acc}, {value})"
    return f"{'tl.maximum' if prim == 'reduce_max' else 'tl.minimum'}({acc}, {value})"


def combined_along(prim: str, dtype: str, acc: str, axis: int) -> str:
    """A block of partial results reduced along `axis`, the axis kept. Max and min propagate NaN: Triton's
    `tl.max` may not, and a `tl.reduce` with a NaN-propagating combiner is slow in the interpreter, so a NaN
    anywhere along the axis is put back after it."""
    if prim == "reduce_sum":
        return f"tl.sum({acc}, axis={axis}, keep_dims=True)"
    if prim == "reduce_prod":
        return f"tl.reduce({acc}, {axis}, ko_mul, keep_dims=True)"
    function = "tl.max" if prim == "reduce_max" else "tl.min"
    reduced = f"{function}({acc}, axis={axis}, keep_dims=True)"
    if dtype not in FLOATS or not REDUCTIONS[prim].propagates_nan:
        return reduced
    nan = f"tl.sum(({acc} != {acc}).to(tl.int32), axis={axis}, keep_dims=True) > 0"
    return f"tl.where({nan}, tl.sum({acc}, axis={axis}, keep_dims=True), {reduced})"  # a sum with a NaN is NaN
