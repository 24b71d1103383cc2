"""A convolution over few input channels (a CNN's stem over RGB), as register blocks of output pixels: in C.

oneDNN's convolutions vectorize and block over input channels; with three of them (an image's stem) most of that
is padding: squeezenet1_1's 3 → 64 3x3 stride-2 conv ran at 40 GFLOP/s in place (83 µs at 64x64), shufflenet's
3 → 24 at 112x112 at 76 GFLOP/s (214 µs), efficientvit's 3 → 8 at 56 GFLOP/s.

The product kernel of streaming_product.py computes it with its rows computed rather than tabled: a parallel
item is one output row of one chunk of output-channel vectors; the row's pixels go in register blocks of
`<name>_ROWS`, each pixel's source offset per tap computed from the geometry (a tap in the padding reads a row of
zeros, as the zero-padded convolution does), every tap x input channel one broadcast per pixel against the
chunk's packed weights (in L1: 27 x 64 floats for a 3x3 stem). The post-ops run on the block's tile as it is
written out. A run allocates nothing.
"""

from __future__ import annotations

import itertools

from kernorch.codegen.backends.library_calls import LibraryCallBackend
from kernorch.codegen.c import CWriter
from kernorch.codegen.library import LibraryCall, binary_operands, post_op_statements, post_ops_rejection
from kernorch.codegen.native.skeleton import run_function, slow_in_onednn
from kernorch.codegen.native.streaming_product import (
    Geometry,
    block_switch,
    chunk_bounds,
    packed_state,
    register_block,
    store_tile,
    zero_row,
)

MAX_INPUT_CHANNELS = 4  # an image's channels (RGB, RGBA): oneDNN's blocking over them is mostly padding
MAX_VECTORS = 4  # output-channel vectors per chunk (a 64-channel stem in one chunk with AVX-512)
MIN_OUTPUT_CHANNELS = 16  # a whole AVX-512 vector
# Measured against oneDNN in place (bench/results/2026-11-27-streaming-product.md): 3 → 64 3x3 s2 on 31x31 31 vs
# 42 µs, 7x7 s2 on 32x32 134 vs 178, 3 → 32 7x7 s4 on 56x56 188 vs 252; but on 112x112 outputs 3 → 16 3x3 163 vs
# 152 and 3 → 64 7x7 1391 vs 1310: there oneDNN's blocking along the long rows holds its own — but not with a
# transcendental post-op (skeleton.slow_in_onednn): efficientnet_b0's 3 → 32 3x3 s2 + swish on 112x112 outputs
# 254 us through oneDNN's swish post-op (318 as conv + a swish pass) vs 183 here, so then any width
MAX_OUTPUT_WIDTH = 64
MAX_WINDOW = 1024  # KH x KW x IC: a block's border copies (that many floats per pixel and kernel row) on the stack


def few_channel_rejection(call: LibraryCall) -> str | None:
    """Why the few-channel kernel does not run `call` (None when it does)."""
    if call.op != "convolution" or len(call.src.dims) != 4 or len(call.weights.dims) != 4:
        return "not a 2-d convolution without groups"
    out_channels, in_channels, kernel_h, kernel_w = call.weights.dims
    if in_channels > MAX_INPUT_CHANNELS:
        return f"{in_channels} input channels: oneDNN's blocking pays off"
    if out_channels < MIN_OUTPUT_CHANNELS:
        return f"{out_channels} output channels leave most of a vector idle"
    if kernel_h * kernel_w * in_channels > MAX_WINDOW:
        return f"a {kernel_h}x{kernel_w} window over {in_channels} channels: its border rows would crowd the stack"
    if call.dst.dims[3] > MAX_OUTPUT_WIDTH and not slow_in_onednn(call):
        return f"output rows of {call.dst.dims[3]} pixels: oneDNN's blocking along them is as fast"
    if call.dst.strides[1] != 1:
        return "output channels are not contiguous"
    return post_ops_rejection(call.post_ops)


def kernel_rows_merged(call: LibraryCall) -> bool:
    """Whether a kernel row's taps x input channels lie contiguous in the source (channels-last, pixels packed,
    no dilation along x): then they are one run of KW x IC elements per pixel, not KW runs of IC."""
    in_channels, dilate_x = call.src.dims[1], call.dilates[1] + 1
    return call.src.strides[1] == 1 and call.src.strides[3] == in_channels and dilate_x == 1


def _geometry(call: LibraryCall) -> Geometry:
    """The product as taps x inputs: (ky, kx) x IC, or with merged kernel rows (ky, 0) x (KW x IC)."""
    out_channels, in_channels, kernel_h, kernel_w = call.weights.dims
    w_o, w_i, w_y, w_x = call.weights.strides
    operands = tuple(tensor for _, tensor in call.post_ops)
    if kernel_rows_merged(call):  # input i of a kernel row is tap kx = i / IC, channel i % IC
        weight = f"w[(long)o * {w_o} + (long)(i % {in_channels}) * {w_i} + (long)ky * {w_y} + " \
                 f"(long)(i / {in_channels}) * {w_x}]"  # fmt: skip
        return Geometry(kernel_w * in_channels, out_channels, tuple((ky, 0) for ky in range(kernel_h)), (), (), (), 1,
                        call.dst.strides[1], weight, operands)  # fmt: skip
    weight = f"w[(long)o * {w_o} + (long)i * {w_i} + (long)ky * {w_y} + (long)kx * {w_x}]"
    return Geometry(in_channels, out_channels, tuple(itertools.product(range(kernel_h), range(kernel_w))), (), (),
                    (), call.src.strides[1], call.dst.strides[1], weight, operands)  # fmt: skip


