"""What the AMX kernels share (amx_matmul.py's matmul and convolution, amx_conv.py's folded convolution): a
library call read as [M, K] x [K, N] products, the weights packed as VNNI tiles, float32 rows rounded to bfloat16,
and the store of a block of float32 sums (bias, post-ops, float32 or bfloat16)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from kernorch.codegen.c import CWriter
from kernorch.codegen.library import LibraryCall, Tensor, post_op_statements
from kernorch.codegen.native.skeleton import aligned_size, create_function
from kernorch.machine import isa_flags

AMX_FLAGS = frozenset({"amx_tile", "amx_bf16", "avx512_bf16"})
MAX_SLOTS = 8  # at most this many threads get scratch (the OpenMP threads when the plan is created, up to this)
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


def as_matrix(tensor: Tensor, row_axes: Sequence[int], column_axis: int) -> Matrix | None:
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


def product_operands(call: LibraryCall) -> Operands | str:
    """The call's matrices, or why it is none such product."""
    if call.op == "matmul":
        rank = len(call.dst.dims)
        if any(d != 1 for d in call.weights.dims[:-2]):
            return "batched weights (not one [K, N] matrix)"
        row_axes, column_axis = tuple(range(rank - 1)), rank - 1
        src = as_matrix(call.src, row_axes, column_axis)
        weights = as_matrix(call.weights, (len(call.weights.dims) - 2,), len(call.weights.dims) - 1)
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
    dst = as_matrix(call.dst, row_axes, column_axis)
    if src is None or dst is None or weights is None:
        return "rows that are not one stride apart"
    return Operands(src, weights, dst, row_axes, column_axis, window)


def post_op_operand(operands: Operands, dst: Tensor, tensor: Tensor) -> Matrix | None:
    """A binary post-op's operand as a matrix: a value per row (or one for all) and per column (or one for all)."""
    rows = tuple(tensor.dims[a] for a in operands.row_axes)
    if tensor.dtype != "float32" or any(d != 1 for d in rows) and rows != tuple(dst.dims[a] for a in operands.row_axes):
        return None
    return as_matrix(tensor, operands.row_axes, operands.column_axis)


def store_function(w: CWriter, name: str, call: LibraryCall, operands: Operands) -> None:
    """`<name>_store(a, acc, m0, rows, n0)`: a block of results (32 rows x 32 columns of `acc`, float32 sums)
    biased, through the post-ops, stored from row m0 and column n0 (rows of them; columns up to N)."""
    pointers, elements = [], []
    for position, (_, tensor) in enumerate(call.post_ops):
        if tensor is None:
            continue
        matrix = post_op_operand(operands, call.dst, tensor)
        assert matrix is not None, "amx_matmul_rejection accepted it"
        m = f"m * {matrix.row_stride}L" if matrix.rows != 1 else "0L"
        n = f" + (long)n * {matrix.column_stride}" if matrix.columns != 1 else ""
        pointers.append(f"const float *t{position} = (const float *)a[{tensor.slot}] + {tensor.offset};")
        elements.append(f"t{position}[{m}{n}]")
    bias = [f"const float *bias = (const float *)a[{call.bias.slot}] + {call.bias.offset};"] if call.bias else []
    biased = " + bias[n]" if call.bias is not None else ""
    element = "uint16_t" if call.dst.dtype == "bfloat16" else "float"
    store = "ko_bf16_bits(v)" if call.dst.dtype == "bfloat16" else "v"
    n_total = operands.dst.columns
    with w.function(f"static inline void {name}_store(void **a, const float *acc, long m0, int rows, long n0)",
                    returns=None):  # fmt: skip
        w.line(*bias, *pointers, f"const int columns = {n_total} - n0 < 32 ? (int)({n_total} - n0) : 32;")
        with w.block("for (int r = 0; r < rows; r++)"):
            w.line("const long m = m0 + r;", "(void)m;",
                   f"{element} *out = ({element} *)a[{call.dst.slot}] + m * {operands.dst.row_stride}L + n0;",
                   "#pragma omp simd")  # fmt: skip
            with w.block("for (int j = 0; j < columns; j++)"):
                w.line("const long n = n0 + j;", "(void)n;", f"float v = acc[r * 32 + j]{biased};",
                       *post_op_statements(call.post_ops, elements), f"out[j] = {store};")


