"""Fixed C text that kernels include ahead of their functions, each guarded so a unit holds it once: the
AVX-512 exp of the attention's softmax, and the AMX tile support (permission, configuration, the tile product,
bfloat16 rounding) of every AMX kernel. Parameter-free helpers, not templates: emitters write their own code
through codegen/c/writer.py's CWriter."""

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
