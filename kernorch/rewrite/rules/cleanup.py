"""Clean-up rules: common subexpressions, constant folding, and primitives that do nothing."""

from __future__ import annotations

import numpy as np

from kernorch.rewrite.engine import Replacement, RewriteContext, rewrite_rule
from kernorch.rewrite.rules.common import free_swap

# A folded constant may grow (expand, pad) but not without bound: past this it stays a computation.
MAX_FOLDED_GROWTH_BYTES = 1 << 20


@rewrite_rule("cse")
def common_subexpression(ctx: RewriteContext) -> Replacement | None:
    """An earlier node applies the same primitive with the same attributes to the same inputs: reuse it."""
    node = ctx.node
    if not node.inputs:
        return None
    for position in ctx.consumer_positions(node.inputs[0]):
        other = ctx.graph.nodes[position]
        if position < ctx.position and other.prim == node.prim and other.inputs == node.inputs \
                and other.attrs == node.attrs:  # fmt: skip
            return dict(zip(node.outputs, other.outputs, strict=True))
    return None


@rewrite_rule("constant-fold")
def constant_fold(ctx: RewriteContext) -> Replacement | None:
    """Every input is a constant: evaluate the primitive at compile time."""
    node = ctx.node
    if not node.inputs or any(ctx.const(v) is None for v in node.inputs):
        return None
    grown = sum(ctx.type(v).nbytes for v in node.outputs) - sum(ctx.type(v).nbytes for v in node.inputs)
    if grown > MAX_FOLDED_GROWTH_BYTES:
        return None
    folded = ctx.emit_all(node.prim, node.inputs, **node.attr_dict)  # the builder folds all-constant nodes
    return dict(zip(node.outputs, folded, strict=True))


def _same(ctx: RewriteContext, value: str) -> Replacement | None:
    """The root's only output equals `value` (same type): drop the root."""
    output = ctx.node.outputs[0]
    return {output: value} if ctx.type(output) == ctx.type(value) else None


@rewrite_rule("identity", roots=["identity"])
def identity(ctx: RewriteContext) -> Replacement | None:
    """identity(x) is x."""
    return _same(ctx, ctx.node.inputs[0])


@rewrite_rule("cast-same-type", roots=["cast"])
def cast_to_same_type(ctx: RewriteContext) -> Replacement | None:
    """cast(x) to x's own dtype is x."""
    return _same(ctx, ctx.node.inputs[0])


@rewrite_rule("reshape-noop", roots=["reshape", "expand"])
def reshape_noop(ctx: RewriteContext) -> Replacement | None:
    """reshape(reshape(x)) is one reshape; reshape or expand to x's own shape is x."""
    node = ctx.node
    (source,) = node.inputs
    if node.prim == "reshape":
        inner = ctx.producer(source)
        if inner is not None and inner.prim == "reshape":
            source = inner.inputs[0]
            if ctx.type(source).shape != ctx.type(node.outputs[0]).shape:
                return {node.outputs[0]: ctx.emit("reshape", source, shape=node.attr("shape"))}
    return _same(ctx, source)


def compose(inner: tuple[int, ...], outer: tuple[int, ...]) -> tuple[int, ...]:
    """transpose(transpose(x, inner), outer) == transpose(x, compose(inner, outer))."""
    return tuple(inner[axis] for axis in outer)


@rewrite_rule("transpose-noop", roots=["transpose"])
def transpose_noop(ctx: RewriteContext) -> Replacement | None:
    """transpose∘transpose is one transpose (none when the permutations cancel); the identity perm is x."""
    node = ctx.node
    perm = tuple(node.attr("perm"))
    source = node.inputs[0]
    inner = ctx.producer(source)
    if inner is not None and inner.prim == "transpose":
        perm = compose(tuple(inner.attr("perm")), perm)
        source = inner.inputs[0]
        if perm != tuple(range(len(perm))):
            if free_swap(ctx, node):
                return None  # merging a free swap into the inner copy gains nothing (transpose-into-matmul)
            return {node.outputs[0]: ctx.emit("transpose", source, perm=perm)}
    return _same(ctx, source) if perm == tuple(range(len(perm))) else None


@rewrite_rule("layout-noop", roots=["pad", "slice", "concat", "split"])
def layout_noop(ctx: RewriteContext) -> Replacement | None:
    """pad by zero, a slice of everything, concat or split of one piece: the input itself."""
    node = ctx.node
    if node.prim == "pad" and not any(node.attr("pads")):
        return _same(ctx, node.inputs[0])
    if node.prim == "slice":
        shape = ctx.type(node.inputs[0]).shape
        if all(tuple(r) == (0, d, 1) for r, d in zip(node.attr("ranges"), shape, strict=True)):
            return _same(ctx, node.inputs[0])
    if node.prim in ("concat", "split") and len(node.inputs) == 1 and len(node.outputs) == 1:
        return _same(ctx, node.inputs[0])
    return None


@rewrite_rule("reduce-noop", roots=["reduce_sum", "reduce_max", "reduce_min", "reduce_prod"])
def reduce_noop(ctx: RewriteContext) -> Replacement | None:
    """A reduction over axes of size 1 only (the reduced axes are kept) is the input."""
    shape = ctx.type(ctx.node.inputs[0]).shape
    return _same(ctx, ctx.node.inputs[0]) if all(shape[a] == 1 for a in ctx.node.attr("axes")) else None


# neutral element and whether it may stand on the left: x*1 = 1*x = x, x+0 = 0+x, x-0, x/1, x^1
_NEUTRAL = {"mul": (1, True), "add": (0, True), "sub": (0, False), "div": (1, False), "pow": (1, False)}


@rewrite_rule("neutral-operand", roots=list(_NEUTRAL))
def neutral_operand(ctx: RewriteContext) -> Replacement | None:
    """x·1, x+0, x−0, x/1, x^1 (the constant broadcasting into x's shape, not beyond) are x."""
    node = ctx.node
    neutral, commutes = _NEUTRAL[node.prim]
    sides = [(0, 1), (1, 0)] if commutes else [(0, 1)]
    for keep, drop in sides:
        constant = ctx.const(node.inputs[drop])
        if constant is not None and constant.size and np.all(constant == neutral):
            replaced = _same(ctx, node.inputs[keep])
            if replaced:
                return replaced
    return None
