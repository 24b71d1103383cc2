"""Fission rules for the integer linear operators onnxruntime's quantization tool writes: MatMulInteger (dynamic
quantization's products), QLinearMatMul, ConvInteger and QLinearConv.

    MatMulInteger: y = (a - a_zero) @ (b - b_zero), int32 sums         -> matmul_integer (an int8 kernel's primitive)
    QLinearMatMul: y = saturate(round(acc * (a_scale * b_scale / y_scale)) + y_zero), acc as MatMulInteger's
    ConvInteger:   y = conv(x - x_zero, w - w_zero), int32 sums        -> conv_integer (int8 convolution kernels)
    QLinearConv:   y = saturate(round((acc + bias) * (x_scale * w_scale / y_scale)) + y_zero)

The requantization multiplies by one multiplier per tensor (or per output channel) as onnxruntime's kernels do,
where the ONNX reference divides the float product by y_scale: both round the same real number, so they differ at
most where it lies within a float rounding of a tie (one step). A convolution over weights that are not constant
(or whose distance from their zero points leaves int8) is computed in float64, where every partial sum of 8-bit
products is an integer far below 2^53 and so exact: the result equals int32 accumulation's. On a CPU without VNNI,
where no int8 kernel here sums it both exactly and fast (common.integer_convolution_pays), a convolution whose
partial sums provably stay below 2^24 (common.sums_exact_in_float32: 255 times an output channel's Σ|w|) is
computed in float32 on the float convolution kernels, marked `exact_sums` (no Winograd transform, no bfloat16):
exactly the int32 sums, at float speed (shufflenet_v2's dynamically quantized file on Zen 3: 36 ms on the reference
ConvInteger against the float model's 3.3).
"""

from __future__ import annotations

import numpy as np

from kernorch.fission.registry import RuleContext, rule
from kernorch.fission.rules.common import (
    centred_int8,
    channel_param,
    integer_convolution_pays,
    reshape,
    spatial_attrs,
    sums_exact_in_float32,
)
from kernorch.fission.rules.quantize import RANGES, saturate
from kernorch.ir.primitives import INTEGER_OPERANDS, MAX_INTEGER_K


def _integer_operand(ctx: RuleContext, index: int, what: str) -> str:
    dtype = ctx.type(index).dtype
    if dtype not in INTEGER_OPERANDS:
        ctx.refuse(f"a {dtype} {what} (int8 or uint8 only)")
    return dtype


def zero_point_of(ctx: RuleContext, index: int, dtype: str, per: int | None, what: str) -> tuple[str, bool]:
    """The zero point at input `index` (0 of `dtype` when absent) as a scalar, or as a vector of `per` values when
    it has one per row or column; with whether it is a vector."""
    if not ctx.has_input(index):
        return ctx.scalar(0, dtype), False
    value, value_type = ctx.input(index), ctx.type(index)
    if value_type.dtype != dtype:
        ctx.refuse(f"a {value_type.dtype} zero point for {dtype} {what}")
    if value_type.numel == 1 and value_type.rank <= 1:
        return reshape(ctx, value, ()), False
    if per is not None and value_type.shape == (per,):
        return value, True
    ctx.refuse(f"a zero point of shape {list(value_type.shape)} for {what} (a scalar"
               + (f" or one per {per}" if per is not None else "") + ")")  # fmt: skip


def scalar_scale(ctx: RuleContext, index: int, what: str) -> str:
    scale_type = ctx.type(index)
    if scale_type.dtype != "float32":
        ctx.refuse(f"a {scale_type.dtype} {what} (float32 only)")
    if scale_type.numel != 1 or scale_type.rank > 1:
        ctx.refuse(f"a {what} of shape {list(scale_type.shape)} (per tensor only)")
    return reshape(ctx, ctx.input(index), ())


