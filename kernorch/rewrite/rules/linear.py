"""Rules around linear primitives (MatMul, Conv): TASO-style substitutions of Korch Fig. 2b.

`scale-into-weight` folds per-channel scales (BatchNorm's, a Gemm's alpha) into a constant weight;
`transpose-of-matmul` and `split-split` only remove copies; `pointwise-conv-before-upsample` and
`pointwise-conv-into-matmul` remove multiplications (a 1x1 conv runs before an upsample, or is folded
into the constant weight of the projection before it). The cost-guided ones change what runs:
`reduce-to-matmul` turns a row sum into a product with a ones vector, `scale-across-matmul` moves a
row scale behind the product (Softmax's division), `merge-matmuls` computes two products sharing
an operand as one, `transpose-into-matmul` leaves the last-two-axes swap of an operand to the
library call, `pointwise-conv-before-resize` runs a 1x1 conv of concatenated resized maps on the
maps before their resizes, and `channel-scale-into-conv` multiplies a conv's kernel, not its input map, by a
per-channel scale computed at run time (squeeze-and-excitation's gate).
"""

from __future__ import annotations

import numpy as np

from kernorch.ir.graph import Node
from kernorch.ir.primitives import STRIDED_VIEW_PRIMS, pointwise_conv
from kernorch.ir.strided import strided_view
from kernorch.rewrite.engine import Replacement, RewriteContext, rewrite_rule
from kernorch.rewrite.rules.common import channel_vector, swap_last_two


@rewrite_rule("scale-into-weight", roots=["mul"])
def scale_into_weight(ctx: RewriteContext) -> Replacement | None:
    """linear(x, W) · s with constant W and a constant per-output-channel s is linear(x, W·s); likewise a
    per-input-channel scale of a matmul's left operand. Folds BatchNorm into a preceding Conv/MatMul."""
    for value, scale in (ctx.node.inputs, ctx.node.inputs[::-1]):
        if ctx.const(value) is None and ctx.type(value) == ctx.type(ctx.node.outputs[0]):
            replacement = _scale_output(ctx, value, scale) or _scale_input(ctx, value, scale)
            if replacement:
                return replacement
    return None


def _scale_output(ctx: RewriteContext, value: str, scale: str) -> Replacement | None:
    producer = ctx.producer(value)
    if producer is None or producer.prim not in ("matmul", "conv") or not ctx.single_use(value):
        return None
    weight = producer.inputs[1]
    w = ctx.const(weight)
    channels_last = producer.prim == "matmul" or producer.attr("channels_last", False)
    out_axis = ctx.type(value).rank - 1 if channels_last else 1
    vector = channel_vector(ctx, scale, value, out_axis)
    if w is None or w.ndim < 2 or vector is None:
        return None
    # matmul weights are [..., K, N]: scale the last axis; conv weights are [C_out, ...]: the first.
    shape = (-1,) if producer.prim == "matmul" else (-1, *([1] * (w.ndim - 1)))
    factor = ctx.constant(vector.reshape(shape) if vector.size > 1 else vector[0])
    scaled = ctx.emit("mul", weight, factor)
    return {ctx.node.outputs[0]: ctx.emit(producer.prim, producer.inputs[0], scaled, **producer.attr_dict)}


def _scale_input(ctx: RewriteContext, value: str, scale: str) -> Replacement | None:
    """(x · s) @ W = x @ (s[:, None] · W) for a constant s along x's last axis (K)."""
    scaled_x = ctx.node.outputs[0]
    consumers = ctx.consumers(scaled_x)
    if len(consumers) != 1 or consumers[0].prim != "matmul" or consumers[0].inputs[0] != scaled_x \
            or consumers[0].inputs[1] == scaled_x or ctx.is_output(scaled_x):  # fmt: skip
        return None
    matmul = consumers[0]
    w = ctx.const(matmul.inputs[1])
    vector = channel_vector(ctx, scale, scaled_x, ctx.type(scaled_x).rank - 1)
    if w is None or w.ndim < 2 or vector is None:
        return None
    factor = ctx.constant(vector.reshape(-1, 1) if vector.size > 1 else vector[0])
    return {matmul.outputs[0]: ctx.emit("matmul", value, ctx.emit("mul", matmul.inputs[1], factor))}


