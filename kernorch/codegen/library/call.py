"""Describe a kernel built around a linear primitive as one oneDNN call: what is computed, no C.

A `LibraryCall` names the primitive (convolution, deconvolution, matmul), every tensor it touches as
oneDNN sees it (dims in oneDNN's order, element strides into the buffer kernorch holds), the geometry,
the bias and the post-ops of the epilogue (epilogue.py). Strides carry the layout: a channels-last conv
reads and writes `[N, H, W, C]` buffers, described to oneDNN as dims (N, C, H, W) with strides
(HWC, 1, WC, C); a matmul operand transposed inside the kernel is its untransposed buffer with the last two
strides swapped. Constant weights are marked so the call can pack them once when the plan is created.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import numpy as np

from kernorch.codegen.library.epilogue import Binary, Eltwise, Epilogue, EpilogueError, compile_epilogue
from kernorch.codegen.loops import NotGeneratable
from kernorch.ir.graph import Graph, Node
from kernorch.ir.kernel import CandidateKernel
from kernorch.ir.primitives import PRIMITIVES, STRIDED_VIEW_PRIMS, Kind
from kernorch.ir.strided import StridedView, row_major, strided_view

LIBRARY_DTYPE = "float32"  # oneDNN's f32 primitives; other dtypes fall back to the reference
# a bf16 call's operand may be stored bfloat16 (by the kernel producing it: kernorch/precision/)
OPERAND_DTYPES = {"f32": ("float32",), "bf16": ("float32", "bfloat16")}
ONEDNN_OP = {"conv": "convolution", "conv_transpose": "deconvolution", "matmul": "matmul"}


@dataclass(frozen=True)
class Tensor:
    slot: int  # argument position: the kernel's inputs, then its outputs
    dims: tuple[int, ...]  # in oneDNN's order
    strides: tuple[int, ...]  # elements, one per dim
    constant: bool = False  # known when the plan is created: weights may be packed once
    offset: int = 0  # elements into the buffer (a strided view of a slice or split, strided.py)
    dtype: str = "float32"  # of the buffer: "bfloat16" for a bf16 call's operand stored so


@dataclass(frozen=True)
class LibraryCall:
    op: str  # "convolution", "deconvolution" or "matmul"
    src: Tensor
    weights: Tensor
    bias: Tensor | None
    dst: Tensor
    strides: tuple[int, ...] = ()  # conv/deconv geometry, spatial dims only
    dilates: tuple[int, ...] = ()  # oneDNN counts dilation from 0
    pad_begin: tuple[int, ...] = ()
    pad_end: tuple[int, ...] = ()
    post_ops: tuple[tuple[Eltwise | Binary, Tensor | None], ...] = ()
    epilogue: Epilogue | None = None
    # "bf16": operands rounded to bfloat16 as they are packed, float32 sums and output; "int8": int8/uint8 source,
    # int8 weights, int32 sums, written as int32 or, dequantized by `scales`, as float32
    precision: str = "f32"
    src_zero: Tensor | None = None  # int8: the source's zero point (a scalar of its type, read on every run)
    scales: Tensor | None = None  # int8: float32 per tensor (1,) or per output channel (O,), times the sums
    # int8 written requantized (dst int8 or uint8): the float32 result divided by `dst_scale` (a float32 scalar),
    # rounded half to even, plus `dst_zero` (a float32 scalar holding an integer), saturated to the dst type
    dst_scale: Tensor | None = None
    dst_zero: Tensor | None = None
    widest_weight: int = 0  # int8: the largest |weight| (what decides whether oneDNN's sums are exact without VNNI)
    # float32 sums that must stay exact integers (an integer convolution in float32, fission/rules/integer_linear.py):
    # direct sums only, no transform that rounds (Winograd's)
    exact_sums: bool = False


def linear_node(kernel: CandidateKernel) -> tuple[int, Node]:
    linear = [i for i in kernel.nodes if PRIMITIVES[kernel.graph.nodes[i].prim].kind == Kind.LINEAR]
    if len(linear) != 1:
        raise NotGeneratable(f"{len(linear)} linear primitives in one library call")
    return linear[0], kernel.graph.nodes[linear[0]]


def _producer(graph: Graph, kernel: CandidateKernel, value: str) -> int | None:
    """The node of `kernel` computing `value`, or None when the kernel reads it."""
    return next((i for i in kernel.nodes if value in graph.nodes[i].outputs), None)


def is_bf16_cast(node: Node) -> bool:
    return node.prim == "cast" and node.attr("to") == "bfloat16"


def operand_conversions(graph: Graph, kernel: CandidateKernel, node: Node) -> dict[str, int]:
    """A bf16 linear primitive's operands converted to bfloat16 inside the kernel (the precision stage's cast,
    absorbed into the call: the call converts its float32 source on every run): operand → the cast's node.
    Raises NotGeneratable when the kernel would also have to write the converted value."""
    conversions: dict[str, int] = {}
    for value in dict.fromkeys(node.inputs):
        producer = _producer(graph, kernel, value)
        if producer is None or not is_bf16_cast(graph.nodes[producer]):
            continue
        if value in kernel.outputs:
            raise NotGeneratable(f"operand {value} is converted inside the call; the kernel cannot also write it")
        conversions[value] = producer
    return conversions


def stored_bf16(graph: Graph, kernel: CandidateKernel, absorbed: set[int]) -> int | None:
    """The cast to bfloat16 (its node) that converts the call's result as it is written, when the kernel ends in
    one (the precision stage's cast before the next bf16 primitive, fused into this call: oneDNN writes a
    bfloat16 destination, rounding to nearest even as the reference does)."""
    casts = [i for i in kernel.nodes if i not in absorbed and is_bf16_cast(graph.nodes[i])]
    if not casts:
        return None
    if linear_node(kernel)[1].attr("precision", "f32") != "bf16":  # oneDNN has no f32 conv writing bf16
        raise NotGeneratable("a float32 call writes float32: the conversion to bfloat16 runs elsewhere")
    if len(casts) > 1 or tuple(graph.nodes[casts[0]].outputs) != tuple(kernel.outputs):
        raise NotGeneratable("a conversion to bfloat16 that is not the call's only output")
    return casts[0]


def call_operand(graph: Graph, kernel: CandidateKernel, value: str) -> str:
    """The value a linear primitive's operand is read from: the float32 value of a conversion absorbed into the
    call (operand_conversions), else the operand itself."""
    producer = _producer(graph, kernel, value)
    return graph.nodes[producer].inputs[0] if producer is not None and is_bf16_cast(graph.nodes[producer]) else value


def operand_views(graph: Graph, kernel: CandidateKernel, node: Node) -> dict[str, StridedView]:
    """Matmul operands computed inside the kernel by layout primitives only (strided.py): operand (the value the
    call reads, `call_operand`) → its view. Raises NotGeneratable when such a chain needs a copy or the kernel
    would have to write a value of it."""
    views: dict[str, StridedView] = {}
    if node.prim != "matmul":
        return views
    nodes = set(kernel.nodes)
    for value in dict.fromkeys(call_operand(graph, kernel, v) for v in node.inputs):
        producer = _producer(graph, kernel, value)
        if producer is None or graph.nodes[producer].prim not in STRIDED_VIEW_PRIMS:
            continue
        view = strided_view(graph, nodes, value)
        if view is None:
            raise NotGeneratable(f"matmul operand {value}: its layout primitives are no strided view")
        if len(view.shape) >= 2 and 1 not in view.strides[-2:]:
            raise NotGeneratable(f"matmul operand {value}: neither of its last two axes is contiguous (oneDNN "
                                 "would run its reference matmul)")
        written = [out for i in view.nodes for out in graph.nodes[i].outputs if out in kernel.outputs]
        if written:
            raise NotGeneratable(f"matmul operand {value} is read through strides; the kernel cannot also write "
                                 f"{written[0]}")
        views[value] = view
    return views


def channel_axis(graph: Graph, node: Node) -> int:
    """The output axis a bias runs along: last for matmul and channels-last convs, else 1."""
    rank = graph.types[node.outputs[0]].rank
    return rank - 1 if node.prim in ("matmul", "matmul_integer") or node.attr("channels_last", False) else 1


def describe_library_call(kernel: CandidateKernel) -> LibraryCall:
    """The oneDNN call that runs `kernel`; NotGeneratable (with the reason) when there is none."""
    graph = kernel.graph
    index, node = linear_node(kernel)
    if node.prim in ("conv_integer", "matmul_integer"):
        return _integer_linear(kernel, index, node)
    allowed = OPERAND_DTYPES[node.attr("precision", "f32")]
    for value in node.inputs:
        if graph.types[value].dtype not in allowed:
            raise NotGeneratable(f"library calls need {' or '.join(allowed)}, {value} is {graph.types[value].dtype}")
    for value in node.outputs:
        if graph.types[value].dtype != LIBRARY_DTYPE:
            raise NotGeneratable(f"library calls need {LIBRARY_DTYPE}, {value} is {graph.types[value].dtype}")
    conversions = operand_conversions(graph, kernel, node)
    views = operand_views(graph, kernel, node)
    absorbed = {i for view in views.values() for i in view.nodes} | set(conversions.values())
    slots = {value: i for i, value in enumerate((*kernel.inputs, *kernel.outputs))}
    sources = {value: call_operand(graph, kernel, value) for value in node.inputs}
    for source in sources.values():  # what the call reads is a buffer: the kernel's input or a view of one
        if source not in slots and (source not in views or views[source].source not in slots):
            raise NotGeneratable(f"{node.prim} operand {source} is computed inside the kernel")
    stored = stored_bf16(graph, kernel, absorbed)
    outputs = kernel.outputs if stored is None else graph.nodes[stored].inputs
    try:
        epilogue = compile_epilogue(graph, index, kernel.nodes, outputs, channel_axis(graph, node),
                                    absorbed | ({stored} if stored is not None else set()))  # fmt: skip
    except EpilogueError as error:
        raise NotGeneratable(f"{node.prim} epilogue: {error}") from None
    dst_dtype = "float32"
    if stored is not None:  # the call writes its result as bfloat16 into the cast's output
        if epilogue.output != graph.nodes[stored].inputs[0]:
            raise NotGeneratable("the conversion to bfloat16 is not of the call's result")
        slots[epilogue.output], dst_dtype = slots[graph.nodes[stored].outputs[0]], "bfloat16"
    if node.prim == "matmul":
        call = _matmul(graph, node, sources, views, slots, epilogue)
    else:
        call = _convolution(graph, node, sources, slots, epilogue)
    described = _with_epilogue(graph, node, call, epilogue, slots, dst_dtype)
    return rows_merged(described) if described.op == "matmul" else described


def _with_epilogue(graph: Graph, node: Node, call: LibraryCall, epilogue: Epilogue, slots: dict[str, int],
                   dst_dtype: str) -> LibraryCall:  # fmt: skip
    """`call` with the epilogue's bias and post-ops as oneDNN sees them, writing `dst_dtype` to its output."""
    out_shape = graph.types[node.outputs[0]].shape
    to_dnnl = _dnnl_order(node, len(out_shape))
    if len(call.dst.dims) != len(out_shape) and (epilogue.bias or epilogue.post_ops):
        raise NotGeneratable("an epilogue on a matmul with a 1-D operand")
    bias = None
    if epilogue.bias is not None:
        bias_shape: tuple[int, ...] = (out_shape[channel_axis(graph, node)],)
        if node.prim == "matmul":  # oneDNN's matmul bias has the rank of dst
            bias_shape = (1,) * (len(call.dst.dims) - 1) + bias_shape
        bias = Tensor(slots[epilogue.bias], bias_shape, row_major(bias_shape), True)
    for op in epilogue.post_ops:  # an operand the kernel computes (a view absorbed into a matmul operand) has no
        if isinstance(op, Binary) and op.operand not in slots:  # buffer of its own to read (found on ResMLP)
            raise NotGeneratable(f"{node.prim} epilogue: the {op.alg} operand {op.operand} is computed inside the "
                                 "kernel")  # fmt: skip
    post_ops = tuple((op, _broadcast_tensor(graph, op.operand, out_shape, slots, to_dnnl, len(call.dst.dims))
                      if isinstance(op, Binary) else None) for op in epilogue.post_ops)  # fmt: skip
    return replace(call, bias=bias, dst=Tensor(slots[epilogue.output], call.dst.dims, call.dst.strides,
                                               dtype=dst_dtype),
                   post_ops=post_ops, epilogue=epilogue, precision=call.precision if call.precision == "int8" else
                   node.attr("precision", "f32"))  # fmt: skip


