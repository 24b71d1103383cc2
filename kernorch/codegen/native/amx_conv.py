"""A bf16 convolution with few output channels on AMX tiles, its kernel columns folded into the product's columns.

As amx_matmul.py multiplies a convolution (rows: output pixels, K: taps x channels, N: output channels), a tile
product is 16 columns wide, so candy's last convolution (32 channels to 3, 9x9) would use 3 of every 32 columns
it computes. Folded, the product's rows are the source pixels of an output row (position p = x + pad, for the
output's width plus the kernel's reach), its K the kernel rows x the channels, and its columns the kernel columns
x the output channels (27 of 32 for candy's):

    P[p, (kx, o)] = sum over (ky, c) of src[oy + ky, p - pad, c] * w[o, c, ky, kx]
    dst[oy, ox, o] = sum over kx of P[ox + kx * dilation, (kx, o)]

Per output row a thread computes P for all its positions (blocks of 32 rows, 2x2 tiles), then sums each output's
kx terms into a block of 32 pixels and stores it through amx_product.py's store (bias, post-ops, float32 or
bfloat16). Where the channels are a multiple of 32, a tile loads its 16 positions straight from the thread's ring
of source rows (amx_product.py's `Ring`: each source row converted once, its padding zeros); otherwise a block of
rows is copied (rounded) first, as the scalar path without the tiles does.
"""

from __future__ import annotations

import math

from kernorch.codegen.c import CWriter
from kernorch.codegen.library import LibraryCall
from kernorch.codegen.native.amx_product import (
    AMX_GUARD,
    BF16_RUN,
    Operands,
    Window,
    amx_create,
    amx_run,
    pack_weights,
    packed_elements,
    ring_function,
    ring_pointers,
    scalar_product,
    source_ring,
    store_function,
    tile_steps,
    tile_stores,
)
from kernorch.codegen.native.preambles import AMX_SUPPORT

NARROW = 16  # output channels below one tile's width fold (with their kernel columns within 32)


def folds(operands: Operands) -> bool:
    """Whether the convolution folds its kernel columns into the product's columns: few output channels, a kernel
    more than one column wide, unit stride along x (positions then serve every output pixel), and the folded
    columns within one block of 32."""
    window = operands.window
    if window is None:
        return False
    outputs, kw = operands.weights.columns, window.kernel[1]
    return outputs < NARROW and kw > 1 and window.strides[1] == 1 and outputs * kw <= 32


def _positions(window: Window) -> int:
    """Source positions an output row reads: its width plus the kernel's reach along x."""
    return window.dst_size[1] + (window.kernel[1] - 1) * window.dilations[1]


def _position_loader(w: CWriter, name: str, call: LibraryCall, window: Window, kp: int) -> None:
    """`<name>_positions(a, ab, n, oy, p0, rows)`: positions p0.. of output row (n, oy) into 32 rows of kp
    bfloat16, each the kernel rows' C channels in turn (taps outside the source, K's padding, rows past `rows`
    zero)."""
    element = "uint16_t" if call.src.dtype == "bfloat16" else "float"
    copy = "memcpy(to, x, {c} * 2)" if element == "uint16_t" else "ko_bf16_run(to, x, {c})"
    (ih, iw), kh, c = window.src_size, window.kernel[0], window.channels
    sy, dy, (py, px) = window.strides[0], window.dilations[0], window.pad_begin
    batch, y_stride, x_stride = window.src_strides
    k_total = kh * c
    with w.function(f"static inline void {name}_positions(void **a, uint16_t *ab, long n, long oy, long p0, int rows)",
                    returns=None):  # fmt: skip
        w.line(f"const {element} *src = (const {element} *)a[{call.src.slot}] + {call.src.offset};")
        with w.block("for (int r = 0; r < 32; r++)"):
            w.line(f"uint16_t *row = ab + r * {kp};", f"const long ix = p0 + r - {px};",
                   f"if (r >= rows || ix < 0 || ix >= {iw}) {{ memset(row, 0, {kp * 2}); continue; }}")
            with w.block(f"for (int ky = 0; ky < {kh}; ky++)"):
                w.line(f"const long iy = oy * {sy} - {py} + ky * {dy};", f"uint16_t *to = row + ky * {c};",
                       f"if (iy < 0 || iy >= {ih}) {{ memset(to, 0, {c * 2}); continue; }}",
                       f"const {element} *x = src + n * {batch}L + iy * {y_stride}L + ix * {x_stride}L;",
                       f"{copy.format(c=c)};")  # fmt: skip
            w.line(f"memset(row + {k_total}, 0, {(kp - k_total) * 2});")


