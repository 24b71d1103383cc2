"""Fission rules for the quantization operators onnxruntime's quantization tool writes: QuantizeLinear,
DequantizeLinear (per tensor, per axis and blocked; with and without a zero point; 8- and 16-bit integers) and
DynamicQuantizeLinear. Each becomes float arithmetic the generated kernels fuse with their neighbours:

    QuantizeLinear:        y = cast(clamp(round(x / scale) + zero_point, qmin, qmax))   (round half to even; NaN: qmin)
    DequantizeLinear:      y = (float(x) - float(zero_point)) * scale
    DynamicQuantizeLinear: scale = (max(x, 0) - min(x, 0)) / 255 (NaN skipped; 1 where that is 0),
                           zero_point = clamp(round(-min(x, 0) / scale)), y = QuantizeLinear(x, scale, zero_point)

The division is a division (not a product with the reciprocal): a value one rounding away from a tie would land
on the other integer. Other element types (int4, float8) and float16 or bfloat16 scales are refused and run
through the onnxruntime fallback.
"""

from __future__ import annotations

from kernorch.fission.registry import RuleContext, rule
from kernorch.fission.rules.common import reshape

# the integer types quantized values may have, with their range
RANGES = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767), "uint16": (0, 65535)}
_OUTPUT_DTYPES = {0: "uint8", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16"}  # TensorProto element types


def scale_operand(ctx: RuleContext, index: int, rank: int) -> str:
    """Input `index` (a scale or a zero point) shaped to broadcast against a rank-`rank` tensor: a scalar as it is,
    a per-axis vector along `axis`, a blocked one (opset 21's `block_size`) repeated over its blocks."""
    value, value_type = ctx.input(index), ctx.type(index)
    block_size = int(ctx.attr("block_size", 0))
    declared_axis = int(ctx.attr("axis", 1))  # read even where a scalar scale ignores it (ONNX: it is ignored)
    if value_type.rank == 0 or (value_type.rank == 1 and value_type.shape[0] == 1 and not block_size):
        return reshape(ctx, value, ())
    axis = ctx.normalize_axis(declared_axis, rank)
    x_shape = ctx.type(0).shape
    if block_size:
        if value_type.rank != rank or any(value_type.shape[a] != x_shape[a] for a in range(rank) if a != axis):
            ctx.refuse("a blocked scale must have the input's shape but along its axis", "block_size")
        if -(-x_shape[axis] // block_size) != value_type.shape[axis]:
            ctx.refuse(f"{value_type.shape[axis]} blocks of {block_size} for an axis of {x_shape[axis]}",
                       "block_size")  # fmt: skip
        if x_shape[axis] % block_size:
            ctx.refuse("a last block shorter than block_size", "block_size")
        expanded = value_type.shape[:axis + 1] + (block_size,) + value_type.shape[axis + 1:]
        lifted = reshape(ctx, value, value_type.shape[:axis + 1] + (1,) + value_type.shape[axis + 1:])
        spread = ctx.emit("expand", lifted, shape=expanded)
        return reshape(ctx, spread, x_shape)
    if value_type.rank != 1 or value_type.shape[0] != x_shape[axis]:
        ctx.refuse(f"a scale of shape {list(value_type.shape)} for axis {axis} of {list(x_shape)}", "axis")
    return reshape(ctx, value, tuple(x_shape[axis] if a == axis else 1 for a in range(rank)))


def quantize(ctx: RuleContext, x: str, scale: str, zero_point: str | None, target: str) -> str:
    """x / scale quantized to `target` (QuantizeLinear's formula)."""
    return saturate(ctx, ctx.emit("div", x, scale), zero_point, target)


def saturate(ctx: RuleContext, scaled: str, zero_point: str | None, target: str) -> str:
    """A float32 value already in steps of the quantized type, rounded half to even, shifted by the zero point
    and saturated to `target`'s range (NaN: its lowest value)."""
    low, high = RANGES[target]
    offset = ctx.emit("cast", zero_point, to="float32") if zero_point is not None else ctx.scalar(0.0, "float32")
    # saturated by selects, not max/min (which keep NaN): a NaN quantizes to qmin, as onnxruntime's does
    clamped = ctx.emit("saturating_round", scaled, offset, ctx.scalar(low, "float32"), ctx.scalar(high, "float32"))
    return ctx.emit("cast", clamped, to=target)


def require_float32(ctx: RuleContext, index: int, what: str) -> None:
    if ctx.type(index).dtype != "float32":
        ctx.refuse(f"a {ctx.type(index).dtype} {what} (float32 only)")


@rule("QuantizeLinear", min_opset=10)
def quantize_linear(ctx: RuleContext) -> list[str]:
    require_float32(ctx, 0, "input")
    require_float32(ctx, 1, "scale")
    rank = ctx.type(0).rank
    if ctx.has_input(2):
        target = ctx.type(2).dtype
    else:
        target = _OUTPUT_DTYPES.get(int(ctx.attr("output_dtype", 0)), "")
    if target not in RANGES:
        ctx.refuse(f"quantizing to {target or 'that output_dtype'} (8- and 16-bit integers only)")
    ctx.allow("saturate", 1, default=1)  # it concerns float8 outputs only
    ctx.allow("precision", 0, default=0)
    scale = scale_operand(ctx, 1, rank)
    zero_point = scale_operand(ctx, 2, rank) if ctx.has_input(2) else None
    return [quantize(ctx, ctx.input(0), scale, zero_point, target)]


@rule("DequantizeLinear", min_opset=10)
def dequantize_linear(ctx: RuleContext) -> list[str]:
    require_float32(ctx, 1, "scale")
    source = ctx.type(0).dtype
    if source not in (*RANGES, "int32"):
        ctx.refuse(f"dequantizing {source} (8- and 16-bit integers and int32 only)")
    ctx.allow("output_dtype", 0, 1, default=0)
    rank = ctx.type(0).rank
    scale = scale_operand(ctx, 1, rank)
    value = ctx.emit("cast", ctx.input(0), to="float32")  # exact: |x| < 2^24 for int8/uint8; int32 as ORT casts
    if ctx.has_input(2):
        if ctx.type(2).dtype != source:
            ctx.refuse(f"a {ctx.type(2).dtype} zero point for {source} values")
        value = ctx.emit("sub", value, ctx.emit("cast", scale_operand(ctx, 2, rank), to="float32"))
    return [ctx.emit("mul", value, scale)]


@rule("DynamicQuantizeLinear", min_opset=11)
def dynamic_quantize_linear(ctx: RuleContext) -> list[str]:
    x_type = ctx.type(0)
    if x_type.dtype != "float32":
        ctx.refuse(f"a {x_type.dtype} input (float32 only)")
    if x_type.numel == 0:
        ctx.refuse("an empty input")
    x = ctx.input(0)
    axes = tuple(range(x_type.rank))
    zero = ctx.scalar(0.0, "float32")
    # onnxruntime's range skips NaN (its min and max keep the running value): a NaN counts as the 0 the range holds
    numbers = ctx.emit("where", ctx.emit("equal", x, x), x, zero)
    low = reshape(ctx, ctx.emit("min", ctx.emit("reduce_min", numbers, axes=axes), zero), ())
    high = reshape(ctx, ctx.emit("max", ctx.emit("reduce_max", numbers, axes=axes), zero), ())
    spread = ctx.emit("sub", high, low)
    # onnxruntime's scale of an input that is all zeros is 1 (the formula's 0 would divide 0 by 0): 255 / 255
    range_255 = ctx.scalar(255.0, "float32")
    scale = ctx.emit("div", ctx.emit("where", ctx.emit("equal", spread, zero), range_255, spread), range_255)
    zero_point = quantize(ctx, ctx.emit("neg", low), scale, None, "uint8")
    return [quantize(ctx, x, scale, zero_point, "uint8"), scale, zero_point]