def _row_pointers(w: CWriter, name: str, call: LibraryCall, shape: Geometry) -> None:
    """C filling row[t * ROWS + r], for each tap t and pixel r of the block from (n, y, x0): where the tap's
    elements of that pixel start in the source, or the zeros where they are in the padding. With merged kernel
    rows, a run that is partly in the padding is copied, zeros around it, into the block's `edge` rows."""
    _, in_channels, height, width = call.src.dims
    src_n, _, src_y, src_x = call.src.strides
    stride_y, stride_x = call.strides
    dilate_y, dilate_x = (d + 1 for d in call.dilates)
    pad_y, pad_x = call.pad_begin
    kernel_w = call.weights.dims[3]
    most, taps = f"{name}_ROWS", len(shape.taps)
    with w.block(f"for (int t = 0; t < {taps}; t++)"):
        w.line(f"const long at_y = y * {stride_y} - {pad_y} + {name}_ky[t] * {dilate_y};")
        with w.block("for (int r = 0; r < rows; r++)"):
            w.line(f"const long at_x = (x0 + r) * {stride_x} - {pad_x} + {name}_kx[t] * {dilate_x};",
                   f"const float **p = &row[t * {most} + r];")
            if not kernel_rows_merged(call):
                w.line(f"*p = at_y >= 0 && at_y < {height} && at_x >= 0 && at_x < {width} ? "
                       f"src + n * {src_n}L + at_y * {src_y}L + at_x * {src_x}L : {name}_zeros;")
                return
            w.line(f"if (at_y < 0 || at_y >= {height}) *p = {name}_zeros;",
                   f"else if (at_x >= 0 && at_x + {kernel_w} <= {width}) "
                   f"*p = src + n * {src_n}L + at_y * {src_y}L + at_x * {src_x}L;")  # fmt: skip
            with w.block("else", comment="the run crosses the border: its pixels inside, zeros outside"):
                w.line(f"float *e = edge + (t * {most} + r) * {shape.inputs};")
                w.nest(f"for (int kx = 0; kx < {kernel_w}; kx++)", f"for (int c = 0; c < {in_channels}; c++)",
                       f"e[kx * {in_channels} + c] = at_x + kx >= 0 && at_x + kx < {width} ? "
                       f"src[n * {src_n}L + at_y * {src_y}L + (at_x + kx) * {src_x}L + c] : 0.0f;")
                w.line("*p = e;")


def render_few_channel_conv(name: str, call: LibraryCall) -> str:
    """C for `call` (which `few_channel_rejection` accepted): state, create, run, destroy."""
    shape = _geometry(call)
    batch = call.src.dims[0]
    _, _, out_h, out_w = call.dst.dims
    dst_n, _, dst_y, dst_x = call.dst.strides
    taps, inputs, most = len(shape.taps), shape.inputs, f"{name}_ROWS"
    vectors = max(1, min(MAX_VECTORS, -(-shape.outputs // 16)))
    pointers, operand_elements = binary_operands(call.post_ops)
    epilogue = post_op_statements(call.post_ops, operand_elements)
    ky = ", ".join(str(ky) for ky, _ in shape.taps)
    kx = ", ".join(str(kx) for _, kx in shape.taps)
    w = CWriter()
    packed_state(w, name, call, shape, vectors)
    w.line(f"static const long {name}_ky[{taps}] = {{{ky}}}, {name}_kx[{taps}] = {{{kx}}};", zero_row(name, shape))
    register_block(w, name, shape)
    with run_function(w, name, call):
        w.line(*pointers, "#pragma omp parallel for schedule(static)")
        with w.block(f"for (long item = 0; item < {batch * out_h}L * {name}_CHUNKS; item++)"):
            w.line(f"const long n = item / ({out_h}L * {name}_CHUNKS), y = item / {name}_CHUNKS % {out_h};",
                   f"const int chunk = (int)(item % {name}_CHUNKS);",
                   chunk_bounds(name, shape.outputs),
                   f"const float *w = s->w + (long)chunk * {taps * inputs} * {name}_CHUNK, *b = s->bias + c0;",
                   f"float tile[{most} * {name}_CHUNK] __attribute__((aligned(64)));",
                   f"const float *row[{taps} * {most}];",
                   *([f"float edge[{taps} * {most} * {inputs}];"] if kernel_rows_merged(call) else []))  # fmt: skip
            with w.block(f"for (long x0 = 0; x0 < {out_w}; x0 += {most})"):
                w.line(f"const int rows = {out_w} - x0 < {most} ? (int)({out_w} - x0) : {most};")
                _row_pointers(w, name, call, shape)
                block_switch(w, name, out_w, "w, b, tile, row")
                with w.block("for (int r = 0; r < rows; r++)"):
                    w.line("const long x = x0 + r;", "(void)x;  /* read by binary post-ops' operands only */",
                           f"float *o = dst + n * {dst_n}L + y * {dst_y}L + x * {dst_x}L;")
                    store_tile(w, name, epilogue, shape.destination_channel)
    return w.text(end="\n")


# oneDNN blocks over input channels: with an image's three, mostly padding
BACKEND = LibraryCallBackend("few_channel_conv", "native C", "C convolution over few input channels",
                             few_channel_rejection, render_few_channel_conv)  # fmt: skip
