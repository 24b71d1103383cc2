"""A convolution or matmul over few output rows, streaming its weights once: in generated C.

A convolution whose output has a handful of pixels — a CNN's last stage on a small image (resnet18's 512 → 512
3x3 convs on a 2x2 map at 64x64 input), or a classifier's matmul over one row — does ~2 FLOPs per weight it reads:
its time is the time to stream the weights (9.4 MB for that conv) from the cache or memory. oneDNN's kernels,
blocked for many rows, read them at ~30 GB/s there (310 µs in place), onnxruntime's at ~34, below what two
threads stream from this host's cache (~47 GB/s).

Here each weight is read once per call: the output channels are cut into chunks of a few vectors (a parallel item
each), whose weights are packed at create as one contiguous stream [tap][input channel][chunk's lanes], prefetched
PREFETCH_BYTES ahead. A register block holds every output row of the chunk (up to KO_VC_ACCUMULATORS / vectors of
them, at most 12; more rows take another pass over the chunk's weights, now in L2), accumulated from the bias;
each source element is broadcast once per row. The rows' source offsets per tap are a table computed here from
the static geometry (a padded tap reads a row of zeros, as the zero-padded convolution does; a tap that every row
reads in the padding is not packed at all), so one loop serves strides, dilations, padding, batch and a matmul's
rows.
The block is stored to a tile in L1, then the post-ops run on it as it is written out. A run allocates nothing.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from kernorch.codegen.backends.library_calls import LibraryCallBackend
from kernorch.codegen.c import CWriter
from kernorch.codegen.library import (
    LibraryCall,
    Tensor,
    binary_operands,
    post_op_loop,
    post_op_statements,
    post_ops_rejection,
)
from kernorch.codegen.native.skeleton import VECTOR_TYPES, create_function, run_function, weights_pointer

MAX_ROWS = 16  # output pixels (or matmul rows): beyond, a product reuses each weight enough to be compute-bound
# ... unless its weights are too many to stay in a core's L2 between inferences: then they come from L3 in place,
# where oneDNN's blocked product waits on them (efficientformer_l1's 49-token 448 -> 1792 products: 300-330 us in
# place against 180 profiled hot) and the stream, prefetched ahead, still wins up to 64 rows (in-process A/B:
# efficientformer_l1 0.95x the time with every product of <= 64 rows streamed; googlenet 1.04x, its 8x8 maps'
# weights all below 1 MiB, so those stay with oneDNN)
MAX_ROWS_COLD = 64
COLD_WEIGHT_BYTES = 1 << 20
MIN_WEIGHT_BYTES = 1 << 16  # below this the weights are no stream: oneDNN's blocking is as good
# how far ahead of its reads a chunk prefetches its weight stream: the reads in flight that cover L3's latency
# at its bandwidth. 8 KiB streamed 1.2-1.6x faster than 1-2 KiB (the former 8 rows) on 1-, 4- and 16-row
# products, 8 convs in a row (2026-11-28, AMX host); 16 KiB was no better.
PREFETCH_BYTES = 8192
MAX_VECTORS = 4  # output-channel vectors per chunk; fewer when that leaves few parallel items
MIN_VECTORS = 2  # with more rows than 24 / 2, a second register block
MAX_BLOCK_ROWS = 12  # the rows' source pointers of a block stay in general registers
MIN_CHUNKS = 4  # parallel items for two threads to share evenly


@dataclass(frozen=True)
class Geometry:
    """The product as rows x taps of source offsets: out[row, o] = bias[o] + Σ_tap Σ_i src[at[tap][row] + i·src_c]
    · w[o, i, tap]. `weight` is the C expression of w[o, i, ky, kx] in the caller's weights."""

    inputs: int  # per tap: input channels, or K
    outputs: int  # output channels, or N
    taps: tuple[tuple[int, int], ...]  # the (ky, kx) some row reads outside the padding, in packing order
    sources: tuple[tuple[int, ...], ...]  # per tap, per row: elements past the source's first, -1 in the padding
    destinations: tuple[int, ...]  # per row: elements past the destination's first
    coordinates: tuple[tuple[int, int, int], ...]  # per row: (n, y, x) for the binary post-ops' operands
    source_channel: int  # stride between a row's input channels
    destination_channel: int  # stride between a row's output channels
    weight: str
    operands: tuple[Tensor | None, ...]  # the post-ops' operands, as [n, c, y, x] tensors


