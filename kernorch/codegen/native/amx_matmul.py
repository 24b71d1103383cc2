"""A bf16 matmul on AMX tiles, for a bf16 plan's linear layers and its convolutions without groups (implicit im2col):
[M, K] x [K, N] with constant weights, the bias and the epilogue's post-ops applied while the result is in cache,
written float32 or bfloat16.

oneDNN 3.2's bf16 matmul (brgemm on AMX) runs the shapes of the transformers here at 300-450 GFLOP/s on two
cores (vit_tiny's 197x768x192: 180-190 µs, torch 2.13's oneDNN the same); a plain 2x2-tile loop reaches 630-820
(89 µs), measured in one process on the Xeon of 2026-11-27 (bench/results/2026-11-27-amx-matmul.md).

The weights are packed once, when the plan is created, as tiles of bfloat16 pairs (VNNI: a tile row holds 16
columns' values at two consecutive k), rounded to nearest even; K and N are padded with zeros to whole steps of
32 and blocks of 32. Per item of 32 rows x 32 columns: the rows' source, rounded to bfloat16 (vcvtne2ps2bf16) or
copied when stored bfloat16, once per block of rows a thread visits; four float32 accumulator tiles (two row
tiles x two column tiles), K in steps of 32; the tiles stored to a float block, then bias, post-ops and the
store (float32, or bfloat16 rounded to nearest even as `ko_bf16_bits`), 32 columns at a time so GCC vectorizes
the post-ops' scalar C.

Compiled where the compiler targets AMX-BF16 and taken when Linux grants the tile state (attention_amx.py's
`ko_amx_ready`); otherwise the same kernel multiplies the same bfloat16 block and packed weights in scalar C
(same products, float32 sums), so a plan never depends on the grant. Where the CPU has no AMX, the backend
declines and oneDNN runs the call. Scratch (a block of rows and one of sums per thread) is allocated at create for
the OpenMP threads then (at most 8); a run uses no more.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from kernorch.codegen.library import LibraryCall, Tensor, post_op_statements, post_ops_rejection
from kernorch.codegen.native.attention_amx import AMX_SUPPORT
from kernorch.codegen.native.skeleton import state_lifecycle
from kernorch.machine import isa_flags

AMX_FLAGS = frozenset({"amx_tile", "amx_bf16", "avx512_bf16"})
MAX_K = 16384  # a thread's block of rows is 32 x K bfloat16 (1 MiB at most), allocated when the plan is created
MAX_SLOTS = 8  # at most this many threads get scratch (the OpenMP threads when the plan is created, up to this)
# Where oneDNN 3.2 was faster, measured in place on the same plans (bench/results/2026-11-27-amx-matmul.md): a
# convolution over few input channels (candy's 9x9 over 3: 2.07 vs 1.18 ms; segformer's 7x7 over 3: 532 vs 457
# µs), and a short K with many columns, where each item's few tile products cannot hide storing its 32x32 block
# (segformer's 4096x64x256: 273 vs 234 µs, 1024x160x640: 309 vs 271; 1024x160x160 and 256x256x1024 stay faster
# on tiles: 95 vs 121, 221 vs 258).
FEW_CHANNELS = 16
SHORT_K, WIDE_N = 192, 256

# count float32 → bfloat16, rounded to nearest even: vcvtne2ps2bf16 32 at a time where the compiler targets
# AVX512-BF16 (it reads subnormals as zero, as the tiles do), else ko_bf16_bits (GCC vectorizes it)
BF16_RUN = """#ifndef KO_BF16_RUN
#define KO_BF16_RUN
#ifdef __AVX512BF16__
#include <immintrin.h>
#endif
static inline void ko_bf16_run(uint16_t *to, const float *x, long count) {
    long c = 0;
#ifdef __AVX512BF16__
    for (; c + 32 <= count; c += 32)
        _mm512_storeu_si512(to + c, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + c + 16), _mm512_loadu_ps(x + c)));
    for (; c < count; c += 16) {
        const __mmask16 valid = count - c >= 16 ? 0xFFFF : (__mmask16)((1u << (count - c)) - 1);
        _mm256_mask_storeu_epi16(to + c, valid, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(valid, x + c)));
    }
#endif
    for (; c < count; c++) to[c] = ko_bf16_bits(x[c]);
}
#endif"""


def amx_supported() -> bool:
    """Whether this CPU has the tiles and instructions the kernel is compiled for (-march=native)."""
    return AMX_FLAGS <= set(isa_flags())


