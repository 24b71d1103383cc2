"""A bf16 matmul on AMX tiles, for a bf16 plan's linear layers and its convolutions without groups (implicit im2col):
[M, K] x [K, N] with constant weights, the bias and the epilogue's post-ops applied while the result is in cache,
written float32 or bfloat16.

oneDNN 3.2's bf16 matmul (brgemm on AMX) runs the shapes of the transformers here at 300-450 GFLOP/s on two
cores (vit_tiny's 197x768x192: 180-190 µs, torch 2.13's oneDNN the same); a plain 2x2-tile loop reaches 630-820
(89 µs), measured in one process on the Xeon of 2026-11-27 (bench/results/2026-11-27-amx-matmul.md).

The weights are packed once, when the plan is created, as tiles of bfloat16 pairs (VNNI: a tile row holds 16
columns' values at two consecutive k), rounded to nearest even; K and N are padded with zeros to whole steps of
32 and blocks of 32. Per item of 32 rows x 32 columns: the rows' source, rounded to bfloat16 (vcvtne2ps2bf16) or
copied when stored bfloat16, once per block of rows a thread visits (a convolution with channels a multiple of 32
instead loads its tiles from the thread's ring of source rows, amx_product.py's `Ring`, its blocks 32 pixels of
an output row); four float32 accumulator tiles (two row tiles x two column tiles), K in steps of 32; the tiles
stored to a float block, then bias, post-ops and the store (float32, or bfloat16 rounded to nearest even as
`ko_bf16_bits`), 32 columns at a time so GCC vectorizes the post-ops' scalar C.

Compiled where the compiler targets AMX-BF16 and taken when Linux grants the tile state (attention_amx.py's
`ko_amx_ready`); otherwise the same kernel multiplies the same bfloat16 block and packed weights in scalar C
(same products, float32 sums), so a plan never depends on the grant. Where the CPU has no AMX, the backend
declines and oneDNN runs the call; a convolution to few output channels is amx_conv.py's (folded). Scratch (a block
of rows, one of sums and the ring per thread) is allocated at create for the OpenMP threads then (at most 8); a
run uses no more.
"""

from __future__ import annotations

from kernorch.codegen.backends.library_calls import LibraryCallBackend
from kernorch.codegen.c import CWriter
from kernorch.codegen.library import LibraryCall, post_ops_rejection
from kernorch.codegen.native.amx_conv import folds, render_folded_conv
from kernorch.codegen.native.amx_product import (
    AMX_GUARD,
    BF16_RUN,
    Operands,
    Ring,
    Window,
    amx_create,
    amx_run,
    amx_supported,
    pack_weights,
    packed_elements,
    post_op_operand,
    product_operands,
    ring_function,
    ring_pointers,
    scalar_product,
    source_ring,
    store_function,
    tile_steps,
    tile_stores,
)
from kernorch.codegen.native.preambles import AMX_SUPPORT

MAX_K = 16384  # a thread's block of rows is 32 x K bfloat16 (1 MiB at most), allocated when the plan is created
# Where oneDNN 3.2 was faster, measured in place on the same plans (bench/results/2026-11-27-amx-matmul.md): a
# convolution over few input channels (candy's 9x9 over 3: 2.07 vs 1.18 ms; segformer's 7x7 over 3: 532 vs 457
# µs), and a short K with many columns, where each item's few tile products cannot hide storing its 32x32 block
# (segformer's 4096x64x256: 273 vs 234 µs, 1024x160x640: 309 vs 271; 1024x160x160 and 256x256x1024 stay faster
# on tiles: 95 vs 121, 221 vs 258).
FEW_CHANNELS, SHORT_RUN = 16, 32  # a kernel row's run of 16x16 taps over 3 channels is long enough (vit's)
RING_WASTE = 1 / 8  # of a convolution's tile rows, where its output rows are no multiple of 32 pixels
SHORT_K, WIDE_N = 192, 256


def _row_taps_one_run(window: Window) -> bool:
    """Whether a kernel row's taps lie one run in the source as in a block's row (undilated along x, pixels
    `channels` apart, more than one tap): the loader then copies them at once where they are inside the source."""
    return window.dilations[1] == 1 and window.src_strides[2] == window.channels and window.kernel[1] > 1


def _run(window: Window) -> int:
    """The elements a block's row copies at a time from the source: a kernel row's taps where they lie one run,
    else one tap's channels."""
    return window.kernel[1] * window.channels if _row_taps_one_run(window) else window.channels