def render_folded_conv(name: str, call: LibraryCall, operands: Operands) -> str:
    """C for a convolution that `folds`: state, create (packing), run, destroy."""
    window = operands.window
    assert window is not None and folds(operands), "render_folded_conv takes a folding convolution"
    (oh, ow), (kh, kw) = window.dst_size, window.kernel
    sy, (dy, dx), py = window.strides[0], window.dilations, window.pad_begin[0]
    c, outputs = window.channels, operands.weights.columns
    k_total, n_total = kh * c, kw * outputs
    kp, steps = (k_total + 31) // 32 * 32, (k_total + 31) // 32
    positions = _positions(window)
    blocks = (positions + 31) // 32
    o_w, i_w, y_w, x_w = window.weight_strides
    # packed column j = kx * outputs + o, row k = ky * C + c
    offset = (f"(n % {outputs}) * {o_w}L + (k % {c}) * {i_w}L + (k / {c}) * {y_w}L + (n / {outputs}) * {x_w}L")
    ring = source_ring(window, blocks * 32)  # positions are padded pixels
    per_thread = 32 * kp * 2 + blocks * 32 * 32 * 4 + 32 * 32 * 4 + (ring.bytes if ring is not None else 0)
    chunks = c // 32
    loads = [f"const uint16_t *x = line[ks / {chunks}] + p0 * {c} + ks % {chunks} * 32;",
             f"_tile_loadd(4, x, {c * 2}); _tile_loadd(5, x + {16 * c}, {c * 2});"] if ring is not None else None
    w = CWriter()
    w.line(AMX_SUPPORT, BF16_RUN)
    _position_loader(w, name, call, window, kp)
    if ring is not None:
        ring_function(w, name, call, window, ring)
    store_function(w, name, call, operands)
    with amx_create(w, name, packed_elements(k_total, n_total) * 2, per_thread):
        pack_weights(w, call, k_total, n_total, offset)
    with amx_run(w, name, call, f"{math.prod(call.dst.dims) // (ow * outputs)}L", per_thread):
        w.line(f"float *sums = (float *)(ab + {32 * kp}), *acc = sums + {blocks * 32 * 32};")
        ring_pointers(w, ring, "(char *)(acc + 1024)")
        with w.block("for (long it = items * p / np; it < items * (p + 1) / np; it++)"):
            w.line(f"const long n = it / {oh}, oy = it % {oh}, iy0 = oy * {sy} - {py};", "(void)iy0;")
            if ring is not None:
                w.line(f"const uint16_t *line[{kh}];",
                       f"if (tiles) for (int ky = 0; ky < {kh}; ky++) "
                       f"line[ky] = {name}_ring(src, ring, tags, n, iy0 + ky * {dy});")  # fmt: skip
            with w.block(f"for (long p0 = 0; p0 < {positions}; p0 += 32)"):
                w.line(f"const int rows = {positions} - p0 < 32 ? (int)({positions} - p0) : 32;",
                       "float *block = sums + p0 * 32;", f"const uint16_t *b0 = s->w, *b1 = b0 + {steps * 512};")
                w.verbatim(AMX_GUARD)
                with w.block("if (tiles)"):
                    if ring is None:
                        w.line(f"{name}_positions(a, ab, n, oy, p0, rows);")
                    tile_steps(w, steps, kp, loads)
                    tile_stores(w, "block")
                    w.line("continue;")
                w.verbatim("#endif")
                w.line(f"{name}_positions(a, ab, n, oy, p0, rows);")
                scalar_product(w, steps, kp, k_total, str(n_total), "block")
            w.line("/* each output pixel's kernel columns summed: P[ox + kx * dx, kx * outputs + o] */")
            with w.block(f"for (long ox0 = 0; ox0 < {ow}; ox0 += 32)"):
                w.line(f"const int rows = {ow} - ox0 < 32 ? (int)({ow} - ox0) : 32;")
                with w.block("for (int r = 0; r < rows; r++)"):
                    w.line(f"float v[{outputs}] = {{0}};")
                    with w.block(f"for (int kx = 0; kx < {kw}; kx++)"):
                        w.line(f"const float *at = sums + (ox0 + r + kx * {dx}) * 32 + kx * {outputs};",
                               f"for (int o = 0; o < {outputs}; o++) v[o] += at[o];")
                    w.line(f"for (int o = 0; o < {outputs}; o++) acc[r * 32 + o] = v[o];")
                w.line(f"{name}_store(a, acc, it * {ow} + ox0, rows, 0);")
    return w.text(end="\n")