def pack_weights(w: CWriter, call: LibraryCall, k_total: int, n_total: int, offset: str) -> None:
    """`<create>`'s packing of s->w: the [K, N] weights (element (k, n) at C expression `offset`) as
    [N/16 blocks][K/32 steps] tiles of bfloat16 pairs (rounded to nearest even), K and N padded with zeros to whole
    steps of 32 and blocks of 32."""
    steps, blocks = (k_total + 31) // 32, (n_total + 31) // 32 * 2
    w_type = "uint16_t" if call.weights.dtype == "bfloat16" else "float"
    w_bits = "w[at]" if call.weights.dtype == "bfloat16" else "ko_bf16_bits(w[at])"
    w.line(f"const {w_type} *w = (const {w_type} *)a[{call.weights.slot}] + {call.weights.offset};",
           "/* tile row r holds (k, n) and (k + 1, n) for 16 columns n, k = 2r */",
           f"for (long nb = 0; nb < {blocks}; nb++) for (long ks = 0; ks < {steps}; ks++)")  # fmt: skip
    with w.indented(), w.block("for (int r = 0; r < 16; r++) for (int c = 0; c < 16; c++) for (int h = 0; h < 2; h++)"):
        w.line("const long k = ks * 32 + 2 * r + h, n = nb * 16 + c;", f"const long at = {offset};",
               f"s->w[((nb * {steps} + ks) * 16 + r) * 32 + c * 2 + h] = "
               f"k < {k_total} && n < {n_total} ? {w_bits} : 0;")  # fmt: skip


def packed_elements(k_total: int, n_total: int) -> int:
    """How many bfloat16 `pack_weights` writes."""
    return (k_total + 31) // 32 * 32 * ((n_total + 31) // 32 * 32)


@contextmanager
def amx_create(w: CWriter, name: str, packed_bytes: int, per_thread: int) -> Iterator[None]:
    """The state (packed weights `w`, `slots` threads' scratch of `per_thread` bytes each: the OpenMP threads when
    the plan is created, at most MAX_SLOTS), its destroy and its create, the packing written inside. The scratch
    starts zeroed: a ring's padding and zero row (`Ring`) are never written after."""
    with create_function(w, name, "uint16_t *w; char *scratch; int slots;", ["w", "scratch"],
                         [f"s->w = (uint16_t *)aligned_alloc(64, {aligned_size(packed_bytes)});",
                          f"s->slots = omp_get_max_threads() < {MAX_SLOTS} ? omp_get_max_threads() : {MAX_SLOTS};",
                          "if (s->slots < 1) s->slots = 1;",
                          f"s->scratch = (char *)aligned_alloc(64, (size_t)s->slots * {per_thread});",
                          f"if (s->scratch) memset(s->scratch, 0, (size_t)s->slots * {per_thread});"]):  # fmt: skip
        yield


def tile_steps(w: CWriter, steps: int, kp: int, loads: list[str] | None = None) -> None:
    """The 2x2-tile product of one item (tiles 0-3 zeroed, then K in `steps` of 32): A's two row tiles loaded onto
    tiles 4 and 5 by `loads` (C statements for step ks), or from the thread's block of rows `ab` (rows kp
    bfloat16 apart); B's two column tiles from `b0` and `b1`. Only inside the AMX guard."""
    if loads is None:
        loads = [f"_tile_loadd(4, ab + ks * 32, {kp * 2});", f"_tile_loadd(5, ab + {16 * kp} + ks * 32, {kp * 2});"]
    w.line("_tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);")
    with w.block(f"for (int ks = 0; ks < {steps}; ks++)"):
        w.line(*loads, "_tile_loadd(6, b0 + ks * 512, 64); _tile_loadd(7, b1 + ks * 512, 64);",
               "_tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);", "_tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);")


def tile_stores(w: CWriter, to: str) -> None:
    """Tiles 0-3 stored as one 32 x 32 float block at `to` (rows 32 floats apart)."""
    w.line(f"_tile_stored(0, {to}, 128); _tile_stored(1, {to} + 16, 128);",
           f"_tile_stored(2, {to} + 512, 128); _tile_stored(3, {to} + 528, 128);")


def scalar_product(w: CWriter, steps: int, kp: int, k_total: int, columns: str, to: str) -> None:
    """Without the tiles: the same products of the same bfloat16 block `ab` and packed columns `b0`, summed in
    float32, into `to` (rows 32 floats apart) for the block's `rows` and `columns` columns."""
    w.line("/* without the tiles: the same products of the same bfloat16 operands, summed in float32 */",
           "for (int r = 0; r < rows; r++)")
    with w.indented(), w.block(f"for (int j = 0; j < {columns}; j++)"):
        w.line(f"const uint16_t *col = b0 + j / 16 * {steps * 512} + j % 16 * 2;", "float sum = 0.0f;",
               f"for (int k = 0; k < {k_total}; k++)")
        with w.indented():
            w.line(f"sum += ko_bf16_float(ab[r * {kp} + k]) *",
                   "       ko_bf16_float(col[(k / 32 * 16 + k % 32 / 2) * 32 + k % 2]);")
        w.line(f"{to}[r * 32 + j] = sum;")


@dataclass(frozen=True)
class Ring:
    """A thread's copy of the source rows a convolution's blocks read, as bfloat16 with the padding written as
    zeros: `rows` slots (the kernel's reach along y; source row iy in slot iy % rows, converted when first read
    in a run) and a row of zeros for rows outside the source; each `pixels` wide (the left padding, the source
    row, then zeros as far as a block's 32 rows reach) x `channels`. Every block then loads its tiles straight
    from the ring, its padding included, and each source row is converted once per thread, not once per tap."""

    rows: int
    pixels: int
    channels: int

    @property
    def row_elements(self) -> int:
        return self.pixels * self.channels

    @property
    def tags_at(self) -> int:
        """Where the slots' tags (one long each) start: after the rows and the zero row, on a 64-byte line."""
        return aligned_size((self.rows + 1) * self.row_elements * 2)

    @property
    def bytes(self) -> int:
        return self.tags_at + aligned_size(self.rows * 8)