@rewrite_rule("transpose-of-matmul", roots=["transpose"])
def transpose_of_matmul(ctx: RewriteContext) -> Replacement | None:
    """(A @ B)ᵀ is Bᵀ @ Aᵀ (last two axes): the operand swaps are strides of the library call, no copy."""
    node = ctx.node
    rank = ctx.type(node.outputs[0]).rank
    product = ctx.producer(node.inputs[0])
    if rank < 2 or tuple(node.attr("perm")) != swap_last_two(rank) or product is None \
            or product.prim != "matmul" or not ctx.single_use(node.inputs[0]):  # fmt: skip
        return None
    a, b = product.inputs
    if ctx.type(a).rank < 2 or ctx.type(b).rank < 2:
        return None
    swapped_b = ctx.emit("transpose", b, perm=swap_last_two(ctx.type(b).rank))
    swapped_a = ctx.emit("transpose", a, perm=swap_last_two(ctx.type(a).rank))
    return {node.outputs[0]: ctx.emit("matmul", swapped_b, swapped_a)}


@rewrite_rule("split-split", roots=["split"])
def split_of_split(ctx: RewriteContext) -> Replacement | None:
    """A piece of a split, split again along the same axis, is one split into all the pieces."""
    node = ctx.node
    outer = ctx.producer(node.inputs[0])
    if outer is None or outer.prim != "split" or outer.attr("axis") != node.attr("axis") \
            or not ctx.single_use(node.inputs[0]):  # fmt: skip
        return None
    piece = outer.outputs.index(node.inputs[0])
    outer_sizes, inner_sizes = list(outer.attr("sizes")), list(node.attr("sizes"))
    sizes = (*outer_sizes[:piece], *inner_sizes, *outer_sizes[piece + 1 :])
    pieces = ctx.emit_all("split", outer.inputs, axis=node.attr("axis"), sizes=sizes)
    replacement = dict(zip(node.outputs, pieces[piece : piece + len(inner_sizes)], strict=True))
    others = [i for i in range(len(outer_sizes)) if i != piece]
    kept = [*pieces[:piece], *pieces[piece + len(inner_sizes) :]]
    replacement.update({outer.outputs[i]: new for i, new in zip(others, kept, strict=True)})
    return replacement


@rewrite_rule("split-to-slices", roots=["split"])
def split_to_slices(ctx: RewriteContext) -> Replacement | None:
    """A split into pieces that are not contiguous blocks, one of them read by a matmul through layout primitives
    that are a strided view, is one slice per piece. The matmul then reads its piece through strides (no copy)
    from a kernel holding the piece's own chain; with the split at the chain's root, that kernel would hold the
    other pieces' source too and stop being convex wherever they feed the matmul's inputs (gpt2: v is split
    from the projection q and k come from, and softmax(q kᵀ) feeds the matmul with v).

    Where the orchestrator copies the pieces anyway, three slices cost what one split does plus two dispatches.
    """
    node = ctx.node
    shape = ctx.type(node.inputs[0]).shape
    axis = node.attr("axis")
    if all(d == 1 for d in shape[:axis]) or not any(_strided_matmul_operand(ctx, p) for p in node.outputs):
        return None  # contiguous pieces are views already (codegen/views.py)
    replacement, start = {}, 0
    for piece, size in zip(node.outputs, node.attr("sizes"), strict=True):
        ranges = tuple((start, start + size, 1) if a == axis else (0, d, 1) for a, d in enumerate(shape))
        replacement[piece] = ctx.emit("slice", node.inputs[0], ranges=ranges)
        start += size
    return replacement


