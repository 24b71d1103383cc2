"""An int8 convolution to few output channels (a style-transfer net's last 32 → 3 convolution back to RGB, a
segmentation head's few classes), on VNNI dot products with output pixels in the lanes: in C.

oneDNN's int8 convolutions put output channels in a vector's lanes: with three of them most lanes idle. candy's
last convolution (32 → 3, 9x9, 224x224 outputs) took 5.4 ms in int8 there against 4.3 ms in float32 by kernorch's
direct convolution (in place, Zen 4), so the quantized model's fission had kept it float. Here a vector holds 16
consecutive output pixels of one output channel.

A parallel item is a band of output rows by a strip of 16·V output pixels. It stages the input its taps read as
words of four channels' bytes, [row][channel quad][pixel] (VNNI's operand: `vpdpbusd` multiplies four unsigned
bytes by four signed bytes and adds the four products to each int32 lane), on its stack: the padding and pixels
past the border hold the source's zero point, an int8 source is read as unsigned by flipping its sign bit (x + 128,
its zero point moved to match). Then, per tap and channel quad, one load of 16 pixels' words per vector and one dot
product per output channel with that channel's four weights broadcast. The zero point comes off once per output
channel, exact in int32 (conv_integer's window is bounded):

    sum (x - zx) * w = sum x' * w - zx' * sum(w)      (x' = x + 128, zx' = zx + 128 for int8 sources)

(taps in the padding read zx' and cancel). The sums then go through the dequantization (a scale per tensor or per
output channel), the bias and the post-ops in scalar C, a few values per pixel. Without VNNI the same staged words
are summed in scalar C, so a plan never depends on the instruction. A run allocates nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from kernorch.codegen.backends.library_calls import LibraryCallBackend
from kernorch.codegen.c import CWriter
from kernorch.codegen.library import LibraryCall, binary_operands, post_op_statements, post_ops_rejection
from kernorch.codegen.native.int8_matmul import VNNI_GUARD, WORD
from kernorch.codegen.native.skeleton import create_function

# Each output channel costs an accumulator per vector, and oneDNN's vectors fill: measured in isolation on Zen 4
# (2 threads, int8, 112x112 outputs): 64 -> 4 3x3 235 vs oneDNN's 550 µs, 64 -> 6 265 vs 316, 64 -> 8 451 vs 355;
# 32 -> 3 3x3 on 224x224 214 vs 625; 32 -> 8 9x9 on 112x112 1493 vs 1313
MAX_OUTPUT_CHANNELS = 6
ACCUMULATORS = 24  # of AVX-512's 32 registers: the rest hold the pixels' words and a broadcast weight
MAX_VECTORS = 4  # 64 pixels a strip
MAX_BAND_ROWS = 8  # output rows an item computes from one staging: the rows its taps share are staged once
MAX_STAGE_BYTES = 64 * 1024  # the staged input, on the item's stack
_C_TYPES = {"uint8": "uint8_t", "int8": "int8_t"}


@dataclass(frozen=True)
class Tiling:
    """How the kernel covers the output: items of `rows` output rows by `vectors` x 16 pixels, each staging
    `stage_rows` input rows of `stage_width` pixels in `quads` words of four channels."""

    outputs: int
    quads: int
    vectors: int
    rows: int
    stage_rows: int
    stage_width: int

    @property
    def strip(self) -> int:
        return self.vectors * 16

    @property
    def stage_bytes(self) -> int:
        return self.stage_rows * self.quads * self.stage_width * 4


def tiling(call: LibraryCall) -> Tiling:
    """The largest band of rows (up to MAX_BAND_ROWS) whose staged input fits MAX_STAGE_BYTES (a band of one row
    when none does: the rejection says so)."""
    outputs, channels, kernel_h, kernel_w = call.weights.dims
    vectors = max(1, min(MAX_VECTORS, ACCUMULATORS // outputs))
    quads, width = -(-channels // 4), vectors * 16 + kernel_w - 1
    stride_y, dilate_y = call.strides[0], call.dilates[0] + 1
    found = None
    for rows in range(1, MAX_BAND_ROWS + 1):
        shape = Tiling(outputs, quads, vectors, rows, (rows - 1) * stride_y + (kernel_h - 1) * dilate_y + 1, width)
        if found is None or shape.stage_bytes <= MAX_STAGE_BYTES:
            found = shape
    assert found is not None
    return found


def pixel_conv_rejection(call: LibraryCall) -> str | None:
    """Why this kernel does not run `call` (None when it does)."""
    if call.precision != "int8":
        return "not an int8 convolution"
    if call.op != "convolution" or len(call.src.dims) != 4 or len(call.weights.dims) != 4 \
            or call.src.dims[1] != call.weights.dims[1]:  # fmt: skip
        return "not a 2-d convolution without groups"
    if call.weights.dims[0] > MAX_OUTPUT_CHANNELS:
        return f"{call.weights.dims[0]} output channels fill oneDNN's vectors"
    if call.strides[1] != 1 or call.dilates[1] != 0:
        return "a stride or dilation along x (its lanes are consecutive pixels)"
    if call.src.strides[1] != 1 or call.src.dtype not in _C_TYPES or call.src_zero is None:
        return "not a channels-last int8 or uint8 source with its zero point"
    if call.weights.dtype != "int8":
        return f"{call.weights.dtype} weights (int8 only)"
    if call.dst_scale is not None:
        return "a requantized int8 dst (oneDNN's)"
    if call.dst.dtype == "int32" and (call.scales is not None or call.bias is not None or call.post_ops):
        return "an epilogue on int32 sums"
    if call.dst.dtype not in ("float32", "int32"):
        return f"a {call.dst.dtype} destination"
    shape = tiling(call)
    if shape.stage_bytes > MAX_STAGE_BYTES:
        _, channels, kernel_h, kernel_w = call.weights.dims
        return f"a {kernel_h}x{kernel_w} window over {channels} channels: its staged rows would crowd the stack"
    return post_ops_rejection(call.post_ops)


@contextmanager
def _loops(w: CWriter, *headers: str) -> Iterator[None]:
    """Blocks nested in the order given, the lines inside the innermost."""
    with ExitStack() as stack:
        for header in headers:
            stack.enter_context(w.block(header))
        yield


def _create(w: CWriter, name: str, call: LibraryCall, shape: Tiling) -> None:
    """State, destroy, create: the weights as words of four channels, w[((ky * KW + kx) * Q + q) * O + o] (zero
    past the channels), and each output channel's weight sum."""
    outputs, channels, kernel_h, kernel_w = call.weights.dims
    s_o, s_i, s_y, s_x = call.weights.strides
    words = kernel_h * kernel_w * shape.quads * outputs
    offset = f" + {call.weights.offset}" if call.weights.offset else ""
    with create_function(w, name, "int32_t *w; int32_t *sums;", ["w", "sums"],
                         [f"s->w = (int32_t *)malloc({words * 4});",
                          f"s->sums = (int32_t *)malloc({outputs * 4});"]):  # fmt: skip
        w.line(f"const int8_t *w = (const int8_t *)a[{call.weights.slot}]{offset};")
        with w.block(f"for (int o = 0; o < {outputs}; o++)"):
            w.line("int32_t sum = 0;")
            with _loops(w, f"for (int ky = 0; ky < {kernel_h}; ky++)", f"for (int kx = 0; kx < {kernel_w}; kx++)",
                        f"for (int q = 0; q < {shape.quads}; q++)"):  # fmt: skip
                w.line("uint32_t word = 0;")
                with w.block(f"for (int b = 0; b < 4 && q * 4 + b < {channels}; b++)"):
                    w.line(f"const int8_t v = w[(long)o * {s_o} + (long)(q * 4 + b) * {s_i} + (long)ky * {s_y} + "
                           f"(long)kx * {s_x}];",
                           "word |= (uint32_t)(uint8_t)v << (8 * b);", "sum += v;")  # fmt: skip
                w.line(f"s->w[((ky * {kernel_w} + kx) * {shape.quads} + q) * {outputs} + o] = (int32_t)word;")
            w.line("s->sums[o] = sum;")


