/* The instruction peaks of this host's vector units, with every OpenMP thread at once: float32 FMA (vfmadd231ps)
   and, where the compiler targets AVX512-BF16, vdpbf16ps, each on 12 independent accumulators, no memory. These
   are upper bounds no kernel passes; bench/zoo/ceiling.py holds the peers' times against them.
   gcc -O2 -march=native -fopenmp bench/peak/vector_peak.c -o /tmp/vector_peak && OMP_NUM_THREADS=2 /tmp/vector_peak
   Prints one line per instruction: "<name> <threads> threads <GFLOP/s>". */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <time.h>

#define ITERATIONS 50000000L
#define SUMS 12

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#ifdef __AVX512F__
typedef __m512 vec;
#define LANES 16
#define FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define SET1(x) _mm512_set1_ps(x)
#define ZERO() _mm512_setzero_ps()
#define SUM(v) _mm512_reduce_add_ps(v)
#else
typedef __m256 vec;
#define LANES 8
#define FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define SET1(x) _mm256_set1_ps(x)
#define ZERO() _mm256_setzero_ps()
static float SUM(__m256 v) { float f[8]; _mm256_storeu_ps(f, v); return f[0] + f[7]; }
#endif

int main(void) {
    const int threads = omp_get_max_threads();
    float sink = 0.0f;
    double t0 = now();
#pragma omp parallel reduction(+ : sink)
    {
        vec acc[SUMS], a = SET1(1e-9f), b = SET1(1.0f);
        for (int j = 0; j < SUMS; j++) acc[j] = ZERO();
        for (long i = 0; i < ITERATIONS; i++) {
#pragma GCC unroll 12
            for (int j = 0; j < SUMS; j++) acc[j] = FMA(a, b, acc[j]);
            __asm__ volatile("" : "+v"(a));
        }
        for (int j = 0; j < SUMS; j++) sink += SUM(acc[j]);
    }
    double seconds = now() - t0;
    printf("fp32-fma %d threads %.1f\n", threads, threads * (double)ITERATIONS * SUMS * LANES * 2 / seconds / 1e9);
#ifdef __AVX512BF16__
    t0 = now();
#pragma omp parallel reduction(+ : sink)
    {
        __m512 acc[SUMS];
        __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80), b = a;
        for (int j = 0; j < SUMS; j++) acc[j] = _mm512_setzero_ps();
        for (long i = 0; i < ITERATIONS; i++) {
#pragma GCC unroll 12
            for (int j = 0; j < SUMS; j++) acc[j] = _mm512_dpbf16_ps(acc[j], a, b);
            __asm__ volatile("" : "+v"(a));
        }
        for (int j = 0; j < SUMS; j++) sink += _mm512_reduce_add_ps(acc[j]);
    }
    seconds = now() - t0;  /* a vdpbf16ps lane: two products and their sum into the accumulator, 4 flops */
    printf("bf16-dp %d threads %.1f\n", threads, threads * (double)ITERATIONS * SUMS * 16 * 4 / seconds / 1e9);
#endif
    return sink == 12345.0f;  /* keeps the sums alive */
}
