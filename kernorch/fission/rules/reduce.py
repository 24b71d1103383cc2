"""Fission rules for reductions and pooling."""

from __future__ import annotations

import math

import numpy as np

from kernorch.fission.registry import RuleContext, rule
from kernorch.fission.rules.common import reduce_axes, reshape, spatial_attrs
from kernorch.ir.types import FLOAT_DTYPES

# Opset from which each reduction takes `axes` as an input instead of an attribute.
_AXES_AS_INPUT_FROM = {"ReduceSum": 13}
_REDUCE_OPS = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare",
               "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp")  # fmt: skip


@rule(*_REDUCE_OPS, static_inputs=(1,))
def reduce(ctx: RuleContext) -> list[str]:
    x_type = ctx.type(0)
    x = ctx.input(0)
    if ctx.op not in ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd") and x_type.dtype not in FLOAT_DTYPES:
        ctx.refuse(f"dtype {x_type.dtype} is not supported")
    if ctx.opset >= _AXES_AS_INPUT_FROM.get(ctx.op, 18):
        raw_axes = ctx.optional_const(1, "axes")
        axes_list = None if raw_axes is None or raw_axes.size == 0 else [int(a) for a in raw_axes.reshape(-1)]
        noop = ctx.attr("noop_with_empty_axes", 0)
    else:
        attr_axes = ctx.attr("axes", None)
        axes_list, noop = (list(attr_axes) if attr_axes else None), 0
    keepdims = ctx.allow("keepdims", 0, 1, default=1)
    # noop_with_empty_axes without axes skips the reduction, not the elementwise part around it: ReduceSumSquare
    # squares, ReduceL1 takes |x|, ReduceL2 sqrt(x*x) (overflowing as onnxruntime does), ReduceLogSum the log.
    # ReduceLogSumExp is log(exp(x)) = x: onnxruntime returns x itself, ±inf included (onnx.reference gives NaN
    # there: x - max(x) is inf - inf), and so does kernorch.
    skip_reduction = axes_list is None and bool(noop)
    if skip_reduction and ctx.op == "ReduceLogSumExp":
        return [ctx.emit("identity", x)]
    axes = () if skip_reduction else reduce_axes(ctx, x_type.rank, axes_list)
    if ctx.op in ("ReduceMax", "ReduceMin", "ReduceLogSumExp") and any(x_type.shape[a] == 0 for a in axes):
        ctx.refuse("max/min over an empty axis")
    dtype = x_type.dtype
    if ctx.op == "ReduceLogSumExp":
        # shifted by the peak so exp does not overflow; an infinite peak shifts by 0 instead (x - peak would be
        # inf - inf), so a slice holding +inf gives inf and one of -inf alone gives -inf, as onnxruntime does
        peak = ctx.emit("reduce_max", x, axes=axes)
        infinite = ctx.emit("equal", ctx.emit("abs", peak), ctx.scalar(math.inf, dtype))
        peak = ctx.emit("where", infinite, ctx.scalar(0, dtype), peak)
        total = ctx.emit("reduce_sum", ctx.emit("exp", ctx.emit("sub", x, peak)), axes=axes)
        result = ctx.emit("add", ctx.emit("log", total), peak)
    else:
        operand = {
            "ReduceSumSquare": lambda: ctx.emit("mul", x, x),
            "ReduceL2": lambda: ctx.emit("mul", x, x),
            "ReduceL1": lambda: ctx.emit("abs", x),
        }.get(ctx.op, lambda: x)()
        primitive = {"ReduceMax": "reduce_max", "ReduceMin": "reduce_min", "ReduceProd": "reduce_prod"}.get(
            ctx.op, "reduce_sum"
        )
        result = operand if skip_reduction else ctx.emit(primitive, operand, axes=axes)
        if ctx.op == "ReduceMean" and not skip_reduction:
            count = int(np.prod([x_type.shape[a] for a in axes], dtype=np.int64))
            result = ctx.emit("div", result, ctx.scalar(count, dtype))
        elif ctx.op == "ReduceL2":
            result = ctx.emit("sqrt", result)
        elif ctx.op == "ReduceLogSum":
            result = ctx.emit("log", result)
    if result == x:  # a skipped reduction with nothing around it: the output is a value of its own
        result = ctx.emit("identity", x)
    if not keepdims:
        result = reshape(ctx, result, [d for i, d in enumerate(x_type.shape) if i not in axes])
    return [result]


