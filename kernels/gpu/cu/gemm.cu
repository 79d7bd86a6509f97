// gemm.cu: the prompt-processing matrix product on f16 operands.
//
//   W [M][K] f16 (weights, dequantized on the device), X [N][K] f16
//   (activations), C [N][M] f32: C[n][m] = Σ_k W[m][k]·X[n][k]
//   K is a multiple of 32 (the dequantizer pads rows with zeros); M, N any.
//
// Block tile 128 (m) × 128 (n) × 32 (k), 256 threads, both operands staged
// K-contiguous in shared memory with rows padded to 40 halves (20 words, so
// the eight rows a fragment load touches fall in distinct banks). The next
// k-tile is fetched into registers while the current one is multiplied.
//
// NVIDIA (sm_80 and later): eight warps of 64 × 32, each k16 step sixteen
// mma.sync m16n8k16 with f32 accumulation, fragments read with ldmatrix. Elsewhere (AMD, older NVIDIA) the
// same tiles feed a plain 8 × 8-per-thread f32 product, a correct fallback
// until an MFMA/WMMA path is written.
#include "common.h"

#define GBM 128
#define GBN 128
#define GBK 32
#define GLD 40

#if defined(FORGE_CUDA) && defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
#define GEMM_MMA 1
#endif

#if defined(GEMM_MMA)
// ldmatrix: four 8×8 f16 tiles from shared memory into the fragment layout
// of mma.sync, one instruction instead of four 32-bit loads per register.
DEV void ldsm_x4(u32* r, const u16* p) {
  u32 a;
  asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}
#endif

// Staging shared by both products: each thread moves rows r0 and r0+64,
// columns c..c+7, of both operands from global memory to registers
// (GEMM_FETCH) and from registers to shared memory (GEMM_STASH).
#define GEMM_FETCH(k0)                           \
  do {                                           \
    ra0 = wv0 ? *(const uint4*)(wp0 + (k0)) : z; \
    ra1 = wv1 ? *(const uint4*)(wp1 + (k0)) : z; \
    rb0 = xv0 ? *(const uint4*)(xp0 + (k0)) : z; \
    rb1 = xv1 ? *(const uint4*)(xp1 + (k0)) : z; \
  } while (0)
#define GEMM_STASH()                             \
  do {                                           \
    *(uint4*)(As + r0 * GLD + c) = ra0;          \
    *(uint4*)(As + (r0 + 64) * GLD + c) = ra1;   \
    *(uint4*)(Bs + r0 * GLD + c) = rb0;          \
    *(uint4*)(Bs + (r0 + 64) * GLD + c) = rb1;   \
  } while (0)

#define GEMM_SETUP()                                                                                          \
  __shared__ __attribute__((aligned(16))) u16 As[GBM * GLD];                                                  \
  __shared__ __attribute__((aligned(16))) u16 Bs[GBN * GLD];                                                  \
  int tid = threadIdx.x;                                                                                      \
  int m0 = blockIdx.x * GBM, n0 = blockIdx.y * GBN;                                                           \
  int r0 = tid >> 2, c = (tid & 3) * 8;                                                                       \
  uint4 z;                                                                                                    \
  z.x = z.y = z.z = z.w = 0;                                                                                  \
  uint4 ra0 = z, ra1 = z, rb0 = z, rb1 = z;                                                                   \
  const u16* wp0 = W + (size_t)min(m0 + r0, M - 1) * K + c;                                                   \
  const u16* wp1 = W + (size_t)min(m0 + r0 + 64, M - 1) * K + c;                                              \
  const u16* xp0 = X + (size_t)min(n0 + r0, N - 1) * K + c;                                                   \
  const u16* xp1 = X + (size_t)min(n0 + r0 + 64, N - 1) * K + c;                                              \
  bool wv0 = m0 + r0 < M, wv1 = m0 + r0 + 64 < M, xv0 = n0 + r0 < N, xv1 = n0 + r0 + 64 < N;

