"""Fission rules for data-movement operators: each becomes layout primitives (or a few of them)."""

from __future__ import annotations

import numpy as np

from kernorch.fission.registry import RuleContext, rule
from kernorch.fission.rules.common import reshape


def _ints(array: np.ndarray) -> list[int]:
    return [int(v) for v in np.asarray(array).reshape(-1)]


@rule("Reshape", static_inputs=(1,))
def reshape_rule(ctx: RuleContext) -> list[str]:
    x_type = ctx.type(0)
    if ctx.opset < 5:
        ctx.refuse("Reshape with a shape attribute (opset < 5) is not supported")
    allow_zero = ctx.allow("allowzero", 0, 1, default=0)
    target = _ints(ctx.const(1, "shape"))
    if not allow_zero:
        if any(d == 0 and i >= x_type.rank for i, d in enumerate(target)):  # found by the fuzzer
            ctx.refuse(f"a 0 in shape {target} copies a dimension the rank-{x_type.rank} input does not have")
        target = [x_type.shape[i] if d == 0 else d for i, d in enumerate(target)]
    if target.count(-1) > 1:
        ctx.refuse("more than one -1 in the target shape")
    if -1 in target:
        known = int(np.prod([d for d in target if d != -1], dtype=np.int64))
        if known == 0 or x_type.numel % known:
            ctx.refuse(f"cannot infer -1 reshaping {x_type.shape} to {target}")
        target[target.index(-1)] = x_type.numel // known
    if int(np.prod(target, dtype=np.int64)) != x_type.numel:
        ctx.refuse(f"reshape {x_type.shape} -> {tuple(target)} changes the element count")
    return [ctx.emit("reshape", ctx.input(0), shape=tuple(target))]


