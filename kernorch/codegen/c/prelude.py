"""The C every generated kernel starts with: includes, NaN-propagating max/min, vector shuffles, and float32
math (exp, tanh, erf, sigmoid) written so the loops calling it vectorize. `prelude_used_by` is the part a given
kernel depends on (what its profile signature hashes).
"""

from __future__ import annotations

import functools
import re

# a 16-float vector, declared in the kernel's scope where one is used: the prelude, which every kernel's profile
# signature hashes, stays as it is
V16_TYPEDEF = "typedef float ko_v16 __attribute__((vector_size(64), aligned(4), may_alias));"

PRELUDE = """#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
/* 8-float vectors through the compiler's vector extension, not <immintrin.h>: that header alone costs 0.36 s of
   every compile here, and every plan, profile batch and test compiles. GCC >= 12 and clang have
   __builtin_shufflevector; with AVX2 it becomes the unpack/shuffle/permute instructions. */
typedef float ko_v8 __attribute__((vector_size(32), aligned(4), may_alias));
#if defined(__AVX2__) && (defined(__clang__) || __GNUC__ >= 12)
#define KO_VECTOR_SHUFFLE 1
#define KO_LO(a, b) __builtin_shufflevector(a, b, 0, 8, 1, 9, 4, 12, 5, 13)
#define KO_HI(a, b) __builtin_shufflevector(a, b, 2, 10, 3, 11, 6, 14, 7, 15)
#define KO_Q0(a, b) __builtin_shufflevector(a, b, 0, 1, 8, 9, 4, 5, 12, 13)
#define KO_Q1(a, b) __builtin_shufflevector(a, b, 2, 3, 10, 11, 6, 7, 14, 15)
#define KO_H0(a, b) __builtin_shufflevector(a, b, 0, 1, 2, 3, 8, 9, 10, 11)
#define KO_H1(a, b) __builtin_shufflevector(a, b, 4, 5, 6, 7, 12, 13, 14, 15)
#else
#define KO_VECTOR_SHUFFLE 0
#endif
/* NaN-propagating max/min like numpy: the plain compare-select (one vmaxps), and where the operands are
   unordered (a NaN in either) their sum, which is NaN. Written as named temporaries in GNU statement expressions
   (operands are evaluated once): GCC 12 left the former `((a > b) | (a != a)) ? a : b` as a scalar loop with
   branches once a max fed a min (hardswish: 200 us for 401,408 floats, 22 us as this) */
#define KO_MAX(a, b) ({ __typeof__(a) ko_a_ = (a), ko_b_ = (b), ko_m_ = ko_a_ > ko_b_ ? ko_a_ : ko_b_; \
                        ((ko_a_ != ko_a_) | (ko_b_ != ko_b_)) ? ko_a_ + ko_b_ : ko_m_; })
#define KO_MIN(a, b) ({ __typeof__(a) ko_a_ = (a), ko_b_ = (b), ko_m_ = ko_a_ < ko_b_ ? ko_a_ : ko_b_; \
                        ((ko_a_ != ko_a_) | (ko_b_ != ko_b_)) ? ko_a_ + ko_b_ : ko_m_; })
/* The same in a running max/min: `acc` keeps a NaN it already holds (x > NaN is false) and takes a new one from x.
   Two compares and a select, no add: a 3x3 max-pool over 24 channels ran 42 us with KO_MAX, 30 us with this */
#define KO_MAX_INTO(acc, x) ({ __typeof__(acc) ko_x_ = (x); \
    (acc) = ((ko_x_ > (acc)) | (ko_x_ != ko_x_)) ? ko_x_ : (acc); })
#define KO_MIN_INTO(acc, x) ({ __typeof__(acc) ko_x_ = (x); \
    (acc) = ((ko_x_ < (acc)) | (ko_x_ != ko_x_)) ? ko_x_ : (acc); })
static inline int64_t ko_index(int64_t i, int64_t n, int *err) {
    if (i < 0) i += n;
    if (i < 0 || i >= n) { *err = 1; return 0; }
    return i;
}
/* The smallest integer >= a / b for b > 0 (C's division truncates toward zero): an interchanged reduction's
   first or last output a tap reaches (a stride-2 pooling window's column) */
static inline int64_t ko_ceil_div(int64_t a, int64_t b) { return a > 0 ? (a + b - 1) / b : -((-a) / b); }
/* Integer division as onnxruntime: a zero divisor is an error (the kernel returns it in `err`, bit 2, and the
   call fails naming it), never a signal; INT_MIN / -1 wraps to INT_MIN and INT_MIN % -1 is 0 (x86 would trap) */
static inline int64_t ko_idiv(int64_t a, int64_t b, int *err) {
    if (b == 0) { *err |= 2; return 0; }
    return b == -1 ? (int64_t)(0 - (uint64_t)a) : a / b;
}
static inline int64_t ko_imod(int64_t a, int64_t b, int *err) {
    if (b == 0) { *err |= 2; return 0; }
    return b == -1 ? 0 : a % b;
}
/* Float to integer as onnxruntime computes it on x86-64: truncation toward zero, and NaN or a value whose
   truncation is out of range gives the truncating conversion's "integer indefinite", the most negative integer
   (C leaves it undefined). Narrower integer types keep the low bits of the 32-bit conversion. */
static inline int32_t ko_f2i32(double x) { return (x > -2147483649.0 && x < 2147483648.0) ? (int32_t)x : INT32_MIN; }
/* The same of a float32 value as two selects and a conversion that is always in range: loops vectorize it (GCC
   vectorized none with the branchy form: a quantization's cast to int8 ran at 1.4 ns per element, 0.35 now) */
static inline int32_t ko_f2i32f(float x) {
    const float below = x < 2147483648.0f ? x : -2147483648.0f;  /* NaN, +inf, too large: the most negative */
    return (int32_t)(below >= -2147483648.0f ? below : -2147483648.0f);
}
/* QuantizeLinear's integer step (ir/primitives.py saturating_round): nearest even, an offset, saturated by two
   selects (a NaN compares false: low) */
static inline float ko_satroundf(float x, float offset, float low, float high) {
    const float shifted = nearbyintf(x) + offset;
    const float above = shifted > low ? shifted : low;
    return above < high ? above : high;
}
static inline int64_t ko_f2i64(double x) {
    return (x >= -9223372036854775808.0 && x < 9223372036854775808.0) ? (int64_t)x : INT64_MIN;
}
/* float32 exp/tanh/erf/sigmoid without libm calls, so loops using them vectorize (glibc's vector math
   needs -ffast-math, which would break NaN semantics). Every vector instruction counts: these loops are
   compute-bound (a 512-bit op issues about once per cycle per core here), so exp has no clamps:
   x/ln2 is rounded by adding 1.5*2^23 + 126, whose low mantissa bits are then n + 126 and shift straight
   into the exponent field of 2^(n-1); exp(r), |r| <= ln2/2, is 1 + r + r^2 P(r) with P of degree 4 fitted
   near-minimax here (relative error 3e-9); inputs past the float range are selected at the end (NaN
   passes through the arithmetic). ~1 ulp; results below 2^-125.5 (x < -87.0) are 0.
   tanh: Cephes polynomial below 0.625, else via exp. erf: x P(x^2) / Q(x^2) on the argument clamped to
   3.9, a rational approximation fitted here (weighted least squares iterated towards minimax in float64,
   fit error 1.4e-9; float32 rounding leaves an absolute error < 4e-7), exactly ±1 where float32 erf is:
   one division and no exp, 0.6 ns per element on one Zen 3 core vs 1.1 for Abramowitz-Stegun's erfc
   through exp. (A rational tanh was as fast a gain but 2-3 ulp off glibc near ±1, which flips integer
   casts of tanh(x) * c in the random-plan tests; tanh keeps its 1-ulp form.) */
static inline float ko_expf(float x) {
    float t = x * 1.44269504088896341f + 12583038.0f;
    float n = t - 12583038.0f;
    float r = x - n * 0.693359375f; /* Cody-Waite: ln2 in two parts */
    r = r + n * 2.12194440e-4f;
    float p = 1.38145184610039e-3f;
    p = p * r + 8.368710987269878e-3f;
    p = p * r + 4.166838899254799e-2f;
    p = p * r + 1.666652113199234e-1f;
    p = p * r + 4.999999403953552e-1f;
    float y = p * r * r + r + 1.0f;
    union { float f; uint32_t i; } scale = {t};
    scale.i <<= 23; /* 2^(n-1), then *2: n = 128 would not fit the exponent field (unsigned: a shift past the
                       sign bit is defined) */
    y = y * scale.f * 2.0f;
    y = x > 88.72284f ? INFINITY : y; /* ln(FLT_MAX) = 88.72284 */
    return x < -87.33f ? 0.0f : y;
}
/* sigmoid(x) = 1 / (1 + 2^n e^r) with its own exp(-x), cheaper than ko_expf's (swish runs it on every
   activation of EfficientNet-style networks: a fifth of their time). The bias 127 rides in t with n, so t's bits
   shifted left are 2^n itself, and 1 + e^r 2^n is one fused multiply-add; e^r by Horner (ko_expf's polynomial).
   Outside [-88, 88], where n's field would wrap, the result is selected: 0 and 1 (the true values are below
   1e-38 or round to 1); NaN passes. 15 vector instructions against 19 (x * sigmoid(x) 0.29 -> 0.24 ns a value
   on one core of the AMX Xeon), within 2.4 ulp as before. */
static inline float ko_sigmoidf(float x) {
    float t = x * -1.44269504088896341f + 12583039.0f; /* 1.5 * 2^23 + 127: the low mantissa bits are n + 127 */
    float n = t - 12583039.0f;                         /* n = round(-x / ln2) */
    float r = n * -0.693359375f - x;                   /* r = -x - n ln2, ln2 in two parts */
    r = n * 2.12194440e-4f + r;
    float p = 1.38145184610039e-3f;
    p = p * r + 8.368710987269878e-3f;
    p = p * r + 4.166838899254799e-2f;
    p = p * r + 1.666652113199234e-1f;
    p = p * r + 4.999999403953552e-1f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union { float f; uint32_t i; } scale = {t};
    scale.i <<= 23; /* 2^n (unsigned: a shift past the sign bit is defined) */
    float y = 1.0f / (p * scale.f + 1.0f);
    y = x < -88.0f ? 0.0f : y;
    return x > 88.0f ? 1.0f : y;
}
/* bfloat16 is float32's top 16 bits: rounded to nearest, ties to even (add 0x7FFF plus the lowest kept bit), as
   the reference (ml_dtypes) and oneDNN round; NaN becomes the quiet NaN of its sign, as ml_dtypes makes it (the
   addition could carry a NaN into inf or -0); subnormals are rounded like any value (vcvtneps2bf16 would flush
   them to zero); beyond the largest finite, inf. Integer arithmetic and a select: GCC vectorizes it */
static inline uint16_t ko_bf16_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)((u & 0x7FFFFFFFu) > 0x7F800000u ? ((u >> 16) & 0x8000u) | 0x7FC0u : rounded);
}
static inline float ko_bf16_float(uint16_t bits) {
    const uint32_t u = (uint32_t)bits << 16;
    float y;
    memcpy(&y, &u, 4);
    return y;
}
static inline float ko_bf16_round(float x) { return ko_bf16_float(ko_bf16_bits(x)); }
/* an 8 x 8 float block: dst[i * ds + j] = src[j * ss + i] (a transposing copy reads whole rows, not one element
   per cache line): a [16384, 144] -> [144, 16384] tiled copy moves 15-20 GB/s on one Zen 3 core, 55-65 on two */
static inline void ko_transpose8(const float *restrict src, int64_t ss, float *restrict dst, int64_t ds) {
#if KO_VECTOR_SHUFFLE
    /* straight-line, not loops over arrays: with loops GCC stopped inlining this (a call per block, 1.4x slower);
       written out it is the same 8 loads, 8 unpacks, 8 shufps, 8 lane exchanges and 8 stores as intrinsics */
    const ko_v8 r0 = *(const ko_v8 *)src, r1 = *(const ko_v8 *)(src + ss), r2 = *(const ko_v8 *)(src + 2 * ss);
    const ko_v8 r3 = *(const ko_v8 *)(src + 3 * ss), r4 = *(const ko_v8 *)(src + 4 * ss);
    const ko_v8 r5 = *(const ko_v8 *)(src + 5 * ss), r6 = *(const ko_v8 *)(src + 6 * ss);
    const ko_v8 r7 = *(const ko_v8 *)(src + 7 * ss);
    /* pairs of rows interleaved (unpacklo/hi within each 128-bit half) */
    const ko_v8 t0 = KO_LO(r0, r1), t1 = KO_HI(r0, r1), t2 = KO_LO(r2, r3), t3 = KO_HI(r2, r3);
    const ko_v8 t4 = KO_LO(r4, r5), t5 = KO_HI(r4, r5), t6 = KO_LO(r6, r7), t7 = KO_HI(r6, r7);
    /* then quadruples */
    const ko_v8 s0 = KO_Q0(t0, t2), s1 = KO_Q1(t0, t2), s2 = KO_Q0(t1, t3), s3 = KO_Q1(t1, t3);
    const ko_v8 s4 = KO_Q0(t4, t6), s5 = KO_Q1(t4, t6), s6 = KO_Q0(t5, t7), s7 = KO_Q1(t5, t7);
    /* then the 128-bit halves exchanged */
    *(ko_v8 *)dst = KO_H0(s0, s4);
    *(ko_v8 *)(dst + ds) = KO_H0(s1, s5);
    *(ko_v8 *)(dst + 2 * ds) = KO_H0(s2, s6);
    *(ko_v8 *)(dst + 3 * ds) = KO_H0(s3, s7);
    *(ko_v8 *)(dst + 4 * ds) = KO_H1(s0, s4);
    *(ko_v8 *)(dst + 5 * ds) = KO_H1(s1, s5);
    *(ko_v8 *)(dst + 6 * ds) = KO_H1(s2, s6);
    *(ko_v8 *)(dst + 7 * ds) = KO_H1(s3, s7);
#else
    for (int64_t i = 0; i < 8; i++)
        for (int64_t j = 0; j < 8; j++) dst[i * ds + j] = src[j * ss + i];
#endif
}
/* sums[j] = part[j * 8] + ... + part[j * 8 + 7]: the lane partials of 8 rows summed row by row at once, as a
   tree of pairwise adds of shuffled vectors (14 shuffles and 7 adds where one row's horizontal sum alone was
   7 dependent adds) */
static inline void ko_sum8x8(const float *restrict part, float *restrict sums) {
#if KO_VECTOR_SHUFFLE
    const ko_v8 *p = (const ko_v8 *)part;
    /* even and odd lanes of two rows: each half now holds two rows' pairs */
    const ko_v8 a0 = __builtin_shufflevector(p[0], p[1], 0, 2, 8, 10, 4, 6, 12, 14) +
                     __builtin_shufflevector(p[0], p[1], 1, 3, 9, 11, 5, 7, 13, 15);
    const ko_v8 a1 = __builtin_shufflevector(p[2], p[3], 0, 2, 8, 10, 4, 6, 12, 14) +
                     __builtin_shufflevector(p[2], p[3], 1, 3, 9, 11, 5, 7, 13, 15);
    const ko_v8 a2 = __builtin_shufflevector(p[4], p[5], 0, 2, 8, 10, 4, 6, 12, 14) +
                     __builtin_shufflevector(p[4], p[5], 1, 3, 9, 11, 5, 7, 13, 15);
    const ko_v8 a3 = __builtin_shufflevector(p[6], p[7], 0, 2, 8, 10, 4, 6, 12, 14) +
                     __builtin_shufflevector(p[6], p[7], 1, 3, 9, 11, 5, 7, 13, 15);
    /* again: each half holds one partial of four rows */
    const ko_v8 b0 = __builtin_shufflevector(a0, a1, 0, 2, 8, 10, 4, 6, 12, 14) +
                     __builtin_shufflevector(a0, a1, 1, 3, 9, 11, 5, 7, 13, 15);
    const ko_v8 b1 = __builtin_shufflevector(a2, a3, 0, 2, 8, 10, 4, 6, 12, 14) +
                     __builtin_shufflevector(a2, a3, 1, 3, 9, 11, 5, 7, 13, 15);
    /* the two halves added */
    *(ko_v8 *)sums = __builtin_shufflevector(b0, b1, 0, 1, 2, 3, 8, 9, 10, 11) +
                     __builtin_shufflevector(b0, b1, 4, 5, 6, 7, 12, 13, 14, 15);
#else
    for (int64_t j = 0; j < 8; j++) {
        float s = 0;
        for (int64_t l = 0; l < 8; l++) s += part[j * 8 + l];
        sums[j] = s;
    }
#endif
}
static inline float ko_tanhf(float x) {
    float a = __builtin_fabsf(x);
    float z = x * x;
    float small = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z
                    + 1.33314422036e-1f) * z - 3.33332819422e-1f) * z * x + x;
    float big = 1.0f - 2.0f / (ko_expf(2.0f * a) + 1.0f);
    big = x < 0 ? -big : big;
    return a < 0.625f ? small : big;
}
/* The clamps are integer minima of bit patterns (|x| and the quotient are non-negative, so their bits order as
   they do): float ternaries against constants made GCC thread each constant through both polynomials and mask
   every instruction (a GELU loop ran 41 vector instructions per 16 values, now 28: 0.348 -> 0.261 ns a value on
   one core of the AMX Xeon at 512 bits). The integer clamp turns NaN into 3.9: restored at the end. The quotient
   at 3.9 is 1 - 3.3e-8, which float32 rounding may leave just below 1: selected. The coefficients are those of
   the fit in (x / 3.9)^2, rescaled to x^2 (absolute error < 3.3e-7). */
static inline float ko_erff(float x) {
    union { float f; uint32_t i; } in = {x}, clamped, out;
    uint32_t magnitude = in.i & 0x7fffffffu;
    clamped.i = magnitude < 0x4079999Au ? magnitude : 0x4079999Au; /* min(|x|, 3.9f): 1 - erf(3.9) = 3.5e-8 */
    float a = clamped.f, z = a * a;
    float p = -1.322786944271193e-08f;
    p = p * z + 4.6974463149290835e-06f;
    p = p * z + 0.000379621890898058f;
    p = p * z + 0.0038300443572912074f;
    p = p * z + 0.05426070804555257f;
    p = p * z + 0.1846971439909386f;
    p = p * z + 1.1283791803293113f;
    float q = 6.322806760846323e-05f;
    q = q * z + 0.0013035580469171737f;
    q = q * z + 0.015423588691634117f;
    q = q * z + 0.11375878775842917f;
    q = q * z + 0.49701710443100544f;
    q = q * z + 1.0f;
    out.f = a * p / q;
    out.i = out.i < 0x3f800000u ? out.i : 0x3f800000u;              /* at most 1 */
    out.i = clamped.i == 0x4079999Au ? 0x3f800000u : out.i;           /* exactly 1 where float32 erf is */
    out.i |= in.i & 0x80000000u;                                      /* erf is odd */
    return x != x ? x : out.f;
}
"""


