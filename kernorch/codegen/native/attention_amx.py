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

# ko_exp16: the softmax's exp on AVX-512, for both paths of the kernel
EXP16_SUPPORT = """#ifdef __AVX512F__
#ifndef KO_EXP16
#define KO_EXP16
#include <immintrin.h>
/* exp of 16 floats in fewer instructions than ko_expf: 2^(x log2 e) = 2^n 2^f with n = round(x log2 e), |f| <= 1/2,
   2^f by its Taylor polynomial of degree 6 (relative error 1.2e-7), 2^n applied by vscalefps (overflow to inf).
   No subnormal is ever computed: a subnormal or underflowing result costs a microcode assist per vector (a causal
   mask's -1e4 made the whole kernel 2x slower), so x log2 e is clamped at -125 and results below 2^-125 (x < -86.6)
   are set to 0, as ko_expf's are; NaN passes (the comparison is unordered-true, vmaxps returns its second operand,
   the NaN). Lanes not in `valid` are 0. */
static inline __m512 ko_exp16(__m512 x, __mmask16 valid) {
    const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
    const __mmask16 kept = _mm512_mask_cmp_ps_mask(valid, t, _mm512_set1_ps(-125.0f), _CMP_NLE_UQ);
    const __m512 c = _mm512_max_ps(_mm512_set1_ps(-125.0f), t);
    const __m512 n = _mm512_roundscale_ps(c, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_mul_ps(_mm512_sub_ps(c, n), _mm512_set1_ps(0.693147180559945309f));
    __m512 p = _mm512_set1_ps(1.0f / 720.0f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps(kept, p, n);
}
#endif
#endif"""

# Linux gives a process AMX's tile data only on request: arch_prctl(ARCH_REQ_XCOMP_PERM = 0x1023,
# XFEATURE_XTILEDATA = 18); a tile instruction before it is SIGILL. Asked once per library (idempotent: two
# threads asking at once both get the same answer); KERNORCH_AMX=0 in the environment then refuses the tiles, so
# the kernels take their paths without them (tests; a host whose tiles misbehave). Every tile is configured
# 16 rows x 64 bytes: palette 1.
AMX_SUPPORT = """#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#ifndef KO_AMX
#define KO_AMX
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
static int ko_amx_ready(void) {
    static int state = 0; /* 0 not asked, 1 granted, -1 refused */
    int known = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (!known) {
        const char *wanted = getenv("KERNORCH_AMX");
        known = wanted && strcmp(wanted, "0") == 0 ? -1 : syscall(SYS_arch_prctl, 0x1023, 18) == 0 ? 1 : -1;
        __atomic_store_n(&state, known, __ATOMIC_RELEASE);
    }
    return known > 0;
}
typedef struct { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } ko_tile_config;
/* static data, not a local filled before the load: GCC 12 dropped a local's stores as dead (it does not see
   ldtilecfg read them), and the load faulted on a configuration of zeros */
static const ko_tile_config ko_amx_config __attribute__((aligned(64))) = {
    1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};
static void ko_amx_configure(void) { _tile_loadconfig(&ko_amx_config); }
/* c [16][16 blocks] (rows `c_pitch` floats apart) = a [16][32 steps] (rows `a_pitch` bfloat16 apart) times b,
   packed as [blocks][steps] tiles of 16 pairs x 16 columns: four column blocks at a time on tiles 0-3 (a on
   tile 4, b on 5-7 in turn), then one at a time */
static inline void ko_amx_product(const uint16_t *a, int64_t a_pitch, const uint16_t *b, int64_t blocks,
                                  int64_t steps, float *c, int64_t c_pitch) {
    int64_t n = 0;
    for (; n + 4 <= blocks; n += 4) {
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        for (int64_t k = 0; k < steps; k++) {
            const uint16_t *b0 = b + (n * steps + k) * 512;
            _tile_loadd(4, a + k * 32, a_pitch * 2);
            _tile_loadd(5, b0, 64); _tile_dpbf16ps(0, 4, 5);
            _tile_loadd(6, b0 + steps * 512, 64); _tile_dpbf16ps(1, 4, 6);
            _tile_loadd(7, b0 + 2 * steps * 512, 64); _tile_dpbf16ps(2, 4, 7);
            _tile_loadd(5, b0 + 3 * steps * 512, 64); _tile_dpbf16ps(3, 4, 5);
        }
        _tile_stored(0, c + n * 16, c_pitch * 4); _tile_stored(1, c + n * 16 + 16, c_pitch * 4);
        _tile_stored(2, c + n * 16 + 32, c_pitch * 4); _tile_stored(3, c + n * 16 + 48, c_pitch * 4);
    }
    for (; n < blocks; n++) {
        _tile_zero(0);
        for (int64_t k = 0; k < steps; k++) {
            _tile_loadd(4, a + k * 32, a_pitch * 2);
            _tile_loadd(5, b + (n * steps + k) * 512, 64); _tile_dpbf16ps(0, 4, 5);
        }
        _tile_stored(0, c + n * 16, c_pitch * 4);
    }
}
/* 32 bfloat16 (lo[0..15], then hi[0..15]) rounded to nearest even by vcvtne2ps2bf16, which reads subnormals as
   zero: so do the tile products (TDPBF16PS treats subnormal inputs as zero), so nothing they would see changes */
static inline __m512i ko_bf16x32(const float *lo, const float *hi) {
    return (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(hi), _mm512_loadu_ps(lo));
}
#endif
#endif"""