def _only_consumer(graph: Graph, kernel: CandidateKernel, value: str) -> int | None:
    """The kernel's one node reading `value`, when no other node (in or out of the kernel) does and the kernel does
    not write it."""
    readers = [i for i, n in enumerate(graph.nodes) if value in n.inputs]
    if len(readers) != 1 or readers[0] not in kernel.nodes or value in kernel.outputs:
        return None
    return readers[0]


def _integer_linear(kernel: CandidateKernel, index: int, node: Node) -> LibraryCall:
    """conv_integer or matmul_integer as oneDNN's int8 convolution or matmul: the source's zero point as its
    attribute, the dequantization that follows (a cast to float32, times a scale per tensor or per output channel)
    absorbed as its output scales, the rest of the epilogue as post-ops; without the cast it writes the int32
    sums. (On a CPU with AMX-INT8 oneDNN's matmul runs on the tiles, which kernorch's own int8 matmul does not.)"""
    graph = kernel.graph
    x, w, x_zero, w_zero = node.inputs
    convolution = node.prim == "conv_integer"
    if w not in graph.constants or graph.types[w].dtype != "int8":
        raise NotGeneratable(f"int8 {node.prim} weights must be constant int8 (packed once)")
    if w_zero not in graph.constants or np.any(graph.constants[w_zero] != 0):
        raise NotGeneratable(f"a weight zero point other than 0 (oneDNN's int8 {node.prim} takes none)")
    if graph.types[x_zero].numel != 1:
        raise NotGeneratable("a zero point per row of the source (oneDNN takes one per tensor)")
    if not convolution and graph.types[w].rank != 2:
        raise NotGeneratable(f"int8 matmul weights of rank {graph.types[w].rank} (2-D only)")
    if convolution and not node.attr("channels_last", False):
        raise NotGeneratable("an int8 convolution on NCHW buffers (oneDNN 3.2 runs it only by its reference "
                             "implementation; the layout stage lays it channels-last)")  # fmt: skip
    slots = {value: i for i, value in enumerate((*kernel.inputs, *kernel.outputs))}
    for value in (x, x_zero):
        if value not in slots:
            raise NotGeneratable(f"{node.prim} operand {value} is computed inside the kernel")
    absorbed, start, scales, dst_dtype = {index}, index, None, "int32"
    cast = _only_consumer(graph, kernel, node.outputs[0])
    if cast is not None and graph.nodes[cast].prim == "cast" and graph.nodes[cast].attr("to") == "float32":
        absorbed, start, dst_dtype = absorbed | {cast}, cast, "float32"
        floats = graph.nodes[cast].outputs[0]
        mul = _only_consumer(graph, kernel, floats)
        scale = next((v for v in graph.nodes[mul].inputs if v != floats), None) if mul is not None else None
        if mul is not None and graph.nodes[mul].prim == "mul" and scale is not None and scale in slots \
                and graph.types[scale].dtype == "float32" and _per_channel(graph, scale, node):  # fmt: skip
            absorbed, start, scales = absorbed | {mul}, mul, scale
    if dst_dtype == "int32" and len(kernel.nodes) > 1:
        raise NotGeneratable("an epilogue on int32 sums (only their dequantization is absorbed)")
    requantized = _requantization(graph, kernel, slots) if dst_dtype == "float32" else None
    outputs = kernel.outputs if requantized is None else (requantized.value,)
    skipped = absorbed - {start} | (set(requantized.nodes) if requantized is not None else set())
    try:
        epilogue = compile_epilogue(graph, start, kernel.nodes, outputs, channel_axis(graph, node), skipped)
    except EpilogueError as error:
        raise NotGeneratable(f"{node.prim} epilogue: {error}") from None
    if requantized is not None:  # the call writes the quantizer's integers into its cast's output
        if epilogue.output != requantized.value:
            raise NotGeneratable("the requantization is not of the call's result")
        slots[epilogue.output], dst_dtype = slots[requantized.output], graph.types[requantized.output].dtype
    operands = {x: x, w: w}
    call = _convolution(graph, node, operands, slots, epilogue) if convolution else \
        _matmul(graph, node, operands, {}, slots, epilogue)  # fmt: skip
    channels = graph.types[w].shape[0 if convolution else -1]
    scalar = (1,), (1,)
    call = replace(call, precision="int8", src_zero=Tensor(slots[x_zero], *scalar, x_zero in graph.constants,
                                                           dtype=graph.types[x_zero].dtype),
                   widest_weight=int(np.abs(graph.constants[w].astype(np.int32)).max(initial=0)),
                   scales=None if scales is None else Tensor(slots[scales], (channels,) if graph.types[scales].numel > 1
                                                             else (1,), (1,), scales in graph.constants))  # fmt: skip
    if requantized is not None:
        call = replace(call, dst_scale=Tensor(slots[requantized.scale], *scalar, requantized.scale in graph.constants),
                       dst_zero=Tensor(slots[requantized.zero], *scalar, requantized.zero in graph.constants))
    described = _with_epilogue(graph, node, call, epilogue, slots, dst_dtype)
    return described if convolution else rows_merged(described)