def prelude_used_by(code: str) -> str:
    """The part of PRELUDE that determines how `code` runs: includes and macros, plus the helper functions it
    calls (transitively), comments dropped. A kernel's profile signature hashes this, so a helper added or
    changed does not invalidate the measurements of kernels that never call it."""
    header, blocks = _prelude_blocks(PRELUDE)
    used: set[str] = set()
    pending = _CALLED.findall(code)
    while pending:
        name = pending.pop()
        if name in blocks and name not in used:
            used.add(name)
            pending += _CALLED.findall(blocks[name])
    return header + "".join(block for name, block in blocks.items() if name in used)


_CALLED = re.compile(r"\b(ko_\w+)\(")


@functools.lru_cache(maxsize=4)
def _prelude_blocks(prelude: str) -> tuple[str, dict[str, str]]:
    """The prelude without comments, split once (tuning asks for thousands of kernels): the includes and
    macros before the first helper, and each `static inline` helper's text by name, in the prelude's order."""
    text = re.sub(r"/\*.*?\*/", "", prelude, flags=re.S)
    starts = [m.start() for m in re.finditer(r"^static inline", text, flags=re.M)]
    header = text[: starts[0]] if starts else text
    blocks = {}
    for begin, end in zip(starts, [*starts[1:], len(text)], strict=True):
        function = re.match(r"static inline [\w ]+?\b(ko_\w+)\(", text[begin:end])
        if function is not None:
            blocks[function.group(1)] = text[begin:end]
    return header, blocks