def _strided_matmul_operand(ctx: RewriteContext, piece: str) -> bool:
    """A matmul reads `piece` through layout primitives that, with the split, are a strided view (ir/strided.py)."""
    frontier = [(piece, frozenset({ctx.position}))]
    while frontier:
        value, chain = frontier.pop()
        for position in ctx.consumer_positions(value):
            user = ctx.graph.nodes[position]
            if user.prim == "matmul" and strided_view(ctx.graph, set(chain), value) is not None:
                return True
            if user.prim in STRIDED_VIEW_PRIMS and len(chain) < 8:
                frontier.extend((out, chain | {position}) for out in user.outputs)
    return False


@rewrite_rule("reshape-through-matmul", roots=["matmul"])
def reshape_through_matmul(ctx: RewriteContext) -> Replacement | None:
    """reshape(x, [..., K]) @ W = reshape(x @ W, [..., N]) for a 2-D W when the reshape keeps the last axis
    (GPT-2's flatten-project-unflatten): the reshape moves to the product's side, where it meets the one
    that undoes it."""
    node = ctx.node
    reshaped, weight = node.inputs
    reshape = ctx.producer(reshaped)
    if reshape is None or reshape.prim != "reshape" or not ctx.single_use(reshaped) or ctx.type(weight).rank != 2:
        return None
    source = reshape.inputs[0]
    if ctx.type(source).rank < 2 or ctx.type(source).shape[-1] != ctx.type(reshaped).shape[-1]:
        return None
    product = ctx.emit("matmul", source, weight)
    return {node.outputs[0]: ctx.emit("reshape", product, shape=ctx.type(node.outputs[0]).shape)}


@rewrite_rule("reshape-through-bias", roots=["add", "mul"])
def reshape_through_bias(ctx: RewriteContext) -> Replacement | None:
    """reshape(y) + b = reshape(y + b) for a constant b along one axis, when the reshape keeps that axis
    whole (the same elements before it, the same size): the reshape moves on towards its consumers (and the
    reshape that undoes it), and the product's epilogue can take the bias."""
    node = ctx.node
    out_type = ctx.type(node.outputs[0])
    for reshaped, bias in (node.inputs, node.inputs[::-1]):
        reshape = ctx.producer(reshaped)
        if reshape is None or reshape.prim != "reshape" or not ctx.single_use(reshaped) \
                or out_type != ctx.type(reshaped):  # fmt: skip
            continue
        source = ctx.type(reshape.inputs[0]).shape
        for axis in reversed(range(out_type.rank)):
            vector = channel_vector(ctx, bias, node.outputs[0], axis)
            kept = _kept_axis(out_type.shape, source, axis)
            if vector is None or (vector.size > 1 and kept is None):
                continue
            shape = () if vector.size == 1 else (vector.size, *(1,) * (len(source) - 1 - (kept or 0)))
            constant = ctx.constant(vector.reshape(shape))
            return {node.outputs[0]: ctx.emit("reshape", ctx.emit(node.prim, reshape.inputs[0], constant),
                                              shape=out_type.shape)}  # fmt: skip
    return None


def _kept_axis(shape: tuple[int, ...], source: tuple[int, ...], axis: int) -> int | None:
    """The axis of `source` that is `axis` of `shape` after a reshape: as many elements before it, as long."""
    before = int(np.prod(shape[:axis]))
    return next((a for a in range(len(source)) if source[a] == shape[axis] and int(np.prod(source[:a])) == before),
                None)


# ------------------------------------------------------------------------------------------ cost-guided


@rewrite_rule("reduce-to-matmul", roots=["reduce_sum"], cost_guided=True)
def reduce_to_matmul(ctx: RewriteContext) -> Replacement | None:
    """Σ over the last axis is a product with a ones vector: x[..., K] @ 1[K, 1] (Korch Fig. 2b)."""
    node = ctx.node
    x_type = ctx.type(node.inputs[0])
    if not x_type.is_float or x_type.rank < 2 or tuple(node.attr("axes")) != (x_type.rank - 1,) \
            or x_type.shape[-1] < 2:  # fmt: skip
        return None
    ones = ctx.constant(np.ones((x_type.shape[-1], 1), dtype=x_type.dtype))
    return {node.outputs[0]: ctx.emit("matmul", node.inputs[0], ones)}


