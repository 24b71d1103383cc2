"""A 3x3 stride-1 convolution by Winograd's F(2x2, 3x3) in generated C: 2.25x fewer multiplications. Also a 3-d
one whose kernel is 3x3 in space (any depth, stride 1 over frames), as 2-d convolutions over its frames (`Frames`).

Without AVX-512, oneDNN 3.2 has no Winograd convolution; its AVX2 direct 3x3 convs run at ~145 GFLOP/s here
(candy's ten 56x56x128 residual convs took 6.3-6.4 ms each in place, 2 threads, Zen 3), and candy spends 85 %
of its time in them; with AVX-512 its direct conv reaches 0.6x the peak on large layers (fcn_resnet50's head,
2048 -> 512 on 16x16: 162 GFLOP/s). F(2x2, 3x3) (Lavin & Gray, 2015) computes each 2x2 output tile from a 4x4
input tile: V = Bᵀ d B per input channel, U = G g Gᵀ per filter (once, at create), then 16 independent products
M[e] = V[e] · U[e] over the input channels, and Y = Aᵀ M A. The 16 products hold 16 instead of 36 multiplies
per output pair of channels and tile.

Two schedules (the constants below say where each runs). Streamed: every tile's input transform, then the 16
products shared out by (e, block of output channels), each transformed filter read once per run, then every
tile's output transform, all tiles' V and M in a scratch of the state. Blocked: items of `TILES` consecutive tiles
(numbered over the whole image, so only the last item is short), each through the three steps in a thread's own
scratch. Both allocate their scratch at create: a run allocates nothing. The products are register-blocked
micro-kernels (tiles x output channels of FMAs, the input transform's value broadcast); the output transform adds
the bias and stores where the tile lies inside the output, then applies the post-ops. Pixels of a tile outside
the input (padding, odd sizes) read zeros.

Numerics: the transforms only add and subtract (and halve, in G), so finite results differ from the direct sum by
rounding, ~1e-6 relative. A value that is not finite is another matter: an infinity subtracted from itself in a
transform is NaN where the direct sum is infinite. A tile reading a pixel that is not finite (the input transform
flags it) is computed by the direct sum instead, as onnxruntime computes it; so is every tile when a weight is
not finite (checked at create). The state keeps the weights for that, [tap][ci][co].
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from kernorch.codegen.backends.library_calls import LibraryCallBackend
from kernorch.codegen.c import CWriter
from kernorch.codegen.library import (
    LibraryCall,
    Tensor,
    binary_operands,
    post_op_statements,
    post_ops_rejection,
    vector_epilogue,
)
from kernorch.codegen.native.skeleton import (
    AVX2_VECTOR_TYPES,
    VECTOR_TYPES,
    aligned_size,
    create_function,
    operand_rejection,
    run_function,
    weights_pointer,
)

TILES = 18  # tiles per item: three micro-kernel rows of 6
MICRO_TILES = 6  # tiles per micro-kernel block: 6 x 16 output channels = 12 AVX2 accumulators
CHANNEL_MULTIPLE = 16  # input and output channels come in multiples of the widest vector (AVX-512)
MIN_MACS = 50_000_000  # below this, oneDNN's direct conv: the transforms and their scratch do not pay
# Two schedules. Streamed, where it applies: every tile's input transform first, then the 16 products split
# between the threads by (e, block of STREAMED_CHANNELS output channels), consecutive items sharing V[e], each
# transformed filter read once per run from its own contiguous panel, then every tile's output transform. Its
# products are blocks of 6 tiles x STREAMED_CHANNELS (4 AVX-512 vectors, 24 accumulators; 2 AVX2 vectors, 4
# times); all tiles' transforms live in a scratch of its own (V and M, [e][tile][channel]). Against oneDNN 3.2's
# direct conv, in place, 2 threads (AMX host, bench/results/2026-11-28-winograd-streamed.md): 2048 -> 512 on 16x16
# 0.47x the time, 512 -> 512 on 28x28 0.55x, 256 -> 256 on 56x56 0.54x, 128 -> 128 on 56x56 0.62x, 256 -> 256 on
# 14x14 0.74x, 512 -> 512 on 7x7 (16 tiles) 0.87x.
# Blocked, the first schedule, for the rest (output channels not a multiple of STREAMED_CHANNELS, or a scratch past
# MAX_STREAMED_SCRATCH): items of TILES tiles, each through all three steps in a thread's scratch; every item reads
# all 16 transformed filters, so they must fit a core's L2: in place (2026-11-28, 4 convs in a row, alternated with
# oneDNN) 64 -> 64 on 56x56 1.16x faster, 128 -> 128 on 28x28 0.96-1.16x, 256 -> 256 on 14x14 0.69x and on 28x28
# 0.88x, 512 -> 512 on 7x7 (one item: one thread) 0.2x, on 14x14 0.33x.
STREAMED_CHANNELS = 64
STREAMED_MIN_TILES = 16  # a transformed filter's 4 bytes per (input, output) pair feed 2 x tiles flops
MAX_STREAMED_SCRATCH = 64 << 20
MAX_TRANSFORMED_BYTES = 1 << 20
MAX_THREADS = 64


@dataclass(frozen=True)
class Frames:
    """A convolution over frames. A 3-d convolution ([N, C, D, H, W], a kernel `taps` frames deep, stride 1 over
    frames) runs as 2-d ones over its N x D frames: every input frame's tiles are transformed once, and an output
    frame's products sum its `taps` input frames' (frame d + t - pad of the image for output frame d): the taps
    are more input channels. A 2-d convolution is one frame per image and one tap."""

    images: int
    depth: int  # input frames per image
    out_depth: int  # output frames per image
    taps: int  # the kernel's frames
    pad: int  # zero frames before an image's first
    tap_stride: int  # the weights' elements between two taps
    # onnxruntime's 3-d conv multiplies the padding's zeros into its sums (an infinite weight there makes NaN); its
    # 2-d conv skips those taps
    pads_multiply: bool = False

    @property
    def padded_depth(self) -> int:
        """Frames per image of the transformed input (V): the input's and the zero frames around them."""
        return self.out_depth + self.taps - 1

    @property
    def identity(self) -> bool:
        """V's tiles are the output's (a 2-d convolution, or frames one tap deep and unpadded)."""
        return self.taps == 1 and self.depth == self.out_depth