# The integers a saturating round to each type may write: oneDNN saturates an int8 or uint8 dst to them
_DST_RANGES = {"int8": (-128, 127), "uint8": (0, 255)}


@dataclass(frozen=True)
class Requantization:
    """A quantizer ending the kernel: `value` / scale → saturating round (+ zero point) → cast to int8 or uint8."""

    value: str  # the float32 value quantized (the call's result after its epilogue)
    nodes: tuple[int, int, int]  # the division, the saturating round and the cast
    scale: str  # float32 scalars the kernel reads
    zero: str
    output: str  # the integers: the kernel's one output


def _requantization(graph: Graph, kernel: CandidateKernel, slots: dict[str, int]) -> Requantization | None:
    """The quantizer ending the kernel where oneDNN can write it as the call's dst (a scale and zero point of one
    element each, the type's full range, nothing else reading its intermediate values), else None."""
    if len(kernel.outputs) != 1:
        return None
    (output,) = kernel.outputs
    cast = _producer(graph, kernel, output)
    dtype = graph.types[output].dtype
    if cast is None or graph.nodes[cast].prim != "cast" or dtype not in _DST_RANGES:
        return None
    rounding = _producer(graph, kernel, graph.nodes[cast].inputs[0])
    if rounding is None or graph.nodes[rounding].prim != "saturating_round" \
            or _only_consumer(graph, kernel, graph.nodes[rounding].outputs[0]) != cast:  # fmt: skip
        return None
    quotient, zero, low, high = graph.nodes[rounding].inputs
    bounds = [graph.constants[v] for v in (low, high) if v in graph.constants]
    if len(bounds) != 2 or tuple(float(b.reshape(-1)[0]) if b.size == 1 else None for b in bounds) \
            != _DST_RANGES[dtype]:  # fmt: skip
        return None
    division = _producer(graph, kernel, quotient)
    if division is None or graph.nodes[division].prim != "div" \
            or _only_consumer(graph, kernel, quotient) != rounding:  # fmt: skip
        return None
    value, scale = graph.nodes[division].inputs
    if _only_consumer(graph, kernel, value) != division or \
            any(v not in slots or graph.types[v].numel != 1 or graph.types[v].dtype != "float32"
                for v in (scale, zero)):  # fmt: skip
        return None
    return Requantization(value, (division, rounding, cast), scale, zero, output)