RING_LIMIT = 4 << 20  # bytes per thread; a convolution needing more copies blocks of rows instead


def source_ring(window: Window, reach: int) -> Ring | None:
    """The ring for `window` whose blocks read padded pixels up to `reach` (exclusive); None where the channels
    are no multiple of 32 (a tile step would straddle two taps) or it would exceed RING_LIMIT."""
    ring = Ring((window.kernel[0] - 1) * window.dilations[0] + 1,
                max(window.pad_begin[1] + window.src_size[1], reach), window.channels)  # fmt: skip
    return ring if window.channels % 32 == 0 and ring.bytes <= RING_LIMIT else None


def ring_function(w: CWriter, name: str, call: LibraryCall, window: Window, ring: Ring) -> None:
    """`<name>_ring(src, ring, tags, n, iy)`: source row (n, iy) in the ring, converted (or copied) there unless
    its slot holds it already; the zero row for a row outside the source. Only the source's pixels of a row are
    written: its padding, like the zero row, stays as the scratch was zeroed at create."""
    element = "uint16_t" if call.src.dtype == "bfloat16" else "float"
    copy = "memcpy({to}, {x}, (size_t)({count}) * 2)" if element == "uint16_t" else "ko_bf16_run({to}, {x}, {count})"
    (ih, iw), c, px = window.src_size, window.channels, window.pad_begin[1]
    batch, y_stride, x_stride = window.src_strides
    if x_stride == c:  # the source row is one run
        fill = f"{copy.format(to=f'row + {px * c}', x='x', count=iw * c)};"
    else:
        pixel = copy.format(to=f"row + ({px} + ix) * {c}", x=f"x + ix * {x_stride}", count=c)
        fill = f"for (long ix = 0; ix < {iw}; ix++) {pixel};"
    with w.function(f"static inline const uint16_t *{name}_ring(const {element} *src, uint16_t *ring, long *tags, "
                    "long n, long iy)", returns="row"):  # fmt: skip
        w.line(f"if (iy < 0 || iy >= {ih}) return ring + {ring.rows * ring.row_elements};",
               f"const long slot = iy % {ring.rows}, tag = n * {ih} + iy;",
               f"uint16_t *row = ring + slot * {ring.row_elements};")  # fmt: skip
        with w.block("if (tags[slot] != tag)"):
            w.line(f"const {element} *x = src + n * {batch}L + iy * {y_stride}L;", fill, "tags[slot] = tag;")


def ring_pointers(w: CWriter, ring: Ring | None, at: str) -> None:
    """In a run's parallel region: the thread's `ring` and `tags` from byte address `at` (64-aligned), every slot
    empty (the source changes between runs)."""
    if ring is not None:
        w.line(f"uint16_t *ring = (uint16_t *)({at});", f"long *tags = (long *)((char *)ring + {ring.tags_at});",
               f"for (int i = 0; i < {ring.rows}; i++) tags[i] = -1;")


AMX_GUARD = "#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)"


@contextmanager
def amx_run(w: CWriter, name: str, call: LibraryCall, items: str, per_thread: int) -> Iterator[None]:
    """`<name>_run`: `src` (the call's source), `tiles` (granted), the parallel region of at most `slots` threads,
    each with its scratch `ab` (per_thread bytes) and the tiles configured; the items' loop written inside the
    region, then the tiles released."""
    src_type = "uint16_t" if call.src.dtype == "bfloat16" else "float"
    with w.function(f"static int {name}_run(void *state, void *stream, void **a)"):
        w.line("(void)stream;", f"const {name}_state *s = (const {name}_state *)state;",
               f"const {src_type} *src = (const {src_type} *)a[{call.src.slot}] + {call.src.offset};", "(void)src;",
               "const int threads = omp_get_max_threads() < s->slots ? omp_get_max_threads() : s->slots;",
               f"const long items = {items};")  # fmt: skip
        w.verbatim(AMX_GUARD)
        w.line("const int tiles = ko_amx_ready();")
        w.verbatim("#else")
        w.line("const int tiles = 0;")
        w.verbatim("#endif")
        w.line("#pragma omp parallel num_threads(threads)")
        with w.block(""):
            w.line("const long p = omp_get_thread_num(), np = omp_get_num_threads();",
                   f"uint16_t *ab = (uint16_t *)(s->scratch + p * {per_thread});")
            w.verbatim(AMX_GUARD)
            w.line("if (tiles) ko_amx_configure();")
            w.verbatim("#endif")
            yield
            w.verbatim(AMX_GUARD)
            w.line("if (tiles) _tile_release();")
            w.verbatim("#endif")
