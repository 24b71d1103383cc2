"""Fission rules for the com.microsoft operators onnxruntime's quantization tool writes in its QOperator format
(`quantize_static(..., quant_format=QuantFormat.QOperator)`; its ONNX-domain QLinearConv and QLinearMatMul are
integer_linear.py's): QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu, QLinearSoftmax,
QLinearGlobalAveragePool, QLinearAveragePool, QLinearConcat, QLinearWhere and QGemm.

Each means its float operator between the dequantization of its inputs and the quantization of its output
(onnxruntime's contrib operator documentation), and is fissioned as exactly that, the float operator by its own
ONNX rule (the same checks and refusals):

    QLinearAdd(a, sa, za, b, sb, zb, sy, zy) = QuantizeLinear(Add(DequantizeLinear(a, sa, za), ...), sy, zy)

Scales are per tensor; an absent zero point is 0 of the quantized input's type. onnxruntime's kernels compute
the same real numbers in another order (QLinearAdd as (a - za)·sa/sy + (b - zb)·sb/sy, the unary operators by a
table of 256 values, the average pools from integer sums): results agree but where a value lies within a float
rounding of a tie, one step apart. QGemm is an integer product (matmul_integer, exact int32 sums) plus its int32
bias, scaled by alpha·sa·sb and requantized by one multiplier, as QLinearMatMul.
"""

from __future__ import annotations

from typing import Any

from kernorch.fission.registry import RuleContext, rule
from kernorch.fission.rules.common import reshape
from kernorch.fission.rules.integer_linear import integer_sums, requantized, scalar_scale, zero_point_of
from kernorch.ir.primitives import INTEGER_OPERANDS

CONTRIB = "com.microsoft"


def _dequantized(ctx: RuleContext, value: int, scale: int, zero_point: int) -> str:
    """The float32 values of the 8-bit input at `value`, with its per-tensor scale and zero point (absent: 0)."""
    dtype = ctx.type(value).dtype
    if dtype not in INTEGER_OPERANDS:
        ctx.refuse(f"a {dtype} input {value} (int8 or uint8 only)")
    zero, _ = zero_point_of(ctx, zero_point, dtype, None, f"input {value}")
    (result,) = ctx.apply("DequantizeLinear", ctx.input(value), scalar_scale(ctx, scale, f"scale {scale}"), zero)
    return result


def _quantized(ctx: RuleContext, value: str, scale: int, zero_point: int, dtype: str) -> str:
    """`value` quantized to `dtype` with the per-tensor scale and zero point (absent: 0) at these inputs."""
    zero, _ = zero_point_of(ctx, zero_point, dtype, None, "the output")
    (result,) = ctx.apply("QuantizeLinear", value, scalar_scale(ctx, scale, f"scale {scale}"), zero)
    return result


@rule("QLinearAdd", "QLinearMul", domain=CONTRIB)
def qlinear_binary(ctx: RuleContext) -> list[str]:
    a, b = _dequantized(ctx, 0, 1, 2), _dequantized(ctx, 3, 4, 5)
    if ctx.type(3).dtype != ctx.type(0).dtype:
        ctx.refuse(f"a {ctx.type(0).dtype} by a {ctx.type(3).dtype} operand (one type for both)")
    (result,) = ctx.apply(ctx.op.removeprefix("QLinear"), a, b)
    return [_quantized(ctx, result, 6, 7, ctx.type(0).dtype)]


@rule("QLinearSigmoid", "QLinearLeakyRelu", domain=CONTRIB)
def qlinear_unary(ctx: RuleContext) -> list[str]:
    attributes: dict[str, Any] = {"alpha": float(ctx.attr("alpha", 0.01))} if ctx.op == "QLinearLeakyRelu" else {}
    (result,) = ctx.apply(ctx.op.removeprefix("QLinear"), _dequantized(ctx, 0, 1, 2), **attributes)
    return [_quantized(ctx, result, 3, 4, ctx.type(0).dtype)]


@rule("QLinearSoftmax", domain=CONTRIB)
def qlinear_softmax(ctx: RuleContext) -> list[str]:
    opset = ctx.attr("opset")
    if opset is None:
        ctx.refuse("no opset (the quantized Softmax's, which its axis means)", "opset")
    (result,) = ctx.apply("Softmax", _dequantized(ctx, 0, 1, 2), at_opset=int(opset), axis=int(ctx.attr("axis", -1)))
    return [_quantized(ctx, result, 3, 4, ctx.type(0).dtype)]