@rewrite_rule("scale-across-matmul", roots=["matmul"], cost_guided=True)
def scale_across_matmul(ctx: RewriteContext) -> Replacement | None:
    """(A ⊘ s) @ B = (A @ B) ⊘ s for a row scale s of A (⊘ = · or /), and A @ (B ⊘ c) = (A @ B) ⊘ c for a
    column scale c of B: the elementwise op moves behind the product (Softmax's division, Fig. 2b)."""
    node = ctx.node
    out = node.outputs[0]
    # a row scale of A is constant along A's last axis, a column scale of B along B's second-to-last
    for side, fixed_axis in ((0, -1), (1, -2)):
        operand = node.inputs[side]
        scaled = ctx.producer(operand)
        if scaled is None or scaled.prim not in ("mul", "div") or not ctx.single_use(operand):
            continue
        candidates = [(0, 1), (1, 0)] if scaled.prim == "mul" else [(0, 1)]
        for keep, scale_index in candidates:
            base, scale = scaled.inputs[keep], scaled.inputs[scale_index]
            base_type, scale_type = ctx.type(base), ctx.type(scale)
            if base_type != ctx.type(operand) or base_type.rank < 2 or scale_type.rank > base_type.rank:
                continue
            if scale_type.rank >= -fixed_axis and scale_type.shape[fixed_axis] != 1:
                continue
            out_shape = ctx.type(out).shape
            if tuple(np.broadcast_shapes(out_shape, scale_type.shape)) != out_shape:
                continue
            inputs = [base, node.inputs[1]] if side == 0 else [node.inputs[0], base]
            product = ctx.emit("matmul", *inputs)
            return {out: ctx.emit(scaled.prim, product, scale)}
    return None


@rewrite_rule("merge-matmuls", roots=["matmul"], cost_guided=True)
def merge_matmuls(ctx: RewriteContext) -> Replacement | None:
    """A @ B1 and A @ B2 are one A @ [B1 | B2] split in two (with their bias additions, when both have
    one): one larger product instead of two (Korch Fig. 2b merges A @ V and A @ ones this way)."""
    node = ctx.node
    shared, right = node.inputs
    for position in ctx.consumer_positions(shared):
        partner = ctx.graph.nodes[position]
        if position >= ctx.position or partner.prim != "matmul" or partner.inputs[0] != shared \
                or partner.inputs[1] == right:  # fmt: skip
            continue
        operands = _same_batch(ctx, partner.inputs[1], right)
        if operands is None:
            continue
        left, right = operands
        sizes = (ctx.type(left).shape[-1], ctx.type(right).shape[-1])
        weights = ctx.emit("concat", left, right, axis=ctx.type(left).rank - 1)
        product = ctx.emit("matmul", shared, weights)
        out_axis = ctx.type(product).rank - 1
        biases = [_bias_add(ctx, partner.outputs[0]), _bias_add(ctx, node.outputs[0])]
        if all(biases):
            bias = ctx.emit("concat", *(ctx.constant(vector) for _, vector in biases), axis=0)  # type: ignore[misc]
            pieces = ctx.emit_all("split", [ctx.emit("add", product, bias)], axis=out_axis, sizes=sizes)
            return {biases[0][0]: pieces[0], biases[1][0]: pieces[1]}  # type: ignore[index]
        pieces = ctx.emit_all("split", [product], axis=out_axis, sizes=sizes)
        return {partner.outputs[0]: pieces[0], node.outputs[0]: pieces[1]}
    return None