# The exp pass when the tiles read E itself: 16 keys at a time (masked past LK: those weigh 0), each 32 of a row's
# e rounded into the weights' row, summed into l in float32
AMX_EXP_PASS = """                __m512 lv = _mm512_setzero_ps();
                for (int64_t j0 = 0; j0 < LK32; j0 += 32) {
                    __m512 e[2];
                    for (int h = 0; h < 2; h++) {
                        const int64_t j = j0 + 16 * h;
                        const __mmask16 valid = j >= LK ? 0 : LK - j >= 16 ? 0xFFFF : (__mmask16)((1u << (LK - j)) - 1);
                        e[h] = ko_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(valid, sr + j), _mm512_set1_ps(m)), valid);
                        lv = _mm512_add_ps(lv, e[h]);
                    }
                    _mm512_storeu_si512(pa + r * LK32 + j0, (__m512i)_mm512_cvtne2ps_pbh(e[1], e[0]));
                }
                l = _mm512_reduce_add_ps(lv);"""

# The float32 path's exp pass: ko_exp16 on AVX-512 (e into the score row, summed into l), else ko_expf in a loop
# GCC vectorizes
FLOAT_EXP_PASS = """#ifdef __AVX512F__
{vector}
#else
                #pragma omp simd reduction(+:l)
                for (int64_t j = 0; j < LK; j++) {{ const float e = ko_expf(sr[j] - m); sr[j] = e; l += e; }}
#endif"""

# The exp pass when the weights are rounded after a division (E / l, or torch's guarded weights): e in float32 into
# the score row, summed into l; the weights are rounded in a pass of their own once l is known
EXP_PASS_F32 = """                __m512 lv = _mm512_setzero_ps();
                for (int64_t j = 0; j < LK; j += 16) {
                    const __mmask16 valid = LK - j >= 16 ? 0xFFFF : (__mmask16)((1u << (LK - j)) - 1);
                    const __m512 x = _mm512_sub_ps(_mm512_maskz_loadu_ps(valid, sr + j), _mm512_set1_ps(m));
                    const __m512 e = ko_exp16(x, valid);
                    _mm512_mask_storeu_ps(sr + j, valid, e);
                    lv = _mm512_add_ps(lv, e);
                }
                l = _mm512_reduce_add_ps(lv);"""