def amx_matmul_rejection(call: LibraryCall) -> str | None:
    """Why the AMX matmul does not run `call` (None when it does)."""
    if call.precision != "bf16":
        return "not a bf16 product"
    if not amx_supported():
        return "no AMX-BF16 on this CPU"
    operands = product_operands(call)
    if isinstance(operands, str):
        return operands
    if operands.src.column_stride != 1 or operands.dst.column_stride != 1:
        return "source or destination rows are not contiguous (channels-last for a convolution)"
    if operands.src.columns > MAX_K:
        return f"K = {operands.src.columns} beyond {MAX_K}"
    if operands.window is not None and operands.window.channels < FEW_CHANNELS and _run(operands.window) < SHORT_RUN:
        return f"{operands.window.channels} input channels: the window's runs are too short to copy fast"
    if operands.src.columns < SHORT_K and operands.weights.columns >= WIDE_N and not folds(operands):
        return f"K = {operands.src.columns} for {operands.weights.columns} columns: oneDNN stores faster"
    if call.dst.offset:
        return "an offset destination"
    if (rejection := post_ops_rejection(call.post_ops)) is not None:
        return rejection
    for _, tensor in call.post_ops:
        if tensor is not None and post_op_operand(operands, call.dst, tensor) is None:
            return "a post-op operand that is not a float32 [M or 1, N or 1] matrix"
    return None


def _loader(w: CWriter, name: str, call: LibraryCall, operands: Operands, kp: int) -> None:
    """`<name>_rows(a, ab, m0, rows)`: rows m0.. of the source into a block of 32 rows of kp bfloat16 (rounded to
    nearest even, or copied when stored bfloat16; K's padding and the rows past M zero): a matmul's rows as they
    are, a convolution's through its window (taps outside the source zero)."""
    element = "uint16_t" if call.src.dtype == "bfloat16" else "float"
    copy = "memcpy(to, x, (size_t)({count}) * 2)" if element == "uint16_t" else "ko_bf16_run(to, x, {count})"
    k_total = operands.src.columns
    window = operands.window
    with w.function(f"static inline void {name}_rows(void **a, uint16_t *ab, long m0, int rows)", returns=None):
        w.line(f"const {element} *src = (const {element} *)a[{call.src.slot}] + {call.src.offset};")
        with w.block("for (int r = 0; r < 32; r++)"):
            w.line(f"uint16_t *row = ab + r * {kp};", f"if (r >= rows) {{ memset(row, 0, {kp * 2}); continue; }}",
                   "const long m = m0 + r;")
            if window is None:
                w.line(f"const {element} *x = src + m * {operands.src.row_stride}L;", "uint16_t *to = row;",
                       f"{copy.format(count=k_total)};")
            else:
                (oh, ow), (ih, iw), (kh, kw) = window.dst_size, window.src_size, window.kernel
                (sy, sx), (dy, dx), (py, px) = window.strides, window.dilations, window.pad_begin
                batch, y_stride, x_stride = window.src_strides
                c = window.channels
                w.line(f"const long n = m / {oh * ow}, oy = m / {ow} % {oh}, ox = m % {ow};")
                with w.block(f"for (int ky = 0; ky < {kh}; ky++)"):
                    w.line(f"const long iy = oy * {sy} - {py} + ky * {dy};")
                    # the kernel row's taps, when all inside the source, are one run of KW x C elements there as
                    # in the block (undilated along x, pixels C apart): one copy (candy's 9x9 conv over 3 channels:
                    # 9, not 81)
                    if _row_taps_one_run(window):
                        w.line(f"const long ix0 = ox * {sx} - {px};")
                        with w.block(f"if (iy >= 0 && iy < {ih} && ix0 >= 0 && ix0 + {kw - 1} < {iw})"):
                            w.line(f"const {element} *x = src + n * {batch}L + iy * {y_stride}L + ix0 * {x_stride}L;",
                                   f"uint16_t *to = row + ky * {kw * c};", f"{copy.format(count=kw * c)};", "continue;")
                    with w.block(f"for (int kx = 0; kx < {kw}; kx++)"):
                        w.line(f"const long ix = ox * {sx} - {px} + kx * {dx};",
                               f"uint16_t *to = row + (ky * {kw} + kx) * {c};")
                        with w.block(f"if (iy < 0 || iy >= {ih} || ix < 0 || ix >= {iw})"):
                            w.line(f"memset(to, 0, {c * 2});", "continue;")
                        w.line(f"const {element} *x = src + n * {batch}L + iy * {y_stride}L + ix * {x_stride}L;",
                               f"{copy.format(count=c)};")
            w.line(f"memset(row + {k_total}, 0, {(kp - k_total) * 2});")


def _weight_offset(operands: Operands) -> str:
    """The C expression of weight (k, n)'s element offset: a matmul's [K, N], a convolution's [OC][C][KH][KW]
    with k = (ky * KW + kx) * C + c (the order the window lays the taps)."""
    if operands.window is None:
        return f"k * {operands.weights.row_stride}L + n * {operands.weights.column_stride}L"
    w = operands.window
    o, i, y, x = w.weight_strides
    return (f"n * {o}L + (k % {w.channels}) * {i}L + (k / {w.channels} / {w.kernel[1]}) * {y}L + "
            f"(k / {w.channels} % {w.kernel[1]}) * {x}L")


def _ring(window: Window) -> Ring | None:
    """The ring a convolution's blocks (32 pixels of an output row) load their tiles from, where it has one (see
    `source_ring`) and a row's short last block idles at most RING_WASTE of the tiles' rows (a 14-pixel row would
    leave 18 of 32 idle: there blocks of consecutive pixels are copied, as without a ring)."""
    ow, sx, kw, dx = window.dst_size[1], window.strides[1], window.kernel[1], window.dilations[1]
    per_row = (ow + 31) // 32
    if per_row * 32 - ow > RING_WASTE * per_row * 32:
        return None
    return source_ring(window, (per_row * 32 - 1) * sx + (kw - 1) * dx + 1)


