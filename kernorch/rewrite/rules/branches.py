"""Parallel branches of one input that are one linear map: `sum-of-convs`, `identity-into-conv`.

Structural re-parameterisation (RepVGG, MobileOne, ACNet) trains a block as several convolutions of the same input
— a 3x3, a 1x1, sometimes over-parameterised copies — whose outputs are summed; after training they are one
convolution, but a model exported in its training form keeps every branch. Summing their kernels (the smaller one
zero-padded to the larger window, at the offset that reads the same pixels) leaves one convolution of the largest
window: the 1x1 and the extra copies cost nothing more. The identity branch (the input itself, or its
BatchNorm: x · s + t) is one more kernel: s on the tap where each output channel reads its own input pixel.
"""

from __future__ import annotations

import numpy as np

from kernorch.ir.graph import Node
from kernorch.rewrite.engine import Replacement, RewriteContext, rewrite_rule
from kernorch.rewrite.rules.common import channel_vector

_SAME = ("strides", "dilations", "group", "channels_last", "precision")  # attributes both convs must share


def _channel_axis(conv: Node, rank: int) -> int:
    return rank - 1 if conv.attr("channels_last", False) else 1


def _with_bias(ctx: RewriteContext, result: str, vectors: list[np.ndarray | None], axis: int) -> str:
    """`result` plus the sum of the per-channel `vectors` that are not None (none: `result` itself)."""
    present = [vector for vector in vectors if vector is not None]
    if not present:
        return result
    out = ctx.type(result)
    channels = out.shape[axis]
    total = np.zeros(channels, dtype=out.dtype)
    for vector in present:
        total = total + np.broadcast_to(vector, (channels,)).astype(out.dtype)
    shape = (channels,) if axis == out.rank - 1 else (channels, *(1,) * (out.rank - 2))
    return ctx.emit("add", result, ctx.constant(total.reshape(shape)))


def _branch(ctx: RewriteContext, value: str) -> tuple[Node, np.ndarray, np.ndarray | None] | None:
    """(the conv, its constant weight, its constant per-channel bias or None) when `value` is conv(x, W) or
    conv(x, W) + b, used only where it is summed."""
    if not ctx.single_use(value):
        return None
    node = ctx.producer(value)
    bias = None
    if node is not None and node.prim == "add":
        for product, other in (node.inputs, node.inputs[::-1]):
            conv = ctx.producer(product)
            if conv is not None and conv.prim == "conv" and ctx.single_use(product):
                bias = channel_vector(ctx, other, product, _channel_axis(conv, ctx.type(product).rank))
                if bias is not None and ctx.type(product) == ctx.type(value):
                    node = conv
                    break
        else:
            return None
    if node is None or node.prim != "conv":
        return None
    weight = ctx.const(node.inputs[1])
    return (node, weight, bias) if weight is not None else None


def _window(first: Node, second: Node, kernels: tuple[tuple[int, ...], tuple[int, ...]]) \
        -> tuple[tuple[int, ...], tuple[int, ...], tuple[tuple[int, ...], ...]] | None:  # fmt: skip
    """(the merged window, its pads, each conv's offset in it) such that tap t of conv i reads what tap
    t + offset_i of the merged conv reads, with the same output size; None when no window does, or when neither
    kernel spans it (a 1x3 and a 3x1: the corners would be taps of weight 0)."""
    spatial = len(kernels[0])
    pads = [node.attr("pads") for node in (first, second)]
    begin = tuple(max(p[a] for p in pads) for a in range(spatial))
    window = tuple(max(k[a] + begin[a] - p[a] for k, p in zip(kernels, pads, strict=True)) for a in range(spatial))
    ends = []
    for k, p in zip(kernels, pads, strict=True):  # the padded extent minus the window: the output size's numerator
        ends.append(tuple(p[a] + p[spatial + a] - k[a] + window[a] - begin[a] for a in range(spatial)))
    if ends[0] != ends[1] or any(e < 0 for e in ends[0]):
        return None
    offsets = tuple(tuple(begin[a] - p[a] for a in range(spatial)) for p in pads)
    if all(k != window for k in kernels):
        return None  # taps no branch reads would multiply their pixels by 0: an inf there would become NaN
    return window, (*begin, *ends[0]), offsets


