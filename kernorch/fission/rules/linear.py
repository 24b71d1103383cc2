"""Fission rules for compute-intensive operators: one linear primitive plus elementwise epilogues.

Bias and alpha/beta scaling are separate elementwise primitives (a linear primitive is linear in its
inputs; a bias is not). Codegen may fold them back into the library call.
"""

from __future__ import annotations

from kernorch.fission.registry import RuleContext, rule
from kernorch.fission.rules.common import channel_param, spatial_attrs
from kernorch.ir.types import FLOAT_DTYPES


def _require_float(ctx: RuleContext) -> str:
    dtype = ctx.type(0).dtype
    if dtype not in FLOAT_DTYPES or dtype == "float16":
        ctx.refuse(f"dtype {dtype} is not supported (float32/float64 only)")
    return dtype


@rule("MatMul")
def matmul(ctx: RuleContext) -> list[str]:
    _require_float(ctx)
    if ctx.type(0).rank == 0 or ctx.type(1).rank == 0:
        ctx.refuse("scalar operands are not allowed")
    return [ctx.emit("matmul", ctx.input(0), ctx.input(1))]


@rule("Gemm")
def gemm(ctx: RuleContext) -> list[str]:
    dtype = _require_float(ctx)
    a, b = ctx.input(0), ctx.input(1)
    if ctx.type(0).rank != 2 or ctx.type(1).rank != 2:
        ctx.refuse("Gemm operands must be 2-D")
    if ctx.opset < 7:
        ctx.refuse("legacy broadcast attribute (opset < 7) is not supported")
    if ctx.attr("transA", 0):
        a = ctx.emit("transpose", a, perm=(1, 0))
    if ctx.attr("transB", 0):
        b = ctx.emit("transpose", b, perm=(1, 0))
    result = ctx.emit("matmul", a, b)
    alpha, beta = float(ctx.attr("alpha", 1.0)), float(ctx.attr("beta", 1.0))
    if alpha != 1.0:
        result = ctx.emit("mul", result, ctx.scalar(alpha, dtype))
    if ctx.has_input(2) and beta != 0.0:
        bias = ctx.input(2)
        if beta != 1.0:
            bias = ctx.emit("mul", bias, ctx.scalar(beta, dtype))
        result = ctx.emit("add", result, bias)
    return [result]


def _kernel_shape(ctx: RuleContext, weight_spatial: tuple[int, ...]) -> tuple[int, ...]:
    declared = ctx.attr("kernel_shape", None)
    if declared is not None and tuple(declared) != weight_spatial:
        ctx.refuse(f"kernel_shape {declared} differs from the weight's {weight_spatial}", "kernel_shape")
    return weight_spatial


@rule("Conv")
def conv(ctx: RuleContext) -> list[str]:
    _require_float(ctx)
    x_type, w_type = ctx.type(0), ctx.type(1)
    if x_type.rank not in (3, 4, 5) or w_type.rank != x_type.rank:
        ctx.refuse(f"1-D to 3-D convolutions only, got input {x_type} weight {w_type}")
    kernel = _kernel_shape(ctx, w_type.shape[2:])
    group = ctx.attr("group", 1)
    if group < 1 or x_type.shape[1] != w_type.shape[1] * group or w_type.shape[0] % group:
        ctx.refuse(f"channels {x_type.shape[1]} do not match weight {w_type.shape} with group {group}", "group")
    strides, pads, dilations = spatial_attrs(ctx, x_type.shape[2:], kernel)
    result = ctx.emit("conv", ctx.input(0), ctx.input(1), strides=strides, pads=pads, dilations=dilations,
                      group=group)  # fmt: skip
    if ctx.has_input(2):
        result = ctx.emit("add", result, channel_param(ctx, ctx.input(2), x_type.rank))
    return [result]


@rule("ConvTranspose")
def conv_transpose(ctx: RuleContext) -> list[str]:
    _require_float(ctx)
    x_type, w_type = ctx.type(0), ctx.type(1)
    if x_type.rank not in (3, 4, 5) or w_type.rank != x_type.rank:
        ctx.refuse(f"1-D to 3-D transposed convolutions only, got input {x_type} weight {w_type}")
    spatial = x_type.rank - 2
    kernel = _kernel_shape(ctx, w_type.shape[2:])
    group = ctx.attr("group", 1)
    if group < 1 or w_type.shape[0] != x_type.shape[1]:
        ctx.refuse(f"channels {x_type.shape[1]} do not match weight {w_type.shape}", "group")
    strides = tuple(ctx.attr("strides", [1] * spatial))
    dilations = tuple(ctx.attr("dilations", [1] * spatial))
    output_padding = tuple(ctx.attr("output_padding", [0] * spatial))
    pads = list(ctx.attr("pads", [0] * (2 * spatial)))
    auto_pad = ctx.allow("auto_pad", "NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER", default="NOTSET")
    output_shape = ctx.attr("output_shape", None)
    if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        targets = (list(output_shape)[-spatial:] if output_shape is not None
                   else [x_type.shape[2 + i] * strides[i] for i in range(spatial)])  # fmt: skip
        for i in range(spatial):
            total = (strides[i] * (x_type.shape[2 + i] - 1) + output_padding[i]
                     + (kernel[i] - 1) * dilations[i] + 1 - targets[i])  # fmt: skip
            # ONNX puts the larger half at the end only for SAME_UPPER.
            upper = auto_pad == "SAME_UPPER"
            pads[i], pads[spatial + i] = (total // 2, total - total // 2) if upper else (total - total // 2, total // 2)
    elif auto_pad == "VALID":
        pads = [0] * (2 * spatial)
    if output_shape is None and min(pads) < 0:
        ctx.refuse("negative pads", "pads")
    if any(p >= max(s, d) for p, s, d in zip(output_padding, strides, dilations, strict=True)):
        ctx.refuse("output_padding must be smaller than stride or dilation", "output_padding")
    result = ctx.emit("conv_transpose", ctx.input(0), ctx.input(1), strides=strides,
                      pads=tuple(max(p, 0) for p in pads), dilations=dilations, group=group,
                      output_padding=output_padding)  # fmt: skip
    if min(pads) < 0:
        # An output_shape larger than the convolution yields: the extra positions hold zeros (+ bias).
        growth = [0, 0] + [max(-p, 0) for p in pads[:spatial]] + [0, 0] + [max(-p, 0) for p in pads[spatial:]]
        result = ctx.emit("pad", result, pads=tuple(growth), mode="constant", value=0.0)
    if ctx.has_input(2):
        result = ctx.emit("add", result, channel_param(ctx, ctx.input(2), x_type.rank))
    return [result]