def _stage(w: CWriter, call: LibraryCall, shape: Tiling) -> None:
    """C filling the item's `stage` from input row y0 * SY - PT and pixel x0 - PL on: four channels' bytes per word
    (flipped for an int8 source), the zero point's bytes where the tap is in the padding or past the border."""
    _, channels, height, width = call.src.dims
    s_n, _, s_y, s_x = call.src.strides
    stride_y = call.strides[0]
    pad_y, pad_x = call.pad_begin
    flip = " ^ 0x80808080u" if call.src.dtype == "int8" else ""
    with w.block(f"for (int r = 0; r < {shape.stage_rows}; r++)"):
        w.line(f"const long iy = y0 * {stride_y} - {pad_y} + r;",
               f"uint32_t *row = stage + (long)r * {shape.quads * shape.stage_width};")
        with w.block(f"for (int p = 0; p < {shape.stage_width}; p++)"):
            w.line(f"const long ix = x0 - {pad_x} + p;")
            with w.block(f"if (iy < 0 || iy >= {height} || ix < 0 || ix >= {width})"):
                w.line(f"for (int q = 0; q < {shape.quads}; q++) row[q * {shape.stage_width} + p] = fill;",
                       "continue;")
            w.line(f"const uint8_t *px = src + n * {s_n}L + iy * {s_y}L + ix * {s_x}L;")
            whole = channels // 4
            if whole:
                w.line(f"for (int q = 0; q < {whole}; q++) row[q * {shape.stage_width} + p] = "
                       f"(uint32_t)ko_i8_word(px + q * 4){flip};")  # fmt: skip
            if channels % 4:  # the last word's bytes past the channels: weights there are 0
                tail = " | ".join(f"(uint32_t)px[{whole * 4 + b}] << {8 * b}" for b in range(channels % 4))
                w.line(f"row[{whole * shape.stage_width} + p] = ({tail}){flip};")