@dataclass(frozen=True)
class Matrix:
    """A tensor of the call as a matrix: its row axes merged into one (their strides nest), and one column axis."""

    rows: int
    columns: int
    row_stride: int
    column_stride: int


def _matrix(tensor: Tensor, row_axes: Sequence[int], column_axis: int) -> Matrix | None:
    """`tensor` with `row_axes` merged into rows (None when their strides do not lay them out as one axis)."""
    axes = [(tensor.dims[a], tensor.strides[a]) for a in row_axes if tensor.dims[a] != 1]
    if any(outer != inner * size for (_, outer), (size, inner) in itertools.pairwise(axes)):
        return None
    rows = math.prod(size for size, _ in axes)
    return Matrix(rows, tensor.dims[column_axis], axes[-1][1] if axes else 0, tensor.strides[column_axis])


@dataclass(frozen=True)
class Window:
    """A 2-d convolution's rows: output pixels (n, oy, ox), each reading kernel taps of C contiguous channels."""

    channels: int
    kernel: tuple[int, int]
    strides: tuple[int, int]
    dilations: tuple[int, int]
    pad_begin: tuple[int, int]
    src_size: tuple[int, int]
    dst_size: tuple[int, int]
    src_strides: tuple[int, int, int]  # batch, y, x (elements)
    weight_strides: tuple[int, int, int, int]  # output channel, input channel, ky, kx


@dataclass(frozen=True)
class Operands:
    """The call as [M, K] x [K, N] → [M, N]: a matmul whose weights are one matrix (the source read by rows), or a
    2-d convolution without groups (rows: the batch and the output pixels, K: the kernel taps x the channels, read
    through its window; columns: the output channels)."""

    src: Matrix
    weights: Matrix  # a convolution's is its [K, N] shape only (packed through the window)
    dst: Matrix
    row_axes: tuple[int, ...]  # of the source, destination and post-op operands
    column_axis: int
    window: Window | None = None


def _operands(call: LibraryCall) -> Operands | str:
    """The call's matrices, or why it is none such product."""
    if call.op == "matmul":
        rank = len(call.dst.dims)
        if any(d != 1 for d in call.weights.dims[:-2]):
            return "batched weights (not one [K, N] matrix)"
        row_axes, column_axis = tuple(range(rank - 1)), rank - 1
        src = _matrix(call.src, row_axes, column_axis)
        weights = _matrix(call.weights, (len(call.weights.dims) - 2,), len(call.weights.dims) - 1)
        window = None
    elif call.op == "convolution":
        if len(call.src.dims) != 4 or len(call.weights.dims) != 4:
            return "not a 2-d convolution without groups"
        (batch, channels, *src_size), (out_channels, _, *kernel) = call.src.dims, call.weights.dims
        if call.src.strides[1] != 1:
            return "source channels are not contiguous (not channels-last)"
        window = Window(channels, (kernel[0], kernel[1]), (call.strides[0], call.strides[1]),
                        (call.dilates[0] + 1, call.dilates[1] + 1), (call.pad_begin[0], call.pad_begin[1]),
                        (src_size[0], src_size[1]), (call.dst.dims[2], call.dst.dims[3]),
                        (call.src.strides[0], call.src.strides[2], call.src.strides[3]),
                        (call.weights.strides[0], call.weights.strides[1], call.weights.strides[2],
                         call.weights.strides[3]))  # fmt: skip
        row_axes, column_axis = (0, 2, 3), 1
        rows = batch * window.dst_size[0] * window.dst_size[1]
        k = channels * kernel[0] * kernel[1]
        src, weights = Matrix(rows, k, 0, 1), Matrix(k, out_channels, 0, 0)
    else:
        return f"a {call.op}"
    dst = _matrix(call.dst, row_axes, column_axis)
    if src is None or dst is None or weights is None:
        return "rows that are not one stride apart"
    return Operands(src, weights, dst, row_axes, column_axis, window)


