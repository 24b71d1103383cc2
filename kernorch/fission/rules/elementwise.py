"""Fission rules for elementwise operators: each becomes one or a few elementwise primitives."""

from __future__ import annotations

import math

import numpy as np

from kernorch.fission.registry import RuleContext, rule
from kernorch.ir.types import FLOAT_DTYPES

_UNARY = {
    "Neg": "neg", "Abs": "abs", "Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Reciprocal": "reciprocal",
    "Sin": "sin", "Cos": "cos", "Tanh": "tanh", "Sigmoid": "sigmoid", "Erf": "erf", "Relu": "relu",
    "Floor": "floor", "Ceil": "ceil", "Round": "round", "Sign": "sign", "Not": "not",
}  # fmt: skip

_BINARY = {
    "Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div",
    "Equal": "equal", "Less": "less", "Greater": "greater", "LessOrEqual": "less_equal",
    "GreaterOrEqual": "greater_equal", "And": "and", "Or": "or", "Xor": "xor",
}  # fmt: skip

_FLOAT_ONLY = {"Exp", "Log", "Sqrt", "Reciprocal", "Sin", "Cos", "Tanh", "Sigmoid", "Erf", "Floor", "Ceil", "Round"}


def _require_float(ctx: RuleContext, index: int = 0) -> str:
    dtype = ctx.type(index).dtype
    if dtype not in FLOAT_DTYPES:
        ctx.refuse(f"input dtype {dtype} is not supported (float only)")
    return dtype


@rule(*_UNARY)
def unary(ctx: RuleContext) -> list[str]:
    if ctx.op in _FLOAT_ONLY:
        _require_float(ctx)
    return [ctx.emit(_UNARY[ctx.op], ctx.input(0))]


@rule(*_BINARY)
def binary(ctx: RuleContext) -> list[str]:
    if ctx.opset < 7 and ctx.op in ("Add", "Sub", "Mul", "Div"):
        ctx.refuse("legacy broadcast attributes (opset < 7) are not supported")
    return [ctx.emit(_BINARY[ctx.op], ctx.input(0), ctx.input(1))]


@rule("Pow")
def power(ctx: RuleContext) -> list[str]:
    base, exponent = ctx.input(0), ctx.input(1)
    base_dtype = ctx.type(0).dtype
    exponent_dtype = ctx.type(1).dtype
    if exponent_dtype != base_dtype:
        if base_dtype not in FLOAT_DTYPES and exponent_dtype in FLOAT_DTYPES:
            # An integer base with a float exponent: compute in float, truncate back to the base type.
            result = ctx.emit("pow", ctx.emit("cast", base, to=exponent_dtype), exponent)
            return [ctx.emit("cast", result, to=base_dtype)]
        exponent = ctx.emit("cast", exponent, to=base_dtype)
    return [ctx.emit("pow", base, exponent)]


@rule("Max", "Min", "Sum", "Mean")
def variadic(ctx: RuleContext) -> list[str]:
    primitive = {"Max": "max", "Min": "min", "Sum": "add", "Mean": "add"}[ctx.op]
    operands = [ctx.input(i) for i in range(len(ctx.inputs))]
    dtype = ctx.type(0).dtype
    # a float16 mean is summed in float32 (onnxruntime too): two large halves would overflow their sum
    widened = ctx.op == "Mean" and dtype == "float16" and len(operands) > 1
    if widened:
        operands = [ctx.emit("cast", operand, to="float32") for operand in operands]
    result = operands[0]
    for operand in operands[1:]:
        result = ctx.emit(primitive, result, operand)
    if len(operands) == 1 and ctx.op != "Mean":
        result = ctx.emit("identity", result)
    if ctx.op == "Mean":
        result = ctx.emit("div", result, ctx.scalar(len(operands), "float32" if widened else dtype))
    if widened:
        result = ctx.emit("cast", result, to=dtype)
    return [result]


@rule("Mod", min_opset=10)
def mod(ctx: RuleContext) -> list[str]:
    """fmod=1: C's fmod (sign of the dividend). fmod=0: the sign of the divisor, as Python's %: a non-zero
    remainder whose sign differs from the divisor's moves by one divisor."""
    a, b = ctx.input(0), ctx.input(1)
    dtype = ctx.type(0).dtype
    if dtype == "bool":
        ctx.refuse("needs numeric operands")
    c_fmod = bool(ctx.allow("fmod", 0, 1, default=0))
    if not c_fmod and dtype.startswith("float") and ctx.opset < 28:
        ctx.refuse("fmod=0 on floats is defined from opset 28", "fmod")
    remainder = ctx.emit("fmod", a, b)
    if c_fmod or dtype.startswith("uint"):
        return [remainder]
    zero = ctx.scalar(0, dtype)
    signs_differ = ctx.emit("xor", ctx.emit("less", remainder, zero), ctx.emit("less", b, zero))
    moves = ctx.emit("and", signs_differ, ctx.emit("not", ctx.emit("equal", remainder, zero)))
    return [ctx.emit("where", moves, ctx.emit("add", remainder, b), remainder)]