def integer_sums(ctx: RuleContext, a: int, b: int, a_zero: int, b_zero: int, b_transposed: bool = False) -> str:
    """matmul_integer of inputs `a` and `b` (a 2-D `b` stored transposed where `b_transposed`, as QGemm's transB
    reads it) with their zero points (absent: 0), checked as the primitive needs."""
    a_type, b_type = ctx.type(a), ctx.type(b)
    a_dtype, b_dtype = _integer_operand(ctx, a, "a"), _integer_operand(ctx, b, "b")
    if a_type.rank < 2 or b_type.rank < 2:
        ctx.refuse(f"a {a_type.rank}-D by {b_type.rank}-D product (2-D and more only)")
    if a_type.shape[-1] > MAX_INTEGER_K:
        ctx.refuse(f"K = {a_type.shape[-1]}: int32 sums could overflow beyond K = {MAX_INTEGER_K}")
    b_value = ctx.input(b)
    if b_transposed:
        if b_type.rank != 2:
            ctx.refuse(f"a transposed {b_type.rank}-D b (2-D only)")
        b_value = ctx.emit("transpose", b_value, perm=(1, 0))
        b_type = ctx.builder.type_of(b_value)
    a_zero_point, per_row = zero_point_of(ctx, a_zero, a_dtype, a_type.shape[-2] if a_type.rank == 2 else None, "a")
    b_zero_point, _ = zero_point_of(ctx, b_zero, b_dtype, b_type.shape[-1] if b_type.rank == 2 else None, "b")
    if per_row:
        a_zero_point = reshape(ctx, a_zero_point, (a_type.shape[-2], 1))
    return ctx.emit("matmul_integer", ctx.input(a), b_value, a_zero_point, b_zero_point)


@rule("MatMulInteger", min_opset=10)
def matmul_integer(ctx: RuleContext) -> list[str]:
    return [integer_sums(ctx, 0, 1, 2, 3)]


def requantized(ctx: RuleContext, acc: str, multiplier: str, zero_index: int) -> str:
    """The int32 sums `acc` requantized to the type of the zero point at input `zero_index`."""
    target = ctx.type(zero_index).dtype
    if target not in RANGES:
        ctx.refuse(f"a {target} output (8- and 16-bit integers only)")
    scaled = ctx.emit("mul", ctx.emit("cast", acc, to="float32"), multiplier)
    return saturate(ctx, scaled, zero_point_of(ctx, zero_index, target, None, "the output")[0], target)


@rule("QLinearMatMul", min_opset=10)
def qlinear_matmul(ctx: RuleContext) -> list[str]:
    acc = integer_sums(ctx, 0, 3, 2, 5)
    a_scale, y_scale = scalar_scale(ctx, 1, "a_scale"), scalar_scale(ctx, 6, "y_scale")
    b_type, b_scale_type = ctx.type(3), ctx.type(4)
    if b_scale_type.dtype != "float32":
        ctx.refuse(f"a {b_scale_type.dtype} b_scale (float32 only)")
    if b_scale_type.numel == 1 and b_scale_type.rank <= 1:
        b_scale = reshape(ctx, ctx.input(4), ())
    elif b_type.rank == 2 and b_scale_type.shape == (b_type.shape[-1],):
        b_scale = ctx.input(4)  # one per column: broadcasts along the product's last axis
    else:
        ctx.refuse(f"a b_scale of shape {list(b_scale_type.shape)} (per tensor or per column of a 2-D b)")
    multiplier = ctx.emit("div", ctx.emit("mul", a_scale, b_scale), y_scale)
    return [requantized(ctx, acc, multiplier, 7)]


