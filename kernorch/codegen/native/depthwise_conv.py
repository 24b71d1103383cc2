"""A depthwise convolution in generated C: channels-last, one filter per channel, its epilogue applied in cache.

Without AVX-512, oneDNN 3.2 runs a channels-last depthwise conv as `brdgmm_dw:avx2`, and with an eltwise
post-op it slows down by half again: efficientnet_b0's 14x14x672 5x5 conv with bias and swish took 250-270 us
in place, ~140 us without the swish (measured through kernorch's own call, 2 threads, Zen 3). The work is
small (6.6 MFLOP, 0.5 MB in and out): what matters is keeping the FMA units fed from registers.

The kernel: each parallel item is one output row (n, y) and a chunk of channels (rows alone would leave one of
two threads idle on a 7x7 map). Inside the image, a block of `B` output pixels and one vector of channels
accumulates in `B` registers: per filter row, the `KW` tap weights are loaded once and every input pixel
the block needs is loaded once and multiplied into each accumulator that uses it (written out at generation
time for the conv's stride and dilation); the columns left after the full blocks are one shorter block.
A channel count that is no multiple of the vector ends with a vector moved back to end at the last channel
(shufflenet's 58 and 116); fewer channels than a vector take half vectors. Pixels whose taps leave the image
(padding) take a bounds-checked loop. The bias starts the sums; the post-ops (library/post_ops.py) then run over the
item's outputs while they are in L1. Weights are repacked once at create, tap-major with the channels
contiguous: [KH][KW][C rounded up to 16]. A run allocates nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kernorch.codegen.backends.library_calls import LibraryCallBackend
from kernorch.codegen.c import CWriter
from kernorch.codegen.library import (
    LibraryCall,
    binary_operands,
    post_op_loop,
    post_op_statements,
    post_ops_rejection,
)
from kernorch.codegen.native.skeleton import (
    VECTOR_TYPES,
    ConvGeometry,
    create_function,
    operand_rejection,
    run_function,
    weights_pointer,
)

CHANNEL_PAD = 16  # packed weight rows are padded to a multiple of the widest vector (AVX-512): aligned loads
MIN_ITEMS = 32  # parallel items a call is cut into when rows allow: both threads busy, little imbalance
MAX_BLOCK = 8  # output pixels per register block
ALIASING_CHANNELS = 128  # from here on, a power-of-two channel count stays with oneDNN (depthwise_rejection)


def _halved(line: str) -> str:
    """A line of vector code on half vectors (VECTOR_TYPES' ko_vh)."""
    return re.sub(r"\bko_vc(u?)\b", r"ko_vh\1", line)


def depthwise_rejection(call: LibraryCall) -> str | None:
    """Why the depthwise kernel does not run `call` (None when it does)."""
    if call.op != "convolution" or len(call.src.dims) != 4 or len(call.weights.dims) != 5:
        return "not a grouped 2-d convolution"
    channels = call.src.dims[1]
    if call.weights.dims[:3] != (channels, 1, 1) or call.dst.dims[1] != channels:
        return "not depthwise (one input and one output channel per group)"
    operands = operand_rejection(call)
    if operands is not None:
        return operands
    if channels >= ALIASING_CHANNELS and channels & (channels - 1) == 0:
        # pixels a power of two of 512+ bytes apart (and rows a multiple of 4 KB) fall into the same L1 sets:
        # a register block's taps evict each other. segformer_b0's 128/256/1024-channel maps ran 1.1-3.5x
        # slower than oneDNN's; its 640-channel one 1.1-2.1x faster (bench/conv_kernels.py)
        return f"{channels} channels: a power of two, whose pixels alias in the L1 cache"
    return post_ops_rejection(call.post_ops)


def _block_size(kernel_w: int) -> int:
    # accumulators + the row's tap weights + one loaded input vector within AVX2's 16 registers
    return max(1, min(MAX_BLOCK, 14 - kernel_w))


def _chunking(rows: int, channels: int) -> tuple[int, int]:
    """(channels per item, items per row): rows alone when there are enough of them."""
    if rows >= MIN_ITEMS or channels <= CHANNEL_PAD:
        return channels, 1
    wanted = min(-(-MIN_ITEMS // rows), channels // CHANNEL_PAD)
    chunk = -(-channels // wanted // CHANNEL_PAD) * CHANNEL_PAD
    return chunk, -(-channels // chunk)


@dataclass(frozen=True)
class _Geometry(ConvGeometry):
    """The conv's sizes and element strides, as the C below uses them."""

    pitch: int  # packed weights: elements between two taps

    def tap(self, tap_y: str, tap_x: str) -> str:
        return f"({tap_y} * {self.kernel_w} + {tap_x}) * {self.pitch}L"

    def vectors(self, w: CWriter, body: list[str], scalar: list[str]) -> None:
        """`body` for every vector of channels in [c0, c1), the last one moved back to end at c1 (it recomputes
        a few channels of the one before: the same values); with fewer channels than a vector, the same on half
        vectors (8 channels ran scalar on AVX-512: 212 µs vs oneDNN's 36 for a 112x112 3x3 map); `scalar` per
        channel when there is not even half a vector."""
        for i, (lanes, vector) in enumerate((("KO_VC_LANES", body), ("KO_VH_LANES", [_halved(line) for line in body]))):
            w.line(*(["} else "] if i else []), f"if (c1 - c0 >= {lanes}) {{")
            with w.indented(), w.block(f"for (int c = c0; c < c1; c += {lanes})"):
                w.line(f"if (c > c1 - {lanes}) c = c1 - {lanes};", *vector)
        w.line("} else {")
        with w.indented(), w.block("for (int c = c0; c < c1; c++)"):
            w.line(*scalar)
        w.line("}")

    def interior(self, w: CWriter, block: int) -> None:
        """`block` pixels from x on whose taps are all inside the image: per channel vector, straight-line loads
        and FMAs (each input pixel loaded once per filter row, into every accumulator that uses it)."""
        (_, stride_x), (_, dilate_x) = self.call.strides, self.call.dilates
        src_x, dst_x = self.call.src.strides[3], self.call.dst.strides[3]
        body = CWriter()
        body.extend(f"ko_vc acc{i} = *(const ko_vcu *)(s->bias + c);" for i in range(block))
        with body.block("for (int ky = ky0; ky < ky1; ky++)"):
            body.line(f"const float *r = in + {self.source_row('ky')} + {self.source_column('x', '0')} * {src_x} + c;",
                      f"const float *wt = s->w + {self.tap('ky', '0')} + c;")  # fmt: skip
            body.extend(f"const ko_vc w{k} = *(const ko_vcu *)(wt + {k * self.pitch});" for k in range(self.kernel_w))
            uses: dict[int, list[tuple[int, int]]] = {}  # input pixel (from the block's first tap) -> (pixel, tap)
            for i in range(block):
                for k in range(self.kernel_w):
                    uses.setdefault(i * stride_x + k * (dilate_x + 1), []).append((i, k))
            for position in sorted(uses):
                fmas = " ".join(f"acc{i} += v * w{k};" for i, k in uses[position])
                body.line(f"{{ const ko_vc v = *(const ko_vcu *)(r + {position * src_x}); {fmas} }}")
        body.extend(f"*(ko_vcu *)(out + (long)(x + {i}) * {dst_x} + c) = acc{i};" for i in range(block))
        scalar = CWriter()
        with scalar.block(f"for (int i = 0; i < {block}; i++)"):
            scalar.line("float acc = s->bias[c];",
                        f"for (int ky = ky0; ky < ky1; ky++) for (int kx = 0; kx < {self.kernel_w}; kx++)")
            with scalar.indented():
                scalar.line(f"acc += in[{self.source_row('ky')} + {self.source_column('x + i', 'kx')} * {src_x} + c] "
                            f"* s->w[{self.tap('ky', 'kx')} + c];")  # fmt: skip
            scalar.line(f"out[(long)(x + i) * {dst_x} + c] = acc;")
        self.vectors(w, body.lines, scalar.lines)

    def edge(self, w: CWriter, begin: str, end: str) -> None:
        """Pixels [begin, end) with taps outside the image (padding): bounds checked per tap."""
        width, src_x, dst_x = self.call.src.dims[3], self.call.src.strides[3], self.call.dst.strides[3]

        def accumulate(zero: str, load: str, weight: str, store: str) -> list[str]:
            code = CWriter()
            code.line(zero)
            with code.block(f"for (int ky = ky0; ky < ky1; ky++) for (int kx = 0; kx < {self.kernel_w}; kx++)"):
                code.line(f"const long ix = {self.source_column('x', 'kx')};",
                          f"if (ix < 0 || ix >= {width}) continue;",
                          f"acc += {load}(in + {self.source_row('ky')} + ix * {src_x} + c) * "
                          f"{weight}(s->w + {self.tap('ky', 'kx')} + c);")  # fmt: skip
            code.line(store)
            return code.lines

        body = accumulate("ko_vc acc = *(const ko_vcu *)(s->bias + c);", "*(const ko_vcu *)", "*(const ko_vcu *)",
                          f"*(ko_vcu *)(out + (long)x * {dst_x} + c) = acc;")  # fmt: skip
        scalar = accumulate("float acc = s->bias[c];", "*", "*", f"out[(long)x * {dst_x} + c] = acc;")
        with w.block(f"for (int x = {begin}; x < {end}; x++)"):
            self.vectors(w, body, scalar)


def render_depthwise_conv(name: str, call: LibraryCall) -> str:
    """C for `call` (which `depthwise_rejection` accepted): state, create, run, destroy."""
    batch, channels = call.src.dims[:2]
    kernel_h, kernel_w = call.weights.dims[3:]
    _, _, out_h, out_w = call.dst.dims
    src_n = call.src.strides[0]
    dst_n, _, dst_y, dst_x = call.dst.strides
    w_c, _, _, w_y, w_x = call.weights.strides
    pitch = -(-channels // CHANNEL_PAD) * CHANNEL_PAD
    geometry = _Geometry(call, pitch)
    block = _block_size(kernel_w)
    chunk, chunks = _chunking(batch * out_h, channels)
    bias = f"(const float *)a[{call.bias.slot}]" if call.bias is not None else "NULL"
    pointers, operands = binary_operands(call.post_ops)
    epilogue = post_op_statements(call.post_ops, operands)

    w = CWriter()
    w.line(VECTOR_TYPES)
    with create_function(w, name, "float *w; float *bias;", ["w", "bias"],
                         [f"s->w = (float *)aligned_alloc(64, {kernel_h * kernel_w * pitch * 4});",
                          f"s->bias = (float *)aligned_alloc(64, {pitch * 4});"]):  # fmt: skip
        w.line(f"const float *w = {weights_pointer(call)};", f"const float *bias = {bias};",
               f"memset(s->w, 0, {kernel_h * kernel_w * pitch * 4});", f"memset(s->bias, 0, {pitch * 4});")
        w.nest(f"for (int ky = 0; ky < {kernel_h}; ky++) for (int kx = 0; kx < {kernel_w}; kx++)",
               f"for (int c = 0; c < {channels}; c++)",
               f"s->w[(ky * {kernel_w} + kx) * {pitch} + c] = "
               f"w[(long)c * {w_c} + (long)ky * {w_y} + (long)kx * {w_x}];")
        w.line(f"if (bias) for (int c = 0; c < {channels}; c++) s->bias[c] = bias[c];")
    with run_function(w, name, call):
        w.line(*pointers, "#pragma omp parallel for schedule(static)")
        with w.block(f"for (long item = 0; item < {batch * out_h * chunks}L; item++)"):
            w.line(f"const long row = item / {chunks}, n = row / {out_h}, y = row % {out_h};",
                   f"const int c0 = (int)(item % {chunks}) * {chunk};",
                   f"const int c1 = c0 + {chunk} < {channels} ? c0 + {chunk} : {channels};",
                   f"const float *in = src + n * {src_n}L;",
                   f"float *out = dst + n * {dst_n}L + y * {dst_y}L;",
                   *geometry.filter_rows())
            geometry.output_row(w, block)
            if epilogue:
                with w.block(f"for (int x = 0; x < {out_w}; x++)"):
                    w.line(f"float *o = out + (long)x * {dst_x};")
                    post_op_loop(w, "o", "c0", "c1", epilogue)
    return w.text(end="\n")


# oneDNN's AVX2 depthwise conv, slower still with an eltwise post-op
BACKEND = LibraryCallBackend("depthwise_conv", "native C", "direct C depthwise convolution", depthwise_rejection,
                             render_depthwise_conv)  # fmt: skip