def _matrix(tensor: Tensor) -> tuple[int, int, int, int] | None:
    """(rows, columns, row stride, column stride) of a tensor whose leading dims are all 1."""
    if len(tensor.dims) < 2 or any(d != 1 for d in tensor.dims[:-2]):
        return None
    (rows, columns), (row_stride, column_stride) = tensor.dims[-2:], tensor.strides[-2:]
    return rows, columns, row_stride, column_stride


def _conv_geometry(call: LibraryCall) -> Geometry | str:
    if len(call.src.dims) != 4 or len(call.weights.dims) != 4:
        return "not a 2-d convolution without groups"
    batch, in_channels, height, width = call.src.dims
    out_channels, _, kernel_h, kernel_w = call.weights.dims
    _, _, out_h, out_w = call.dst.dims
    src_n, src_c, src_y, src_x = call.src.strides
    dst_n, dst_c, dst_y, dst_x = call.dst.strides
    w_o, w_i, w_y, w_x = call.weights.strides
    stride_y, stride_x = call.strides
    dilate_y, dilate_x = (d + 1 for d in call.dilates)
    pad_y, pad_x = call.pad_begin
    rows = list(itertools.product(range(batch), range(out_h), range(out_w)))

    def source(n: int, y: int, x: int, ky: int, kx: int) -> int:
        at_y, at_x = y * stride_y - pad_y + ky * dilate_y, x * stride_x - pad_x + kx * dilate_x
        inside = 0 <= at_y < height and 0 <= at_x < width
        return n * src_n + at_y * src_y + at_x * src_x if inside else -1

    taps, sources = [], []
    for ky, kx in itertools.product(range(kernel_h), range(kernel_w)):
        offsets = tuple(source(n, y, x, ky, kx) for n, y, x in rows)
        if any(offset >= 0 for offset in offsets):
            taps.append((ky, kx))
            sources.append(offsets)
    return Geometry(in_channels, out_channels, tuple(taps), tuple(sources),
                    tuple(n * dst_n + y * dst_y + x * dst_x for n, y, x in rows), tuple(rows),
                    src_c, dst_c, f"w[(long)o * {w_o} + (long)i * {w_i} + (long)ky * {w_y} + (long)kx * {w_x}]",
                    tuple(tensor for _, tensor in call.post_ops))  # fmt: skip


def _matmul_geometry(call: LibraryCall) -> Geometry | str:
    src, weights, dst = _matrix(call.src), _matrix(call.weights), _matrix(call.dst)
    if src is None or weights is None or dst is None:
        return "a batched matmul"
    rows, inputs, src_m, src_k = src
    _, outputs, w_k, w_n = weights
    _, _, dst_m, dst_n = dst
    operands: list[Tensor | None] = []
    for _, tensor in call.post_ops:
        operand = None if tensor is None else _matrix(tensor)
        if tensor is not None and operand is None:
            return "a post-op operand with batch dims"
        # as a [1, columns, 1, rows] tensor: a matmul's row is the conv's x
        operands.append(None if tensor is None or operand is None else
                        Tensor(tensor.slot, (1, operand[1], 1, operand[0]), (0, operand[3], 0, operand[2]),
                               tensor.constant, tensor.offset, tensor.dtype))  # fmt: skip
    return Geometry(inputs, outputs, ((0, 0),), (tuple(m * src_m for m in range(rows)),),
                    tuple(m * dst_m for m in range(rows)), tuple((0, 0, m) for m in range(rows)),
                    src_k, dst_n, f"w[(long)i * {w_k} + (long)o * {w_n}]", tuple(operands))  # fmt: skip


def geometry(call: LibraryCall) -> Geometry | str:
    """The call's rows and taps, or why it is no product this kernel computes."""
    if call.op == "convolution":
        return _conv_geometry(call)
    if call.op == "matmul":
        return _matmul_geometry(call)
    return f"a {call.op}"