def _vnni_rows(w: CWriter, call: LibraryCall, shape: Tiling) -> None:
    """Each output row of the band on VNNI dot products into `tile` (inside the guard). Accumulators and pixel words
    are named one by one (an array of vectors that a loop indexes is kept in memory by GCC)."""
    _, _, kernel_h, kernel_w = call.weights.dims
    stride_y, dilate_y = call.strides[0], call.dilates[0] + 1
    outputs, vectors = range(shape.outputs), range(shape.vectors)
    with w.block("for (int yy = 0; yy < rows; yy++)"):
        w.line(*(f"__m512i {', '.join(f'c{o}_{v} = _mm512_setzero_si512()' for v in vectors)};" for o in outputs))
        with w.block(f"for (int ky = 0; ky < {kernel_h}; ky++)"):
            w.line(f"const uint32_t *band = stage + (long)(yy * {stride_y} + ky * {dilate_y}) * "
                   f"{shape.quads * shape.stage_width};")  # fmt: skip
            with w.block(f"for (int kx = 0; kx < {kernel_w}; kx++)"):
                w.line(f"const int32_t *wk = s->w + (long)(ky * {kernel_w} + kx) * {shape.quads * shape.outputs};")
                with w.block(f"for (int q = 0; q < {shape.quads}; q++)"):
                    w.line(f"const uint32_t *p = band + q * {shape.stage_width} + kx;",
                           *(f"const __m512i x{v} = _mm512_loadu_si512((const void *)(p + {v * 16}));"
                             for v in vectors))  # fmt: skip
                    for o in outputs:
                        w.line(f"const __m512i w{o} = _mm512_set1_epi32(wk[q * {shape.outputs} + {o}]);",
                               *(f"c{o}_{v} = _mm512_dpbusd_epi32(c{o}_{v}, x{v}, w{o});" for v in vectors))
        for o in outputs:
            w.line(f"const __m512i z{o} = _mm512_set1_epi32(zx * s->sums[{o}]);",
                   *(f"_mm512_storeu_si512((void *)(tile + (long)yy * {shape.outputs * shape.strip} + "
                     f"{o * shape.strip + v * 16}), _mm512_sub_epi32(c{o}_{v}, z{o}));" for v in vectors))


def _scalar_rows(w: CWriter, call: LibraryCall, shape: Tiling) -> None:
    """The same sums of the same staged words and packed weights in scalar C."""
    _, _, kernel_h, kernel_w = call.weights.dims
    stride_y, dilate_y = call.strides[0], call.dilates[0] + 1
    with _loops(w, "for (int yy = 0; yy < rows; yy++)", f"for (int o = 0; o < {shape.outputs}; o++)",
                f"for (int p = 0; p < {shape.strip}; p++)"):  # fmt: skip
        w.line("int32_t sum = 0;")
        with _loops(w, f"for (int ky = 0; ky < {kernel_h}; ky++)", f"for (int kx = 0; kx < {kernel_w}; kx++)",
                    f"for (int q = 0; q < {shape.quads}; q++)"):  # fmt: skip
            w.line(f"const uint32_t x = stage[((long)(yy * {stride_y} + ky * {dilate_y}) * {shape.quads} + q) * "
                   f"{shape.stage_width} + kx + p];",
                   f"const uint32_t k = (uint32_t)s->w[((ky * {kernel_w} + kx) * {shape.quads} + q) * "
                   f"{shape.outputs} + o];",
                   "for (int b = 0; b < 4; b++) sum += (int32_t)(uint8_t)(x >> (8 * b)) * "
                   "(int32_t)(int8_t)(k >> (8 * b));")  # fmt: skip
        w.line(f"tile[((long)yy * {shape.outputs} + o) * {shape.strip} + p] = sum - zx * s->sums[o];")