def amx_matmul_rejection(call: LibraryCall) -> str | None:
    """Why the AMX matmul does not run `call` (None when it does)."""
    if call.precision != "bf16":
        return "not a bf16 product"
    if not amx_supported():
        return "no AMX-BF16 on this CPU"
    operands = _operands(call)
    if isinstance(operands, str):
        return operands
    if not call.weights.constant:
        return "weights are not constant (packed once, when the plan is created)"
    if operands.src.column_stride != 1 or operands.dst.column_stride != 1:
        return "source or destination rows are not contiguous (channels-last for a convolution)"
    if operands.src.columns > MAX_K:
        return f"K = {operands.src.columns} beyond {MAX_K}"
    if operands.window is not None and operands.window.channels < FEW_CHANNELS:
        return f"{operands.window.channels} input channels: the window's runs are too short to copy fast"
    if operands.src.columns < SHORT_K and operands.weights.columns >= WIDE_N:
        return f"K = {operands.src.columns} for {operands.weights.columns} columns: oneDNN stores faster"
    if call.dst.offset:
        return "an offset destination"
    if (rejection := post_ops_rejection(call.post_ops)) is not None:
        return rejection
    for _, tensor in call.post_ops:
        if tensor is not None and _post_op_operand(operands, call.dst, tensor) is None:
            return "a post-op operand that is not a float32 [M or 1, N or 1] matrix"
    return None


def _post_op_operand(operands: Operands, dst: Tensor, tensor: Tensor) -> Matrix | None:
    """A binary post-op's operand as a matrix: a value per row (or one for all) and per column (or one for all)."""
    rows = tuple(tensor.dims[a] for a in operands.row_axes)
    if tensor.dtype != "float32" or any(d != 1 for d in rows) and rows != tuple(dst.dims[a] for a in operands.row_axes):
        return None
    return _matrix(tensor, operands.row_axes, operands.column_axis)


def _epilogue(name: str, call: LibraryCall, operands: Operands) -> list[str]:
    """`<name>_store(a, acc, m0, rows, n0)`: a block of results (32 rows x 32 columns of `acc`, float32 sums)
    biased, through the post-ops, stored from row m0 and column n0 (rows of them; columns up to N)."""
    pointers, elements = [], []
    for position, (_, tensor) in enumerate(call.post_ops):
        if tensor is None:
            continue
        matrix = _post_op_operand(operands, call.dst, tensor)
        assert matrix is not None, "amx_matmul_rejection accepted it"
        m = f"m * {matrix.row_stride}L" if matrix.rows != 1 else "0L"
        n = f" + (long)n * {matrix.column_stride}" if matrix.columns != 1 else ""
        pointers.append(f"    const float *t{position} = (const float *)a[{tensor.slot}] + {tensor.offset};")
        elements.append(f"t{position}[{m}{n}]")
    bias = [f"    const float *bias = (const float *)a[{call.bias.slot}] + {call.bias.offset};"] if call.bias else []
    biased = " + bias[n]" if call.bias is not None else ""
    element = "uint16_t" if call.dst.dtype == "bfloat16" else "float"
    store = "ko_bf16_bits(v)" if call.dst.dtype == "bfloat16" else "v"
    n_total = operands.dst.columns
    return [f"static inline void {name}_store(void **a, const float *acc, long m0, int rows, long n0) {{",
            *bias,
            *pointers,
            f"    const int columns = {n_total} - n0 < 32 ? (int)({n_total} - n0) : 32;",
            "    for (int r = 0; r < rows; r++) {",
            "        const long m = m0 + r;",
            "        (void)m;",
            f"        {element} *out = ({element} *)a[{call.dst.slot}] + m * {operands.dst.row_stride}L + n0;",
            "        #pragma omp simd",
            "        for (int j = 0; j < columns; j++) {",
            "            const long n = n0 + j;",
            "            (void)n;",
            f"            float v = acc[r * 32 + j]{biased};",
            *(f"            {s}" for s in post_op_statements(call.post_ops, elements)),
            f"            out[j] = {store};",
            "        }",
            "    }",
            "}"]  # fmt: skip