def streaming_rejection(call: LibraryCall) -> str | None:
    """Why the streaming kernel does not run `call` (None when it does)."""
    if call.op == "convolution" and len(call.dst.dims) == 4 and len(call.weights.dims) == 4:
        rows = call.dst.dims[0] * call.dst.dims[2] * call.dst.dims[3]
        if rows > max(MAX_ROWS, MAX_ROWS_COLD):  # whatever its weights: told before every row's taps are listed
            return f"{rows} output rows reuse each of {4 * math.prod(call.weights.dims)} bytes of weights: " \
                "oneDNN's blocking pays off"  # fmt: skip
    shape = geometry(call)
    if isinstance(shape, str):
        return shape
    weight_bytes = 4 * shape.inputs * shape.outputs * len(shape.taps)
    rows = len(shape.destinations)
    if rows > (MAX_ROWS_COLD if weight_bytes >= COLD_WEIGHT_BYTES else MAX_ROWS):
        return f"{rows} output rows reuse each of {weight_bytes} bytes of weights: oneDNN's blocking pays off"
    if weight_bytes < MIN_WEIGHT_BYTES:
        return f"{weight_bytes} bytes of weights are no stream"
    if call.bias is not None and call.bias.dims[-1] != shape.outputs:
        return "a bias that is not one per output channel"
    return post_ops_rejection(call.post_ops)