@rule("Flatten")
def flatten(ctx: RuleContext) -> list[str]:
    x_type = ctx.type(0)
    axis = ctx.attr("axis", 1)
    axis = axis + x_type.rank if axis < 0 else axis
    if not 0 <= axis <= x_type.rank:
        ctx.refuse(f"axis {axis} out of range", "axis")
    outer = int(np.prod(x_type.shape[:axis], dtype=np.int64))
    return [ctx.emit("reshape", ctx.input(0), shape=(outer, x_type.numel // outer if outer else 0))]


@rule("Squeeze", "Unsqueeze", static_inputs=(1,))
def squeeze(ctx: RuleContext) -> list[str]:
    x_type = ctx.type(0)
    if ctx.opset >= 13:
        raw = ctx.optional_const(1, "axes")
        axes = None if raw is None else _ints(raw)
    else:
        attr_axes = ctx.attr("axes", None)
        axes = None if attr_axes is None else list(attr_axes)
    shape = list(x_type.shape)
    if ctx.op == "Squeeze":
        if axes is None:
            kept = [d for d in shape if d != 1]
        else:
            drop = {ctx.normalize_axis(a, x_type.rank, "axes") for a in axes}
            if any(shape[a] != 1 for a in drop):
                ctx.refuse("squeezing an axis whose size is not 1", "axes")
            kept = [d for i, d in enumerate(shape) if i not in drop]
        return [ctx.emit("reshape", ctx.input(0), shape=tuple(kept))]
    if not axes:
        ctx.refuse("Unsqueeze needs axes")
    rank = x_type.rank + len(axes)
    inserted = sorted({ctx.normalize_axis(a, rank, "axes") for a in axes})
    if len(inserted) != len(axes):
        ctx.refuse("repeated axes", "axes")
    remaining = iter(shape)
    new_shape = [1 if i in inserted else next(remaining) for i in range(rank)]
    return [ctx.emit("reshape", ctx.input(0), shape=tuple(new_shape))]


@rule("Transpose")
def transpose(ctx: RuleContext) -> list[str]:
    rank = ctx.type(0).rank
    perm = tuple(ctx.attr("perm", list(reversed(range(rank)))))
    if sorted(perm) != list(range(rank)):
        ctx.refuse(f"perm {perm} is not a permutation of the axes", "perm")
    if perm == tuple(range(rank)):
        return [ctx.emit("identity", ctx.input(0))]
    return [ctx.emit("transpose", ctx.input(0), perm=perm)]


def slice_ranges(ctx: RuleContext, shape: tuple[int, ...], starts: list[int], ends: list[int],
                 axes: list[int] | None, steps: list[int] | None) -> tuple[tuple[int, int, int], ...]:  # fmt: skip
    """Normalized (start, stop, step) per axis; clamping follows Python/ONNX slice semantics."""
    rank = len(shape)
    axes = axes if axes is not None else list(range(len(starts)))
    steps = steps if steps is not None else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        ctx.refuse("starts/ends/axes/steps lengths differ")
    ranges = [(0, d, 1) for d in shape]
    seen: set[int] = set()
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        axis = ctx.normalize_axis(axis, rank, "axes")
        if step == 0 or axis in seen:
            ctx.refuse("zero step or repeated axis")
        seen.add(axis)
        ranges[axis] = slice(start, end, step).indices(shape[axis])
    return tuple(ranges)


@rule("Slice", static_inputs=(1, 2, 3, 4))
def slice_rule(ctx: RuleContext) -> list[str]:
    x_type = ctx.type(0)
    if ctx.opset >= 10:
        starts, ends = _ints(ctx.const(1, "starts")), _ints(ctx.const(2, "ends"))
        axes_value, steps_value = ctx.optional_const(3, "axes"), ctx.optional_const(4, "steps")
        axes = None if axes_value is None else _ints(axes_value)
        steps = None if steps_value is None else _ints(steps_value)
    else:
        starts, ends = list(ctx.attr("starts")), list(ctx.attr("ends"))
        attr_axes = ctx.attr("axes", None)
        axes, steps = (list(attr_axes) if attr_axes is not None else None), None
    ranges = slice_ranges(ctx, x_type.shape, starts, ends, axes, steps)
    return [ctx.emit("slice", ctx.input(0), ranges=ranges)]


@rule("Concat")
def concat(ctx: RuleContext) -> list[str]:
    operands = [ctx.input(i) for i in range(len(ctx.inputs))]
    rank = ctx.type(0).rank
    axis = ctx.normalize_axis(ctx.attr("axis"), rank)
    non_empty = [v for v in operands if ctx.builder.type_of(v).numel > 0]
    if len(non_empty) == 1 and len(operands) > 1:
        return [ctx.emit("identity", non_empty[0])]
    return [ctx.emit("concat", *operands, axis=axis)]


@rule("Split", static_inputs=(1,))
def split(ctx: RuleContext) -> list[str]:
    x_type = ctx.type(0)
    axis = ctx.normalize_axis(ctx.attr("axis", 0), x_type.rank)
    outputs = len(ctx.node.output)
    size = x_type.shape[axis]
    if ctx.opset >= 13 and ctx.has_input(1):
        sizes = _ints(ctx.const(1, "split"))
    elif ctx.opset < 13 and ctx.has_attr("split"):
        sizes = list(ctx.attr("split"))
    else:
        count = ctx.attr("num_outputs", outputs) if ctx.opset >= 18 else outputs
        chunk = -(-size // count)
        sizes = [min(chunk, size - i * chunk) for i in range(count)]
        if min(sizes) < 0:
            ctx.refuse(f"cannot split {size} into {count} parts", "num_outputs")
    if len(sizes) != outputs or sum(sizes) != size:
        ctx.refuse(f"split sizes {sizes} do not match {outputs} outputs of an axis of {size}")
    return ctx.emit_multi("split", [ctx.input(0)], axis=axis, sizes=tuple(sizes))


@rule("Pad", static_inputs=(1, 2, 3))
def pad(ctx: RuleContext) -> list[str]:
    x_type = ctx.type(0)
    rank = x_type.rank
    mode = ctx.allow("mode", "constant", "reflect", "edge", "wrap", default="constant")
    if ctx.opset >= 11:
        raw = _ints(ctx.const(1, "pads"))
        value_array = ctx.optional_const(2, "constant_value")
        value = 0.0 if value_array is None else value_array.reshape(-1)[0].item()
        axes = (None if ctx.opset < 18 or not ctx.has_input(3)
                else [ctx.normalize_axis(a, rank, "axes") for a in _ints(ctx.const(3, "axes"))])  # fmt: skip
    else:
        raw, value, axes = list(ctx.attr("pads")), ctx.attr("value", 0.0), None
    axes = axes if axes is not None else list(range(rank))
    if len(raw) != 2 * len(axes):
        ctx.refuse(f"{len(raw)} pads for {len(axes)} axes")
    pads = [0] * (2 * rank)
    for i, axis in enumerate(axes):
        pads[axis], pads[rank + axis] = raw[i], raw[len(axes) + i]
    x = ctx.input(0)
    if min(pads) < 0:
        # Negative pads crop: a slice first, then the remaining non-negative padding.
        ranges = tuple((max(-pads[i], 0), x_type.shape[i] - max(-pads[rank + i], 0), 1) for i in range(rank))
        x = ctx.emit("slice", x, ranges=ranges)
        pads = [max(p, 0) for p in pads]
    shape = ctx.builder.type_of(x).shape
    for i in range(rank):
        grow = max(pads[i], pads[rank + i])
        if grow and mode != "constant" and shape[i] == 0:
            ctx.refuse(f"{mode} padding of an empty axis", "mode")
        if grow and mode == "reflect" and grow >= shape[i]:
            ctx.refuse("reflect padding as large as the axis", "mode")
    if not any(pads):
        return [ctx.emit("identity", x)]
    return [ctx.emit("pad", x, pads=tuple(pads), mode=mode, value=float(value) if mode == "constant" else 0.0)]


@rule("Gather")
def gather(ctx: RuleContext) -> list[str]:
    axis = ctx.normalize_axis(ctx.attr("axis", 0), ctx.type(0).rank)
    return [ctx.emit("gather", ctx.input(0), ctx.input(1), axis=axis)]


@rule("GatherElements")
def gather_elements(ctx: RuleContext) -> list[str]:
    axis = ctx.normalize_axis(ctx.attr("axis", 0), ctx.type(0).rank)
    return [ctx.emit("gather_elements", ctx.input(0), ctx.input(1), axis=axis)]


@rule("Expand", static_inputs=(1,))
def expand(ctx: RuleContext) -> list[str]:
    x_type = ctx.type(0)
    requested = tuple(_ints(ctx.const(1, "shape")))
    try:
        target = tuple(int(d) for d in np.broadcast_shapes(x_type.shape, requested))
    except ValueError:
        ctx.refuse(f"cannot broadcast {x_type.shape} to {requested}")
    x = reshape(ctx, ctx.input(0), (1,) * (len(target) - x_type.rank) + x_type.shape)
    if target == ctx.builder.type_of(x).shape:
        return [ctx.emit("identity", x)]
    return [ctx.emit("expand", x, shape=target)]


@rule("Tile", static_inputs=(1,))
def tile(ctx: RuleContext) -> list[str]:
    # tile = interleave a new size-r axis before each axis (expand), then merge the pairs (reshape).
    x_type = ctx.type(0)
    repeats = _ints(ctx.const(1, "repeats"))
    if len(repeats) != x_type.rank or min(repeats, default=1) < 0:
        ctx.refuse(f"repeats {repeats} do not match rank {x_type.rank}")
    spread = reshape(ctx, ctx.input(0), [d for size in x_type.shape for d in (1, size)])
    expanded = ctx.emit("expand", spread, shape=tuple(d for r, size in zip(repeats, x_type.shape, strict=True)
                                                       for d in (r, size)))  # fmt: skip
    return [ctx.emit("reshape", expanded, shape=tuple(r * s for r, s in zip(repeats, x_type.shape, strict=True)))]


@rule("DepthToSpace", "SpaceToDepth")
def depth_space(ctx: RuleContext) -> list[str]:
    x_type = ctx.type(0)
    if x_type.rank != 4:
        ctx.refuse("needs a 4-D NCHW input")
    b = ctx.attr("blocksize")
    n, c, h, w = x_type.shape
    mode = ctx.allow("mode", "DCR", "CRD", default="DCR")
    if ctx.op == "SpaceToDepth":
        if h % b or w % b:
            ctx.refuse("spatial dims not divisible by blocksize", "blocksize")
        blocks = reshape(ctx, ctx.input(0), [n, c, h // b, b, w // b, b])
        perm = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
        return [reshape(ctx, ctx.emit("transpose", blocks, perm=perm), [n, c * b * b, h // b, w // b])]
    if c % (b * b):
        ctx.refuse("channels not divisible by blocksize²", "blocksize")
    if mode == "DCR":
        blocks = reshape(ctx, ctx.input(0), [n, b, b, c // (b * b), h, w])
        moved = ctx.emit("transpose", blocks, perm=(0, 3, 4, 1, 5, 2))
    else:
        blocks = reshape(ctx, ctx.input(0), [n, c // (b * b), b, b, h, w])
        moved = ctx.emit("transpose", blocks, perm=(0, 1, 4, 2, 5, 3))
    return [reshape(ctx, moved, [n, c // (b * b), h * b, w * b])]