def _loader(name: str, call: LibraryCall, operands: Operands, kp: int) -> list[str]:
    """`<name>_rows(a, ab, m0, rows)`: rows m0.. of the source into a block of 32 rows of kp bfloat16 (rounded to
    nearest even, or copied when stored bfloat16; K's padding and the rows past M zero): a matmul's rows as they
    are, a convolution's through its window (taps outside the source zero)."""
    element = "uint16_t" if call.src.dtype == "bfloat16" else "float"
    copy = "memcpy(to, x, (size_t)({count}) * 2)" if element == "uint16_t" else "ko_bf16_run(to, x, {count})"
    k_total = operands.src.columns
    lines = [f"static inline void {name}_rows(void **a, uint16_t *ab, long m0, int rows) {{",
             f"    const {element} *src = (const {element} *)a[{call.src.slot}] + {call.src.offset};",
             "    for (int r = 0; r < 32; r++) {",
             f"        uint16_t *row = ab + r * {kp};",
             f"        if (r >= rows) {{ memset(row, 0, {kp * 2}); continue; }}",
             "        const long m = m0 + r;"]  # fmt: skip
    window = operands.window
    if window is None:
        lines += [f"        const {element} *x = src + m * {operands.src.row_stride}L;",
                  "        uint16_t *to = row;",
                  f"        {copy.format(count=k_total)};"]  # fmt: skip
    else:
        (oh, ow), (ih, iw), (kh, kw) = window.dst_size, window.src_size, window.kernel
        (sy, sx), (dy, dx), (py, px) = window.strides, window.dilations, window.pad_begin
        batch, y_stride, x_stride = window.src_strides
        c = window.channels
        # the kernel row's taps, when all inside the source, are one run of KW x C elements there as in the
        # block (undilated along x, pixels C apart): one copy (candy's 9x9 conv over 3 channels: 9, not 81)
        run = [f"            const long ix0 = ox * {sx} - {px};",
               f"            if (iy >= 0 && iy < {ih} && ix0 >= 0 && ix0 + {kw - 1} < {iw}) {{",
               f"                const {element} *x = src + n * {batch}L + iy * {y_stride}L + ix0 * {x_stride}L;",
               f"                uint16_t *to = row + ky * {kw * c};",
               f"                {copy.format(count=kw * c)};",
               "                continue;",
               "            }"]  # fmt: skip
        lines += [f"        const long n = m / {oh * ow}, oy = m / {ow} % {oh}, ox = m % {ow};",
                  f"        for (int ky = 0; ky < {kh}; ky++) {{",
                  f"            const long iy = oy * {sy} - {py} + ky * {dy};",
                  *(run if dx == 1 and x_stride == c and kw > 1 else []),
                  f"            for (int kx = 0; kx < {kw}; kx++) {{",
                  f"                const long ix = ox * {sx} - {px} + kx * {dx};",
                  f"                uint16_t *to = row + (ky * {kw} + kx) * {c};",
                  f"                if (iy < 0 || iy >= {ih} || ix < 0 || ix >= {iw}) {{",
                  f"                    memset(to, 0, {c * 2});",
                  "                    continue;",
                  "                }",
                  f"                const {element} *x = src + n * {batch}L + iy * {y_stride}L + ix * {x_stride}L;",
                  f"                {copy.format(count=c)};",
                  "            }",
                  "        }"]  # fmt: skip
    return [*lines, f"        memset(row + {k_total}, 0, {(kp - k_total) * 2});", "    }", "}"]


def _weight_offset(operands: Operands) -> str:
    """The C expression of weight (k, n)'s element offset: a matmul's [K, N], a convolution's [OC][C][KH][KW]
    with k = (ky * KW + kx) * C + c (the order the window lays the taps)."""
    if operands.window is None:
        return f"k * {operands.weights.row_stride}L + n * {operands.weights.column_stride}L"
    w = operands.window
    o, i, y, x = w.weight_strides
    return (f"n * {o}L + (k % {w.channels}) * {i}L + (k / {w.channels} / {w.kernel[1]}) * {y}L + "
            f"(k / {w.channels} % {w.kernel[1]}) * {x}L")


