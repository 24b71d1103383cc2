"""Rules for sliding windows: a max or sum pool over several axes becomes one pool per axis; a clamp before a max
pool moves after it.

max and Σ are separable: the max (sum) over a kh × kw window is the max (sum) over kh rows of each row's max
(sum) over kw columns, padding included (it never wins a max and adds 0 to a sum), per-axis strides, dilations
and ceil mode too, since a window's extent along each axis depends on that axis alone. One pass over all
kh·kw taps reads each input kh·kw times per output; one pass per axis reads it kh + kw times, and the
outermost axis's pass reads whole rows, which vectorize (shufflenet_v2's stem pool, 3x3/2 over 24
channels-last channels, ran at 3.9x its roofline in one pass). The cost model decides whether the
intermediate pays off, except for a small unstrided window (every axis at most 3 wide, stride 1: the token mixers
of PoolFormer-like models, inception's 3x3/1 branch pools), which stays one pass: it saves 3 of 9 additions per
output and costs an intermediate that is hot in cache when profiled alone but cold in place (efficientformer_l1's
twelve 3x3/1 pools took 0.80 ms separated and 0.45 ms whole in place, googlenet's 0.11 and 0.09 ms), so the
isolated profiles that guide the rule choose it where it loses.

A max pool of a clamp (relu, max or min with a scalar constant: Clip, ReLU6) is the clamp of the max pool: the
clamp is monotone and NaN-propagating, as the pool's max is, so both orders give the same value for every window
that holds an input element (a window of padding alone pools to -inf, which a clamp would change: such pools are
left as they are). After a strided pool the clamp runs over fewer elements and can join the pool's kernel: ResNet's
stem relu over 112x112x64 (a pass of its own after oneDNN's convolution, whose relu post-op costs an exp per
output) then clamps the 56x56 pool's output.
"""

from __future__ import annotations

from kernorch.ir.graph import Node
from kernorch.rewrite.engine import Replacement, RewriteContext, rewrite_rule

SMALL_WINDOW = 3  # widest axis of an unstrided window kept in one pass
CLAMPS = ("relu", "max", "min")  # monotone, NaN-propagating; max and min with a scalar constant only


@rewrite_rule("separate-window-axes", roots=["window_max", "window_sum"], cost_guided=True)
def separate_window_axes(ctx: RewriteContext) -> Replacement | None:
    """window(x) over spatial axes a < b (kernel > 1 on both) is window_b(window_a(x)): the outermost axis
    first, so the first pass reads whole rows and the second works on fewer of them. Not for a small unstrided
    window (the module's docstring says why)."""
    attrs = ctx.node.attr_dict
    kernel, strides, pads, dilations = attrs["kernel"], attrs["strides"], attrs["pads"], attrs["dilations"]
    spatial = len(kernel)
    axes = [i for i in range(spatial) if kernel[i] > 1]
    if len(axes) < 2 or all(kernel[i] <= SMALL_WINDOW and strides[i] == 1 for i in axes):
        return None
    value = ctx.node.inputs[0]
    for axis in axes:
        one_axis = {**attrs, "kernel": _along(kernel, axis, 1), "strides": _along(strides, axis, 1),
                    "dilations": _along(dilations, axis, 1),
                    "pads": _along(pads[:spatial], axis, 0) + _along(pads[spatial:], axis, 0)}  # fmt: skip
        value = ctx.emit(ctx.node.prim, value, **one_axis)
    return {ctx.node.outputs[0]: value}


def _along(values: tuple[int, ...], axis: int, other: int) -> tuple[int, ...]:
    """`values` at `axis`, `other` (no window) everywhere else."""
    return tuple(v if i == axis else other for i, v in enumerate(values))


@rewrite_rule("pool-before-clamp", roots=["window_max"], cost_guided=True)
def pool_before_clamp(ctx: RewriteContext) -> Replacement | None:
    """window_max(clamp(x)) is clamp(window_max(x)) for relu and max/min with a scalar constant, where every
    window holds an input element; only where the pool has fewer outputs than inputs, so the clamp does less."""
    source = ctx.node.inputs[0]
    clamp = ctx.producer(source)
    if clamp is None or clamp.prim not in CLAMPS or not ctx.single_use(source) or not ctx.type(source).is_float:
        return None
    data = _clamped(ctx, clamp)
    if data is None or ctx.type(ctx.node.outputs[0]).numel >= ctx.type(source).numel:
        return None
    if not _every_window_reads_input(ctx.type(source).shape, ctx.type(ctx.node.outputs[0]).shape,
                                     ctx.node.attr_dict):  # fmt: skip
        return None
    pooled = ctx.emit("window_max", data, **ctx.node.attr_dict)
    inputs = [pooled if value == data else value for value in clamp.inputs]
    return {ctx.node.outputs[0]: ctx.emit(clamp.prim, *inputs, **clamp.attr_dict)}


def _clamped(ctx: RewriteContext, clamp: Node) -> str | None:
    """The value `clamp` clamps: relu's input, or max/min's operand beside a scalar constant (None otherwise)."""
    if clamp.prim == "relu":
        return clamp.inputs[0]
    bounds = [bound for value in clamp.inputs if (bound := ctx.const(value)) is not None]
    data = [value for value in clamp.inputs if ctx.const(value) is None]
    if len(bounds) != 1 or len(data) != 1 or bounds[0].size != 1:
        return None
    return data[0] if ctx.type(data[0]) == ctx.type(clamp.outputs[0]) else None


def _every_window_reads_input(source: tuple[int, ...], pooled: tuple[int, ...], attrs: dict) -> bool:
    """Whether every window has a tap inside the input along every axis (a window of padding alone is -inf)."""
    kernel, strides, pads, dilations = attrs["kernel"], attrs["strides"], attrs["pads"], attrs["dilations"]
    spatial, lead = len(kernel), len(source) - len(kernel)
    for axis in range(spatial):
        size = source[lead + axis]
        for out in range(pooled[lead + axis]):
            start = out * strides[axis] - pads[axis]
            if not any(0 <= start + tap * dilations[axis] < size for tap in range(kernel[axis])):
                return False
    return True