// The plain product: 8 × 8 outputs per thread in f32 FMAs. The prompt GEMM
// of AMD and older NVIDIA targets, and on any NVIDIA target the kernel
// gemm_f16_fma, which Options.GEMMFMA forces so that the path AMD runs is
// tested on the H100.
DEV void gemm_fma_body(const u16* __restrict__ W, const u16* __restrict__ X, float* __restrict__ C, int M, int N,
                       int K) {
  GEMM_SETUP();
  int tm = tid & 15, tn = tid >> 4;
  float acc[8][8];
#pragma unroll
  for (int i = 0; i < 8; i++)
#pragma unroll
    for (int j = 0; j < 8; j++) acc[i][j] = 0.0f;
  GEMM_FETCH(0);
  for (int k0 = 0; k0 < K; k0 += GBK) {
    __syncthreads();
    GEMM_STASH();
    __syncthreads();
    if (k0 + GBK < K) GEMM_FETCH(k0 + GBK);
#pragma unroll 4
    for (int k = 0; k < GBK; k++) {
      float av[8], bv[8];
#pragma unroll
      for (int i = 0; i < 8; i++) av[i] = h2f(As[(tm + 16 * i) * GLD + k]);
#pragma unroll
      for (int j = 0; j < 8; j++) bv[j] = h2f(Bs[(tn + 16 * j) * GLD + k]);
#pragma unroll
      for (int i = 0; i < 8; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
  }

#pragma unroll
  for (int i = 0; i < 8; i++)
#pragma unroll
    for (int j = 0; j < 8; j++) {
      int m = m0 + tm + 16 * i, n = n0 + tn + 16 * j;
      if (m < M && n < N) C[(size_t)n * M + m] = acc[i][j];
    }
}

#if defined(GEMM_MMA)
// LDM selects how the mma path reads fragments: ldmatrix (gemm_f16) or
// 32-bit shared loads (gemm_f16_lds, kept as a reference variant).
template <bool LDM>
static __device__ void gemm_mma_body(const u16* __restrict__ W, const u16* __restrict__ X, float* __restrict__ C,
                                     int M, int N, int K) {
  GEMM_SETUP();
  int lane = tid & 31, warp = tid >> 5;
  int g = lane >> 2, t = lane & 3;
  int wm = (warp & 1) * 64, wn = (warp >> 1) * 32;
  float acc[4][4][4];
#pragma unroll
  for (int i = 0; i < 4; i++)
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;
  GEMM_FETCH(0);
  for (int k0 = 0; k0 < K; k0 += GBK) {
    __syncthreads();
    GEMM_STASH();
    __syncthreads();
    if (k0 + GBK < K) GEMM_FETCH(k0 + GBK);
#pragma unroll
    for (int kk = 0; kk < GBK; kk += 16) {
      u32 a[4][4], b[4][2];
      if (LDM) {
        int lane = tid & 31;
#pragma unroll
        for (int i = 0; i < 4; i++) ldsm_x4(a[i], As + (wm + 16 * i + (lane & 15)) * GLD + kk + 8 * (lane >> 4));
#pragma unroll
        for (int j = 0; j < 4; j += 2) {
          u32 r[4];
          ldsm_x4(r, Bs + (wn + 8 * j + 8 * (lane >> 4) + (lane & 7)) * GLD + kk + 8 * ((lane >> 3) & 1));
          b[j][0] = r[0];
          b[j][1] = r[1];
          b[j + 1][0] = r[2];
          b[j + 1][1] = r[3];
        }
      } else {
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const u16* p = As + (wm + 16 * i + g) * GLD + kk + 2 * t;
        a[i][0] = *(const u32*)p;
        a[i][1] = *(const u32*)(p + 8 * GLD);
        a[i][2] = *(const u32*)(p + 8);
        a[i][3] = *(const u32*)(p + 8 * GLD + 8);
      }
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const u16* p = Bs + (wn + 8 * j + g) * GLD + kk + 2 * t;
        b[j][0] = *(const u32*)p;
        b[j][1] = *(const u32*)(p + 8);
      }
      }
#pragma unroll
      for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
          asm volatile(
              "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
              "{%0,%1,%2,%3};"
              : "+f"(acc[i][j][0]), "+f"(acc[i][j][1]), "+f"(acc[i][j][2]), "+f"(acc[i][j][3])
              : "r"(a[i][0]), "r"(a[i][1]), "r"(a[i][2]), "r"(a[i][3]), "r"(b[j][0]), "r"(b[j][1]));
    }
  }

#pragma unroll
  for (int i = 0; i < 4; i++)
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        int m = m0 + wm + 16 * i + g + 8 * (e >> 1);
        int n = n0 + wn + 8 * j + 2 * t + (e & 1);
        if (m < M && n < N) C[(size_t)n * M + m] = acc[i][j][e];
      }
}
#endif

template <bool LDM>
DEV void gemm_f16_body(const u16* W, const u16* X, float* C, int M, int N, int K) {
#if defined(GEMM_MMA)
  gemm_mma_body<LDM>(W, X, C, M, N, K);
#else
  gemm_fma_body(W, X, C, M, N, K);
#endif
}

KERNEL void __launch_bounds__(256) gemm_f16(const u16* W, const u16* X, float* C, int M, int N, int K) {
  GRID_DEPEND();
  gemm_f16_body<true>(W, X, C, M, N, K);
}
KERNEL void __launch_bounds__(256) gemm_f16_lds(const u16* W, const u16* X, float* C, int M, int N, int K) {
  GRID_DEPEND();
  gemm_f16_body<false>(W, X, C, M, N, K);
}
KERNEL void __launch_bounds__(256) gemm_f16_fma(const u16* W, const u16* X, float* C, int M, int N, int K) {
  GRID_DEPEND();
  gemm_fma_body(W, X, C, M, N, K);
}
