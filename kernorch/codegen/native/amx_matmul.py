"""A bf16 matmul on AMX tiles, for a bf16 plan's linear layers and pointwise (1x1) convolutions: [M, K] x [K, N]
with constant weights, the bias and the epilogue's post-ops applied while the result is in cache, written float32
or bfloat16.

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
`ko_amx_ready`); otherwise the same kernel multiplies the packed operands in scalar C (same products, float32
sums), so a plan never depends on the grant. Where the CPU has no AMX, the backend declines and oneDNN runs the
matmul.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from kernorch.codegen.library import LibraryCall, Tensor
from kernorch.codegen.library.post_ops import post_op_statements, post_ops_rejection
from kernorch.codegen.native.attention_amx import AMX_SUPPORT
from kernorch.codegen.native.skeleton import state_lifecycle
from kernorch.machine import isa_flags

AMX_FLAGS = frozenset({"amx_tile", "amx_bf16", "avx512_bf16"})
MAX_K = 16384  # a thread's block of rows is 32 x K bfloat16 (1 MiB at most), allocated when the plan is created
SLOTS = 8  # threads the scratch is allocated for (a run uses at most this many)


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
class Operands:
    """The call as [M, K] x [K, N] → [M, N]: a matmul whose weights are one matrix, or a 1x1 convolution with
    stride 1 and no padding (rows: the batch and the pixels; columns: the channels)."""

    src: Matrix
    weights: Matrix
    dst: Matrix
    row_axes: tuple[int, ...]  # of the source, destination and post-op operands
    column_axis: int


def _operands(call: LibraryCall) -> Operands | str:
    """The call's matrices, or why it is none such product."""
    if call.op == "matmul":
        rank = len(call.dst.dims)
        if any(d != 1 for d in call.weights.dims[:-2]):
            return "batched weights (not one [K, N] matrix)"
        row_axes, column_axis = tuple(range(rank - 1)), rank - 1
        weights = _matrix(call.weights, (len(call.weights.dims) - 2,), len(call.weights.dims) - 1)
    elif call.op == "convolution":
        if len(call.weights.dims) != len(call.src.dims):
            return "a grouped convolution"
        if any(d != 1 for d in call.weights.dims[2:]) or any(s != 1 for s in call.strides) or any(call.pad_begin) or \
                any(call.pad_end):  # fmt: skip
            return "a convolution other than 1x1 with stride 1 and no padding"
        row_axes, column_axis = (0, *range(2, len(call.src.dims))), 1
        weights = _matrix(call.weights, (1,), 0)
    else:
        return f"a {call.op}"
    src, dst = _matrix(call.src, row_axes, column_axis), _matrix(call.dst, row_axes, column_axis)
    if src is None or dst is None or weights is None:
        return "rows that are not one stride apart"
    return Operands(src, weights, dst, row_axes, column_axis)


def amx_matmul_rejection(call: LibraryCall) -> str | None:
    """Why the AMX matmul does not run `call` (None when it does)."""
    if call.precision != "bf16":
        return "not a bf16 product"
    if not AMX_FLAGS <= set(isa_flags()):
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