@rewrite_rule("sum-of-convs", roots=["add"])
def sum_of_convs(ctx: RewriteContext) -> Replacement | None:
    """conv(x, W1) (+ b1) + conv(x, W2) (+ b2) with constant kernels, the same strides, groups and undilated, is
    conv(x, W1' + W2') (+ b1 + b2): the smaller kernel zero-padded into the larger's window where its taps read the
    same pixels (a 1x1 in a padded 3x3's centre). RepVGG's and MobileOne's training-form branches become one conv.

    Equal in real arithmetic; in floating point the products are summed in another order (~1e-7 relative, as
    Winograd's transforms), and an infinite pixel read by both kernels at weights of opposite signs gives ±inf
    where the two branches' sum gives NaN."""
    node = ctx.node
    out = ctx.type(node.outputs[0])
    if any(ctx.type(value) != out for value in node.inputs) or node.inputs[0] == node.inputs[1]:
        return None
    left, right = (_branch(ctx, value) for value in node.inputs)
    if left is None or right is None:
        return None
    (first, w1, b1), (second, w2, b2) = left, right
    if first.inputs[0] != second.inputs[0] or any(first.attr(k) != second.attr(k) for k in _SAME) \
            or any(d != 1 for d in first.attr("dilations")) or w1.shape[:2] != w2.shape[:2] \
            or w1.dtype != w2.dtype:  # fmt: skip
        return None
    merged = _window(first, second, (w1.shape[2:], w2.shape[2:]))
    if merged is None:
        return None
    window, pads, offsets = merged
    weight = np.zeros((*w1.shape[:2], *window), dtype=w1.dtype)
    for w, offset in ((w1, offsets[0]), (w2, offsets[1])):
        weight[(slice(None), slice(None), *(slice(o, o + k) for o, k in zip(offset, w.shape[2:], strict=True)))] += w
    attrs = {**first.attr_dict, "pads": pads}
    result = ctx.emit("conv", first.inputs[0], ctx.constant(weight), **attrs)
    return {node.outputs[0]: _with_bias(ctx, result, [b1, b2], _channel_axis(first, out.rank))}


def _scaled(ctx: RewriteContext, value: str, x: str, axis: int) -> tuple[np.ndarray, np.ndarray | None] | None:
    """(s, t) when `value` is x, x · s, x + t or x · s + t with constant per-channel s and t (a BatchNorm of x),
    used only where it is summed."""
    shift = None
    if value != x:
        node = ctx.producer(value)
        if not ctx.single_use(value) or node is None:
            return None
        if node.prim == "add":  # · s + t: peel the shift
            shifted = [(scaled, channel_vector(ctx, other, scaled, axis)) for scaled, other in
                       (node.inputs, node.inputs[::-1]) if ctx.type(scaled) == ctx.type(value)]  # fmt: skip
            found = [(scaled, vector) for scaled, vector in shifted if vector is not None
                     and (scaled == x or ctx.single_use(scaled))]  # fmt: skip
            if not found:
                return None
            value, shift = found[0]
    if value == x:
        return np.ones(1, np.float32), shift
    node = ctx.producer(value)
    if node is None or node.prim != "mul" or ctx.type(value) != ctx.type(x):
        return None
    for source, other in (node.inputs, node.inputs[::-1]):
        scale = channel_vector(ctx, other, source, axis)
        if source == x and scale is not None:
            return scale, shift
    return None


@rewrite_rule("identity-into-conv", roots=["add"])
def identity_into_conv(ctx: RewriteContext) -> Replacement | None:
    """conv(x, W) (+ b) + x · s (+ t), the conv keeping x's shape (as many output channels as input channels,
    stride 1, undilated), is conv(x, W') (+ b + t) with s added to each output channel's weight on its own
    input channel at the tap that reads the output's own pixel: RepVGG's identity branch (its BatchNorm) joins
    the conv. The conv reads that pixel at that tap already, so no new product appears."""
    node = ctx.node
    out = ctx.type(node.outputs[0])
    if any(ctx.type(value) != out for value in node.inputs):
        return None
    for conv_side, other in (node.inputs, node.inputs[::-1]):
        branch = _branch(ctx, conv_side)
        if branch is None:
            continue
        conv, weight, bias = branch
        x, axis = conv.inputs[0], _channel_axis(conv, out.rank)
        identity = _scaled(ctx, other, x, axis)
        spatial = out.rank - 2
        pads, kernel = conv.attr("pads"), weight.shape[2:]
        if identity is None or ctx.type(x) != out or any(s != 1 for s in conv.attr("strides")) \
                or any(d != 1 for d in conv.attr("dilations")) \
                or any(not 0 <= pads[a] < kernel[a] for a in range(spatial)):  # fmt: skip
            continue  # the other operand may be the conv
        scale, shift = identity
        channels = out.shape[axis]
        per_group = weight.shape[1]
        merged = weight.copy()
        taps = tuple(pads[a] for a in range(spatial))  # the tap reading output pixel y's own input pixel
        for o, s in enumerate(np.broadcast_to(scale, (channels,))):
            merged[(o, o % per_group, *taps)] += s
        result = ctx.emit("conv", x, ctx.constant(merged), **conv.attr_dict)
        return {node.outputs[0]: _with_bias(ctx, result, [bias, shift], axis)}
    return None
