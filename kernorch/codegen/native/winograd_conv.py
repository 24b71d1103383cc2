"""A 3x3 stride-1 convolution by Winograd's F(2x2, 3x3) in generated C: 2.25x fewer multiplications.

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

from kernorch.codegen.library import LibraryCall, binary_operands, post_op_statements, post_ops_rejection
from kernorch.codegen.native.skeleton import (
    VECTOR_TYPES,
    operand_rejection,
    run_prologue,
    state_lifecycle,
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


def winograd_rejection(call: LibraryCall) -> str | None:
    """Why the Winograd kernel does not run `call` (None when it does)."""
    if call.op != "convolution" or len(call.src.dims) != 4 or len(call.weights.dims) != 4:
        return "not a 2-d convolution without groups"
    out_channels, in_channels, kernel_h, kernel_w = call.weights.dims
    if (kernel_h, kernel_w) != (3, 3) or call.strides != (1, 1) or any(call.dilates):
        return "not 3x3, stride 1, undilated"
    if in_channels % CHANNEL_MULTIPLE or out_channels % CHANNEL_MULTIPLE:
        return f"channels are not multiples of {CHANNEL_MULTIPLE}"
    operands = operand_rejection(call)
    if operands is not None:
        return operands
    batch, _, out_h, out_w = call.dst.dims
    if batch * out_h * out_w * in_channels * out_channels * 9 < MIN_MACS:
        return "too small for the transforms to pay"
    transformed = 16 * in_channels * out_channels * 4
    if not _streamed(call) and transformed > MAX_TRANSFORMED_BYTES:
        return (f"its transformed filters ({transformed >> 10} KiB) outgrow the L2 every block of tiles reads them "
                f"from, and the streamed schedule {_streamed_rejection(call)}")
    return post_ops_rejection(call.post_ops)


def _streamed_rejection(call: LibraryCall) -> str | None:
    """Why the call does not run on the streamed schedule (None when it does)."""
    out_channels, in_channels = call.weights.dims[:2]
    tiles = call.dst.dims[0] * math.prod(_tiles(call))
    if out_channels % STREAMED_CHANNELS:
        return f"takes output channels in multiples of {STREAMED_CHANNELS}"
    if tiles < STREAMED_MIN_TILES:
        return f"needs {STREAMED_MIN_TILES} tiles to read its filters once for all, this map has {tiles}"
    if 16 * tiles * (in_channels + out_channels) * 4 > MAX_STREAMED_SCRATCH:
        return f"would hold every tile's transforms in more than {MAX_STREAMED_SCRATCH >> 20} MiB"
    return None


def _streamed(call: LibraryCall) -> bool:
    return _streamed_rejection(call) is None


def _tiles(call: LibraryCall) -> tuple[int, int]:
    """Tiles of 2x2 outputs along y and x (the last ones partial on an odd size)."""
    _, _, out_h, out_w = call.dst.dims
    return -(-out_h // 2), -(-out_w // 2)


def _tile_position(call: LibraryCall, indent: str) -> str:
    """C naming the image `n` and the tile row and column `ty`, `tx` of tile number `tile`."""
    tiles_y, tiles_x = _tiles(call)
    return (f"{indent}const long n = tile / {tiles_y * tiles_x}, ty = tile / {tiles_x} % {tiles_y}, "
            f"tx = tile % {tiles_x};")


def _input_transform(call: LibraryCall, indent: str, row: str, rows: int | str, flag: str) -> list[str]:
    """C writing tile `tile`'s V = Bᵀ d B, B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], into V[e][row][ci] of a V
    holding `rows` tiles per e (pixels outside the input read zeros), and setting `flag` (C) when a pixel the tile
    reads is not finite (their sum is not: a huge sum only sends the tile to the direct sum too)."""
    _, in_channels, height, width = call.src.dims
    src_n, _, src_y, src_x = call.src.strides
    pad_y, pad_x = call.pad_begin
    e_stride = f"{rows * in_channels}L" if isinstance(rows, int) else f"{rows} * {in_channels}L"
    return [_tile_position(call, indent),
            f"{indent}const long y0 = ty * 2 - {pad_y}, x0 = tx * 2 - {pad_x};",
            f"{indent}const int inside = y0 >= 0 && x0 >= 0 && y0 + 4 <= {height} && x0 + 4 <= {width};",
            f"{indent}ko_vc sum = (ko_vc){{0}};",
            f"{indent}for (int ci = 0; ci < {in_channels}; ci += KO_VC_LANES) {{",
            f"{indent}    ko_vc d[4][4], r[4][4];",
            f"{indent}    for (int i = 0; i < 4; i++) for (int j = 0; j < 4; j++) {{",
            f"{indent}        const long y = y0 + i, x = x0 + j;",
            f"{indent}        d[i][j] = inside || (y >= 0 && y < {height} && x >= 0 && x < {width}) ?",
            f"{indent}            *(const ko_vcu *)(src + n * {src_n}L + y * {src_y}L + x * {src_x}L + ci) : "
            "(ko_vc){0};",
            f"{indent}        sum += d[i][j];",
            f"{indent}    }}",
            f"{indent}    for (int j = 0; j < 4; j++) {{",
            f"{indent}        r[0][j] = d[0][j] - d[2][j]; r[1][j] = d[1][j] + d[2][j];",
            f"{indent}        r[2][j] = d[2][j] - d[1][j]; r[3][j] = d[1][j] - d[3][j];",
            f"{indent}    }}",
            f"{indent}    float *v = V + (long){row} * {in_channels} + ci;",
            f"{indent}    for (int i = 0; i < 4; i++) {{",
            f"{indent}        *(ko_vc *)(v + (i * 4 + 0) * {e_stride}) = r[i][0] - r[i][2];",
            f"{indent}        *(ko_vc *)(v + (i * 4 + 1) * {e_stride}) = r[i][1] + r[i][2];",
            f"{indent}        *(ko_vc *)(v + (i * 4 + 2) * {e_stride}) = r[i][2] - r[i][1];",
            f"{indent}        *(ko_vc *)(v + (i * 4 + 3) * {e_stride}) = r[i][1] - r[i][3];",
            f"{indent}    }}",
            f"{indent}}}",
            f"{indent}{{",
            f"{indent}    const ko_vc z = sum * 0.0f;  /* NaN where the sum is not finite */",
            f"{indent}    int nonfinite = 0;",
            f"{indent}    for (int l = 0; l < KO_VC_LANES; l++) nonfinite |= z[l] != z[l];",
            f"{indent}    {flag} = (char)nonfinite;",
            f"{indent}}}"]  # fmt: skip


def _post(call: LibraryCall, indent: str) -> list[str]:
    """C applying the post-ops to the vector of output channels just stored at `o + co`."""
    _, operands = binary_operands(call.post_ops)
    epilogue = post_op_statements(call.post_ops, operands)
    return [f"{indent}for (int l = 0; l < KO_VC_LANES; l++) {{",
            f"{indent}    const int c = co + l;",
            f"{indent}    float v = o[c];",
            *(f"{indent}    {statement}" for statement in epilogue),
            f"{indent}    o[c] = v;",
            f"{indent}}}"] if epilogue else []  # fmt: skip


def _direct_tile(call: LibraryCall, indent: str) -> list[str]:
    """C computing tile `tile`'s outputs by the direct sum, as onnxruntime does, for a tile reading a pixel that is
    not finite (or every tile, when a weight is not): Winograd's transforms would spread an infinity or NaN over the
    whole tile, and inf - inf makes NaN where the direct sum is infinite. Taps in the padding are skipped, as
    onnxruntime skips them (an infinite weight there leaves the output finite). Weights are the state's copy
    [tap][ci][co]."""
    _, in_channels, height, width = call.src.dims
    _, _, out_h, out_w = call.dst.dims
    out_channels = call.weights.dims[0]
    src_n, _, src_y, src_x = call.src.strides
    dst_n, _, dst_y, dst_x = call.dst.strides
    pad_y, pad_x = call.pad_begin
    return [_tile_position(call, indent),
            f"{indent}for (int i = 0; i < 4; i++) {{",
            f"{indent}    const long y = ty * 2 + i / 2, x = tx * 2 + i % 2;",
            f"{indent}    if (y >= {out_h} || x >= {out_w}) continue;",
            f"{indent}    float *o = dst + n * {dst_n}L + y * {dst_y}L + x * {dst_x}L;",
            f"{indent}    for (int co = 0; co < {out_channels}; co += KO_VC_LANES) {{",
            f"{indent}        ko_vc acc = *(const ko_vcu *)(s->bias + co);",
            f"{indent}        for (int tap = 0; tap < 9; tap++) {{",
            f"{indent}            const long iy = y + tap / 3 - {pad_y}, ix = x + tap % 3 - {pad_x};",
            f"{indent}            if (iy < 0 || iy >= {height} || ix < 0 || ix >= {width}) continue;",
            f"{indent}            const float *in = src + n * {src_n}L + iy * {src_y}L + ix * {src_x}L;",
            f"{indent}            const float *wt = s->wd + (long)tap * {in_channels * out_channels}L + co;",
            f"{indent}            for (int ci = 0; ci < {in_channels}; ci++)",
            f"{indent}                acc += in[ci] * *(const ko_vc *)(wt + (long)ci * {out_channels});",
            f"{indent}        }}",
            f"{indent}        *(ko_vcu *)(o + co) = acc;",
            *_post(call, f"{indent}        "),
            f"{indent}    }}",
            f"{indent}}}"]  # fmt: skip


def _output_transform(call: LibraryCall, indent: str, row: str, rows: int) -> list[str]:
    """C storing tile `tile`'s Y = Aᵀ M A, A^T = [1 1 1 0; 0 1 -1 -1], plus the bias, from M[e][row][co] of an M
    holding `rows` tiles per e, then applying the post-ops to it."""
    _, _, out_h, out_w = call.dst.dims
    out_channels = call.weights.dims[0]
    dst_n, _, dst_y, dst_x = call.dst.strides
    return [_tile_position(call, indent),
            f"{indent}for (int co = 0; co < {out_channels}; co += KO_VC_LANES) {{",
            f"{indent}    ko_vc m[4][4], q[2][4];",
            f"{indent}    for (int e = 0; e < 16; e++) "
            f"m[e / 4][e % 4] = *(const ko_vc *)(M + ((long)e * {rows} + {row}) * {out_channels} + co);",
            f"{indent}    for (int j = 0; j < 4; j++) {{",
            f"{indent}        q[0][j] = m[0][j] + m[1][j] + m[2][j]; q[1][j] = m[1][j] - m[2][j] - m[3][j];",
            f"{indent}    }}",
            f"{indent}    const ko_vc b = *(const ko_vcu *)(s->bias + co);",
            f"{indent}    for (int i = 0; i < 2; i++) {{",
            f"{indent}        const long y = ty * 2 + i;",
            f"{indent}        if (y >= {out_h}) continue;",
            f"{indent}        const ko_vc out[2] = {{q[i][0] + q[i][1] + q[i][2] + b, "
            "q[i][1] - q[i][2] - q[i][3] + b};",
            f"{indent}        for (int jj = 0; jj < 2; jj++) {{",
            f"{indent}            const long x = tx * 2 + jj;",
            f"{indent}            if (x >= {out_w}) continue;",
            f"{indent}            float *o = dst + n * {dst_n}L + y * {dst_y}L + x * {dst_x}L;",
            f"{indent}            *(ko_vcu *)(o + co) = out[jj];",
            *_post(call, f"{indent}            "),
            f"{indent}        }}",
            f"{indent}    }}",
            f"{indent}}}"]  # fmt: skip


def _tile_outputs(call: LibraryCall, indent: str, row: str, rows: int, flag: str) -> list[str]:
    """C storing tile `tile`'s outputs: by the direct sum when `flag` (C) marks it or a weight is not finite, else
    by the output transform from M[e][row][co]."""
    return [f"{indent}if ({flag} || s->weights_bad) {{",
            *_direct_tile(call, f"{indent}    "),
            f"{indent}}} else {{",
            *_output_transform(call, f"{indent}    ", row, rows),
            f"{indent}}}"]  # fmt: skip


def _filter_transform(call: LibraryCall, u_index: str = "") -> list[str]:
    """The opening of create after its allocations: the bias and U = G g Gᵀ for every (input, output) channel pair,
    stored [e][ci][co] (or at `u_index`, C of e, ci and co)."""
    in_channels, out_channels = call.weights.dims[1], call.weights.dims[0]
    w_o, w_i, w_y, w_x = call.weights.strides
    bias = f"(const float *)a[{call.bias.slot}]" if call.bias is not None else "NULL"
    return [f"    const float *w = {weights_pointer(call)};",
            f"    const float *bias = {bias};",
            f"    for (int c = 0; c < {out_channels}; c++) s->bias[c] = bias ? bias[c] : 0.0f;",
            "    /* the direct sum's copy [tap][ci][co]; a weight that is not finite sends every tile there */",
            f"    for (int co = 0; co < {out_channels}; co++) for (int ci = 0; ci < {in_channels}; ci++)",
            "        for (int tap = 0; tap < 9; tap++) {",
            f"            const float g = w[(long)co * {w_o} + (long)ci * {w_i} + tap / 3 * {w_y} + tap % 3 * {w_x}];",
            f"            s->wd[((long)tap * {in_channels} + ci) * {out_channels} + co] = g;",
            "            const float z = g * 0.0f;",
            "            if (z != z) s->weights_bad = 1;",
            "        }",
            "    static const double G[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};",
            f"    for (int co = 0; co < {out_channels}; co++) for (int ci = 0; ci < {in_channels}; ci++) {{",
            "        double g[3][3], t[4][3];",
            "        for (int i = 0; i < 3; i++) for (int j = 0; j < 3; j++)",
            f"            g[i][j] = w[(long)co * {w_o} + (long)ci * {w_i} + i * {w_y} + j * {w_x}];",
            "        for (int i = 0; i < 4; i++) for (int j = 0; j < 3; j++)",
            "            t[i][j] = G[i][0] * g[0][j] + G[i][1] * g[1][j] + G[i][2] * g[2][j];",
            "        for (int i = 0; i < 4; i++) for (int j = 0; j < 4; j++) {",
            "            const int e = i * 4 + j;",
            f"            s->u[{u_index or f'((long)e * {in_channels} + ci) * {out_channels} + co'}] = "
            "(float)(t[i][0] * G[j][0] + t[i][1] * G[j][1] + t[i][2] * G[j][2]);",
            "        }",
            "    }",
            "    return s;",
            "}"]  # fmt: skip


def render_winograd_conv(name: str, call: LibraryCall) -> str:
    """C for `call` (which `winograd_rejection` accepted): state, create, run, destroy."""
    if _streamed(call):
        return _render_streamed(name, call)
    batch, in_channels = call.src.dims[:2]
    out_channels = call.weights.dims[0]
    tiles = batch * math.prod(_tiles(call))
    items = -(-tiles // TILES)
    v_floats, m_floats = 16 * TILES * in_channels, 16 * TILES * out_channels
    pointers, _ = binary_operands(call.post_ops)

    lines = [VECTOR_TYPES,
             *state_lifecycle(name, "float *u; float *bias; float *wd; float *scratch; int threads; char weights_bad;",
                              ["u", "bias", "wd", "scratch"],
                              [f"s->threads = omp_get_max_threads() < {MAX_THREADS} ? omp_get_max_threads() : "
                               f"{MAX_THREADS};",
                               f"s->u = (float *)aligned_alloc(64, {16 * in_channels * out_channels * 4}L);",
                               f"s->bias = (float *)aligned_alloc(64, {out_channels * 4});",
                               f"s->wd = (float *)aligned_alloc(64, {9 * in_channels * out_channels * 4}L);",
                               f"s->scratch = (float *)aligned_alloc(64, (size_t)s->threads * "
                               f"{(v_floats + m_floats) * 4}L);"]),
             *_filter_transform(call),
             *run_prologue(name, call),
             *pointers,
             "    const int threads = omp_get_max_threads() < s->threads ? omp_get_max_threads() : s->threads;",
             "    #pragma omp parallel num_threads(threads)",
             "    {",
             f"    float *V = s->scratch + (long)omp_get_thread_num() * {v_floats + m_floats};  /* [e][tile][ci] */",
             f"    float *M = V + {v_floats};  /* [e][tile][co] */",
             "    #pragma omp for schedule(static)",
             f"    for (long item = 0; item < {items}L; item++) {{",
             f"        const long first = item * {TILES};",
             f"        const int count = first + {TILES} <= {tiles}L ? {TILES} : (int)({tiles}L - first);",
             "        /* input transform: V = B^T d B, B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1] */",
             f"        char bad[{TILES}];  /* tiles reading a pixel that is not finite */",
             f"        for (int t = 0; t < {TILES}; t++) {{",
             "            const long tile = first + (t < count ? t : 0);",
             *_input_transform(call, "            ", "t", TILES, "bad[t]"),
             "        }",
             "        /* M[e] = V[e] U[e]: blocks of 6 tiles x 16 output channels in registers */",
             "        for (int e = 0; e < 16; e++) {",
             f"            const float *ve = V + (long)e * {TILES * in_channels};",
             f"            const float *ue = s->u + (long)e * {in_channels * out_channels};",
             f"            float *me = M + (long)e * {TILES * out_channels};",
             f"            for (int co = 0; co < {out_channels}; co += 16)",
             f"                for (int t = 0; t < {TILES}; t += {MICRO_TILES}) {{",
             f"                    ko_vc acc[{MICRO_TILES}][16 / KO_VC_LANES];",
             f"                    for (int i = 0; i < {MICRO_TILES}; i++) for (int k = 0; k < 16 / KO_VC_LANES; k++) "
             "acc[i][k] = (ko_vc){0};",
             f"                    for (int ci = 0; ci < {in_channels}; ci++) {{",
             "                        ko_vc u[16 / KO_VC_LANES];",
             "                        for (int k = 0; k < 16 / KO_VC_LANES; k++) "
             f"u[k] = *(const ko_vc *)(ue + (long)ci * {out_channels} + co + k * KO_VC_LANES);",
             f"                        for (int i = 0; i < {MICRO_TILES}; i++) {{",
             f"                            const float b = ve[(long)(t + i) * {in_channels} + ci];",
             "                            for (int k = 0; k < 16 / KO_VC_LANES; k++) acc[i][k] += b * u[k];",
             "                        }",
             "                    }",
             f"                    for (int i = 0; i < {MICRO_TILES}; i++) for (int k = 0; k < 16 / KO_VC_LANES; k++)",
             f"                        *(ko_vc *)(me + (long)(t + i) * {out_channels} + co + k * KO_VC_LANES) = "
             "acc[i][k];",
             "                }",
             "        }",
             "        /* output transform: Y = A^T M A, A^T = [1 1 1 0; 0 1 -1 -1], plus the bias; the post-ops */",
             "        for (int t = 0; t < count; t++) {",
             "            const long tile = first + t;",
             *_tile_outputs(call, "            ", "t", TILES, "bad[t]"),
             "        }",
             "    }",
             "    }",
             "    return 0;",
             "}",
             ""]  # fmt: skip
    return "\n".join(lines)


def _render_streamed(name: str, call: LibraryCall) -> str:
    """C for a call the streamed schedule takes (`_streamed`): the three phases over all tiles."""
    batch, in_channels = call.src.dims[:2]
    out_channels = call.weights.dims[0]
    tiles = batch * math.prod(_tiles(call))
    blocks = out_channels // STREAMED_CHANNELS
    pointers, _ = binary_operands(call.post_ops)
    block = f"{name}_block"
    lines = [VECTOR_TYPES,
             f"#define {name}_VECTORS (KO_VC_ACCUMULATORS / {MICRO_TILES})  /* per register block */",
             *state_lifecycle(name, "float *u; float *bias; float *wd; float *v; float *m; char *bad; "
                                    "char weights_bad;",
                              ["u", "bias", "wd", "v", "m", "bad"],
                              [f"s->u = (float *)aligned_alloc(64, {16 * in_channels * out_channels * 4}L);",
                               f"s->bias = (float *)aligned_alloc(64, {out_channels * 4});",
                               f"s->wd = (float *)aligned_alloc(64, {9 * in_channels * out_channels * 4}L);",
                               f"s->bad = (char *)malloc({tiles});",
                               f"s->v = (float *)aligned_alloc(64, {16 * tiles * in_channels * 4}L);",
                               f"s->m = (float *)aligned_alloc(64, {16 * tiles * out_channels * 4}L);"]),
             # each (e, block of output channels) contiguous, [ci][co of the block]: one stream per item
             *_filter_transform(call, f"(((long)e * {blocks} + co / {STREAMED_CHANNELS}) * {in_channels} + ci) * "
                                f"{STREAMED_CHANNELS} + co % {STREAMED_CHANNELS}"),
             # rows x vectors of one block; `rows` is a constant at every call (always inlined)
             f"static inline __attribute__((always_inline)) void {block}(const float *restrict v, "
             "const float *restrict u, float *restrict m, int rows) {",
             f"    ko_vc acc[{MICRO_TILES}][{name}_VECTORS];",
             f"    for (int r = 0; r < rows; r++) for (int k = 0; k < {name}_VECTORS; k++) acc[r][k] = (ko_vc){{0}};",
             f"    for (int ci = 0; ci < {in_channels}; ci++) {{",
             f"        ko_vc w[{name}_VECTORS];",
             f"        for (int k = 0; k < {name}_VECTORS; k++) w[k] = *(const ko_vc *)(u + (long)ci * "
             f"{STREAMED_CHANNELS} + k * KO_VC_LANES);",
             "        for (int r = 0; r < rows; r++) {",
             f"            const float x = v[(long)r * {in_channels} + ci];",
             f"            for (int k = 0; k < {name}_VECTORS; k++) acc[r][k] += x * w[k];",
             "        }",
             "    }",
             f"    for (int r = 0; r < rows; r++) for (int k = 0; k < {name}_VECTORS; k++)",
             f"        *(ko_vc *)(m + (long)r * {out_channels} + k * KO_VC_LANES) = acc[r][k];",
             "}",
             *run_prologue(name, call),
             *pointers,
             "    float *V = s->v, *M = s->m;  /* [e][tile][ci], [e][tile][co] */",
             "    #pragma omp parallel",
             "    {",
             "    #pragma omp for schedule(static)",
             f"    for (long tile = 0; tile < {tiles}L; tile++) {{",
             *_input_transform(call, "        ", "tile", tiles, "s->bad[tile]"),
             "    }",
             "    /* M[e] = V[e] U[e]: each (e, block of output channels) once, consecutive ones sharing V[e] */",
             "    #pragma omp for schedule(static)",
             f"    for (int item = 0; item < {16 * blocks}; item++) {{",
             f"        const int e = item / {blocks};",
             f"        for (int c0 = item % {blocks} * {STREAMED_CHANNELS}; c0 < (item % {blocks} + 1) * "
             f"{STREAMED_CHANNELS}; c0 += {name}_VECTORS * KO_VC_LANES) {{",
             f"            const float *ve = V + (long)e * {tiles * in_channels}L;",
             f"            const float *ue = s->u + (long)item * {in_channels * STREAMED_CHANNELS}L + c0 % "
             f"{STREAMED_CHANNELS};",
             f"            float *me = M + (long)e * {tiles * out_channels}L + c0;",
             "            int t = 0;",
             f"            for (; t + {MICRO_TILES} <= {tiles}; t += {MICRO_TILES})",
             f"                {block}(ve + (long)t * {in_channels}, ue, me + (long)t * {out_channels}, "
             f"{MICRO_TILES});",
             f"            switch ({tiles} - t) {{",
             *(f"                case {rows}: {block}(ve + (long)t * {in_channels}, ue, me + (long)t * {out_channels}, "
               f"{rows}); break;" for rows in range(1, MICRO_TILES)),
             "                default: break;",
             "            }",
             "        }",
             "    }",
             "    #pragma omp for schedule(static)",
             f"    for (long tile = 0; tile < {tiles}L; tile++) {{",
             *_tile_outputs(call, "        ", "tile", tiles, "s->bad[tile]"),
             "    }",
             "    }",
             "    return 0;",
             "}",
             ""]  # fmt: skip
    return "\n".join(lines)
