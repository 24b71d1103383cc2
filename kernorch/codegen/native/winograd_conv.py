"""A 3x3 stride-1 convolution by Winograd's F(2x2, 3x3) in generated C: 2.25x fewer multiplications.

Without AVX-512, oneDNN 3.2 has no Winograd convolution; its AVX2 direct 3x3 convs run at ~145 GFLOP/s here
(candy's ten 56x56x128 residual convs took 6.3-6.4 ms each in place, 2 threads, Zen 3), and candy spends 85 %
of its time in them. F(2x2, 3x3) (Lavin & Gray, 2015) computes each 2x2 output tile from a 4x4 input tile:
V = Bᵀ d B per input channel, U = G g Gᵀ per filter (once, at create), then 16 independent products
M[e] = V[e] · U[e] over the input channels, and Y = Aᵀ M A. The 16 products hold 16 instead of 36 multiplies
per output pair of channels and tile.

Each parallel item is a block of `TILES` consecutive tiles (numbered over the whole image, so only the last item
is short). Per item, in a thread's own scratch (allocated at create, one per thread, so a run allocates
nothing): the input transform for every channel vector (channels-last: channels contiguous), the 16 products as
a register-blocked micro-kernel (6 tiles x 16 output channels of FMAs, the input transform's value broadcast),
and the output transform with the bias, stored where the tile lies inside the output, then the post-ops on it.
Pixels of a tile outside the input (padding, odd sizes) read zeros. Numerics: the transforms only add and
subtract (and halve, in G), so results differ from the direct sum by rounding, ~1e-6 relative.
"""

from __future__ import annotations

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
# Every item multiplies its tiles by all 16 transformed filters (16 x in x out floats): beyond a core's share of L2
# each item streams them from L3 again. In place (2026-11-28, AMX host, 4 convs in a row, alternated with
# oneDNN): 64 -> 64 on 56x56 1.16x faster, 128 -> 128 on 28x28 0.96-1.16x, 256 -> 256 on 14x14 0.69x and on 28x28
# 0.88x, 512 -> 512 on 7x7 (one item: one thread) 0.2x, on 14x14 0.33x.
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
    if transformed > MAX_TRANSFORMED_BYTES:
        return f"its transformed filters ({transformed >> 10} KiB) outgrow the L2 every block of tiles reads them from"
    return post_ops_rejection(call.post_ops)


