// mmq32.cu: Q4_0 and Q8_0 weights times 8-bit activations (the q8 blocks
// of quantize_q8: per 32 values one float scale) for prompt pieces (any
// number of rows; the backend sends those of 16 to 64, longer ones go to
// the f16 GEMM on the 8-bit form of x that q8_to_f16 below makes, which is
// faster there), on the tensor cores (mma.sync m16n8k32, s8·s8 → s32;
// CUDA sm_80 and later).
//
// Why: the prompt path multiplies every other weight type by f16-rounded
// activations (dequantize to f16, then a GEMM), while the CPU backend, like
// llama.cpp, quantizes the activations of these types to 8 bits and takes
// integer dot products. For Q4_0 the two estimates of a perplexity differed
// by 0.1 % on stories260K (issue 20). Here each block of 32 weights meets
// the same 8-bit codes of x as on the CPU, its integer sum is exact (one
// mma k-step is one block), and the float steps are the CPU's: the sum
// times d_w·d_x, d_x rounded to f16 as the CPU stores it (quantize_q8 keeps
// it as a float32), added to one running sum per output block after block
// in the order of the row. So the results are the CPU's up to the order of
// its own vector reductions.
//
// Layout: a block of 4 warps computes 64 weight rows (16 per warp) × 8·NT
// rows of x; each warp walks all blocks of its rows and keeps NT·4 running
// sums per thread. Thread (g, q) = (lane/4, lane%4) holds the A words of
// weight rows g and g+8 (bytes 4q…4q+3 and 16+4q…16+4q+3 of each block's
// 32 codes, the mma's k) and the B words of x row g of each 8-row tile.
// grid (ceil(nx/(8·NT)), ceil(rows/64)): the blocks of one weight tile are
// neighbours, so the weights are read from DRAM about once.
//   needs: cols % 32 == 0, w 2-byte aligned (blocks are 18 and 34 bytes,
//   read as 16-bit halves), x rows as written by quantize_q8 (row v at
//   xq + v·cols, its scales at xd + v·cols/32)
//   y [nx][rows]

#include "common.h"

#if defined(FORGE_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define MQ32_MMA 1
#else
#define MQ32_MMA 0
#endif

#if MQ32_MMA
// c = A (16×32 s8: a0 row g k 4q…4q+3, a1 row g+8 same k, a2 row g k
// 16+4q…, a3 row g+8) · B (32×8 s8: b0 k 4q…4q+3 column g, b1 k 16+4q…).
// c0, c1: row g, columns 2q, 2q+1; c2, c3: row g+8.
DEV void mma_s8_k32(int (&c)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %11, %12, %13};"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0), "r"(0), "r"(0), "r"(0));
}

// ld_2h: a 32-bit word at a 2-byte aligned address, as two 16-bit halves.
DEV u32 ld_2h(const u8* p) {
  const u16* h = (const u16*)p;
  return (u32)h[0] | ((u32)h[1] << 16);
}

// q40_s8: four nibbles (the low one of each byte) less 8, as signed bytes:
// n + 0x78 stays within the byte (at most 0x87) and flipping bit 7 then
// gives n − 8 in two's complement.
DEV u32 q40_s8(u32 v) { return ((v & 0x0F0F0F0Fu) + 0x78787878u) ^ 0x80808080u; }

// B32 traits: ld gives thread q's A words of one block (lo: codes 4q…4q+3,
// hi: codes 16+4q…16+4q+3, signed bytes) and its scale.
struct M32Q4_0 {  // d f16, 16 bytes: code i low nibble of byte i, code 16+i its high nibble
  static constexpr int BB = 18;
  static DEVM void ld(const u8* b, int q, u32& lo, u32& hi, float& d) {
    d = h2f(*(const u16*)b);
    u32 v = ld_2h(b + 2 + 4 * q);
    lo = q40_s8(v);
    hi = q40_s8(v >> 4);
  }
};
struct M32Q8_0 {  // d f16, 32 signed bytes
  static constexpr int BB = 34;
  static DEVM void ld(const u8* b, int q, u32& lo, u32& hi, float& d) {
    d = h2f(*(const u16*)b);
    lo = ld_2h(b + 2 + 4 * q);
    hi = ld_2h(b + 18 + 4 * q);
  }
};

// dx16: an activation block's scale as the CPU keeps it (rounded to f16).
DEV float dx16(float d) { return h2f(f2h(d)); }

template <class B, int NT>
DEV void mmq32_body(const u8* __restrict__ w, const i8* __restrict__ xq, const float* __restrict__ xd,
                    float* __restrict__ y, int rows, int cols, int nx) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int g = lane >> 2, q = lane & 3;
  int row0 = blockIdx.y * 64 + warp * 16;
  if (row0 >= rows) return;  // no block-wide synchronisation below
  int x0 = blockIdx.x * 8 * NT;
  int nb = cols / 32;
  size_t rb = (size_t)nb * B::BB;
  const u8* wa = w + (size_t)min(row0 + g, rows - 1) * rb;
  const u8* wb = w + (size_t)min(row0 + g + 8, rows - 1) * rb;
  const i8* xb[NT];        // the x row this thread gives the mma (column g)
  const float* xs[NT][2];  // the scales of the x rows of its outputs (columns 2q, 2q+1)
