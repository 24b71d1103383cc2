/* What the tiles give on this host: tdpbf16ps on four accumulators with tile loads from L1, per thread and
   with every OpenMP thread at once (bench/results/2026-11-27-amx-matmul.md).
   gcc -O2 -march=native -fopenmp bench/amx/tile_peak.c -o /tmp/tile_peak && OMP_NUM_THREADS=2 /tmp/tile_peak */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>
typedef struct { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } cfg_t;
static const cfg_t CFG __attribute__((aligned(64))) = {1,0,{0},{64,64,64,64,64,64,64,64},{16,16,16,16,16,16,16,16}};
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(){ syscall(SYS_arch_prctl,0x1023,18);
 long n=10000000; double t0=now();
 #pragma omp parallel
 { uint16_t buf[4][512] __attribute__((aligned(64))) = {{0}}; _tile_loadconfig(&CFG);
 for(long i=0;i<n;i++){ _tile_loadd(4,buf[0],64);_tile_loadd(5,buf[1],64);_tile_loadd(6,buf[2],64);_tile_loadd(7,buf[3],64); _tile_dpbf16ps(0,4,6); _tile_dpbf16ps(1,4,7); _tile_dpbf16ps(2,5,6); _tile_dpbf16ps(3,5,7);}
 _tile_release(); }
 double dt=now()-t0; int t=omp_get_max_threads(); printf("%d threads: %.0f GFLOP/s total\n", t, t*4.0*n*16*16*32*2/dt/1e9);
}
