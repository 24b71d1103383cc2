"""Helpers shared by several fission rules."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kernorch import machine
from kernorch.fission.registry import RuleContext


def reshape(ctx: RuleContext, value: str, shape: Sequence[int]) -> str:
    if tuple(shape) == ctx.builder.type_of(value).shape:
        return value
    return ctx.emit("reshape", value, shape=tuple(int(d) for d in shape))


def channel_param(ctx: RuleContext, value: str, rank: int, axis: int = 1) -> str:
    """Reshape a per-channel vector [C] so it broadcasts against a rank-`rank` tensor along `axis`."""
    size = ctx.builder.type_of(value).numel
    return reshape(ctx, value, [size if i == axis else 1 for i in range(rank)])


def centred_int8(integers: np.ndarray, zero: np.ndarray, axis: int) -> np.ndarray | None:
    """Constant 8-bit `integers` minus their zero point (a scalar, or one per index along `axis`), in int8, when
    every difference fits int8 (the int8 kernels' operand); else None."""
    along = [1] * integers.ndim
    along[axis] = -1
    centred = integers.astype(np.int32) - zero.astype(np.int32).reshape(() if zero.size == 1 else tuple(along))
    if centred.size and (centred.min() < -128 or centred.max() > 127):
        return None
    return centred.astype(np.int8)


def integer_convolution_pays(source: np.dtype, widest_weight: int) -> bool:
    """Whether a convolution of `source` bytes by centred weights up to `widest_weight` in magnitude runs as an
    integer convolution on this CPU: with VNNI always; without, only where oneDNN's int8 convolution sums it exactly
    (kernorch's pixel kernel, exact everywhere, is scalar C there: slower than a float convolution)."""
    return machine.int8_dot_products() or (source == np.uint8 and widest_weight <= machine.SATURATION_FREE_WEIGHT)


FLOAT32_WHOLE = 2**24  # every integer of at most this magnitude is a float32


def sums_exact_in_float32(centred: np.ndarray) -> bool:
    """Whether a float32 convolution of 8-bit sources by these centred int8 weights ([O, ...]) adds exactly: a
    source minus its zero point (any zero point of its type) is at most 255 in magnitude, so every partial sum of
    output channel o, in any order, is an integer of magnitude at most 255 · Σ|w[o]|, exact below 2^24; each
    product (at most 255 · 128) is exact too, fused or not."""
    widest_sum = int(np.abs(centred.astype(np.int64)).reshape(centred.shape[0], -1).sum(axis=1).max(initial=0))
    return 255 * widest_sum < FLOAT32_WHOLE


def reduce_axes(ctx: RuleContext, rank: int, axes: Sequence[int] | None) -> tuple[int, ...]:
    if axes is None:
        return tuple(range(rank))
    normalized = sorted({ctx.normalize_axis(int(a), rank, "axes") for a in axes})
    if len(normalized) != len(list(axes)):
        ctx.refuse("repeated reduction axes", "axes")
    return tuple(normalized)


def mean_over(ctx: RuleContext, value: str, axes: tuple[int, ...]) -> str:
    value_type = ctx.builder.type_of(value)
    count = int(np.prod([value_type.shape[a] for a in axes], dtype=np.int64))
    total = ctx.emit("reduce_sum", value, axes=axes)
    return ctx.emit("div", total, ctx.scalar(count, value_type.dtype))


def normalize(ctx: RuleContext, x: str, axes: tuple[int, ...], epsilon: float) -> tuple[str, str, str]:
    """(x - mean) / sqrt(var + eps) over `axes`; returns (normalized, mean, inverse std-dev)."""
    dtype = ctx.builder.type_of(x).dtype
    mean = mean_over(ctx, x, axes)
    centered = ctx.emit("sub", x, mean)
    variance = mean_over(ctx, ctx.emit("mul", centered, centered), axes)
    inv_std = ctx.emit("reciprocal", ctx.emit("sqrt", ctx.emit("add", variance, ctx.scalar(epsilon, dtype))))
    return ctx.emit("mul", centered, inv_std), mean, inv_std


def spatial_attrs(ctx: RuleContext, spatial_shape: Sequence[int], kernel: Sequence[int],
                  ceil_mode: bool = False) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:  # fmt: skip
    """strides, pads (begins then ends) and dilations of a conv/pool node, auto_pad resolved."""
    spatial = len(kernel)
    strides = tuple(ctx.attr("strides", [1] * spatial))
    dilations = tuple(ctx.attr("dilations", [1] * spatial))
    pads = list(ctx.attr("pads", [0] * (2 * spatial)))
    auto_pad = ctx.allow("auto_pad", "NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER", default="NOTSET")
    if len(strides) != spatial or len(dilations) != spatial or len(pads) != 2 * spatial:
        ctx.refuse("strides/dilations/pads length does not match the kernel rank")
    if min(strides) < 1 or min(dilations) < 1 or min(pads) < 0:
        ctx.refuse("non-positive strides/dilations or negative pads")
    if auto_pad == "VALID":
        pads = [0] * (2 * spatial)
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        for i in range(spatial):
            out = -(-spatial_shape[i] // strides[i])
            total = max((out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - spatial_shape[i], 0)
            small, large = total // 2, total - total // 2
            pads[i], pads[spatial + i] = (small, large) if auto_pad == "SAME_UPPER" else (large, small)
    return strides, tuple(pads), dilations