def _merged(tensor: Tensor, images: int, depth: int) -> Tensor | None:
    """A 5-d tensor [n, c, d, y, x] of `images` images of `depth` frames as 4-d with its frames one axis (image i's
    frame f at i * depth + f), or None when they are not one axis in memory, or it broadcasts over its images but
    not its frames or the other way round (the kernel indexes one frame axis)."""
    n, c, d, y, x = tensor.dims
    sn, sc, sd, sy, sx = tensor.strides
    if n == 1 and d == 1:
        frames, stride = 1, 0  # the same for every frame
    elif n != images or d != depth:
        return None
    elif d == 1:
        frames, stride = n, sn
    elif n == 1 or sn == d * sd:
        frames, stride = n * d, sd
    else:
        return None
    return replace(tensor, dims=(frames, c, y, x), strides=(stride, sc, sy, sx))


def planar(call: LibraryCall) -> tuple[LibraryCall, Frames] | str:
    """`call` as a 2-d convolution over frames and how its frames combine, or why it cannot be one."""
    if call.op != "convolution" or len(call.src.dims) not in (4, 5) or len(call.weights.dims) != len(call.src.dims):
        return "not a 2-d or 3-d convolution without groups"
    if len(call.src.dims) == 4:
        return call, Frames(call.src.dims[0], 1, 1, 1, 0, 0)
    if call.strides[0] != 1 or call.dilates[0]:
        return "strided or dilated over frames"
    images = call.src.dims[0]
    depth, out_depth = call.src.dims[2], call.dst.dims[2]
    src, dst = _merged(call.src, images, depth), _merged(call.dst, images, out_depth)
    operands = [None if t is None else _merged(t, images, out_depth) for _, t in call.post_ops]
    pairs = list(zip(call.post_ops, operands, strict=True))
    if src is None or dst is None or any(m is None and t is not None for (_, t), m in pairs):
        return "its frames are not one axis in memory"
    w = call.weights
    weights = replace(w, dims=(*w.dims[:2], *w.dims[3:]), strides=(*w.strides[:2], *w.strides[3:]))
    flat = replace(call, src=src, dst=dst, weights=weights, strides=call.strides[1:], dilates=call.dilates[1:],
                   pad_begin=call.pad_begin[1:], pad_end=call.pad_end[1:],
                   post_ops=tuple((op, m) for (op, _), m in pairs))  # fmt: skip
    frames = Frames(images, depth, out_depth, w.dims[2], call.pad_begin[0], w.strides[2], True)
    return flat, frames


