"""Fission rules for index-driven operators: ArgMax/ArgMin, OneHot, Trilu and GatherND become elementwise,
reduce and gather primitives; TopK, CumSum and ScatterND (a sort, a scan, data-dependent writes) are opaque
primitives of their own."""

from __future__ import annotations

import numpy as np

from kernorch.fission.registry import RuleContext, rule
from kernorch.fission.rules.common import reshape
from kernorch.ir.types import FLOAT_DTYPES


def _iota(ctx: RuleContext, size: int, axis: int, rank: int) -> str:
    """0, 1, ..., size-1 along `axis` of a rank-`rank` int64 constant (size 1 elsewhere)."""
    shape = [size if i == axis else 1 for i in range(rank)]
    return ctx.constant(np.arange(size, dtype=np.int64).reshape(shape), hint="iota")


@rule("ArgMax", "ArgMin")
def arg_extreme(ctx: RuleContext) -> list[str]:
    """The first (or, with select_last_index, the last) position holding the max (min): compare every element
    with the reduced extreme, keep the positions that match, reduce them with min (max). NaN counts as the
    extreme, as in numpy's argmax: where the extreme is NaN, the NaN positions match."""
    x_type = ctx.type(0)
    x = ctx.input(0)
    if x_type.dtype == "bool" or x_type.rank == 0:
        ctx.refuse(f"needs a numeric tensor of rank >= 1, got {x_type}")
    axis = ctx.normalize_axis(ctx.attr("axis", 0), x_type.rank)
    keepdims = ctx.allow("keepdims", 0, 1, default=1)
    last = bool(ctx.allow("select_last_index", 0, 1, default=0))
    size = x_type.shape[axis]
    if size == 0:
        ctx.refuse("arg max/min over an empty axis")
    extreme = ctx.emit("reduce_max" if ctx.op == "ArgMax" else "reduce_min", x, axes=(axis,))
    hit = ctx.emit("equal", x, extreme)
    if x_type.dtype in FLOAT_DTYPES:
        hit = ctx.emit("or", hit, ctx.emit("not", ctx.emit("equal", x, x)))
    miss = ctx.scalar(-1 if last else size, "int64")
    positions = ctx.emit("where", hit, _iota(ctx, size, axis, x_type.rank), miss)
    result = ctx.emit("reduce_max" if last else "reduce_min", positions, axes=(axis,))
    if not keepdims:
        result = reshape(ctx, result, x_type.shape[:axis] + x_type.shape[axis + 1 :])
    return [result]


@rule("TopK", static_inputs=(1,), min_opset=10)
def top_k(ctx: RuleContext) -> list[str]:
    x_type = ctx.type(0)
    if x_type.dtype == "bool" or x_type.rank == 0:
        ctx.refuse(f"needs a numeric tensor of rank >= 1, got {x_type}")
    axis = ctx.normalize_axis(ctx.attr("axis", -1), x_type.rank)
    k_values = ctx.const(1, "k").reshape(-1)
    if k_values.size != 1 or not 0 <= int(k_values[0]) <= x_type.shape[axis]:
        ctx.refuse(f"k must be one value in [0, {x_type.shape[axis]}], got {k_values.tolist()}")
    largest = bool(ctx.allow("largest", 0, 1, default=1)) if ctx.opset >= 11 else True
    if ctx.opset >= 11:
        ctx.allow("sorted", 1, default=1)  # unsorted output is any order: sorted is one of them, but say so
    return ctx.emit_multi("top_k", [ctx.input(0)], axis=axis, k=int(k_values[0]), largest=largest)


@rule("CumSum", static_inputs=(1,), min_opset=11)
def cumsum(ctx: RuleContext) -> list[str]:
    x_type = ctx.type(0)
    if x_type.dtype == "bool" or x_type.rank == 0:
        ctx.refuse(f"needs a numeric tensor of rank >= 1, got {x_type}")
    axis_values = ctx.const(1, "axis").reshape(-1)
    if axis_values.size != 1:
        ctx.refuse("axis must be a single value")
    axis = ctx.normalize_axis(int(axis_values[0]), x_type.rank)
    exclusive = bool(ctx.allow("exclusive", 0, 1, default=0))
    reverse = bool(ctx.allow("reverse", 0, 1, default=0))
    return [ctx.emit("cumsum", ctx.input(0), axis=axis, exclusive=exclusive, reverse=reverse)]


@rule("Trilu", static_inputs=(1,), min_opset=14)
def trilu(ctx: RuleContext) -> list[str]:
    """Keep the lower (upper) triangle from diagonal k: a select against a constant mask."""
    x_type = ctx.type(0)
    if x_type.rank < 2:
        ctx.refuse(f"needs rank >= 2, got {x_type}")
    k = int(ctx.const(1, "k").reshape(-1)[0]) if ctx.has_input(1) else 0
    upper = bool(ctx.allow("upper", 0, 1, default=1))
    rows, cols = x_type.shape[-2:]
    mask = np.triu(np.ones((rows, cols), bool), k) if upper else np.tril(np.ones((rows, cols), bool), k)
    zero = ctx.scalar(0, x_type.dtype) if x_type.dtype != "bool" else ctx.constant(np.array(False))
    return [ctx.emit("where", ctx.constant(mask, hint="triangle"), ctx.input(0), zero)]