def render_amx_matmul(name: str, call: LibraryCall) -> str:
    """C for `call` (which `amx_matmul_rejection` accepted): state, create (packing), run, destroy."""
    operands = _operands(call)
    assert isinstance(operands, Operands), operands
    m_total, k_total, n_total = operands.src.rows, operands.src.columns, operands.weights.columns
    kp, np_ = (k_total + 31) // 32 * 32, (n_total + 31) // 32 * 32
    steps, blocks, columns = kp // 32, (m_total + 31) // 32, np_ // 32
    w_type = "uint16_t" if call.weights.dtype == "bfloat16" else "float"
    w_bits = "w[at]" if call.weights.dtype == "bfloat16" else "ko_bf16_bits(w[at])"
    packed_bytes = np_ * kp * 2
    per_thread = 32 * kp * 2 + 32 * 32 * 4
    lines = [AMX_SUPPORT,
             BF16_RUN,
             *_loader(name, call, operands, kp),
             *_epilogue(name, call, operands),
             *state_lifecycle(name, "uint16_t *w; char *scratch; int slots;", ["w", "scratch"],
                              [f"s->w = (uint16_t *)aligned_alloc(64, {(packed_bytes + 63) // 64 * 64});",
                               f"s->slots = omp_get_max_threads() < {MAX_SLOTS} ? omp_get_max_threads() : {MAX_SLOTS};",
                               "if (s->slots < 1) s->slots = 1;",
                               f"s->scratch = (char *)aligned_alloc(64, (size_t)s->slots * {per_thread});"]),
             f"    const {w_type} *w = (const {w_type} *)a[{call.weights.slot}] + {call.weights.offset};",
             "    /* [N/16 blocks][K/32 steps] tiles: row r holds (k, n) and (k + 1, n) for 16 columns n, k = 2r */",
             f"    for (long nb = 0; nb < {np_ // 16}; nb++) for (long ks = 0; ks < {steps}; ks++)",
             "        for (int r = 0; r < 16; r++) for (int c = 0; c < 16; c++) for (int h = 0; h < 2; h++) {",
             "            const long k = ks * 32 + 2 * r + h, n = nb * 16 + c;",
             f"            const long at = {_weight_offset(operands)};",
             f"            s->w[((nb * {steps} + ks) * 16 + r) * 32 + c * 2 + h] = "
             f"k < {k_total} && n < {n_total} ? {w_bits} : 0;",
             "        }",
             "    return s;",
             "}",
             f"static int {name}_run(void *state, void *stream, void **a) {{",
             "    (void)stream;",
             f"    const {name}_state *s = (const {name}_state *)state;",
             "    const int threads = omp_get_max_threads() < s->slots ? omp_get_max_threads() : s->slots;",
             f"    const long items = {blocks}L * {columns};",
             "#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)",
             "    const int tiles = ko_amx_ready();",
             "#else",
             "    const int tiles = 0;",
             "#endif",
             "    #pragma omp parallel num_threads(threads)",
             "    {",
             "        const long p = omp_get_thread_num(), np = omp_get_num_threads();",
             f"        uint16_t *ab = (uint16_t *)(s->scratch + p * {per_thread});",
             f"        float *acc = (float *)(ab + {32 * kp});",
             "        long loaded = -1;",
             "#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)",
             "        if (tiles) ko_amx_configure();",
             "#endif",
             "        for (long it = items * p / np; it < items * (p + 1) / np; it++) {",
             f"            const long mb = it / {columns}, n0 = it % {columns} * 32, m0 = mb * 32;",
             f"            const int rows = {m_total} - m0 < 32 ? (int)({m_total} - m0) : 32;",
             "            if (mb != loaded) {",
             f"                {name}_rows(a, ab, m0, rows);",
             "                loaded = mb;",
             "            }",
             f"            const uint16_t *b0 = s->w + n0 / 16 * {steps * 512}, *b1 = b0 + {steps * 512};",
             "#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)",
             "            if (tiles) {",
             "                _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);",
             f"                for (int ks = 0; ks < {steps}; ks++) {{",
             f"                    _tile_loadd(4, ab + ks * 32, {kp * 2});",
             f"                    _tile_loadd(5, ab + {16 * kp} + ks * 32, {kp * 2});",
             "                    _tile_loadd(6, b0 + ks * 512, 64);",
             "                    _tile_loadd(7, b1 + ks * 512, 64);",
             "                    _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);",
             "                    _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);",
             "                }",
             "                _tile_stored(0, acc, 128); _tile_stored(1, acc + 16, 128);",
             "                _tile_stored(2, acc + 512, 128); _tile_stored(3, acc + 528, 128);",
             f"                {name}_store(a, acc, m0, rows, n0);",
             "                continue;",
             "            }",
             "#endif",
             "            /* without the tiles: the same products of the same bfloat16 operands, summed in float32 */",
             "            for (int r = 0; r < rows; r++)",
             "                for (int j = 0; j < 32; j++) {",
             "                    const uint16_t *col = b0 + j / 16 * " + str(steps * 512) + " + j % 16 * 2;",
             "                    float sum = 0.0f;",
             f"                    for (int k = 0; k < {k_total}; k++)",
             f"                        sum += ko_bf16_float(ab[r * {kp} + k]) * "
             "ko_bf16_float(col[(k / 32 * 16 + k % 32 / 2) * 32 + k % 2]);",
             "                    acc[r * 32 + j] = sum;",
             "                }",
             f"            {name}_store(a, acc, m0, rows, n0);",
             "        }",
             "#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)",
             "        if (tiles) _tile_release();",
             "#endif",
             "    }",
             "    return 0;",
             "}",
             ""]  # fmt: skip
    return "\n".join(lines)