def render_amx_matmul(name: str, call: LibraryCall) -> str:
    """C for `call` (which `amx_matmul_rejection` accepted): state, create (packing), run, destroy. A convolution
    with a ring (`_ring`) takes its blocks within an output row (32 pixels of it) and loads their tiles from the
    ring; without the tiles, and without a ring, a block of rows is copied first."""
    operands = product_operands(call)
    assert isinstance(operands, Operands), operands
    if folds(operands):
        return render_folded_conv(name, call, operands)
    m_total, k_total, n_total = operands.src.rows, operands.src.columns, operands.weights.columns
    kp, np_ = (k_total + 31) // 32 * 32, (n_total + 31) // 32 * 32
    steps, columns = kp // 32, np_ // 32
    window = operands.window
    ring = _ring(window) if window is not None else None
    loads = None
    w = CWriter()

    def block() -> None:
        """The item's block of rows (`m0`, `rows`), and with a ring its source rows (`line`)."""
        if ring is not None:
            w.line(f"const long row = mb / {per_row}, ox0 = mb % {per_row} * 32, m0 = row * {ow} + ox0;",
                   f"const int rows = {ow} - ox0 < 32 ? (int)({ow} - ox0) : 32;")
        else:
            w.line("const long m0 = mb * 32;", f"const int rows = {m_total} - m0 < 32 ? (int)({m_total} - m0) : 32;")

    if ring is not None:
        assert window is not None
        (oh, ow), (kh, kw), c = window.dst_size, window.kernel, window.channels
        (sy, sx), (dy, dx), py = window.strides, window.dilations, window.pad_begin[0]
        per_row = (ow + 31) // 32
        blocks = m_total // ow * per_row
        # padded x of a block's first pixel's tap kx: ox0 * sx + kx * dx (the ring holds the left padding)
        lines_of_block = [f"const long n = row / {oh}, iy0 = row % {oh} * {sy} - {py};",
                          f"const uint16_t *line[{kh}];",
                          f"for (int ky = 0; ky < {kh}; ky++) "
                          f"line[ky] = {name}_ring(src, ring, tags, n, iy0 + ky * {dy});"]  # fmt: skip
        loads = [f"const long tap = ks / {c // 32}, at = (ox0 * {sx} + tap % {kw} * {dx}) * {c} + ks % {c // 32} * 32;",
                 f"const uint16_t *x = line[tap / {kw}] + at;",
                 f"_tile_loadd(4, x, {sx * c * 2}); _tile_loadd(5, x + {16 * sx * c}, {sx * c * 2});"]  # fmt: skip
    else:
        blocks = (m_total + 31) // 32
        lines_of_block = []
    packed_bytes = packed_elements(k_total, n_total) * 2
    per_thread = 32 * kp * 2 + 32 * 32 * 4 + (ring.bytes if ring is not None else 0)
    w.line(AMX_SUPPORT, BF16_RUN)
    _loader(w, name, call, operands, kp)
    if ring is not None and window is not None:
        ring_function(w, name, call, window, ring)
    store_function(w, name, call, operands)
    with amx_create(w, name, packed_bytes, per_thread):
        pack_weights(w, call, k_total, n_total, _weight_offset(operands))
    with amx_run(w, name, call, f"{blocks}L * {columns}", per_thread):
        w.line(f"float *acc = (float *)(ab + {32 * kp});")
        ring_pointers(w, ring, "(char *)(acc + 1024)")
        w.line("long loaded = -1;")
        with w.block("for (long it = items * p / np; it < items * (p + 1) / np; it++)"):
            w.line(f"const long mb = it / {columns}, n0 = it % {columns} * 32;")
            block()
            with w.block(f"if ({'!tiles && ' if ring is not None else ''}mb != loaded)"):
                w.line(f"{name}_rows(a, ab, m0, rows);", "loaded = mb;")
            w.line(f"const uint16_t *b0 = s->w + n0 / 16 * {steps * 512}, *b1 = b0 + {steps * 512};")
            w.verbatim(AMX_GUARD)
            with w.block("if (tiles)"):
                w.line(*lines_of_block)
                tile_steps(w, steps, kp, loads)
                tile_stores(w, "acc")
                w.line(f"{name}_store(a, acc, m0, rows, n0);", "continue;")
            w.verbatim("#endif")
            scalar_product(w, steps, kp, k_total, "32", "acc")
            w.line(f"{name}_store(a, acc, m0, rows, n0);")
    return w.text(end="\n")


# oneDNN 3.2's bf16 matmul reaches half of what a plain loop over AMX tiles does on these shapes
BACKEND = LibraryCallBackend("amx_matmul", "native C", "AMX bf16 matmul", amx_matmul_rejection, render_amx_matmul,
                             precisions=("bf16",))  # fmt: skip
