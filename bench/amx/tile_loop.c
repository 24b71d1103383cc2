/* The AMX matmul's 2x2-tile loop alone, for bench/results/2026-11-27-amx-matmul.md: M x K x N with weights packed
   as native/amx_matmul.py packs them, rows rounded per block of 32, bias added on the float32 block.
   Build and run: gcc -O3 -march=native -fopenmp bench/amx/tile_loop.c -o /tmp/tile_loop -lm &&
   OMP_NUM_THREADS=2 /tmp/tile_loop 197 768 192    (prints µs, GFLOP/s and the error against bf16 products) */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <math.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>
typedef struct { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } cfg_t;
static const cfg_t CFG __attribute__((aligned(64))) = {1,0,{0},{64,64,64,64,64,64,64,64},{16,16,16,16,16,16,16,16}};
static inline __m512i bf32(const float *lo, const float *hi) { return (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(hi), _mm512_loadu_ps(lo)); }
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int M, K, N, KP, NP;
uint16_t *wp; float *bias;
/* pack W [K][N] f32 -> [NP/16][KP/32][16][32] */
void pack(const float *w){
  wp = aligned_alloc(64, (size_t)NP*KP*2); memset(wp,0,(size_t)NP*KP*2);
  for (int nb=0; nb<NP/16; nb++) for (int ks=0; ks<KP/32; ks++) for (int r=0;r<16;r++) for (int c=0;c<16;c++) for (int h=0;h<2;h++){
    int k=ks*32+2*r+h, n=nb*16+c; float v = (k<K&&n<N)? w[(size_t)k*N+n]:0;
    uint32_t u; memcpy(&u,&v,4); u = (u + 0x7fff + ((u>>16)&1))>>16;
    wp[(((size_t)nb*(KP/32)+ks)*16+r)*32+c*2+h]=u; }
}
void run(const float *a, float *c, int variant){
  #pragma omp parallel
  {
    int p=omp_get_thread_num(), np=omp_get_num_threads();
    _tile_loadconfig(&CFG);
    uint16_t *ab = aligned_alloc(64, 32*(size_t)KP*2);
    float cb[32*32] __attribute__((aligned(64)));
    int MB=(M+31)/32, NB=NP/32;
    long items = (long)MB*NB, first=items*p/np, last=items*(p+1)/np;
    int have=-1;
    for (long it=first; it<last; it++){
      int mb=it/NB, nb=it%NB;
      if (mb!=have){ have=mb;
        for (int r=0;r<32;r++){ int row=mb*32+r;
          if (row<M){ const float *ar=a+(size_t)row*K; int k=0;
            for (;k+32<=K;k+=32) _mm512_storeu_si512(ab+r*KP+k, bf32(ar+k,ar+k+16));
            if (k<KP){ float x[32]={0}; for(int e=0;k+e<K;e++) x[e]=ar[k+e]; _mm512_storeu_si512(ab+r*KP+k, bf32(x,x+16)); }
          } else memset(ab+r*KP,0,KP*2);
        }
      }
      const uint16_t *b0=wp+(size_t)(nb*2)*(KP/32)*512, *b1=b0+(KP/32)*512;
      _tile_zero(0);_tile_zero(1);_tile_zero(2);_tile_zero(3);
      for (int ks=0; ks<KP/32; ks++){
        _tile_loadd(4, ab+ks*32, KP*2);
        _tile_loadd(5, ab+16*KP+ks*32, KP*2);
        _tile_loadd(6, b0+ks*512, 64);
        _tile_loadd(7, b1+ks*512, 64);
        _tile_dpbf16ps(0,4,6); _tile_dpbf16ps(1,4,7); _tile_dpbf16ps(2,5,6); _tile_dpbf16ps(3,5,7);
      }
      _tile_stored(0, cb, 128); _tile_stored(1, cb+16, 128); _tile_stored(2, cb+512, 128); _tile_stored(3, cb+528, 128);
      int rows = M-mb*32<32?M-mb*32:32;
      for (int r=0;r<rows;r++){ float *o=c+(size_t)(mb*32+r)*N+nb*32;
        for (int j=0;j<32;j+=16){ __m512 v=_mm512_add_ps(_mm512_load_ps(cb+r*32+j), _mm512_loadu_ps(bias+nb*32+j));
          if (nb*32+j+16<=N) _mm512_storeu_ps(o+j, v); else _mm512_mask_storeu_ps(o+j, (__mmask16)((1u<<(N-nb*32-j))-1), v);} }
    }
    free(ab);
    _tile_release();
  }
}
int main(int argc,char**argv){
  M=atoi(argv[1]);K=atoi(argv[2]);N=atoi(argv[3]);
  KP=(K+31)/32*32; NP=(N+31)/32*32;
  if (syscall(SYS_arch_prctl,0x1023,18)) {printf("no amx\n");return 1;}
  float *a=malloc(4L*M*K),*w=malloc(4L*K*N),*c=malloc(4L*M*N); bias=calloc(NP,4);
  for(long i=0;i<(long)M*K;i++)a[i]=(rand()%2001-1000)/1000.f;
  for(long i=0;i<(long)K*N;i++)w[i]=(rand()%2001-1000)/1000.f;
  pack(w);
  run(a,c,0);
  // check vs reference with bf16 rounded inputs
  double maxe=0;
  for(int i=0;i<M;i+=7)for(int j=0;j<N;j+=5){double s=0;for(int k=0;k<K;k++){float x=a[(long)i*K+k],y=w[(long)k*N+j];uint32_t u,v;memcpy(&u,&x,4);memcpy(&v,&y,4);u=((u+0x7fff+((u>>16)&1))>>16)<<16;v=((v+0x7fff+((v>>16)&1))>>16)<<16;memcpy(&x,&u,4);memcpy(&y,&v,4);s+=(double)x*y;}
   double e=fabs(s-c[(long)i*N+j]); if(e>maxe)maxe=e;}
  int reps=200; double best=1e9;
  for(int t=0;t<5;t++){double t0=now();for(int r=0;r<reps;r++)run(a,c,0);double dt=(now()-t0)/reps;if(dt<best)best=dt;}
  printf("M%d K%d N%d: %.1f us  %.0f GFLOP/s  maxerr %.2e\n",M,K,N,best*1e6,2.0*M*K*N/best/1e9,maxe);
}