def render_winograd_conv(name: str, call: LibraryCall) -> str:
    """C for `call` (which `winograd_rejection` accepted): state, create, run, destroy."""
    batch, in_channels, height, width = call.src.dims
    out_channels = call.weights.dims[0]
    _, _, out_h, out_w = call.dst.dims
    src_n, _, src_y, src_x = call.src.strides
    dst_n, _, dst_y, dst_x = call.dst.strides
    w_o, w_i, w_y, w_x = call.weights.strides
    pad_y, pad_x = call.pad_begin
    tiles_y, tiles_x = -(-out_h // 2), -(-out_w // 2)
    tiles = batch * tiles_y * tiles_x
    items = -(-tiles // TILES)
    v_floats, m_floats = 16 * TILES * in_channels, 16 * TILES * out_channels
    bias = f"(const float *)a[{call.bias.slot}]" if call.bias is not None else "NULL"
    pointers, operands = binary_operands(call.post_ops)
    epilogue = post_op_statements(call.post_ops, operands)
    post = ["                        for (int l = 0; l < KO_VC_LANES; l++) {",
            "                            const int c = co + l;",
            "                            float v = o[c];",
            *(f"                            {statement}" for statement in epilogue),
            "                            o[c] = v;",
            "                        }"] if epilogue else []  # fmt: skip

    lines = [VECTOR_TYPES,
             *state_lifecycle(name, "float *u; float *bias; float *scratch; int threads;", ["u", "bias", "scratch"],
                              [f"s->threads = omp_get_max_threads() < {MAX_THREADS} ? omp_get_max_threads() : "
                               f"{MAX_THREADS};",
                               f"s->u = (float *)aligned_alloc(64, {16 * in_channels * out_channels * 4}L);",
                               f"s->bias = (float *)aligned_alloc(64, {out_channels * 4});",
                               f"s->scratch = (float *)aligned_alloc(64, (size_t)s->threads * "
                               f"{(v_floats + m_floats) * 4}L);"]),
             f"    const float *w = {weights_pointer(call)};",
             f"    const float *bias = {bias};",
             f"    for (int c = 0; c < {out_channels}; c++) s->bias[c] = bias ? bias[c] : 0.0f;",
             "    /* U = G g G^T for every (input, output) channel pair, stored [e][ci][co] */",
             "    static const double G[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};",
             f"    for (int co = 0; co < {out_channels}; co++) for (int ci = 0; ci < {in_channels}; ci++) {{",
             "        double g[3][3], t[4][3];",
             "        for (int i = 0; i < 3; i++) for (int j = 0; j < 3; j++)",
             f"            g[i][j] = w[(long)co * {w_o} + (long)ci * {w_i} + i * {w_y} + j * {w_x}];",
             "        for (int i = 0; i < 4; i++) for (int j = 0; j < 3; j++)",
             "            t[i][j] = G[i][0] * g[0][j] + G[i][1] * g[1][j] + G[i][2] * g[2][j];",
             "        for (int i = 0; i < 4; i++) for (int j = 0; j < 4; j++)",
             f"            s->u[((long)(i * 4 + j) * {in_channels} + ci) * {out_channels} + co] = "
             "(float)(t[i][0] * G[j][0] + t[i][1] * G[j][1] + t[i][2] * G[j][2]);",
             "    }",
             "    return s;",
             "}",
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
             f"        for (int t = 0; t < {TILES}; t++) {{",
             "            const long tile = first + (t < count ? t : 0);",
             f"            const long n = tile / {tiles_y * tiles_x}, ty = tile / {tiles_x} % {tiles_y}, "
             f"tx = tile % {tiles_x};",
             f"            const long y0 = ty * 2 - {pad_y}, x0 = tx * 2 - {pad_x};",
             f"            const int inside = y0 >= 0 && x0 >= 0 && y0 + 4 <= {height} && x0 + 4 <= {width};",
             f"            for (int ci = 0; ci < {in_channels}; ci += KO_VC_LANES) {{",
             "                ko_vc d[4][4], r[4][4];",
             "                for (int i = 0; i < 4; i++) for (int j = 0; j < 4; j++) {",
             "                    const long y = y0 + i, x = x0 + j;",
             f"                    d[i][j] = inside || (y >= 0 && y < {height} && x >= 0 && x < {width}) ?",
             f"                        *(const ko_vcu *)(src + n * {src_n}L + y * {src_y}L + x * {src_x}L + ci) : "
             "(ko_vc){0};",
             "                }",
             "                for (int j = 0; j < 4; j++) {",
             "                    r[0][j] = d[0][j] - d[2][j]; r[1][j] = d[1][j] + d[2][j];",
             "                    r[2][j] = d[2][j] - d[1][j]; r[3][j] = d[1][j] - d[3][j];",
             "                }",
             f"                float *v = V + (long)t * {in_channels} + ci;",
             "                for (int i = 0; i < 4; i++) {",
             f"                    *(ko_vc *)(v + (i * 4 + 0) * {TILES * in_channels}L) = r[i][0] - r[i][2];",
             f"                    *(ko_vc *)(v + (i * 4 + 1) * {TILES * in_channels}L) = r[i][1] + r[i][2];",
             f"                    *(ko_vc *)(v + (i * 4 + 2) * {TILES * in_channels}L) = r[i][2] - r[i][1];",
             f"                    *(ko_vc *)(v + (i * 4 + 3) * {TILES * in_channels}L) = r[i][1] - r[i][3];",
             "                }",
             "            }",
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
             f"            const long n = tile / {tiles_y * tiles_x}, ty = tile / {tiles_x} % {tiles_y}, "
             f"tx = tile % {tiles_x};",
             f"            for (int co = 0; co < {out_channels}; co += KO_VC_LANES) {{",
             "                ko_vc m[4][4], q[2][4];",
             "                for (int e = 0; e < 16; e++) "
             f"m[e / 4][e % 4] = *(const ko_vc *)(M + ((long)e * {TILES} + t) * {out_channels} + co);",
             "                for (int j = 0; j < 4; j++) {",
             "                    q[0][j] = m[0][j] + m[1][j] + m[2][j]; q[1][j] = m[1][j] - m[2][j] - m[3][j];",
             "                }",
             "                const ko_vc b = *(const ko_vcu *)(s->bias + co);",
             "                for (int i = 0; i < 2; i++) {",
             "                    const long y = ty * 2 + i;",
             f"                    if (y >= {out_h}) continue;",
             "                    const ko_vc out[2] = {q[i][0] + q[i][1] + q[i][2] + b,",
             "                                          q[i][1] - q[i][2] - q[i][3] + b};",
             "                    for (int jj = 0; jj < 2; jj++) {",
             "                        const long x = tx * 2 + jj;",
             f"                        if (x >= {out_w}) continue;",
             f"                        float *o = dst + n * {dst_n}L + y * {dst_y}L + x * {dst_x}L;",
             "                        *(ko_vcu *)(o + co) = out[jj];",
             *post,
             "                    }",
             "                }",
             "            }",
             "        }",
             "    }",
             "    }",
             "    return 0;",
             "}",
             ""]  # fmt: skip
    return "\n".join(lines)