def _per_channel(graph: Graph, scale: str, node: Node) -> bool:
    """A scale per tensor, or one per output channel broadcast along the conv's channel axis only."""
    if graph.types[scale].numel == 1:
        return True
    out_shape = graph.types[node.outputs[0]].shape
    shape = graph.types[scale].shape
    axis = channel_axis(graph, node) - (len(out_shape) - len(shape))
    return 0 <= axis < len(shape) and shape[axis] == out_shape[channel_axis(graph, node)] \
        and graph.types[scale].numel == shape[axis]  # fmt: skip


def _merged_rows(tensor: Tensor) -> tuple[int, int] | None:
    """The leading axes of a matmul tensor (batch axes and rows) as one axis: (rows, their stride), or None when
    the strides do not lay them out as one axis (a size-1 axis has no say in that)."""
    axes = [(d, s) for d, s in zip(tensor.dims[:-1], tensor.strides[:-1], strict=True) if d != 1]
    for (_, outer), (size, inner) in itertools.pairwise(axes):
        if outer != inner * size:
            return None
    rows = int(np.prod([d for d, _ in axes], dtype=np.int64))
    return rows, axes[-1][1] if axes else tensor.dims[-1] * tensor.strides[-1]


def _as_rows(tensor: Tensor, rows: tuple[int, int], lead: int = 0) -> Tensor:
    """The tensor as [rows, columns], behind `lead` axes of size 1."""
    return replace(tensor, dims=(1,) * lead + (rows[0], tensor.dims[-1]),
                   strides=(rows[0] * rows[1],) * lead + (rows[1], tensor.strides[-1]))