def _same_batch(ctx: RewriteContext, left: str, right: str) -> tuple[str, str] | None:
    """Two right-hand operands [..., K, N1] and [..., K, N2] with equal leading axes, so they concatenate
    along the last; a constant one with fewer leading axes is broadcast to the other's (a ones vector)."""
    left_type, right_type = ctx.type(left), ctx.type(right)
    if min(left_type.rank, right_type.rank) < 2 or left_type.dtype != right_type.dtype \
            or left_type.shape[-2] != right_type.shape[-2]:  # fmt: skip
        return None
    if left_type.shape[:-1] == right_type.shape[:-1]:
        return left, right
    for small, large in ((left, right), (right, left)):
        array = ctx.const(small)
        lead = ctx.type(large).shape[:-2]
        if array is not None and ctx.type(small).rank <= ctx.type(large).rank \
                and np.broadcast_shapes(array.shape[:-2], lead) == lead:  # fmt: skip
            grown = ctx.constant(np.asarray(np.broadcast_to(array, (*lead, *array.shape[-2:])), order="C"))
            return (grown, right) if small == left else (left, grown)
    return None


def _bias_add(ctx: RewriteContext, product: str) -> tuple[str, np.ndarray] | None:
    """The only use of `product` is + a constant along its last axis: (that sum, the bias vector)."""
    users = ctx.consumers(product)
    if len(users) != 1 or users[0].prim != "add" or ctx.is_output(product):
        return None
    add = users[0]
    other = add.inputs[1] if add.inputs[0] == product else add.inputs[0]
    vector = channel_vector(ctx, other, product, ctx.type(product).rank - 1)
    if vector is None or ctx.type(add.outputs[0]) != ctx.type(product):
        return None
    size = ctx.type(product).shape[-1]
    return add.outputs[0], np.broadcast_to(vector, (size,)).astype(ctx.type(product).dtype)


@rewrite_rule("transpose-into-matmul", roots=["matmul"], cost_guided=True)
def transpose_into_matmul(ctx: RewriteContext) -> Replacement | None:
    """A matmul operand transpose(x, p) whose p moves x's last axis is transpose(x, p') followed by a swap
    of the last two axes, where p' keeps the last axis in place: the swap is free (the library reads
    the operand through strides) and p' copies contiguous rows instead of single elements."""
    node = ctx.node
    for side in (0, 1):
        operand = node.inputs[side]
        transpose = ctx.producer(operand)
        rank = ctx.type(operand).rank
        if transpose is None or transpose.prim != "transpose" or rank < 3:
            continue
        perm = tuple(transpose.attr("perm"))
        rows_first = perm[:-2] + (perm[-1], perm[-2])  # perm = rows_first then swap the last two axes
        if rows_first[-1] != rank - 1 or rows_first == tuple(range(rank)):
            continue  # the last axis stays put (no gain), or perm is the swap alone (already free)
        inner = ctx.emit("transpose", transpose.inputs[0], perm=rows_first)
        swapped = ctx.emit("transpose", inner, perm=swap_last_two(rank))
        inputs = [swapped, node.inputs[1]] if side == 0 else [node.inputs[0], swapped]
        return {node.outputs[0]: ctx.emit("matmul", *inputs)}
    return None


@rewrite_rule("pointwise-conv-before-resize", roots=["conv"], cost_guided=True)
def pointwise_conv_before_resize(ctx: RewriteContext) -> Replacement | None:
    """A 1x1 conv of a channel concat is the sum of 1x1 convs, each with its slice of the weight; and a 1x1
    conv (channel mixing) commutes with a resize that maps every channel the same linear way. So a conv of
    concatenated upsampled maps runs on the small maps, and only the sums are upsampled. SegFormer's decode
    head concatenates four 256-channel maps upsampled to 128x128 from 16², 32², 64² and 128²: its 1x1 fuse
    conv (8.6 GFLOP) becomes 2.9 GFLOP and the 64 MB concat disappears."""
    x, _ = ctx.node.inputs
    attrs = ctx.node.attr_dict
    w = _pointwise_weight(ctx, ctx.node)
    if w is None:
        return None
    concat = ctx.producer(x)
    if concat is None or concat.prim != "concat" or concat.attr("axis") != 1 or not ctx.single_use(x):
        return None
    resizes = [ctx.producer(v) for v in concat.inputs]
    movable = [_channelwise_resize(ctx, value, r) for value, r in zip(concat.inputs, resizes, strict=True)]
    if not any(movable):
        return None
    parts, offset = [], 0
    for value, resize, move in zip(concat.inputs, resizes, movable, strict=True):
        channels = ctx.type(value).shape[1]
        piece = ctx.constant(np.asarray(w[:, offset:offset + channels], order="C"))
        offset += channels
        if move:
            assert resize is not None
            mixed = ctx.emit("conv", resize.inputs[0], piece, **attrs)
            sizes = (*resize.attr("sizes")[:1], w.shape[0], *resize.attr("sizes")[2:])
            parts.append(ctx.emit("resize", mixed, **{**resize.attr_dict, "sizes": sizes}))
        else:
            parts.append(ctx.emit("conv", value, piece, **attrs))
    total = parts[0]
    for part in parts[1:]:
        total = ctx.emit("add", total, part)
    return {ctx.node.outputs[0]: total}