def chunk_vectors(rows: int, outputs: int) -> int:
    """Output-channel vectors (of 16 lanes) per parallel item: as many as keep every row in registers with
    AVX-512's 24 accumulators, up to MAX_VECTORS, and fewer while that leaves under MIN_CHUNKS items."""
    vectors = min(MAX_VECTORS, max(MIN_VECTORS, 24 // rows))
    while vectors > 1 and -(-outputs // (16 * vectors)) < MIN_CHUNKS:
        vectors -= 1
    return vectors


def _table(values: tuple[int, ...]) -> str:
    return "{" + ", ".join(f"{v}L" for v in values) + "}"


def packed_state(w: CWriter, name: str, call: LibraryCall, shape: Geometry, vectors: int) -> None:
    """The macros of a product kernel's blocking (`<name>_VECTORS` per chunk, `_CHUNK` channels, `_CHUNKS`,
    `_ROWS` per register block), its state and `<name>_create`: the weights of each chunk packed as one stream
    [tap][input channel][chunk's lanes] (zeros past the outputs, and `<name>_PREFETCH` rows of them past the end
    for the prefetches), the bias padded to whole chunks."""
    taps, inputs, outputs = len(shape.taps), shape.inputs, shape.outputs
    chunk, chunks = f"{name}_CHUNK", f"{name}_CHUNKS"
    stream = f"{chunks} * {chunk} * {taps * inputs}L + {name}_PREFETCH * {chunk}"  # floats
    bias = f"(const float *)a[{call.bias.slot}] + {call.bias.offset}" if call.bias is not None else "NULL"
    bias_stride = call.bias.strides[-1] if call.bias is not None else 0
    unpack = "const long ky = 0, kx = 0;"  # a matmul's one tap
    if call.op == "convolution":
        ky_table = _table(tuple(ky for ky, _ in shape.taps))
        kx_table = _table(tuple(kx for _, kx in shape.taps))
        unpack = f"static const long ky_of[{taps}] = {ky_table}, kx_of[{taps}] = {kx_table}; " \
                 "const long ky = ky_of[t], kx = kx_of[t];"  # fmt: skip
    w.line(VECTOR_TYPES,
           f"#define {name}_VECTORS {vectors}",
           f"#define {chunk} ({name}_VECTORS * KO_VC_LANES)  /* output channels per item */",
           f"#define {chunks} (({outputs} + {chunk} - 1) / {chunk})",
           f"#define {name}_PREFETCH ({PREFETCH_BYTES} / (4 * {chunk}))  /* weight rows ahead */",
           # rows per register block: as many as the accumulators hold, and no more row pointers than GPRs
           f"#define {name}_ROWS (KO_VC_ACCUMULATORS / {name}_VECTORS < {MAX_BLOCK_ROWS} ? "
           f"KO_VC_ACCUMULATORS / {name}_VECTORS : {MAX_BLOCK_ROWS})")  # fmt: skip
    with create_function(w, name, "float *w; float *bias;", ["w", "bias"],
                         [f"s->w = (float *)aligned_alloc(64, (({stream}) * 4 + 63) / 64 * 64);",
                          f"s->bias = (float *)aligned_alloc(64, {chunks} * {chunk} * 4);"]):  # fmt: skip
        w.line(f"const float *w = {weights_pointer(call)};", f"const float *bias = {bias};")
        with w.block(f"for (long o = 0; o < (long){chunks} * {chunk}; o++)"):
            w.line(f"const long item = o / {chunk}, lane = o % {chunk};",
                   f"s->bias[o] = bias && o < {outputs} ? bias[o * {bias_stride}] : 0.0f;")
            with w.block(f"for (int t = 0; t < {taps}; t++)"):
                w.line(unpack, "(void)ky; (void)kx;")
                w.nest(f"for (long i = 0; i < {inputs}; i++)",
                       f"s->w[((item * {taps} + t) * {inputs} + i) * {chunk} + lane] = "
                       f"o < {outputs} ? {shape.weight} : 0.0f;")
        w.line(f"for (long f = (long){chunks} * {chunk} * {taps * inputs}; f < {stream}; f++) s->w[f] = 0.0f;")


def register_block(w: CWriter, name: str, shape: Geometry) -> None:
    """`<name>_block(w, bias, tile, row, rows)`: `rows` rows x one chunk accumulated from the bias over every tap
    and input channel, then stored to `tile` (rows x the chunk's lanes); row r reads tap t's elements from
    row[t * <name>_ROWS + r]. Always inlined, with `rows` a constant at every call: the accumulators stay in
    registers."""
    taps, inputs, most, chunk = len(shape.taps), shape.inputs, f"{name}_ROWS", f"{name}_CHUNK"
    with w.function(f"static inline __attribute__((always_inline)) void {name}_block(const float *restrict w, "
                    "const float *restrict bias, float *restrict tile, const float *const *row, int rows)",
                    returns=None):  # fmt: skip
        w.line(f"ko_vc acc[{most}][{name}_VECTORS];")
        w.nest("for (int r = 0; r < rows; r++)",
               f"for (int v = 0; v < {name}_VECTORS; v++) acc[r][v] = *(const ko_vc *)(bias + v * KO_VC_LANES);")
        with w.block(f"for (int t = 0; t < {taps}; t++)"):
            w.line(f"const float *in[{most}];", f"for (int r = 0; r < rows; r++) in[r] = row[t * {most} + r];",
                   f"const float *wt = w + (long)t * {inputs} * {chunk};")
            with w.block(f"for (long i = 0; i < {inputs}; i++)"):
                w.line(f"for (int v = 0; v < {name}_VECTORS; v++) "
                       f"__builtin_prefetch(wt + (i + {name}_PREFETCH) * {chunk} + v * KO_VC_LANES);",
                       f"ko_vc wv[{name}_VECTORS];",
                       f"for (int v = 0; v < {name}_VECTORS; v++) "
                       f"wv[v] = *(const ko_vc *)(wt + i * {chunk} + v * KO_VC_LANES);")  # fmt: skip
                with w.block("for (int r = 0; r < rows; r++)"):
                    w.line(f"const float x = in[r][i * {shape.source_channel}];",
                           f"for (int v = 0; v < {name}_VECTORS; v++) acc[r][v] += x * wv[v];")
        w.nest("for (int r = 0; r < rows; r++)",
               f"for (int v = 0; v < {name}_VECTORS; v++) *(ko_vc *)(tile + r * {chunk} + v * KO_VC_LANES) = "
               "acc[r][v];")


def zero_row(name: str, shape: Geometry) -> str:
    """The row of zeros a padded tap reads (as long as a row's input channels span)."""
    return f"static const float {name}_zeros[{(shape.inputs - 1) * shape.source_channel + 1}] " \
           "__attribute__((aligned(64)));"  # fmt: skip


def block_switch(w: CWriter, name: str, most_rows: int, arguments: str) -> None:
    """`<name>_block(arguments, rows)` dispatched on the C variable `rows` (1..most_rows) so each call has a
    constant row count; the cases past an ISA's `<name>_ROWS` are compiled out."""
    with w.block("switch (rows)"):
        for count in range(1, min(most_rows, MAX_BLOCK_ROWS) + 1):
            w.verbatim(f"#if {count} <= {name}_ROWS")
            w.line(f"case {count}: {name}_block({arguments}, {count}); break;")
            w.verbatim("#endif")


def store_tile(w: CWriter, name: str, epilogue: list[str], destination_channel: int) -> None:
    """Write the tile's row r (channels c0..c1 of the chunk) to `o`, each value through the post-ops."""
    w.line(f"const float *t = tile + r * {name}_CHUNK - c0;")
    post_op_loop(w, "t", "c0", "c1", epilogue, simd=True, store=f"o[(long)c * {destination_channel}]")


def chunk_bounds(name: str, outputs: int) -> str:
    return f"const int c0 = chunk * {name}_CHUNK, c1 = c0 + {name}_CHUNK < {outputs} ? c0 + {name}_CHUNK : {outputs};"


def render_streaming_product(name: str, call: LibraryCall) -> str:
    """C for `call` (which `streaming_rejection` accepted): state, create, run, destroy."""
    shape = geometry(call)
    assert not isinstance(shape, str), shape
    rows, taps, inputs = len(shape.destinations), len(shape.taps), shape.inputs
    padded = any(offset < 0 for offsets in shape.sources for offset in offsets)
    pointers, operand_elements = binary_operands(tuple((op, t) for (op, _), t in
                                                       zip(call.post_ops, shape.operands, strict=True)))  # fmt: skip
    epilogue = post_op_statements(call.post_ops, operand_elements)
    most = f"{name}_ROWS"
    w = CWriter()
    packed_state(w, name, call, shape, chunk_vectors(rows, shape.outputs))
    w.line(f"static const long {name}_src[{taps}][{rows}] = {{"
           + ", ".join(_table(offsets) for offsets in shape.sources) + "};  /* -1: in the padding */",
           f"static const long {name}_dst[{rows}] = {_table(shape.destinations)};",
           *([zero_row(name, shape)] if padded else []))  # fmt: skip
    register_block(w, name, shape)
    with run_function(w, name, call):
        w.line(*pointers, "#pragma omp parallel for schedule(static)")
        with w.block(f"for (int chunk = 0; chunk < {name}_CHUNKS; chunk++)"):
            w.line(chunk_bounds(name, shape.outputs),
                   f"const float *w = s->w + (long)chunk * {taps * inputs} * {name}_CHUNK, *b = s->bias + c0;",
                   f"float tile[{most} * {name}_CHUNK] __attribute__((aligned(64)));")  # fmt: skip
            with w.block(f"for (int first = 0; first < {rows}; first += {most})"):
                w.line(f"const int rows = {rows} - first < {most} ? {rows} - first : {most};",
                       f"const float *row[{taps} * {most}];", f"for (int t = 0; t < {taps}; t++)")
                with w.indented(), w.block("for (int r = 0; r < rows; r++)"):
                    w.line(f"const long at = {name}_src[t][first + r];",
                           f"row[t * {most} + r] = at < 0 ? {name}_zeros : src + at;" if padded else
                           f"row[t * {most} + r] = src + at;")  # fmt: skip
                block_switch(w, name, rows, "w, b, tile, row")
                with w.block("for (int r = 0; r < rows; r++)"):
                    w.line("const int p = first + r;")
                    if pointers:  # the binary post-ops' operands are indexed by them
                        w.extend(f"static const long {name}_{axis}[{rows}] = "
                                 f"{_table(tuple(c[k] for c in shape.coordinates))};" for k, axis in enumerate("nyx"))
                        w.line(f"const long n = {name}_n[p], y = {name}_y[p], x = {name}_x[p];")
                    w.line(f"float *o = dst + {name}_dst[p];")
                    store_tile(w, name, epilogue, shape.destination_channel)
    return w.text(end="\n")


# oneDNN reads the weights of a product over a few output rows below the cache's bandwidth
BACKEND = LibraryCallBackend("streaming_product", "native C", "C product over few rows, weights read once",
                             streaming_rejection, render_streaming_product)  # fmt: skip