# Both products by ko_amx_product (S from Q and the packed Kᵀ, O from the weights and the packed V). `{load_k}`,
# `{load_v}`, `{load_q}` read one element as float32 (j: key, d: head dim, c: value column, r: query row);
# `{softmax}` is the float32 path's, on `s` with rows of LKP.
AMX_PATH = """
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
    if (ko_amx_ready()) {{
        #pragma omp parallel num_threads(threads)
        {{
            const int64_t p = omp_get_thread_num(), np = omp_get_num_threads();
            char *base = (char *)(((uintptr_t)(scratch + p * {per_thread}) + 63) & ~(uintptr_t)63);
            uint16_t *ktp = (uint16_t *)base;  /* [LKP/16][DP/32] tiles: 16 pairs of d x 16 keys */
            uint16_t *vpk = ktp + LKP * DP;  /* [DV/16][LK32/32] tiles: 16 pairs of keys x 16 columns */
            uint16_t *qa = vpk + LK32 * DV;  /* [16][DP] */
            uint16_t *pa = qa + AMX_ROWS * DP;  /* [16][LK32] */
            float *s = (float *)(pa + AMX_ROWS * LK32);  /* [16][LKP] */
            float *ob = s + AMX_ROWS * LKP;  /* [16][DV] */
            ko_amx_configure();
            int64_t packed = -1;
            const int64_t items = {items};
            const int64_t first = items * p / np, last = items * (p + 1) / np;
            for (int64_t it = first; it < last; it++) {{
                const int64_t b = it / {qblocks}, i0 = (it % {qblocks}) * AMX_ROWS;
                const int64_t rows = LQ - i0 < AMX_ROWS ? LQ - i0 : AMX_ROWS;
                if (b != packed) {{
                    /* Kᵀ: per key, 32 of its head dims rounded, then its 16 pairs scattered to the tile's 16 rows
                       (keys past LK: zeros); loops without conditions inside, so that GCC vectorizes the reads */
                    const __m512i rows64 = _mm512_set_epi32(240, 224, 208, 192, 176, 160, 144, 128, 112, 96, 80, 64,
                                                            48, 32, 16, 0);
                    for (int64_t j = 0; j < LKP; j++)
                        for (int64_t dc = 0; dc < DP / 32; dc++) {{
                            float x[32] = {{0}};
                            const int64_t end = j >= LK ? 0 : HD - dc * 32 < 32 ? HD - dc * 32 : 32;
                            for (int64_t e = 0; e < end; e++) {{
                                const int64_t d = dc * 32 + e;
                                x[e] = {load_k};
                            }}
                            _mm512_i32scatter_epi32(ktp + ((j / 16) * (DP / 32) + dc) * 512 + j % 16 * 2, rows64,
                                                    ko_bf16x32(x, x + 16), 4);
                        }}
                    /* V: two keys' 16 columns rounded, interleaved into one tile row of pairs */
                    const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                                           23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
                    for (int64_t j = 0; j < LK32; j += 2)
                        for (int64_t cb = 0; cb < DV / 16; cb++) {{
                            float x[16] = {{0}}, y[16] = {{0}};
                            if (j < LK)
                                for (int64_t c = cb * 16; c < cb * 16 + 16; c++) x[c - cb * 16] = {load_v};
                            if (j + 1 < LK)
                                for (int64_t c = cb * 16; c < cb * 16 + 16; c++) y[c - cb * 16] = {load_v1};
                            _mm512_storeu_si512(vpk + ((cb * (LK32 / 32) + j / 32) * 16 + j % 32 / 2) * 32,
                                                _mm512_permutexvar_epi16(pairs, ko_bf16x32(x, y)));
                        }}
                    packed = b;
                }}
                for (int64_t r = 0; r < AMX_ROWS; r++)
                    for (int64_t dc = 0; dc < DP / 32; dc++) {{
                        float x[32] = {{0}};
                        const int64_t end = r >= rows ? 0 : HD - dc * 32 < 32 ? HD - dc * 32 : 32;
                        for (int64_t e = 0; e < end; e++) {{
                            const int64_t d = dc * 32 + e;
                            x[e] = {load_q};
                        }}
                        _mm512_storeu_si512(qa + r * DP + dc * 32, ko_bf16x32(x, x + 16));
                    }}
                ko_amx_product(qa, DP, ktp, LKP / 16, DP / 32, s, LKP);  /* S = Q·Kᵀ */
{softmax}
                for (int64_t r = 0; r < AMX_ROWS; r++) {{
                    if ({separately} && r < rows) {{  /* the weights, rounded here: E / l or the guarded ones */
                        const float *sr = s + r * LKP;
                        const float l = sums[r];
                        (void)l;
                        for (int64_t j0 = 0; j0 < LK32; j0 += 32) {{
                            float x[32] = {{0}};
                            const int64_t end = LK - j0 < 32 ? LK : j0 + 32;
                            for (int64_t j = j0; j < end; j++) x[j - j0] = {weight};
                            _mm512_storeu_si512(pa + r * LK32 + j0, ko_bf16x32(x, x + 16));
                        }}
{divided}
                    }} else {{  /* the keys past LK (and rows past the last query) weigh nothing */
                        for (int64_t j = r < rows ? LK : 0; j < LK32; j++) pa[r * LK32 + j] = 0;
                    }}
                }}
                ko_amx_product(pa, LK32, vpk, DV / 16, LK32 / 32, ob, DV);  /* O = P·V */
                for (int64_t r = 0; r < rows; r++)
                    for (int64_t c = 0; c < DV; c += KO_VC_LANES)
                        *(ko_vcu *)(out + ((b * LQ) + i0 + r) * DV + c) = *(const ko_vc *)(ob + r * DV + c) / sums[r];
            }}
            _tile_release();
        }}
        return 0;
    }}
#endif"""

FLOAT_EXP_PASS = FLOAT_EXP_PASS.format(vector=EXP_PASS_F32)