def _channels_first(ctx: RuleContext, value: str, last: bool, back: bool = False) -> str:
    """A channels-last tensor (N, spatial..., C) as (N, C, spatial...), or `back`; unchanged where not `last`."""
    if not last:
        return value
    rank = ctx.builder.type_of(value).rank
    perm = (0, *range(2, rank), 1) if back else (0, rank - 1, *range(1, rank - 1))
    (result,) = ctx.apply("Transpose", value, perm=list(perm))
    return result


@rule("QLinearGlobalAveragePool", "QLinearAveragePool", domain=CONTRIB)
def qlinear_average_pool(ctx: RuleContext) -> list[str]:
    last = bool(ctx.allow("channels_last", 0, 1, default=0))
    # the pool's own attributes (kernel_shape, pads, ...), for its rule to read and check
    attributes = {a.name: ctx.attr(a.name) for a in ctx.node.attribute if a.name != "channels_last"}
    x = _channels_first(ctx, _dequantized(ctx, 0, 1, 2), last)
    (pooled,) = ctx.apply(ctx.op.removeprefix("QLinear"), x, **attributes)
    return [_quantized(ctx, _channels_first(ctx, pooled, last, back=True), 3, 4, ctx.type(0).dtype)]


@rule("QLinearConcat", domain=CONTRIB)
def qlinear_concat(ctx: RuleContext) -> list[str]:
    parts = len(ctx.inputs) - 2
    if parts < 3 or parts % 3:
        ctx.refuse(f"{len(ctx.inputs)} inputs (y_scale, y_zero_point, then a value, scale, zero point per input)")
    values = [_dequantized(ctx, i, i + 1, i + 2) for i in range(2, len(ctx.inputs), 3)]
    (result,) = ctx.apply("Concat", *values, axis=int(ctx.attr("axis")))
    return [_quantized(ctx, result, 0, 1, ctx.type(1).dtype if ctx.has_input(1) else ctx.type(2).dtype)]


@rule("QLinearWhere", domain=CONTRIB)
def qlinear_where(ctx: RuleContext) -> list[str]:
    (result,) = ctx.apply("Where", ctx.input(0), _dequantized(ctx, 1, 2, 3), _dequantized(ctx, 4, 5, 6))
    return [_quantized(ctx, result, 7, 8, ctx.type(1).dtype)]


@rule("QGemm", domain=CONTRIB)
def qgemm(ctx: RuleContext) -> list[str]:
    ctx.allow("transA", 0, default=0)
    sums = integer_sums(ctx, 0, 3, 2, 5, b_transposed=bool(ctx.allow("transB", 0, 1, default=0)))
    if ctx.has_input(6):  # int32, on the sums' grid: scale alpha·sa·sb, zero point 0
        if ctx.type(6).dtype != "int32":
            ctx.refuse(f"a {ctx.type(6).dtype} bias C (int32 only)")
        sums = ctx.emit("add", sums, ctx.input(6))
    b_scale_type, columns = ctx.type(4), ctx.builder.type_of(sums).shape[-1]
    if b_scale_type.dtype != "float32" or b_scale_type.numel not in (1, columns) or b_scale_type.rank > 1:
        ctx.refuse(f"a b_scale {b_scale_type} (float32, per tensor or one per column)")
    b_scale = ctx.input(4) if b_scale_type.numel != 1 else reshape(ctx, ctx.input(4), ())
    scale = ctx.emit("mul", ctx.emit("mul", scalar_scale(ctx, 1, "a_scale"), b_scale),
                     ctx.scalar(float(ctx.attr("alpha", 1.0)), "float32"))  # fmt: skip
    if not ctx.has_input(7):  # no output scale: the output is float
        return [ctx.emit("mul", ctx.emit("cast", sums, to="float32"), scale)]
    if not ctx.has_input(8):
        ctx.refuse("a quantized output without its zero point (its type)")
    return [requantized(ctx, sums, ctx.emit("div", scale, scalar_scale(ctx, 7, "y_scale")), 8)]
