"""How each primitive can run on values stored in other layouts: its *modes*, and how to rewrite it.

A mode fixes the layout each (non-constant) input must be stored in and the layout each output is stored
in. Primitives that only relabel axes (elementwise, reductions, pooling, slice/concat/split/pad/resize/
expand) run in any layout with their attributes remapped; a transpose can become free (its output simply
takes the permuted layout of its input); a reshape is free when it does not mix axes the layout separates;
a convolution has an NCHW and a channels-last mode with measured costs; a matmul reads an operand stored with
its last two axes swapped through strides, and stores its product swapped as Bᵀ @ Aᵀ (unless B is constant
weights), both for free.
Everything else (gather, the LSTM scan...) runs only on row-major values. Constants take whatever layout a
mode asks for at no cost: they are permuted when the graph is rewritten.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kernorch.ir.graph import Graph, Node
from kernorch.ir.primitives import PRIMITIVES, Kind, pointwise_conv
from kernorch.ir.strided import swap_last_two
from kernorch.layout.layouts import (
    Perm,
    broadcast_operand,
    canonical,
    channels_last,
    identity,
    inverse,
    permute,
    reshape_layout,
)

# axis-relabelling primitives: one layout for the (full-rank) inputs and outputs, attributes remapped
_SAME_LAYOUT = {"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "window_max", "window_sum", "slice",
                "concat", "split", "pad", "resize", "expand"}  # fmt: skip
CONV_PRIMS = ("conv", "conv_transpose", "conv_integer")  # conv_integer: its zero points are scalars
AS_MATMUL_FACTOR = 1.07  # a 1x1 conv as a matmul reading one layout and writing the other, vs channels-last


@dataclass(frozen=True)
class Mode:
    inputs: tuple[Perm, ...]  # required stored layout per input, canonical (constants are permuted for free)
    outputs: tuple[Perm, ...]  # stored layout per output, canonical
    cost: float = 0.0  # seconds this mode costs (a measured conv, a transpose that stays a copy)
    channels_last: bool = False  # conv modes only
    # a 1x1 conv run as a matmul over the channel axis, so that it reads one layout and writes the other
    as_matmul: bool = False
    # The exact axis order the node runs in (axis-relabelling primitives): its attributes are remapped by it
    # and every operand is viewed in it. Canonical layouts ignore where size-1 axes sit; a frame does not.
    frame: Perm | None = None

    @property
    def reads_channels_last(self) -> bool:
        """A conv mode reading its activation channels-last (as a conv, or as a matmul writing NCHW)."""
        return self.channels_last or (self.as_matmul and self.inputs[0] != identity(len(self.inputs[0])))


def is_identity_memory(perm: Perm, shape: tuple[int, ...]) -> bool:
    return canonical(perm, shape) == identity(len(shape))


def transpose_materialized(node: Node, graph: Graph, source: Perm, target: Perm) -> Perm:
    """The transpose the node becomes when its input is stored in `source` and its output in `target`."""
    t = tuple(node.attr("perm"))
    inv_source = inverse(source)
    return tuple(inv_source[t[q]] for q in target)


def modes_of(graph: Graph, node: Node, candidates: Callable[[str], list[Perm]],
             conv_cost: Callable[[Node, bool], float], transpose_cost: Callable[[str, Perm, Perm], float]
             ) -> list[Mode]:  # fmt: skip
    """Every mode of `node` given the candidate layouts of its values."""
    in_types = [graph.types[v] for v in node.inputs]
    out_types = [graph.types[v] for v in node.outputs]
    ids_in = tuple(identity(t.rank) for t in in_types)
    ids_out = tuple(identity(t.rank) for t in out_types)
    kind = PRIMITIVES[node.prim].kind
    if node.prim in CONV_PRIMS:
        rank = out_types[0].rank
        modes = [Mode(ids_in, ids_out, conv_cost(node, False))]
        if rank >= 3 and "channels_last" not in node.attr_dict:
            cl_in = (canonical(channels_last(rank), in_types[0].shape), *ids_in[1:])
            cl_out = (canonical(channels_last(rank), out_types[0].shape),)
            modes.append(Mode(cl_in, cl_out, conv_cost(node, True), channels_last=True))
            if pointwise_conv(node.prim, node.attr_dict, graph.constants.get(node.inputs[1])) \
                    and cl_in[0] != ids_in[0] and cl_out[0] != ids_out[0]:
                # the same product as the channels-last conv, written in the other layout: SegFormer's
                # classifier reads channels-last and writes the NCHW graph output with no transpose after it.
                # Priced as the channels-last conv plus what the matmul form measured slower on that one
                # (7.73 vs 7.20 ms profiled), so only a real transpose saved pays for it, not a tie.
                cost = conv_cost(node, True) * AS_MATMUL_FACTOR
                modes.append(Mode(cl_in, ids_out, cost, as_matmul=True))
                modes.append(Mode(ids_in, cl_out, cost, as_matmul=True))
        return modes
    if node.prim == "matmul":
        return matmul_modes(graph, node, candidates)
    if node.prim == "transpose":
        t = tuple(node.attr("perm"))
        inv_t = inverse(t)
        sources = list(candidates(node.inputs[0]))
        targets = list(candidates(node.outputs[0]))
        # the layouts that make the transpose free, seen from either side
        targets += [canonical(tuple(inv_t[a] for a in p), out_types[0].shape) for p in sources]
        sources += [canonical(tuple(t[a] for a in q), in_types[0].shape) for q in targets]
        modes = []
        for source in dict.fromkeys(sources):
            for target in dict.fromkeys(targets):
                moved = transpose_materialized(node, graph, source, target)
                stored = permute(in_types[0].shape, source)
                cost = 0.0 if is_identity_memory(moved, stored) else transpose_cost(node.inputs[0], source, target)
                modes.append(Mode((source,), (target,), cost))
        return modes
    if node.prim == "reshape":
        pairs = {(ids_in[0], ids_out[0])}
        for source in candidates(node.inputs[0]):  # forward: where the input's layout leads
            reshaped = reshape_layout(in_types[0].shape, out_types[0].shape, source)
            if reshaped is not None:
                pairs.add((source, reshaped))
        for target in candidates(node.outputs[0]):  # backward: what the output's layout needs
            source_layout = reshape_layout(out_types[0].shape, in_types[0].shape, target)
            if source_layout is not None and reshape_layout(in_types[0].shape, out_types[0].shape,
                                                            source_layout) == target:  # fmt: skip
                pairs.add((source_layout, target))
        return [Mode((source,), (target,)) for source, target in sorted(pairs)]
    if kind == Kind.ELEMENTWISE or node.prim in _SAME_LAYOUT:
        rank = out_types[0].rank
        layouts = list(candidates(node.outputs[0]))  # and, forward, the layouts of full-rank inputs
        layouts += [p for v, t in zip(node.inputs, in_types, strict=True) if t.rank == rank for p in candidates(v)]
        # the frame is canonical for the largest tensor involved: the output of a broadcast, else the input
        frame_shape = out_types[0].shape if (kind == Kind.ELEMENTWISE or node.prim in ("expand", "concat")) \
            else in_types[0].shape  # fmt: skip
        modes = []
        for frame in dict.fromkeys(canonical(p, frame_shape) for p in layouts):
            if node.prim.startswith("window_") and window_relabel(node.attr_dict, frame, in_types[0].rank) is None:
                continue
            required = tuple(canonical(broadcast_operand(frame, t.rank), t.shape) for t in in_types)
            modes.append(Mode(required, tuple(canonical(frame, t.shape) for t in out_types), frame=frame))
        return modes or [Mode(ids_in, ids_out)]
    return [Mode(ids_in, ids_out)]


def swapped(shape: tuple[int, ...]) -> Perm | None:
    """The layout with the last two axes swapped, when that is another memory order than row-major."""
    if len(shape) < 2:
        return None
    layout = canonical(swap_last_two(len(shape)), shape)
    return None if layout == identity(len(shape)) else layout


def matmul_modes(graph: Graph, node: Node, candidates: Callable[[str], list[Perm]]) -> list[Mode]:
    """A matmul's modes: each operand row-major or swapped (the library reads it through strides) and the
    product row-major or swapped (computed as Bᵀ @ Aᵀ), all free. A swapped layout is offered only where it
    is already a candidate (a neighbouring transpose or reshape made it one), so matmuls do not spread
    layouts of their own; constant operands stay row-major here and are permuted as the product needs."""
    values = (*node.inputs, *node.outputs)
    shapes = [graph.types[v].shape for v in values]
    if any(len(shape) < 2 for shape in shapes):
        return [Mode(tuple(identity(len(s)) for s in shapes[:2]), (identity(len(shapes[2])),))]
    options: list[list[Perm]] = []
    for value, shape in zip(values, shapes, strict=True):
        layout = swapped(shape)
        choices = [identity(len(shape))]
        if layout is not None and value not in graph.constants and layout in candidates(value):
            choices.append(layout)
        options.append(choices)
    if node.inputs[1] in graph.constants and node.inputs[0] not in graph.constants:
        # A product stored swapped is computed as Bᵀ @ Aᵀ: the constant B would become the library's left operand,
        # which it cannot pack, and the activation its right one, repacked every call (efficientformer_l1's
        # 49-token qkv product: 359 us so, 280 us as A @ B)
        options[2] = options[2][:1]
    return [Mode((a, b), (out,)) for a in options[0] for b in options[1] for out in options[2]]


def window_relabel(attrs: dict[str, Any], layout: Perm, rank: int) -> dict[str, Any] | None:
    """Pooling over the trailing axes, stored in `layout`: the window over the stored tensor's trailing axes
    (axes that are not pooled get a window of 1), or None when the pooled axes change order."""
    spatial = len(attrs["kernel"])
    pooled = list(range(rank - spatial, rank))
    positions = [layout.index(a) for a in pooled]
    if positions != sorted(positions):
        return None
    first = positions[0]
    kernel, strides, dilations, begin, end = [], [], [], [], []
    for axis in layout[first:]:
        if axis in pooled:
            i = pooled.index(axis)
            kernel.append(attrs["kernel"][i])
            strides.append(attrs["strides"][i])
            dilations.append(attrs["dilations"][i])
            begin.append(attrs["pads"][i])
            end.append(attrs["pads"][spatial + i])
        else:
            kernel.append(1)
            strides.append(1)
            dilations.append(1)
            begin.append(0)
            end.append(0)
    return {**attrs, "kernel": tuple(kernel), "strides": tuple(strides), "dilations": tuple(dilations),
            "pads": tuple(begin + end)}  # fmt: skip


def relabel_attrs(graph: Graph, node: Node, mode: Mode, materialized_perm: Perm | None) -> dict[str, Any]:
    """The node's attributes when it runs in `mode` on stored tensors."""
    attrs = node.attr_dict
    layout = mode.frame if mode.frame is not None else mode.outputs[0]
    if layout == identity(len(layout)) and not mode.channels_last and node.prim != "transpose":
        return attrs
    position = inverse(layout)  # logical axis -> its place in the stored tensor
    prim = node.prim
    if prim in CONV_PRIMS:
        return {**attrs, "channels_last": True}
    if prim.startswith("reduce_"):
        return {**attrs, "axes": tuple(sorted(position[a] for a in attrs["axes"]))}
    if prim.startswith("window_"):
        relabelled = window_relabel(attrs, layout, graph.types[node.inputs[0]].rank)
        assert relabelled is not None
        return relabelled
    if prim == "slice":
        return {**attrs, "ranges": permute(attrs["ranges"], layout)}
    if prim in ("concat", "split"):
        return {**attrs, "axis": position[attrs["axis"]]}
    if prim == "pad":
        rank = len(layout)
        pads = tuple(attrs["pads"])
        return {**attrs, "pads": permute(pads[:rank], layout) + permute(pads[rank:], layout)}
    if prim == "resize":
        return {**attrs, "sizes": permute(attrs["sizes"], layout), "scales": permute(attrs["scales"], layout)}
    if prim == "expand":
        return {**attrs, "shape": permute(attrs["shape"], layout)}
    if prim == "reshape":
        return {**attrs, "shape": permute(graph.types[node.outputs[0]].shape, layout)}
    if prim == "transpose":
        assert materialized_perm is not None
        return {**attrs, "perm": materialized_perm}
    return attrs  # elementwise: nothing to remap