@rule("IsNaN")
def is_nan(ctx: RuleContext) -> list[str]:
    x = ctx.input(0)
    _require_float(ctx)
    return [ctx.emit("not", ctx.emit("equal", x, x))]


@rule("IsInf", min_opset=10)
def is_inf(ctx: RuleContext) -> list[str]:
    x, dtype = ctx.input(0), _require_float(ctx)
    negative = ctx.allow("detect_negative", 0, 1, default=1)
    positive = ctx.allow("detect_positive", 0, 1, default=1)
    if not (negative or positive):  # false everywhere: |x| < -1 never holds, NaN included
        return [ctx.emit("less", ctx.emit("abs", x), ctx.scalar(-1, dtype))]
    if negative and positive:
        return [ctx.emit("equal", ctx.emit("abs", x), ctx.scalar(math.inf, dtype))]
    return [ctx.emit("equal", x, ctx.scalar(math.inf if positive else -math.inf, dtype))]


@rule("Where")
def where(ctx: RuleContext) -> list[str]:
    return [ctx.emit("where", ctx.input(0), ctx.input(1), ctx.input(2))]


@rule("Cast")
def cast(ctx: RuleContext) -> list[str]:
    from kernorch.frontend.onnx_import import onnx_dtype_name

    to = onnx_dtype_name(ctx.attr("to"), ctx.node.name)
    ctx.allow("saturate", 1, default=1)
    return [ctx.emit("cast", ctx.input(0), to=to)]


@rule("CastLike")
def cast_like(ctx: RuleContext) -> list[str]:
    ctx.allow("saturate", 1, default=1)
    return [ctx.emit("cast", ctx.input(0), to=ctx.type(1).dtype)]


@rule("Clip")
def clip(ctx: RuleContext) -> list[str]:
    x = ctx.input(0)
    dtype = ctx.type(0).dtype
    if ctx.opset < 11:
        low, high = ctx.attr("min", None), ctx.attr("max", None)
        bounds = [ctx.scalar(low, dtype) if low is not None else None,
                  ctx.scalar(high, dtype) if high is not None else None]  # fmt: skip
    else:
        bounds = [ctx.input(i) if ctx.has_input(i) else None for i in (1, 2)]
    result = x
    if bounds[0] is not None:
        result = ctx.emit("max", result, bounds[0])
    if bounds[1] is not None:
        result = ctx.emit("min", result, bounds[1])
    return [result if result != x else ctx.emit("identity", x)]


@rule("LeakyRelu")
def leaky_relu(ctx: RuleContext) -> list[str]:
    x, dtype = ctx.input(0), _require_float(ctx)
    alpha = ctx.attr("alpha", 0.01)
    negative = ctx.emit("less", x, ctx.scalar(0, dtype))
    return [ctx.emit("where", negative, ctx.emit("mul", x, ctx.scalar(alpha, dtype)), x)]


@rule("PRelu")
def prelu(ctx: RuleContext) -> list[str]:
    x, slope = ctx.input(0), ctx.input(1)
    dtype = _require_float(ctx)
    negative = ctx.emit("less", x, ctx.scalar(0, dtype))
    return [ctx.emit("where", negative, ctx.emit("mul", x, slope), x)]


@rule("Elu", "Celu")
def elu(ctx: RuleContext) -> list[str]:
    # Elu: x<0 ? alpha*(e^x - 1) : x.  Celu: max(0,x) + min(0, alpha*(e^(x/alpha) - 1)), the same curve.
    x, dtype = ctx.input(0), _require_float(ctx)
    alpha = ctx.attr("alpha", 1.0)
    scaled = ctx.emit("div", x, ctx.scalar(alpha, dtype)) if ctx.op == "Celu" else x
    curve = ctx.emit("mul", ctx.emit("sub", ctx.emit("exp", scaled), ctx.scalar(1, dtype)), ctx.scalar(alpha, dtype))
    negative = ctx.emit("less", x, ctx.scalar(0, dtype))
    return [ctx.emit("where", negative, curve, x)]


@rule("Selu")
def selu(ctx: RuleContext) -> list[str]:
    x, dtype = ctx.input(0), _require_float(ctx)
    alpha = ctx.attr("alpha", 1.67326319217681884765625)
    gamma = ctx.attr("gamma", 1.05070102214813232421875)
    curve = ctx.emit("mul", ctx.emit("sub", ctx.emit("exp", x), ctx.scalar(1, dtype)), ctx.scalar(alpha, dtype))
    negative = ctx.emit("less_equal", x, ctx.scalar(0, dtype))
    return [ctx.emit("mul", ctx.emit("where", negative, curve, x), ctx.scalar(gamma, dtype))]