#pragma unroll
  for (int t = 0; t < NT; t++) {
    xb[t] = xq + (size_t)min(x0 + 8 * t + g, nx - 1) * cols + 4 * q;
    xs[t][0] = xd + (size_t)min(x0 + 8 * t + 2 * q, nx - 1) * nb;
    xs[t][1] = xd + (size_t)min(x0 + 8 * t + 2 * q + 1, nx - 1) * nb;
  }
  float acc[NT][4];
#pragma unroll
  for (int t = 0; t < NT; t++)
#pragma unroll
    for (int p = 0; p < 4; p++) acc[t][p] = 0.0f;
#pragma unroll 2
  for (int k = 0; k < nb; k++) {
    u32 a0, a1, a2, a3;
    float da, db;
    B::ld(wa + (size_t)k * B::BB, q, a0, a2, da);
    B::ld(wb + (size_t)k * B::BB, q, a1, a3, db);
#pragma unroll
    for (int t = 0; t < NT; t++) {
      u32 b0 = *(const u32*)(xb[t] + 32 * k), b1 = *(const u32*)(xb[t] + 32 * k + 16);
      int c[4];
      mma_s8_k32(c, a0, a1, a2, a3, b0, b1);
      float dx0 = dx16(xs[t][0][k]), dx1 = dx16(xs[t][1][k]);
      // the CPU's term: d_w·d_x·Σ, added to the running sum
      acc[t][0] = __fadd_rn(acc[t][0], __fmul_rn(__fmul_rn(da, dx0), (float)c[0]));
      acc[t][1] = __fadd_rn(acc[t][1], __fmul_rn(__fmul_rn(da, dx1), (float)c[1]));
      acc[t][2] = __fadd_rn(acc[t][2], __fmul_rn(__fmul_rn(db, dx0), (float)c[2]));
      acc[t][3] = __fadd_rn(acc[t][3], __fmul_rn(__fmul_rn(db, dx1), (float)c[3]));
    }
  }
#pragma unroll
  for (int t = 0; t < NT; t++)
#pragma unroll
    for (int p = 0; p < 4; p++) {
      int wr = row0 + g + 8 * (p >> 1), xr = x0 + 8 * t + 2 * q + (p & 1);
      if (wr < rows && xr < nx) y[(size_t)xr * rows + wr] = acc[t][p];
    }
}
#endif  // MQ32_MMA

// mmq32_{type}_n{8·NT}: 8·NT rows of x per block. Where there are no mma
// instructions (HIP, CUDA before sm_80) the kernels exist but do nothing:
// the backend never launches them there (mmq32.go).
#if MQ32_MMA
#define MQ32_CALL(...) __VA_ARGS__(w, xq, xd, y, rows, cols, nx)
#else
#define MQ32_CALL(...) (void)0
#endif
#define MQ32_ARGS const u8 *w, const i8 *xq, const float *xd, float *y, int rows, int cols, int nx
KERNEL void __launch_bounds__(128) mmq32_q4_0_n16(MQ32_ARGS) { GRID_DEPEND(); MQ32_CALL(mmq32_body<M32Q4_0, 2>); }
KERNEL void __launch_bounds__(128) mmq32_q4_0_n32(MQ32_ARGS) { GRID_DEPEND(); MQ32_CALL(mmq32_body<M32Q4_0, 4>); }
KERNEL void __launch_bounds__(128) mmq32_q4_0_n64(MQ32_ARGS) { GRID_DEPEND(); MQ32_CALL(mmq32_body<M32Q4_0, 8>); }
KERNEL void __launch_bounds__(128) mmq32_q8_0_n16(MQ32_ARGS) { GRID_DEPEND(); MQ32_CALL(mmq32_body<M32Q8_0, 2>); }
KERNEL void __launch_bounds__(128) mmq32_q8_0_n32(MQ32_ARGS) { GRID_DEPEND(); MQ32_CALL(mmq32_body<M32Q8_0, 4>); }
KERNEL void __launch_bounds__(128) mmq32_q8_0_n64(MQ32_ARGS) { GRID_DEPEND(); MQ32_CALL(mmq32_body<M32Q8_0, 8>); }

// q8_to_f16: x [n] f32 → xh [n] f16 of its 8-bit form, q·d per block of 32
// (the codes and the f16-rounded scale the CPU backend multiplies with,
// computed as quantize_q8 computes them), the operand of the prompt GEMM
// for the weight types the CPU multiplies on 8-bit activations (mmq32.go).
// q·d is exact in float32 (a 7-bit code times an 11-bit scale); only its
// rounding to f16 differs from the CPU's arithmetic, far less than the
// 8-bit rounding both share. One thread per value, 32 consecutive threads
// a block of x: n % 32 == 0 (x rows of whole blocks).
KERNEL void __launch_bounds__(256) q8_to_f16(const float* x, u16* xh, int n) {
  GRID_DEPEND();
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  float v = i < n ? x[i] : 0.0f;
  float a = fabsf(v);
  for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, SHFL_XOR(a, o));
  float inv = a > 0.0f ? 127.0f / a : 0.0f;
  float d = h2f(f2h(a / 127.0f));
  if (i < n) xh[i] = f2h((float)(int)rintf(v * inv) * d);
}