def winograd_rejection(call: LibraryCall) -> str | None:
    """Why the Winograd kernel does not run `call` (None when it does)."""
    flat = planar(call)
    if isinstance(flat, str):
        return flat
    call, frames = flat
    out_channels, in_channels, kernel_h, kernel_w = call.weights.dims
    if (kernel_h, kernel_w) != (3, 3) or call.strides != (1, 1) or any(call.dilates):
        return "not 3x3, stride 1, undilated"
    if call.exact_sums:
        return "its sums must stay exact integers (an integer convolution in float32): the transforms round"
    if in_channels % CHANNEL_MULTIPLE or out_channels % CHANNEL_MULTIPLE:
        return f"channels are not multiples of {CHANNEL_MULTIPLE}"
    operands = operand_rejection(call)
    if operands is not None:
        return operands
    frame_count, _, out_h, out_w = call.dst.dims
    if frame_count * out_h * out_w * in_channels * out_channels * 9 * frames.taps < MIN_MACS:
        return "too small for the transforms to pay"
    streamed = _streamed_rejection(call, frames)
    if not frames.identity and streamed is not None:
        return f"its frames need the streamed schedule, which {streamed}"
    transformed = 16 * in_channels * out_channels * 4
    if streamed is not None and transformed > MAX_TRANSFORMED_BYTES:
        return (f"its transformed filters ({transformed >> 10} KiB) outgrow the L2 every block of tiles reads them "
                f"from, and the streamed schedule {streamed}")
    return post_ops_rejection(call.post_ops)


def _streamed_rejection(call: LibraryCall, frames: Frames) -> str | None:
    """Why the (planar) call does not run on the streamed schedule (None when it does)."""
    out_channels, in_channels = call.weights.dims[:2]
    tiles = call.dst.dims[0] * math.prod(_tiles(call))
    transformed_rows = frames.images * frames.padded_depth * math.prod(_tiles(call))
    if out_channels % STREAMED_CHANNELS:
        return f"takes output channels in multiples of {STREAMED_CHANNELS}"
    if tiles < STREAMED_MIN_TILES:
        return f"needs {STREAMED_MIN_TILES} tiles to read its filters once for all, this map has {tiles}"
    if 16 * (transformed_rows * in_channels + tiles * out_channels) * 4 > MAX_STREAMED_SCRATCH:
        return f"would hold every tile's transforms in more than {MAX_STREAMED_SCRATCH >> 20} MiB"
    return None


def _streamed(call: LibraryCall) -> bool:
    """Whether the Winograd kernel runs `call` (accepted by `winograd_rejection`) on the streamed schedule."""
    flat = planar(call)
    return not isinstance(flat, str) and _streamed_rejection(*flat) is None