@rule("OneHot", static_inputs=(1,), min_opset=9)
def one_hot(ctx: RuleContext) -> list[str]:
    """on where the (wrapped) index equals the position along the new axis, off elsewhere."""
    indices_type = ctx.type(0)
    if indices_type.dtype == "bool":
        ctx.refuse("indices must be numeric")
    depth_values = ctx.const(1, "depth").reshape(-1)
    if depth_values.size != 1 or depth_values[0] < 1:
        ctx.refuse(f"depth must be one positive value, got {depth_values.tolist()}")
    depth = int(depth_values[0])
    values_type = ctx.type(2)
    if values_type.numel != 2:
        ctx.refuse(f"values must hold [off, on], got {values_type}")
    rank = indices_type.rank + 1
    axis = ctx.normalize_axis(ctx.attr("axis", -1), rank)
    indices = ctx.input(0)
    if indices_type.dtype != "int64":  # ONNX casts real-valued indices to integers (truncation)
        indices = ctx.emit("cast", indices, to="int64")
    wrapped = ctx.emit("where", ctx.emit("less", indices, ctx.scalar(0, "int64")),
                       ctx.emit("add", indices, ctx.scalar(depth, "int64")), indices)  # fmt: skip
    shape = list(indices_type.shape)
    shape.insert(axis, 1)
    hit = ctx.emit("equal", reshape(ctx, wrapped, shape), _iota(ctx, depth, axis, rank))
    values = reshape(ctx, ctx.input(2), [2])
    off = reshape(ctx, ctx.emit("slice", values, ranges=((0, 1, 1),)), [])
    on = reshape(ctx, ctx.emit("slice", values, ranges=((1, 2, 1),)), [])
    return [ctx.emit("where", hit, on, off)]


@rule("GatherND", min_opset=11)
def gather_nd(ctx: RuleContext) -> list[str]:
    """Index tuples become one linear index into data flattened over the batch and indexed axes (negative
    indices wrapped), then a gather along that flattened axis."""
    data_type, indices_type = ctx.type(0), ctx.type(1)
    batch_dims = ctx.attr("batch_dims", 0) if ctx.opset >= 12 else 0
    if indices_type.dtype != "int64" or indices_type.rank < 1:
        ctx.refuse(f"indices must be int64 of rank >= 1, got {indices_type}")
    k = indices_type.shape[-1]
    if not 0 <= batch_dims < min(data_type.rank, indices_type.rank) or batch_dims + k > data_type.rank:
        ctx.refuse(f"batch_dims {batch_dims} and index length {k} do not fit data {data_type.shape}", "batch_dims")
    if data_type.shape[:batch_dims] != indices_type.shape[:batch_dims]:
        ctx.refuse("data and indices differ in their batch dimensions")
    batch_shape = data_type.shape[:batch_dims]
    indexed = data_type.shape[batch_dims : batch_dims + k]
    rest = data_type.shape[batch_dims + k :]
    tuple_shape = indices_type.shape[:-1]
    flat_data = reshape(ctx, ctx.input(0), [int(np.prod(batch_shape + indexed, dtype=np.int64)), *rest])
    strides = [int(np.prod(indexed[j + 1 :], dtype=np.int64)) for j in range(k)]
    linear = None
    for j in range(k):
        ranges = tuple((0, d, 1) for d in indices_type.shape[:-1]) + ((j, j + 1, 1),)
        component = reshape(ctx, ctx.emit("slice", ctx.input(1), ranges=ranges), tuple_shape)
        component = ctx.emit("where", ctx.emit("less", component, ctx.scalar(0, "int64")),
                             ctx.emit("add", component, ctx.scalar(indexed[j], "int64")), component)  # fmt: skip
        term = ctx.emit("mul", component, ctx.scalar(strides[j], "int64")) if strides[j] != 1 else component
        linear = term if linear is None else ctx.emit("add", linear, term)
    block = int(np.prod(indexed, dtype=np.int64))
    if batch_dims:  # each batch entry owns `block` consecutive rows of the flattened data
        batch_count = int(np.prod(batch_shape, dtype=np.int64))
        offsets = (np.arange(batch_count, dtype=np.int64) * block).reshape(
            batch_shape + (1,) * (len(tuple_shape) - batch_dims))
        offset = ctx.constant(offsets, hint="batch_offset")
        linear = offset if linear is None else ctx.emit("add", linear, offset)
    if linear is None:  # k == 0 and no batch: every tuple selects all of data
        linear = ctx.constant(np.zeros(tuple_shape, np.int64), hint="index")
    elif ctx.builder.type_of(linear).shape != tuple_shape:
        linear = ctx.emit("expand", linear, shape=tuple_shape)
    return [ctx.emit("gather", flat_data, linear, axis=0)]


@rule("ScatterND", min_opset=11)
def scatter_nd(ctx: RuleContext) -> list[str]:
    reduction = ctx.allow("reduction", "none", "add", "mul", "max", "min", default="none") if ctx.opset >= 16 \
        else "none"
    if ctx.type(1).dtype != "int64":
        ctx.refuse("indices must be int64")
    return [ctx.emit("scatter_nd", ctx.input(0), ctx.input(1), ctx.input(2), reduction=reduction)]