def rows_merged(call: LibraryCall) -> LibraryCall:
    """`call` as one 2-D matmul [rows, K] x [K, N] (3-D [1, rows, K] x [1, K, N] with a per-row post-op, below)
    when its weights are the same matrix for every batch (all their batch axes 1: a linear layer applied to
    [B, H, W, C] or [B, S, C]) and every other tensor's batch axes and rows are laid out as one axis. oneDNN 3.2
    keeps the weights of a 4-D matmul in their plain layout and repacks blocks of them on every run (swin_t's
    [1, 7, 7, 768] x [1, 1, 768, 3072]: 26 GFLOP/s); as a 2-D matmul it packs them once. The call otherwise stays
    as described."""
    weights = call.weights
    if len(weights.dims) <= 2 or any(d != 1 for d in weights.dims[:-2]):
        return call
    tensors = [call.src, call.dst, *(t for _, t in call.post_ops if t is not None)]
    merged = [_merged_rows(t) for t in tensors]
    src_rows = merged[0]
    if src_rows is None or merged[1] is None or merged[1][0] != src_rows[0]:
        return call
    if any(m is None or m[0] not in (1, src_rows[0]) for m in merged[2:]):
        return call
    # a post-op operand with a value per row and one for every column (a layer norm's 1/σ moved past the matmul)
    # is mask 1 on a 2-D matmul, and mask 6 on a 4-D one ([1, H, W, 1]), which oneDNN 3.2 runs only by its
    # reference matmul (197x192x768: 540 ms, against 0.63 ms 3-D; swin_t's bf16 MLPs 2.4 s each): such a call
    # is one 3-D matmul [1, rows, K] x [1, K, N], where a value per row is mask 2, which its brgemm takes
    columns = call.dst.dims[-1]
    per_row = columns > 1 and any(m is not None and m[0] > 1 and t.dims[-1] == 1 for m, t in
                                  zip(merged[2:], (t for _, t in call.post_ops if t is not None), strict=True))
    lead = 1 if per_row else 0
    post_ops = tuple((op, None if t is None else _as_rows(t, _merged_rows(t) or (1, 1), lead))
                     for op, t in call.post_ops)  # fmt: skip
    bias = None if call.bias is None else _as_rows(call.bias, (1, call.bias.dims[-1]), lead)
    return replace(call, src=_as_rows(call.src, src_rows, lead), dst=_as_rows(call.dst, merged[1], lead),
                   weights=replace(weights, dims=(1,) * lead + weights.dims[-2:],
                                   strides=weights.strides[-2 - lead:]),
                   bias=bias, post_ops=post_ops)  # fmt: skip