def _tiles(call: LibraryCall) -> tuple[int, int]:
    """Tiles of 2x2 outputs along y and x (the last ones partial on an odd size)."""
    _, _, out_h, out_w = call.dst.dims
    return -(-out_h // 2), -(-out_w // 2)


def _tile_position(w: CWriter, call: LibraryCall) -> None:
    """C naming the image `n` and the tile row and column `ty`, `tx` of tile number `tile`."""
    tiles_y, tiles_x = _tiles(call)
    w.line(f"const long n = tile / {tiles_y * tiles_x}, ty = tile / {tiles_x} % {tiles_y}, tx = tile % {tiles_x};")


def _input_transform(w: CWriter, call: LibraryCall, row: str, rows: int | str, flag: str) -> None:
    """C writing tile `tile`'s V = Bᵀ d B, B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], into V[e][row][ci] of a V
    holding `rows` tiles per e (pixels outside the input read zeros), and setting `flag` (C) when a pixel the tile
    reads is not finite (their sum is not: a huge sum only sends the tile to the direct sum too)."""
    _, in_channels, height, width = call.src.dims
    src_n, _, src_y, src_x = call.src.strides
    pad_y, pad_x = call.pad_begin
    e_stride = f"{rows * in_channels}L" if isinstance(rows, int) else f"{rows} * {in_channels}L"
    _tile_position(w, call)
    w.line(f"const long y0 = ty * 2 - {pad_y}, x0 = tx * 2 - {pad_x};",
           f"const int inside = y0 >= 0 && x0 >= 0 && y0 + 4 <= {height} && x0 + 4 <= {width};",
           "ko_vc sum = (ko_vc){0};")  # fmt: skip
    with w.block(f"for (int ci = 0; ci < {in_channels}; ci += KO_VC_LANES)"):
        w.line("ko_vc d[4][4], r[4][4];")
        with w.block("for (int i = 0; i < 4; i++) for (int j = 0; j < 4; j++)"):
            w.line("const long y = y0 + i, x = x0 + j;",
                   f"d[i][j] = inside || (y >= 0 && y < {height} && x >= 0 && x < {width}) ?")
            with w.indented():
                w.line(f"*(const ko_vcu *)(src + n * {src_n}L + y * {src_y}L + x * {src_x}L + ci) : (ko_vc){{0}};")
            w.line("sum += d[i][j];")
        with w.block("for (int j = 0; j < 4; j++)"):
            w.line("r[0][j] = d[0][j] - d[2][j]; r[1][j] = d[1][j] + d[2][j];",
                   "r[2][j] = d[2][j] - d[1][j]; r[3][j] = d[1][j] - d[3][j];")
        w.line(f"float *v = V + (long){row} * {in_channels} + ci;")
        with w.block("for (int i = 0; i < 4; i++)"):
            w.line(f"*(ko_vc *)(v + (i * 4 + 0) * {e_stride}) = r[i][0] - r[i][2];",
                   f"*(ko_vc *)(v + (i * 4 + 1) * {e_stride}) = r[i][1] + r[i][2];",
                   f"*(ko_vc *)(v + (i * 4 + 2) * {e_stride}) = r[i][2] - r[i][1];",
                   f"*(ko_vc *)(v + (i * 4 + 3) * {e_stride}) = r[i][1] - r[i][3];")
    with w.block(""):
        w.line("const ko_vc z = sum * 0.0f;  /* NaN where the sum is not finite */", "int nonfinite = 0;",
               "for (int l = 0; l < KO_VC_LANES; l++) nonfinite |= z[l] != z[l];", f"{flag} = (char)nonfinite;")


def _post(w: CWriter, call: LibraryCall) -> None:
    """C applying the post-ops to the vector of output channels just stored at `o + co`."""
    _, operands = binary_operands(call.post_ops)
    epilogue = post_op_statements(call.post_ops, operands)
    if epilogue:
        with w.block("for (int l = 0; l < KO_VC_LANES; l++)"):
            w.line("const int c = co + l;", "float v = o[c];", *epilogue, "o[c] = v;")


def _store(w: CWriter, call: LibraryCall, value: str) -> None:
    """C storing the vector `value` of output channels at `o + co` (output frame `n`, pixel `y`, `x`) with the
    post-ops applied: in registers, 8 lanes at a time, where they have a vector form, else over the stored lanes
    (_post). Reloading what was just stored cost more than a pass of its own: ResNet-50's plan ran a relu after
    each of its 11 Winograd convs (~50 µs each in place)."""
    vector = vector_epilogue(call.post_ops, "n", "co + h", "y", "x") if call.post_ops else None
    if not vector:
        w.line(f"*(ko_vcu *)(o + co) = {value};")
        _post(w, call)
        return
    w.line(f"const ko_vc stored = {value};")
    with w.block("for (int h = 0; h < KO_VC_LANES; h += 8)  /* once with AVX2, twice with AVX-512 */"):
        w.line("ko_v8 v;", "__builtin_memcpy(&v, (const float *)&stored + h, sizeof v);", *vector,
               "*(ko_v8u *)(o + co + h) = v;")


def _direct_tile(w: CWriter, call: LibraryCall, frames: Frames) -> None:
    """C computing tile `tile`'s outputs by the direct sum, as onnxruntime does, for a tile reading a pixel that is
    not finite (or every tile, when a weight is not): Winograd's transforms would spread an infinity or NaN over the
    whole tile, and inf - inf makes NaN where the direct sum is infinite. Taps in the padding are skipped, as
    onnxruntime's 2-d conv skips them (an infinite weight there leaves the output finite), or multiply zeros, as its
    3-d conv does (`Frames.pads_multiply`). Weights are the state's copy
    [frame tap][tap][ci][co]; `n` is the output frame, whose image's input frames the frame taps read."""
    _, in_channels, height, width = call.src.dims
    _, _, out_h, out_w = call.dst.dims
    out_channels = call.weights.dims[0]
    src_n, _, src_y, src_x = call.src.strides
    dst_n, _, dst_y, dst_x = call.dst.strides
    pad_y, pad_x = call.pad_begin
    depth, out_depth = frames.depth, frames.out_depth
    _tile_position(w, call)
    with w.block("for (int i = 0; i < 4; i++)"):
        w.line("const long y = ty * 2 + i / 2, x = tx * 2 + i % 2;", f"if (y >= {out_h} || x >= {out_w}) continue;",
               f"float *o = dst + n * {dst_n}L + y * {dst_y}L + x * {dst_x}L;")  # fmt: skip
        with w.block(f"for (int co = 0; co < {out_channels}; co += KO_VC_LANES)"):
            w.line("ko_vc acc = *(const ko_vcu *)(s->bias + co);")
            with w.block(f"for (int ft = 0; ft < {frames.taps}; ft++)"):
                w.line(f"const long d = n % {out_depth} + ft - {frames.pad};",
                       f"const int frame_inside = d >= 0 && d < {depth};",
                       *([] if frames.pads_multiply else ["if (!frame_inside) continue;"]),
                       f"const long frame = n / {out_depth} * {depth} + d;")  # fmt: skip
                with w.block("for (int tap = 0; tap < 9; tap++)"):
                    w.line(f"const long iy = y + tap / 3 - {pad_y}, ix = x + tap % 3 - {pad_x};",
                           f"const float *wt = s->wd + ((long)ft * 9 + tap) * {in_channels * out_channels}L + co;")
                    with w.block(f"if (!frame_inside || iy < 0 || iy >= {height} || ix < 0 || ix >= {width})"):
                        if frames.pads_multiply:
                            w.line(f"for (int ci = 0; ci < {in_channels}; ci++)  /* the padding's zeros */")
                            with w.indented():
                                w.line(f"acc += 0.0f * *(const ko_vc *)(wt + (long)ci * {out_channels});")
                        w.line("continue;")
                    w.line(f"const float *in = src + frame * {src_n}L + iy * {src_y}L + ix * {src_x}L;",
                           f"for (int ci = 0; ci < {in_channels}; ci++)")
                    with w.indented():
                        w.line(f"acc += in[ci] * *(const ko_vc *)(wt + (long)ci * {out_channels});")
            _store(w, call, "acc")


def _output_transform(w: CWriter, call: LibraryCall, row: str, rows: int) -> None:
    """C storing tile `tile`'s Y = Aᵀ M A, A^T = [1 1 1 0; 0 1 -1 -1], plus the bias, from M[e][row][co] of an M
    holding `rows` tiles per e, then applying the post-ops to it."""
    _, _, out_h, out_w = call.dst.dims
    out_channels = call.weights.dims[0]
    dst_n, _, dst_y, dst_x = call.dst.strides
    _tile_position(w, call)
    with w.block(f"for (int co = 0; co < {out_channels}; co += KO_VC_LANES)"):
        w.line("ko_vc m[4][4], q[2][4];", "for (int e = 0; e < 16; e++) "
               f"m[e / 4][e % 4] = *(const ko_vc *)(M + ((long)e * {rows} + {row}) * {out_channels} + co);")
        with w.block("for (int j = 0; j < 4; j++)"):
            w.line("q[0][j] = m[0][j] + m[1][j] + m[2][j]; q[1][j] = m[1][j] - m[2][j] - m[3][j];")
        w.line("const ko_vc b = *(const ko_vcu *)(s->bias + co);")
        with w.block("for (int i = 0; i < 2; i++)"):
            w.line("const long y = ty * 2 + i;", f"if (y >= {out_h}) continue;",
                   "const ko_vc out[2] = {q[i][0] + q[i][1] + q[i][2] + b, q[i][1] - q[i][2] - q[i][3] + b};")
            with w.block("for (int jj = 0; jj < 2; jj++)"):
                w.line("const long x = tx * 2 + jj;", f"if (x >= {out_w}) continue;",
                       f"float *o = dst + n * {dst_n}L + y * {dst_y}L + x * {dst_x}L;")
                _store(w, call, "out[jj]")


def _tile_outputs(w: CWriter, call: LibraryCall, frames: Frames, row: str, rows: int, flag: str) -> None:
    """C storing tile `tile`'s outputs: by the direct sum when `flag` (C) marks it or a weight is not finite, else
    by the output transform from M[e][row][co]."""
    with w.block(f"if ({flag} || s->weights_bad)", end="} else {"):
        _direct_tile(w, call, frames)
    with w.indented():
        _output_transform(w, call, row, rows)
    w.line("}")


def _filter_transform(w: CWriter, call: LibraryCall, frames: Frames, u_index: str = "") -> None:
    """Inside create, after its allocations: the bias and U = G g Gᵀ for every (input, output) channel pair and
    frame tap, stored [e][k][co] where k = tap * input channels + ci (or at `u_index`, C of e, k and co)."""
    in_channels, out_channels = call.weights.dims[1], call.weights.dims[0]
    w_o, w_i, w_y, w_x = call.weights.strides
    bias = f"(const float *)a[{call.bias.slot}]" if call.bias is not None else "NULL"
    w.line(f"const float *w = {weights_pointer(call)};", f"const float *bias = {bias};",
           f"for (int c = 0; c < {out_channels}; c++) s->bias[c] = bias ? bias[c] : 0.0f;",
           "/* the direct sum's copy [frame tap][tap][ci][co]; a weight not finite sends every tile there */",
           # the frame-tap loop and the channel loops nest at one depth: one loop nest over (ft, co, ci)
           f"for (int ft = 0; ft < {frames.taps}; ft++)",
           f"for (int co = 0; co < {out_channels}; co++) for (int ci = 0; ci < {in_channels}; ci++)")  # fmt: skip
    with w.indented(), w.block("for (int tap = 0; tap < 9; tap++)"):
        w.line(f"const float g = w[(long)co * {w_o} + (long)ci * {w_i} + (long)ft * {frames.tap_stride} + "
               f"tap / 3 * {w_y} + tap % 3 * {w_x}];",
               f"s->wd[(((long)ft * 9 + tap) * {in_channels} + ci) * {out_channels} + co] = g;",
               "const float z = g * 0.0f;", "if (z != z) s->weights_bad = 1;")  # fmt: skip
    w.line("static const double G[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};",
           f"for (int ft = 0; ft < {frames.taps}; ft++)")
    with w.block(f"for (int co = 0; co < {out_channels}; co++) for (int ci = 0; ci < {in_channels}; ci++)"):
        w.line(f"const long k = (long)ft * {in_channels} + ci;", "double g[3][3], t[4][3];",
               "for (int i = 0; i < 3; i++) for (int j = 0; j < 3; j++)")
        with w.indented():
            w.line(f"g[i][j] = w[(long)co * {w_o} + (long)ci * {w_i} + (long)ft * {frames.tap_stride} + "
                   f"i * {w_y} + j * {w_x}];")
        w.line("for (int i = 0; i < 4; i++) for (int j = 0; j < 3; j++)")
        with w.indented():
            w.line("t[i][j] = G[i][0] * g[0][j] + G[i][1] * g[1][j] + G[i][2] * g[2][j];")
        with w.block("for (int i = 0; i < 4; i++) for (int j = 0; j < 4; j++)"):
            w.line("const int e = i * 4 + j;",
                   f"s->u[{u_index or f'((long)e * {frames.taps * in_channels} + k) * {out_channels} + co'}] = "
                   "(float)(t[i][0] * G[j][0] + t[i][1] * G[j][1] + t[i][2] * G[j][2]);")  # fmt: skip


def render_winograd_conv(name: str, call: LibraryCall) -> str:
    """C for `call` (which `winograd_rejection` accepted): state, create, run, destroy."""
    flat = planar(call)
    assert not isinstance(flat, str), flat
    call, frames = flat
    if _streamed_rejection(call, frames) is None:
        return _render_streamed(name, call, frames)
    batch, in_channels = call.src.dims[:2]
    out_channels = call.weights.dims[0]
    tiles = batch * math.prod(_tiles(call))
    items = -(-tiles // TILES)
    v_floats, m_floats = 16 * TILES * in_channels, 16 * TILES * out_channels
    pointers, _ = binary_operands(call.post_ops)
    w = CWriter()
    w.line(VECTOR_TYPES)
    w.line(AVX2_VECTOR_TYPES)
    with create_function(w, name, "float *u; float *bias; float *wd; float *scratch; int threads; char weights_bad;",
                         ["u", "bias", "wd", "scratch"],
                         [f"s->threads = omp_get_max_threads() < {MAX_THREADS} ? omp_get_max_threads() : "
                          f"{MAX_THREADS};",
                          f"s->u = (float *)aligned_alloc(64, {16 * in_channels * out_channels * 4}L);",
                          f"s->bias = (float *)aligned_alloc(64, {aligned_size(out_channels * 4)});",
                          f"s->wd = (float *)aligned_alloc(64, {aligned_size(9 * in_channels * out_channels * 4)}L);",
                          f"s->scratch = (float *)aligned_alloc(64, (size_t)s->threads * "
                          f"{(v_floats + m_floats) * 4}L);"]):  # fmt: skip
        _filter_transform(w, call, frames)
    with run_function(w, name, call):
        w.line(*pointers,
               "const int threads = omp_get_max_threads() < s->threads ? omp_get_max_threads() : s->threads;",
               "#pragma omp parallel num_threads(threads)")
        with w.flat_block(""):  # the parallel region's body keeps the function's depth
            w.line(f"float *V = s->scratch + (long)omp_get_thread_num() * {v_floats + m_floats};  /* [e][tile][ci] */",
                   f"float *M = V + {v_floats};  /* [e][tile][co] */",
                   "#pragma omp for schedule(static)")  # fmt: skip
            with w.block(f"for (long item = 0; item < {items}L; item++)"):
                w.line(f"const long first = item * {TILES};",
                       f"const int count = first + {TILES} <= {tiles}L ? {TILES} : (int)({tiles}L - first);",
                       "/* input transform: V = B^T d B, B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1] */",
                       f"char bad[{TILES}];  /* tiles reading a pixel that is not finite */")  # fmt: skip
                with w.block(f"for (int t = 0; t < {TILES}; t++)"):
                    w.line("const long tile = first + (t < count ? t : 0);")
                    _input_transform(w, call, "t", TILES, "bad[t]")
                w.line("/* M[e] = V[e] U[e]: blocks of 6 tiles x 16 output channels in registers */")
                with w.block("for (int e = 0; e < 16; e++)"):
                    w.line(f"const float *ve = V + (long)e * {TILES * in_channels};",
                           f"const float *ue = s->u + (long)e * {in_channels * out_channels};",
                           f"float *me = M + (long)e * {TILES * out_channels};",
                           f"for (int co = 0; co < {out_channels}; co += 16)")  # fmt: skip
                    with w.indented(), w.block(f"for (int t = 0; t < {TILES}; t += {MICRO_TILES})"):
                        w.line(f"ko_vc acc[{MICRO_TILES}][16 / KO_VC_LANES];",
                               f"for (int i = 0; i < {MICRO_TILES}; i++) for (int k = 0; k < 16 / KO_VC_LANES; k++) "
                               "acc[i][k] = (ko_vc){0};")  # fmt: skip
                        with w.block(f"for (int ci = 0; ci < {in_channels}; ci++)"):
                            w.line("ko_vc u[16 / KO_VC_LANES];",
                                   "for (int k = 0; k < 16 / KO_VC_LANES; k++) "
                                   f"u[k] = *(const ko_vc *)(ue + (long)ci * {out_channels} + co + k * KO_VC_LANES);")
                            with w.block(f"for (int i = 0; i < {MICRO_TILES}; i++)"):
                                w.line(f"const float b = ve[(long)(t + i) * {in_channels} + ci];",
                                       "for (int k = 0; k < 16 / KO_VC_LANES; k++) acc[i][k] += b * u[k];")
                        w.line(f"for (int i = 0; i < {MICRO_TILES}; i++) for (int k = 0; k < 16 / KO_VC_LANES; k++)")
                        with w.indented():
                            w.line(f"*(ko_vc *)(me + (long)(t + i) * {out_channels} + co + k * KO_VC_LANES) = "
                                   "acc[i][k];")
                w.line("/* output transform: Y = A^T M A, A^T = [1 1 1 0; 0 1 -1 -1], plus the bias; the post-ops */")
                with w.block("for (int t = 0; t < count; t++)"):
                    w.line("const long tile = first + t;")
                    _tile_outputs(w, call, frames, "t", TILES, "bad[t]")
    return w.text(end="\n")


def _render_streamed(name: str, call: LibraryCall, frames: Frames) -> str:
    """C for a (planar) call the streamed schedule takes: the three phases over all tiles. V holds every input
    frame's tiles, [e][image][padded frame][tile][ci], its padding frames zero; an output frame's products read the
    `frames.taps` frames from its own on (one frame: V's tiles are the output's)."""
    in_channels = call.src.dims[1]
    out_channels = call.weights.dims[0]
    frame_tiles = math.prod(_tiles(call))
    tiles = call.dst.dims[0] * frame_tiles  # the output's
    in_tiles = call.src.dims[0] * frame_tiles
    rows = frames.images * frames.padded_depth * frame_tiles  # V's tiles
    taps_k = frames.taps * in_channels  # the products' depth: each frame tap's input channels
    blocks = out_channels // STREAMED_CHANNELS
    # the products run per image (a run of its output frames' tiles), or over all tiles at once
    groups, group_rows = (1, tiles) if frames.identity else (frames.images, frames.out_depth * frame_tiles)
    v_group, m_group = frames.padded_depth * frame_tiles * in_channels, group_rows * out_channels
    pointers, _ = binary_operands(call.post_ops)
    block = f"{name}_block"
    tap_rows = frame_tiles * in_channels  # V's floats between a tile and the same tile one frame on

    def v_row(per_image: int, shift: int) -> str:
        """C of V's row for tile number `tile` over frames of `per_image` frames an image, `shift` frames on."""
        if frames.identity:
            return "tile"
        return (f"((tile / {frame_tiles}) / {per_image} * {frames.padded_depth} + (tile / {frame_tiles}) % "
                f"{per_image} + {shift}) * {frame_tiles} + tile % {frame_tiles}")

    w = CWriter()
    w.line(VECTOR_TYPES, AVX2_VECTOR_TYPES,
           f"#define {name}_VECTORS (KO_VC_ACCUMULATORS / {MICRO_TILES})  /* per register block */")
    with create_function(w, name, "float *u; float *bias; float *wd; float *v; float *m; char *bad; char weights_bad;",
                         ["u", "bias", "wd", "v", "m", "bad"],
                         [f"s->u = (float *)aligned_alloc(64, {16 * taps_k * out_channels * 4}L);",
                          f"s->bias = (float *)aligned_alloc(64, {aligned_size(out_channels * 4)});",
                          f"s->wd = (float *)aligned_alloc(64, {aligned_size(9 * taps_k * out_channels * 4)}L);",
                          f"s->bad = (char *)calloc({rows}, 1);",
                          f"s->v = (float *)aligned_alloc(64, {16 * rows * in_channels * 4}L);",
                          f"s->m = (float *)aligned_alloc(64, {16 * tiles * out_channels * 4}L);"]):  # fmt: skip
        if not frames.identity:
            w.line(f"memset(s->v, 0, {16 * rows * in_channels * 4}L);  "
                   "/* the padding frames' transforms: never written */")
        # each (e, block of output channels) contiguous, [k][co of the block]: one stream per item
        _filter_transform(w, call, frames, f"(((long)e * {blocks} + co / {STREAMED_CHANNELS}) * {taps_k} + k) * "
                          f"{STREAMED_CHANNELS} + co % {STREAMED_CHANNELS}")  # fmt: skip
    # rows x vectors of one block; `rows` is a constant at every call (always inlined)
    with w.function(f"static inline __attribute__((always_inline)) void {block}(const float *restrict v, "
                    "const float *restrict u, float *restrict m, int rows)", returns=None):  # fmt: skip
        w.line(f"ko_vc acc[{MICRO_TILES}][{name}_VECTORS];",
               f"for (int r = 0; r < rows; r++) for (int k = 0; k < {name}_VECTORS; k++) acc[r][k] = (ko_vc){{0}};",
               f"for (int ft = 0; ft < {frames.taps}; ft++)")  # fmt: skip
        with w.block(f"for (int ci = 0; ci < {in_channels}; ci++)"):
            w.line(f"ko_vc w[{name}_VECTORS];", f"for (int k = 0; k < {name}_VECTORS; k++)")
            with w.indented():
                w.line(f"w[k] = *(const ko_vc *)(u + ((long)ft * {in_channels} + ci) * {STREAMED_CHANNELS} + "
                       "k * KO_VC_LANES);")
            with w.block("for (int r = 0; r < rows; r++)"):
                w.line(f"const float x = v[(long)ft * {tap_rows} + (long)r * {in_channels} + ci];",
                       f"for (int k = 0; k < {name}_VECTORS; k++) acc[r][k] += x * w[k];")
        w.line(f"for (int r = 0; r < rows; r++) for (int k = 0; k < {name}_VECTORS; k++)")
        with w.indented():
            w.line(f"*(ko_vc *)(m + (long)r * {out_channels} + k * KO_VC_LANES) = acc[r][k];")
    with run_function(w, name, call):
        w.line(*pointers, "float *V = s->v, *M = s->m;  /* [e][V's tile][ci], [e][tile][co] */",
               "#pragma omp parallel")
        with w.flat_block(""):  # the parallel region's body keeps the function's depth
            w.line("#pragma omp for schedule(static)")
            with w.block(f"for (long tile = 0; tile < {in_tiles}L; tile++)"):
                w.line(f"const long row = {v_row(frames.depth, frames.pad)};")
                _input_transform(w, call, "row", rows, "s->bad[row]")
            w.line("/* M[e] = V[e] U[e]: each (e, block of output channels) once, consecutive ones sharing V[e] */",
                   "#pragma omp for schedule(static)")
            with w.block(f"for (int item = 0; item < {16 * blocks}; item++)"):
                w.line(f"const int e = item / {blocks};", f"for (int g = 0; g < {groups}; g++)")
                with w.block(f"for (int c0 = item % {blocks} * {STREAMED_CHANNELS}; c0 < (item % {blocks} + 1) * "
                             f"{STREAMED_CHANNELS}; c0 += {name}_VECTORS * KO_VC_LANES)"):  # fmt: skip
                    w.line(f"const float *ve = V + (long)e * {rows * in_channels}L + (long)g * {v_group}L;",
                           f"const float *ue = s->u + (long)item * {taps_k * STREAMED_CHANNELS}L + c0 % "
                           f"{STREAMED_CHANNELS};",
                           f"float *me = M + (long)e * {tiles * out_channels}L + (long)g * {m_group}L + c0;",
                           "int t = 0;",
                           f"for (; t + {MICRO_TILES} <= {group_rows}; t += {MICRO_TILES})")  # fmt: skip
                    with w.indented():
                        w.line(f"{block}(ve + (long)t * {in_channels}, ue, me + (long)t * {out_channels}, "
                               f"{MICRO_TILES});")
                    with w.block(f"switch ({group_rows} - t)"):
                        w.extend(f"case {r}: {block}(ve + (long)t * {in_channels}, ue, me + (long)t * {out_channels}, "
                                 f"{r}); break;" for r in range(1, MICRO_TILES))
                        w.line("default: break;")
            w.line("#pragma omp for schedule(static)")
            with w.block(f"for (long tile = 0; tile < {tiles}L; tile++)"):
                w.line(f"const long row = {v_row(frames.out_depth, 0)};",
                       "char bad = 0;  /* a tile any of its frame taps reads is not finite */",
                       f"for (int ft = 0; ft < {frames.taps}; ft++) bad |= s->bad[row + (long)ft * {frame_tiles}];")
                _tile_outputs(w, call, frames, "tile", tiles, "bad")
    return w.text(end="\n")


# oneDNN has no Winograd convolution without AVX-512
BACKEND = LibraryCallBackend("winograd_conv", "native C", "Winograd F(2x2, 3x3) convolution in C",
                             winograd_rejection, render_winograd_conv)  # fmt: skip