# A kernel computed at run time costs a oneDNN repacking per call at ~3 GB/s (jit:uni reorder to Acdb32a: 50 us for
# 80x480) where the gated map's pass runs at 20-30 GB/s: only a map this many times the kernel's size can gain
# (in place: 56x56x96 -> 24, 131x, 139 -> 112 us; 14x14x480 -> 80, 2.5x, 104 -> 153 us)
MIN_MAP_PER_KERNEL = 16


@rewrite_rule("channel-scale-into-conv", roots=["conv"], cost_guided=True)
def channel_scale_into_conv(ctx: RewriteContext) -> Replacement | None:
    """conv(x · s, W) = conv(x, W · s) for a constant W, an unpadded conv without groups and a scale s with one
    value per input channel (the same for every pixel and image): the scale moves from the map onto the kernel.
    Squeeze-and-excitation (EfficientNet, MobileNetV3, RegNetY) gates a whole feature map before the block's 1x1
    projection; this multiplies Cout·C kernel values instead of the map's N·C·H·W, and the kernel becomes a value
    of the run (oneDNN repacks it on every call, a pass over the kernel).

    Equal in real arithmetic; each term's three factors are multiplied in another order (~1 ulp), and a term is
    NaN exactly where it was (a NaN, or a 0 and an inf, among its factors). Unpadded: no padding tap multiplies
    a scaled weight (an inf scale would make 0 · inf there)."""
    node = ctx.node
    x, kernel = node.inputs
    weight = ctx.const(kernel)
    scaled = ctx.producer(x)
    if weight is None or node.attr("group") != 1 or any(node.attr("pads")) or scaled is None \
            or scaled.prim != "mul" or not ctx.single_use(x):  # fmt: skip
        return None
    x_type = ctx.type(x)
    if x_type.numel < MIN_MAP_PER_KERNEL * weight.size:
        return None  # the pass over the map saved is smaller than what the kernel's repacking costs
    axis = x_type.rank - 1 if node.attr("channels_last", False) else 1
    channels = x_type.shape[axis]
    for source, scale in (scaled.inputs, scaled.inputs[::-1]):
        scale_type = ctx.type(scale)
        offset = x_type.rank - scale_type.rank
        if ctx.type(source) != x_type or offset < 0 or scale_type.dtype != weight.dtype or any(
                size != 1 and (i + offset != axis or size != channels) for i, size in enumerate(scale_type.shape)):
            continue  # fmt: skip
        # onto W's input-channel axis ([Cout, C, k...]); a single value broadcasts as it is
        per_channel = (1, channels, *(1,) * (weight.ndim - 2)) if scale_type.numel > 1 else (1,) * weight.ndim
        factor = ctx.emit("reshape", scale, shape=per_channel)
        return {node.outputs[0]: ctx.emit("conv", source, ctx.emit("mul", kernel, factor), **node.attr_dict)}
    return None