def _store(w: CWriter, call: LibraryCall, shape: Tiling) -> None:
    """The band's sums from `tile` to the destination: dequantized (scale, bias) and through the post-ops, or as
    int32 sums."""
    out_w = call.dst.dims[3]
    d_n, d_c, d_y, d_x = call.dst.strides
    _, operands = binary_operands(call.post_ops)  # their pointers: declared before the items' loop
    with _loops(w, "for (int yy = 0; yy < rows; yy++)",
                f"for (int px = 0; px < {shape.strip} && x0 + px < {out_w}; px++)",
                f"for (int c = 0; c < {shape.outputs}; c++)"):  # fmt: skip
        w.line("const long y = y0 + yy, x = x0 + px;", "(void)y; (void)x;  /* read by binary post-ops' operands */",
               f"const int32_t sum = tile[((long)yy * {shape.outputs} + c) * {shape.strip} + px];",
               f"const long at = n * {d_n}L + (long)c * {d_c} + y * {d_y}L + x * {d_x}L;")  # fmt: skip
        if call.dst.dtype == "int32":
            w.line("dst[at] = sum;")
        else:
            scale = "" if call.scales is None else (" * scale[c]" if call.scales.dims[0] > 1 else " * scale[0]")
            bias = "" if call.bias is None else " + bias[c]"
            w.line(f"float v = (float)sum{scale}{bias};", *post_op_statements(call.post_ops, operands),
                   "dst[at] = v;")


def render_pixel_conv(name: str, call: LibraryCall) -> str:
    """C for `call` (which `pixel_conv_rejection` accepted): state, create, run, destroy."""
    shape = tiling(call)
    batch, _, out_h, out_w = call.dst.dims
    bands, strips = -(-out_h // shape.rows), -(-out_w // shape.strip)
    dst_type = "int32_t" if call.dst.dtype == "int32" else "float"
    src_offset = f" + {call.src.offset}" if call.src.offset else ""
    dst_offset = f" + {call.dst.offset}" if call.dst.offset else ""
    assert call.src_zero is not None
    w = CWriter()
    w.verbatim(VNNI_GUARD, "#include <immintrin.h>", "#endif", WORD)
    _create(w, name, call, shape)
    pointers, _ = binary_operands(call.post_ops)
    with w.function(f"static int {name}_run(void *state, void *stream, void **a)"):
        w.line("(void)stream;", f"const {name}_state *s = (const {name}_state *)state;",
               f"const uint8_t *src = (const uint8_t *)a[{call.src.slot}]{src_offset};",
               f"{dst_type} *dst = ({dst_type} *)a[{call.dst.slot}]{dst_offset};",
               # the sums use the zero point as the source is read (unsigned: int8 moved by 128)
               f"const int32_t zx = (int32_t)((const {_C_TYPES[call.src_zero.dtype]} *)a[{call.src_zero.slot}])[0]"
               f"{' + 128' if call.src.dtype == 'int8' else ''};",
               "const uint32_t fill = (uint32_t)(uint8_t)zx * 0x01010101u;",
               *([f"const float *scale = (const float *)a[{call.scales.slot}] + {call.scales.offset};"]
                 if call.scales is not None else []),
               *([f"const float *bias = (const float *)a[{call.bias.slot}] + {call.bias.offset};"]
                 if call.bias is not None else []),
               *pointers, "#pragma omp parallel for schedule(static)")  # fmt: skip
        with w.block(f"for (long item = 0; item < {batch * bands * strips}L; item++)"):
            w.line(f"const long n = item / {bands * strips}, y0 = item / {strips} % {bands} * {shape.rows}, "
                   f"x0 = item % {strips} * {shape.strip};",
                   f"const int rows = {out_h} - y0 < {shape.rows} ? (int)({out_h} - y0) : {shape.rows};",
                   f"uint32_t stage[{shape.stage_rows * shape.quads * shape.stage_width}] "
                   "__attribute__((aligned(64)));",
                   f"int32_t tile[{shape.rows * shape.outputs * shape.strip}] __attribute__((aligned(64)));")
            _stage(w, call, shape)
            w.verbatim(VNNI_GUARD)
            _vnni_rows(w, call, shape)
            w.verbatim("#else")
            _scalar_rows(w, call, shape)
            w.verbatim("#endif")
            _store(w, call, shape)
    return w.text(end="\n")


# oneDNN's int8 convolutions vectorize over output channels: with a handful most lanes idle
BACKEND = LibraryCallBackend("int8_pixel_conv", "native C", "int8 convolution over pixels, few output channels",
                             pixel_conv_rejection, render_pixel_conv, precisions=("int8",))  # fmt: skip