@rule("GlobalAveragePool", "GlobalMaxPool")
def global_pool(ctx: RuleContext) -> list[str]:
    x_type = ctx.type(0)
    if x_type.dtype not in FLOAT_DTYPES or x_type.rank < 3:
        ctx.refuse(f"needs a float tensor of rank >= 3, got {x_type}")
    axes = tuple(range(2, x_type.rank))
    if ctx.op == "GlobalMaxPool":
        return [ctx.emit("reduce_max", ctx.input(0), axes=axes)]
    count = int(np.prod(x_type.shape[2:], dtype=np.int64))
    total = ctx.emit("reduce_sum", ctx.input(0), axes=axes)
    return [ctx.emit("div", total, ctx.scalar(count, x_type.dtype))]


def _pool_attrs(ctx: RuleContext) -> dict[str, object]:
    x_type = ctx.type(0)
    if x_type.dtype == "bool" or (ctx.op != "MaxPool" and x_type.dtype not in FLOAT_DTYPES) or x_type.rank < 3:
        ctx.refuse(f"needs a numeric tensor of rank >= 3 (float for averages), got {x_type}")
    kernel = tuple(ctx.attr("kernel_shape"))
    if len(kernel) != x_type.rank - 2:
        ctx.refuse("kernel_shape rank does not match the input", "kernel_shape")
    ceil_mode = bool(ctx.allow("ceil_mode", 0, 1, default=0))
    strides, pads, dilations = spatial_attrs(ctx, x_type.shape[2:], kernel, ceil_mode)
    return {"kernel": kernel, "strides": strides, "pads": pads, "dilations": dilations, "ceil_mode": ceil_mode}


@rule("MaxPool")
def max_pool(ctx: RuleContext) -> list[str]:
    ctx.allow("storage_order", 0, default=0)
    attrs = _pool_attrs(ctx)
    return [ctx.emit("window_max", ctx.input(0), **attrs)]


def _window_counts(size: int, out: int, kernel: int, stride: int, pad_begin: int, pad_end: int,
                   dilation: int, include_pad: bool) -> np.ndarray:  # fmt: skip
    """How many positions of each window along one axis count toward the average."""
    low, high = (-pad_begin, size + pad_end) if include_pad else (0, size)
    starts = np.arange(out) * stride - pad_begin
    positions = starts[:, None] + dilation * np.arange(kernel)[None, :]
    return ((positions >= low) & (positions < high)).sum(axis=1)


@rule("AveragePool")
def average_pool(ctx: RuleContext) -> list[str]:
    x_type = ctx.type(0)
    include_pad = bool(ctx.allow("count_include_pad", 0, 1, default=0))
    attrs = _pool_attrs(ctx)
    total = ctx.emit("window_sum", ctx.input(0), **attrs)
    out_shape = ctx.builder.type_of(total).shape
    spatial = len(attrs["kernel"])  # type: ignore[arg-type]
    kernel, strides, pads, dilations = (attrs[k] for k in ("kernel", "strides", "pads", "dilations"))
    counts = np.ones((), dtype=np.int64)
    for i in range(spatial):
        axis_counts = _window_counts(x_type.shape[2 + i], out_shape[2 + i], kernel[i], strides[i],  # type: ignore[index]
                                     pads[i], pads[spatial + i], dilations[i], include_pad)  # type: ignore[index]
        counts = np.multiply.outer(counts, axis_counts)
    # Windows with no valid position (possible only in ceil mode) divide 0 by 1 rather than by 0.
    counts = np.maximum(counts, 1).astype(x_type.dtype)
    return [ctx.emit("div", total, ctx.constant(counts, hint="pool_counts"))]