@rule("ThresholdedRelu")
def thresholded_relu(ctx: RuleContext) -> list[str]:
    x, dtype = ctx.input(0), _require_float(ctx)
    above = ctx.emit("greater", x, ctx.scalar(ctx.attr("alpha", 1.0), dtype))
    return [ctx.emit("where", above, x, ctx.scalar(0, dtype))]


def _hard_sigmoid(ctx: RuleContext, x: str, dtype: str, alpha: float, beta: float) -> str:
    linear = ctx.emit("add", ctx.emit("mul", x, ctx.scalar(alpha, dtype)), ctx.scalar(beta, dtype))
    return ctx.emit("min", ctx.emit("max", linear, ctx.scalar(0, dtype)), ctx.scalar(1, dtype))


@rule("HardSigmoid")
def hard_sigmoid(ctx: RuleContext) -> list[str]:
    x, dtype = ctx.input(0), _require_float(ctx)
    return [_hard_sigmoid(ctx, x, dtype, ctx.attr("alpha", 0.2), ctx.attr("beta", 0.5))]


@rule("HardSwish")
def hard_swish(ctx: RuleContext) -> list[str]:
    x, dtype = ctx.input(0), _require_float(ctx)
    # ONNX's alpha is a float attribute: 1/6 rounded to float32, in every dtype (onnxruntime's float64 too)
    return [ctx.emit("mul", x, _hard_sigmoid(ctx, x, dtype, float(np.float32(1 / 6)), 0.5))]


def _log1p_exp_minus_abs(ctx: RuleContext, x: str) -> str:
    """log(1 + e^-|x|) with log1p: log(1 + t) rounds away the low bits of a small t (softplus(-7.25) was 6e-4
    off in float32)."""
    return ctx.emit("log1p", ctx.emit("exp", ctx.emit("neg", ctx.emit("abs", x))))


@rule("Softplus")
def softplus(ctx: RuleContext) -> list[str]:
    # log(1 + e^x) computed as max(x, 0) + log(1 + e^-|x|): no overflow for large x.
    x = ctx.input(0)
    _require_float(ctx)
    return [ctx.emit("add", ctx.emit("relu", x), _log1p_exp_minus_abs(ctx, x))]


@rule("Softsign")
def softsign(ctx: RuleContext) -> list[str]:
    x, dtype = ctx.input(0), _require_float(ctx)
    return [ctx.emit("div", x, ctx.emit("add", ctx.scalar(1, dtype), ctx.emit("abs", x)))]


@rule("Mish")
def mish(ctx: RuleContext) -> list[str]:
    x = ctx.input(0)
    _require_float(ctx)
    softplus = ctx.emit("add", ctx.emit("relu", x), _log1p_exp_minus_abs(ctx, x))
    return [ctx.emit("mul", x, ctx.emit("tanh", softplus))]


@rule("Gelu", min_opset=20)
def gelu(ctx: RuleContext) -> list[str]:
    x, dtype = ctx.input(0), _require_float(ctx)
    approximate = ctx.allow("approximate", "none", "tanh", default="none")
    half_x = ctx.emit("mul", x, ctx.scalar(0.5, dtype))
    if approximate == "none":
        inner = ctx.emit("erf", ctx.emit("mul", x, ctx.scalar(1 / math.sqrt(2), dtype)))
    else:
        cube = ctx.emit("mul", ctx.emit("mul", x, x), x)
        poly = ctx.emit("add", x, ctx.emit("mul", cube, ctx.scalar(0.044715, dtype)))
        inner = ctx.emit("tanh", ctx.emit("mul", poly, ctx.scalar(math.sqrt(2 / math.pi), dtype)))
    return [ctx.emit("mul", half_x, ctx.emit("add", inner, ctx.scalar(1, dtype)))]


@rule("Identity")
def identity(ctx: RuleContext) -> list[str]:
    # Pure aliasing: no primitive is emitted.
    return [ctx.input(0)]


@rule("Dropout", static_inputs=(2,))
def dropout(ctx: RuleContext) -> list[str]:
    # Inference: identity, with the optional mask output all true. Ratio and seed do not matter then.
    ctx.attr("seed")
    ctx.attr("ratio")
    if ctx.opset < 7:
        ctx.allow("is_test", 1, default=0)
    if ctx.has_input(2) and bool(ctx.const(2, "training_mode")):
        ctx.refuse("training_mode=True is not supported")
    mask = ctx.constant(np.ones(ctx.type(0).shape, dtype=bool), hint="mask")
    return [ctx.input(0), mask]