def _conv_integer(ctx: RuleContext, x: int, w: int, x_zero: int, w_zero: int) -> str:
    """The int32 sums of an integer convolution: over constant weights whose distance from their zero points fits
    int8 (per-tensor or per-channel zero points folded into them) the conv_integer primitive, which the int8
    convolution kernels run; any other in float64 (see the module's docstring)."""
    x_type, w_type = ctx.type(x), ctx.type(w)
    x_dtype, w_dtype = _integer_operand(ctx, x, "input"), _integer_operand(ctx, w, "weight")
    if x_type.rank not in (3, 4, 5) or w_type.rank != x_type.rank:
        ctx.refuse(f"1-D to 3-D convolutions only, got input {x_type} weight {w_type}")
    kernel = w_type.shape[2:]
    declared = ctx.attr("kernel_shape", None)
    if declared is not None and tuple(declared) != kernel:
        ctx.refuse(f"kernel_shape {declared} differs from the weight's {kernel}", "kernel_shape")
    group = ctx.attr("group", 1)
    if group < 1 or x_type.shape[1] != w_type.shape[1] * group or w_type.shape[0] % group:
        ctx.refuse(f"channels {x_type.shape[1]} do not match weight {w_type.shape} with group {group}", "group")
    if w_type.numel // w_type.shape[0] > MAX_INTEGER_K:
        ctx.refuse(f"{w_type.numel // w_type.shape[0]} products per output: int32 sums could overflow")
    strides, pads, dilations = spatial_attrs(ctx, x_type.shape[2:], kernel)
    x_zero_point, _ = zero_point_of(ctx, x_zero, x_dtype, None, "the input")
    w_zero_point, per_channel = zero_point_of(ctx, w_zero, w_dtype, w_type.shape[0], "the weight")
    geometry = dict(strides=strides, pads=pads, dilations=dilations, group=group)
    weights = ctx.builder.graph.constants.get(ctx.input(w))
    zeros = ctx.builder.graph.constants.get(w_zero_point)
    centred = centred_int8(weights, zeros, 0) if weights is not None and zeros is not None else None

    def centred_float(value: str, zero_point: str, dtype: str) -> str:
        return ctx.emit("sub", ctx.emit("cast", value, to=dtype), ctx.emit("cast", zero_point, to=dtype))

    # the zero point is subtracted before the padding: a padded position contributes 0, as onnxruntime's (padding
    # with the zero point)
    if centred is not None:
        widest = int(np.abs(centred.astype(np.int32)).max(initial=0))
        if integer_convolution_pays(np.dtype(x_dtype), widest) or not sums_exact_in_float32(centred):
            return ctx.emit("conv_integer", ctx.input(x), ctx.constant(centred), x_zero_point,
                            ctx.scalar(0, "int8"), **geometry)  # fmt: skip
        sums = ctx.emit("conv", centred_float(ctx.input(x), x_zero_point, "float32"),
                        ctx.constant(centred.astype(np.float32)), exact_sums=True, **geometry)  # fmt: skip
        return ctx.emit("cast", sums, to="int32")
    if per_channel:
        w_zero_point = channel_param(ctx, w_zero_point, w_type.rank, axis=0)
    sums = ctx.emit("conv", centred_float(ctx.input(x), x_zero_point, "float64"),
                    centred_float(ctx.input(w), w_zero_point, "float64"), **geometry)  # fmt: skip
    return ctx.emit("cast", sums, to="int32")


@rule("ConvInteger", min_opset=10)
def conv_integer(ctx: RuleContext) -> list[str]:
    return [_conv_integer(ctx, 0, 1, 2, 3)]


@rule("QLinearConv", min_opset=10)
def qlinear_conv(ctx: RuleContext) -> list[str]:
    sums = _conv_integer(ctx, 0, 3, 2, 5)
    rank, channels = ctx.type(0).rank, ctx.type(3).shape[0]
    if ctx.has_input(8):
        bias_type = ctx.type(8)
        if bias_type.dtype != "int32" or bias_type.shape != (channels,):
            ctx.refuse(f"a bias {bias_type} (int32, one per output channel)")
        sums = ctx.emit("add", sums, channel_param(ctx, ctx.input(8), rank))  # int32, as onnxruntime adds it
    x_scale, y_scale = scalar_scale(ctx, 1, "x_scale"), scalar_scale(ctx, 6, "y_scale")
    w_scale_type = ctx.type(4)
    if w_scale_type.dtype != "float32":
        ctx.refuse(f"a {w_scale_type.dtype} w_scale (float32 only)")
    if w_scale_type.numel == 1 and w_scale_type.rank <= 1:
        w_scale = reshape(ctx, ctx.input(4), ())
    elif w_scale_type.shape == (channels,):
        w_scale = channel_param(ctx, ctx.input(4), rank)
    else:
        ctx.refuse(f"a w_scale of shape {list(w_scale_type.shape)} (per tensor or per output channel)")
    multiplier = ctx.emit("div", ctx.emit("mul", x_scale, w_scale), y_scale)
    return [requantized(ctx, sums, multiplier, 7)]