@rewrite_rule("pointwise-conv-before-upsample", roots=["conv"])
def pointwise_conv_before_upsample(ctx: RewriteContext) -> Replacement | None:
    """A 1x1 conv after a resize that maps every channel the same linear way runs before it, on the smaller
    map (the two commute): fewer pixels to mix, and only the conv's outputs are resized."""
    mix = _pointwise_weight(ctx, ctx.node)
    x, weight = ctx.node.inputs
    resize = ctx.producer(x)
    if mix is None or not _channelwise_resize(ctx, x, resize):
        return None
    assert resize is not None
    source, target = ctx.type(resize.inputs[0]).shape, ctx.type(x).shape
    pixels_before, pixels_after = int(np.prod(source[2:])), int(np.prod(target[2:]))
    outputs, channels = mix.shape[:2]
    if pixels_before > pixels_after or (pixels_before == pixels_after and outputs > channels):
        return None  # a downsample (or more channels to resize): the conv is cheaper where it is
    mixed = ctx.emit("conv", resize.inputs[0], weight, **ctx.node.attr_dict)
    sizes = (target[0], outputs, *target[2:])
    return {ctx.node.outputs[0]: ctx.emit("resize", mixed, **{**resize.attr_dict, "sizes": sizes})}


@rewrite_rule("pointwise-conv-into-matmul", roots=["conv"])
def pointwise_conv_into_matmul(ctx: RewriteContext) -> Replacement | None:
    """A 1x1 conv (W, [O, C]) of a product A @ B with a constant A ([C, K]) viewed as an image ([N, C, H·W]
    reshaped to [N, C, H, W]) is the one product (W A) @ B, its weight multiplied at compile time, when that
    is fewer multiplications (O·K ≤ C·K + O·C). SegFormer's decode head projects each stage's K-channel
    tokens to 256 channels and mixes them with a 256 → 256 1x1 conv: at 128x128 from K = 32 that is
    2.4 GFLOP, folded 0.27."""
    mix = _pointwise_weight(ctx, ctx.node)
    x = ctx.node.inputs[0]
    reshape = ctx.producer(x)
    if mix is None or reshape is None or reshape.prim != "reshape" or not ctx.single_use(x):
        return None
    product = ctx.producer(reshape.inputs[0])
    if product is None or product.prim != "matmul" or not ctx.single_use(reshape.inputs[0]):
        return None
    a = ctx.const(product.inputs[0])
    matrix = mix[:, :, 0, 0]
    outputs, channels = matrix.shape
    image, flat = ctx.type(x).shape, ctx.type(product.outputs[0]).shape
    if a is None or a.ndim != 2 or len(flat) < 2 or flat[-2:] != (channels, int(np.prod(image[2:]))) \
            or int(np.prod(flat[:-2])) != image[0]:  # fmt: skip
        return None  # not [N, C, H·W] → [N, C, H, W] of a product with a constant [C, K]
    k = a.shape[1]
    if outputs * k > channels * k + outputs * channels:
        return None
    folded = ctx.constant((matrix.astype(np.float64) @ a.astype(np.float64)).astype(a.dtype))
    merged = ctx.emit("matmul", folded, product.inputs[1])
    return {ctx.node.outputs[0]: ctx.emit("reshape", merged, shape=(image[0], outputs, *image[2:]))}


def _pointwise_weight(ctx: RewriteContext, conv: Node) -> np.ndarray | None:
    """The constant [O, C, 1, 1] weight of a 2-d conv that only mixes channels; else None."""
    w = ctx.const(conv.inputs[1])
    return w if pointwise_conv(conv.prim, conv.attr_dict, w) and w is not None and w.ndim == 4 else None


def _channelwise_resize(ctx: RewriteContext, value: str, resize: Node | None) -> bool:
    """`value` is only a resize's output and that resize keeps batch and channels and is linear in its input
    (tf_crop_and_resize writes an extrapolation constant outside the crop: affine, not linear)."""
    if resize is None or resize.prim != "resize" or not ctx.single_use(value):
        return False
    source = ctx.type(resize.inputs[0]).shape
    sizes, scales = resize.attr("sizes"), resize.attr("scales")
    return len(source) == 4 and tuple(sizes[:2]) == tuple(source[:2]) and tuple(scales[:2]) == (1.0, 1.0) \
        and resize.attr("coordinate_mode") != "tf_crop_and_resize"  # fmt: skip
