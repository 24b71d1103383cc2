"""The fused attention's AMX path (Intel AMX-BF16 tiles), for a bf16 plan whose attention multiplies bfloat16
operands: Q, Kᵀ, V and the softmax's weights reach their matmuls rounded to bfloat16 (kernorch/precision/ casts
them), so the tiles multiply the very operands the unfused plan's oneDNN matmuls would, and sum in float32.

Per block of 16 query rows (a tile's rows): S = Q·Kᵀ into float32 tile stores, the steps and softmax on S in
float32 (the float32 path's code), the weights rounded to bfloat16 (divided by the row sum first when the graph
divides before ·V, as it rounds E / l), then O = P·V on tiles, divided by the row sums when the graph divides
after. Kᵀ and V are packed once per head each thread visits, as tiles of bfloat16 pairs (VNNI: rows are pairs
along the reduced axis); the head dim and the keys are padded with zeros to whole tiles.

The path is compiled where the compiler targets AMX (`-march=native` on such a CPU defines __AMX_TILE__ and
__AMX_BF16__) and taken when Linux grants the process the tile state (arch_prctl ARCH_REQ_XCOMP_PERM, asked once);
otherwise the same kernel runs its float32 path. Measured on the Xeon of 2026-11-27: see
bench/results/2026-11-27-amx-attention.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kernorch.codegen.c import CWriter
from kernorch.codegen.native.amx_product import AMX_GUARD


def _valid_lanes(w: CWriter, start: str) -> None:
    """`valid`: the lanes of 16 keys from `start` that are keys (< LK)."""
    w.line(f"const __mmask16 valid = LK - {start} >= 16 ? 0xFFFF : (__mmask16)((1u << (LK - {start})) - 1);")


def write_amx_exp_pass(w: CWriter) -> None:
    """The exp pass when the tiles read E itself: 16 keys at a time (masked past LK: those weigh 0), each 32 of a
    row's e rounded into the weights' row, summed into l in float32."""
    w.line("__m512 lv = _mm512_setzero_ps();")
    with w.block("for (int64_t j0 = 0; j0 < LK32; j0 += 32)"):
        w.line("__m512 e[2];")
        with w.block("for (int h = 0; h < 2; h++)"):
            w.line("const int64_t j = j0 + 16 * h;",
                   "const __mmask16 valid = j >= LK ? 0 : LK - j >= 16 ? 0xFFFF : (__mmask16)((1u << (LK - j)) - 1);",
                   "e[h] = ko_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(valid, sr + j), _mm512_set1_ps(m)), valid);",
                   "lv = _mm512_add_ps(lv, e[h]);")  # fmt: skip
        w.line("_mm512_storeu_si512(pa + r * LK32 + j0, (__m512i)_mm512_cvtne2ps_pbh(e[1], e[0]));")
    w.line("l = _mm512_reduce_add_ps(lv);")


def write_exp_pass_f32(w: CWriter) -> None:
    """The exp pass when the weights are rounded after a division (E / l, or torch's guarded weights), and the
    float32 path's on AVX-512: e in float32 into the score row, summed into l."""
    w.line("__m512 lv = _mm512_setzero_ps();")
    with w.block("for (int64_t j = 0; j < LK; j += 16)"):
        _valid_lanes(w, "j")
        w.line("const __m512 x = _mm512_sub_ps(_mm512_maskz_loadu_ps(valid, sr + j), _mm512_set1_ps(m));",
               "const __m512 e = ko_exp16(x, valid);", "_mm512_mask_storeu_ps(sr + j, valid, e);",
               "lv = _mm512_add_ps(lv, e);")  # fmt: skip
    w.line("l = _mm512_reduce_add_ps(lv);")


def write_float_exp_pass(w: CWriter) -> None:
    """The float32 path's exp pass: ko_exp16 on AVX-512, else ko_expf in a loop GCC vectorizes."""
    w.verbatim("#ifdef __AVX512F__")
    write_exp_pass_f32(w)
    w.verbatim("#else")
    w.line("#pragma omp simd reduction(+:l)",
           "for (int64_t j = 0; j < LK; j++) { const float e = ko_expf(sr[j] - m); sr[j] = e; l += e; }")
    w.verbatim("#endif")


@dataclass(frozen=True)
class AmxLoads:
    """C expressions reading one operand element as float32 (j: key, d: head dim, c: value column, r: query row;
    value_next: V at key j + 1), and the weight a row rounds (`sr[j]`, or `sr[j] / l` when it divides first)."""

    key: str
    value: str
    value_next: str
    query: str
    weight: str


def write_amx_path(w: CWriter, loads: AmxLoads, softmax: Callable[[CWriter], None], items: int, qblocks: int,
                   per_thread: int, separately: bool, divides: bool) -> None:  # fmt: skip
    """Both products by ko_amx_product (S from Q and the packed Kᵀ, O from the weights and the packed V), taken
    when the process has the tiles; `softmax` writes the float32 path's softmax on `s` with rows of LKP.
    `separately`: the weights are rounded in a pass of their own (E / l or the guarded ones), divided by the row
    sum there when `divides`."""
    w.verbatim(AMX_GUARD)
    with w.block("if (ko_amx_ready())"):
        w.line("#pragma omp parallel num_threads(threads)")
        with w.block(""):
            w.line("const int64_t p = omp_get_thread_num(), np = omp_get_num_threads();",
                   f"char *base = (char *)(((uintptr_t)(scratch + p * {per_thread}) + 63) & ~(uintptr_t)63);",
                   "uint16_t *ktp = (uint16_t *)base;  /* [LKP/16][DP/32] tiles: 16 pairs of d x 16 keys */",
                   "uint16_t *vpk = ktp + LKP * DP;  /* [DV/16][LK32/32] tiles: 16 pairs of keys x 16 columns */",
                   "uint16_t *qa = vpk + LK32 * DV;  /* [16][DP] */",
                   "uint16_t *pa = qa + AMX_ROWS * DP;  /* [16][LK32] */",
                   "float *s = (float *)(pa + AMX_ROWS * LK32);  /* [16][LKP] */",
                   "float *ob = s + AMX_ROWS * LKP;  /* [16][DV] */", "ko_amx_configure();", "int64_t packed = -1;",
                   f"const int64_t items = {items};",
                   "const int64_t first = items * p / np, last = items * (p + 1) / np;")  # fmt: skip
            with w.block("for (int64_t it = first; it < last; it++)"):
                w.line(f"const int64_t b = it / {qblocks}, i0 = (it % {qblocks}) * AMX_ROWS;",
                       "const int64_t rows = LQ - i0 < AMX_ROWS ? LQ - i0 : AMX_ROWS;")
                with w.block("if (b != packed)"):
                    _pack_tiles(w, loads)
                    w.line("packed = b;")
                w.line("for (int64_t r = 0; r < AMX_ROWS; r++)")
                with w.indented(), w.block("for (int64_t dc = 0; dc < DP / 32; dc++)"):
                    _rounded_head_dims(w, "r >= rows", loads.query)
                    w.line("_mm512_storeu_si512(qa + r * DP + dc * 32, ko_bf16x32(x, x + 16));")
                w.line("ko_amx_product(qa, DP, ktp, LKP / 16, DP / 32, s, LKP);  /* S = Q·Kᵀ */")
                softmax(w)
                _rounded_weights(w, loads.weight, separately, divides)
                w.line("ko_amx_product(pa, LK32, vpk, DV / 16, LK32 / 32, ob, DV);  /* O = P·V */")
                w.nest("for (int64_t r = 0; r < rows; r++)", "for (int64_t c = 0; c < DV; c += KO_VC_LANES)",
                       "*(ko_vcu *)(out + ((b * LQ) + i0 + r) * DV + c) = *(const ko_vc *)(ob + r * DV + c) / sums[r];")
            w.line("_tile_release();")
        w.line("return 0;")
    w.verbatim("#endif")


def _rounded_head_dims(w: CWriter, past: str, load: str) -> None:
    """x[32]: 32 head dims (dc's) of one row read by `load` (zeros past HD, and for every dim when `past`)."""
    w.line("float x[32] = {0};", f"const int64_t end = {past} ? 0 : HD - dc * 32 < 32 ? HD - dc * 32 : 32;")
    with w.block("for (int64_t e = 0; e < end; e++)"):
        w.line("const int64_t d = dc * 32 + e;", f"x[e] = {load};")


def _pack_tiles(w: CWriter, loads: AmxLoads) -> None:
    """Kᵀ and V of head b as tiles of bfloat16 pairs, in the thread's scratch."""
    w.line("/* Kᵀ: per key, 32 of its head dims rounded, then its 16 pairs scattered to the tile's 16 rows\n"
           "   (keys past LK: zeros); loops without conditions inside, so that GCC vectorizes the reads */",
           "const __m512i rows64 = _mm512_set_epi32(240, 224, 208, 192, 176, 160, 144, 128, 112, 96, 80, 64,\n"
           "                                        48, 32, 16, 0);",
           "for (int64_t j = 0; j < LKP; j++)")  # fmt: skip
    with w.indented(), w.block("for (int64_t dc = 0; dc < DP / 32; dc++)"):
        _rounded_head_dims(w, "j >= LK", loads.key)
        w.line("_mm512_i32scatter_epi32(ktp + ((j / 16) * (DP / 32) + dc) * 512 + j % 16 * 2, rows64,\n"
               "                        ko_bf16x32(x, x + 16), 4);")
    w.line("/* V: two keys' 16 columns rounded, interleaved into one tile row of pairs */",
           "const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,\n"
           "                                       23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);",
           "for (int64_t j = 0; j < LK32; j += 2)")  # fmt: skip
    with w.indented(), w.block("for (int64_t cb = 0; cb < DV / 16; cb++)"):
        w.line("float x[16] = {0}, y[16] = {0};")
        w.nest("if (j < LK)", f"for (int64_t c = cb * 16; c < cb * 16 + 16; c++) x[c - cb * 16] = {loads.value};")
        w.nest("if (j + 1 < LK)",
               f"for (int64_t c = cb * 16; c < cb * 16 + 16; c++) y[c - cb * 16] = {loads.value_next};")
        w.line("_mm512_storeu_si512(vpk + ((cb * (LK32 / 32) + j / 32) * 16 + j % 32 / 2) * 32,\n"
               "                    _mm512_permutexvar_epi16(pairs, ko_bf16x32(x, y)));")


def _rounded_weights(w: CWriter, weight: str, separately: bool, divides: bool) -> None:
    """The weights' rows in bfloat16 (when `separately`: rounded here; otherwise the exp pass rounded them), the
    keys past LK and the rows past the last query zero."""
    with w.block("for (int64_t r = 0; r < AMX_ROWS; r++)"):
        with w.block(f"if ({int(separately)} && r < rows)", comment="the weights, rounded here: E / l or the "
                     "guarded ones"):  # fmt: skip
            w.line("const float *sr = s + r * LKP;", "const float l = sums[r];", "(void)l;")
            with w.block("for (int64_t j0 = 0; j0 < LK32; j0 += 32)"):
                w.line("float x[32] = {0};", "const int64_t end = LK - j0 < 32 ? LK : j0 + 32;",
                       f"for (int64_t j = j0; j < end; j++) x[j - j0] = {weight};",
                       "_mm512_storeu_si512(pa + r * LK32 + j0, ko_bf16x32(x, x + 16));")  # fmt: skip
            w.line("sums[r] = 1.0f;" if divides else "")
        with w.orelse(comment="the keys past LK (and rows past the last query) weigh nothing"):
            w.line("for (int64_t j = r < rows ? LK : 0; j < LK32; j++) pa[r * LK32 + j] = 0;")