def render_amx_matmul(name: str, call: LibraryCall) -> str:
    """C for `call` (which `amx_matmul_rejection` accepted): state, create (packing), run, destroy."""
    operands = _operands(call)
    assert isinstance(operands, Operands), operands
    m_total, k_total, src_rows = operands.src.rows, operands.src.columns, operands.src.row_stride
    n_total, w_k, w_n = operands.weights.columns, operands.weights.row_stride, operands.weights.column_stride
    kp, np_ = (k_total + 31) // 32 * 32, (n_total + 31) // 32 * 32
    steps, blocks = kp // 32, (m_total + 31) // 32
    src_type = "uint16_t" if call.src.dtype == "bfloat16" else "float"
    w_type = "uint16_t" if call.weights.dtype == "bfloat16" else "float"
    w_bits = "w[at]" if call.weights.dtype == "bfloat16" else "ko_bf16_bits(w[at])"
    # a row of the source into the thread's block, as bfloat16: copied, or rounded 32 at a time (a masked tail)
    if call.src.dtype == "bfloat16":
        load_row = [f"                    memcpy(ab + r * {kp}, x, {k_total} * 2);",
                    f"                    memset(ab + r * {kp} + {k_total}, 0, {kp - k_total} * 2);"]  # fmt: skip
    else:
        load_row = [f"                    for (int k = 0; k < {kp}; k += 32) {{",
                    f"                        const __mmask16 lo = k >= {k_total} ? 0 : {k_total} - k >= 16 ? 0xFFFF "
                    f": (__mmask16)((1u << ({k_total} - k)) - 1);",
                    f"                        const __mmask16 hi = k + 16 >= {k_total} ? 0 : {k_total} - k - 16 >= 16 "
                    f"? 0xFFFF : (__mmask16)((1u << ({k_total} - k - 16)) - 1);",
                    f"                        _mm512_storeu_si512(ab + r * {kp} + k, (__m512i)_mm512_cvtne2ps_pbh("
                    "_mm512_maskz_loadu_ps(hi, x + k + 16), _mm512_maskz_loadu_ps(lo, x + k)));",
                    "                    }"]  # fmt: skip
    source_row = f"(const {src_type} *)a[{call.src.slot}] + {call.src.offset} + (m0 + r) * {src_rows}L"
    packed_bytes = np_ * kp * 2
    scratch = f"{SLOTS} * ({32 * kp * 2} + {32 * 32 * 4})"
    lines = [AMX_SUPPORT,
             *_epilogue(name, call, operands),
             *state_lifecycle(name, "uint16_t *w; char *scratch;", ["w", "scratch"],
                              [f"s->w = (uint16_t *)aligned_alloc(64, {(packed_bytes + 63) // 64 * 64});",
                               f"s->scratch = (char *)aligned_alloc(64, {scratch});"]),
             f"    const {w_type} *w = (const {w_type} *)a[{call.weights.slot}] + {call.weights.offset};",
             "    /* [N/16 blocks][K/32 steps] tiles: row r holds (k, n) and (k + 1, n) for 16 columns n, k = 2r */",
             f"    for (long nb = 0; nb < {np_ // 16}; nb++) for (long ks = 0; ks < {steps}; ks++)",
             "        for (int r = 0; r < 16; r++) for (int c = 0; c < 16; c++) for (int h = 0; h < 2; h++) {",
             "            const long k = ks * 32 + 2 * r + h, n = nb * 16 + c;",
             f"            const long at = k * {w_k}L + n * {w_n}L;",
             f"            s->w[((nb * {steps} + ks) * 16 + r) * 32 + c * 2 + h] = "
             f"k < {k_total} && n < {n_total} ? {w_bits} : 0;",
             "        }",
             "    return s;",
             "}",
             f"static int {name}_run(void *state, void *stream, void **a) {{",
             "    (void)stream;",
             f"    const {name}_state *s = (const {name}_state *)state;",
             f"    const int threads = omp_get_max_threads() < {SLOTS} ? omp_get_max_threads() : {SLOTS};",
             f"    const long items = {blocks}L * {np_ // 32};",
             "#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)",
             "    if (ko_amx_ready()) {",
             "        #pragma omp parallel num_threads(threads)",
             "        {",
             "            const long p = omp_get_thread_num(), np = omp_get_num_threads();",
             f"            uint16_t *ab = (uint16_t *)(s->scratch + p * {32 * kp * 2 + 32 * 32 * 4});",
             f"            float *acc = (float *)(ab + {32 * kp});",
             "            ko_amx_configure();",
             "            long converted = -1;",
             "            for (long it = items * p / np; it < items * (p + 1) / np; it++) {",
             f"                const long mb = it / {np_ // 32}, n0 = it % {np_ // 32} * 32, m0 = mb * 32;",
             f"                const int rows = {m_total} - m0 < 32 ? (int)({m_total} - m0) : 32;",
             "                if (mb != converted) {",
             "                    for (int r = 0; r < rows; r++) {",
             f"                        const {src_type} *x = {source_row};",
             *("    " + line for line in load_row),
             "                    }",
             f"                    memset(ab + rows * {kp}, 0, (size_t)(32 - rows) * {kp * 2});",
             "                    converted = mb;",
             "                }",
             f"                const uint16_t *b0 = s->w + n0 / 16 * {steps * 512}, *b1 = b0 + {steps * 512};",
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
             "            }",
             "            _tile_release();",
             "        }",
             "        return 0;",
             "    }",
             "#endif",
             "    /* without the tiles: the same products of the packed operands, summed in float32 */",
             "    #pragma omp parallel for num_threads(threads) schedule(static)",
             "    for (long it = 0; it < items; it++) {",
             f"        const long mb = it / {np_ // 32}, n0 = it % {np_ // 32} * 32, m0 = mb * 32;",
             f"        const int rows = {m_total} - m0 < 32 ? (int)({m_total} - m0) : 32;",
             "        float acc[32 * 32];",
             "        for (int r = 0; r < rows; r++) {",
             f"            const {src_type} *x = {source_row};",
             "            for (int j = 0; j < 32; j++) {",
             "                const long n = n0 + j;",
             f"                const uint16_t *col = s->w + n / 16 * {steps * 512} + n % 16 * 2;",
             "                float sum = 0.0f;",
             f"                for (int k = 0; k < {k_total}; k++)",
             "                    sum += ko_bf16_float(" + ("x[k]" if src_type == "uint16_t" else "ko_bf16_bits(x[k])")
             + ") * ko_bf16_float(col[(k / 32 * 16 + k % 32 / 2) * 32 + k % 2]);",
             "                acc[r * 32 + j] = sum;",
             "            }",
             "        }",
             f"        {name}_store(a, acc, m0, rows, n0);",
             "    }",
             "    return 0;",
             "}",
             ""]  # fmt: skip
    return "\n".join(lines)