def _dnnl_order(node: Node, rank: int) -> tuple[int, ...]:
    """For each oneDNN dim, the logical axis it is: channels-last convs see (N, C, spatial...)."""
    if node.prim != "matmul" and node.attr("channels_last", False):
        return (0, rank - 1, *range(1, rank - 1))
    return tuple(range(rank))


def _described(shape: tuple[int, ...], order: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    strides = row_major(shape)
    return tuple(shape[a] for a in order), tuple(strides[a] for a in order)


def _broadcast_tensor(graph: Graph, value: str, out_shape: tuple[int, ...], slots: dict[str, int],
                      order: tuple[int, ...], dst_rank: int) -> Tensor:  # fmt: skip
    shape = graph.types[value].shape
    padded = (1,) * (len(out_shape) - len(shape)) + shape
    dims, strides = _described(padded, order)
    extra = dst_rank - len(dims)  # matmul dst promoted from 1-D operands
    return Tensor(slots[value], (1,) * extra + dims, (1,) * extra + strides, value in graph.constants)


def _convolution(graph: Graph, node: Node, sources: dict[str, str], slots: dict[str, int],
                 epilogue: Epilogue) -> LibraryCall:  # fmt: skip
    x, w = (sources[value] for value in node.inputs[:2])
    attrs = node.attr_dict
    x_shape, w_shape = graph.types[x].shape, graph.types[w].shape
    out_shape = graph.types[node.outputs[0]].shape
    spatial = len(x_shape) - 2
    if spatial not in (1, 2, 3):
        raise NotGeneratable(f"{spatial}-d {node.prim}")
    order = _dnnl_order(node, len(x_shape))
    src_dims, src_strides = _described(x_shape, order)
    dst_dims, dst_strides = _described(out_shape, order)
    group = int(attrs["group"])
    kernel_size = w_shape[2:]
    pads = tuple(int(p) for p in attrs["pads"])
    begin, end = pads[:spatial], pads[spatial:]
    if node.prim in ("conv", "conv_integer"):
        op = "convolution"
        grouped = (group, w_shape[0] // group, w_shape[1], *kernel_size) if group > 1 else w_shape
        w_dims, w_strides = grouped, row_major(grouped)
    else:
        op = "deconvolution"
        # ONNX [C_in, C_out/g, k...]; oneDNN wants (g,) OC/g, IC/g, k... : the two channel axes swap strides
        per_group = (group, w_shape[0] // group, w_shape[1], *kernel_size)
        strides = row_major(per_group)
        if group > 1:
            w_dims = (group, w_shape[1], w_shape[0] // group, *kernel_size)
            w_strides = (strides[0], strides[2], strides[1], *strides[3:])
        else:
            w_dims = (w_shape[1], w_shape[0], *kernel_size)
            w_strides = (strides[2], strides[1], *strides[3:])
        # oneDNN has no output_padding: it is padding taken off the end
        end = tuple(e - int(p) for e, p in zip(end, attrs["output_padding"], strict=True))
        if any(e < 0 for e in end):
            raise NotGeneratable("conv_transpose output_padding beyond its end padding")
    src = Tensor(slots[x], src_dims, src_strides, x in graph.constants, dtype=graph.types[x].dtype)
    weights = Tensor(slots[w], tuple(w_dims), tuple(w_strides), w in graph.constants, dtype=graph.types[w].dtype)
    dst = Tensor(slots[epilogue.output], dst_dims, dst_strides)
    return LibraryCall(op, src, weights, None, dst, tuple(int(s) for s in attrs["strides"]),
                       tuple(int(d) - 1 for d in attrs["dilations"]), tuple(begin), tuple(end),
                       epilogue=epilogue, exact_sums=bool(attrs.get("exact_sums", False)))  # fmt: skip


def _matmul(graph: Graph, node: Node, sources: dict[str, str], views: dict[str, StridedView],
            slots: dict[str, int], epilogue: Epilogue) -> LibraryCall:  # fmt: skip
    a, b = (sources[value] for value in node.inputs[:2])
    a_shape, b_shape = graph.types[a].shape, graph.types[b].shape
    if len(a_shape) == 1:
        a_shape = (1, *a_shape)
    if len(b_shape) == 1:
        b_shape = (*b_shape, 1)
    rank = max(len(a_shape), len(b_shape))
    a_shape = (1,) * (rank - len(a_shape)) + a_shape
    b_shape = (1,) * (rank - len(b_shape)) + b_shape
    batch = tuple(int(d) for d in np.broadcast_shapes(a_shape[:-2], b_shape[:-2]))
    dst_dims = (*batch, a_shape[-2], b_shape[-1])

    def operand(value: str, shape: tuple[int, ...]) -> Tensor:
        view = views.get(value)
        if view is None:
            return Tensor(slots[value], shape, row_major(shape), value in graph.constants,
                          dtype=graph.types[value].dtype)  # fmt: skip
        if len(view.shape) < 2:
            raise NotGeneratable(f"matmul operand {value}: a 1-D strided view")
        extent = max(s * n for s, n in zip(view.strides, view.shape, strict=True))
        strides = (extent,) * (len(shape) - len(view.shape)) + view.strides  # leading size-1 batch axes
        return Tensor(slots[view.source], shape, strides, view.source in graph.constants, view.offset,
                      graph.types[view.source].dtype)  # fmt: skip

    return LibraryCall("matmul", operand(a, a_shape), operand(b, b_shape), None,
                       Tensor(slots[epilogue.output], dst_dims, row_major(dst_dims)), epilogue=epilogue)  # fmt: skip


def _operand_summary(graph: Graph, view: StridedView) -> str:
    prims = [graph.nodes[i].prim for i in view.nodes]
    return "transposed operand" if prims == ["transpose"] else f"strided operand ({' → '.join(prims)})"


def absorbed_summary(kernel: CandidateKernel) -> str | None:
    """What a library kernel absorbed, by kind ("conv ← bias, mul tensor, swish"); None if it is not one."""
    if not any(PRIMITIVES[n.prim].kind == Kind.LINEAR for n in kernel.primitives):
        return None
    try:
        call = describe_library_call(kernel)
    except NotGeneratable:
        return None
    _, node = linear_node(kernel)
    epilogue = call.epilogue
    assert epilogue is not None
    parts = [_operand_summary(kernel.graph, view) for view in operand_views(kernel.graph, kernel, node).values()]
    parts += ["converted operand"] * len(operand_conversions(kernel.graph, kernel, node))
    parts += ["bias"] if epilogue.bias else []
    parts += [f"{op.alg} tensor" if isinstance(op, Binary) else op.describe() for op in epilogue.post_ops]
    layout = " (channels-last)" if node.attr("channels_last", False) else ""
    precision = f" [{call.precision}]" if call.precision != "f32" else ""
    return f"{node.prim}{layout}{precision}" + (f" ← {', '.join(parts)}" if parts else "")
