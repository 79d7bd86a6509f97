// mmqbody.h: the bodies of the tensor-core Q4_K and Q6_K products on 8-bit
// x (mma.sync, CUDA sm_80 on). mmq.cu's kernels (one weight, rows of x)
// and the prompt's grouped expert products (moemmq.cu: every expert's rows
// in one launch) both include it, so a row comes out bit for bit alike;
// mmq.cu's header comment says how the arithmetic is made batch-invariant.
// A body computes the block's tile of 16 weight rows from row0 and 8·NT
// rows of x from x0 (the caller maps its grid onto them).
#pragma once
#include "common.h"
#include "q8terms.h"

#if defined(FORGE_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define MMQ_MMA 1
#else
#define MMQ_MMA 0
#endif

#if MMQ_MMA
// c = A (16×16 s8, rows: a0 row g, a1 row g+8; k 4q…4q+3) · B (16×8 s8:
// k 4q…4q+3, column g), g = lane/4, q = lane%4. c0, c1: row g, columns 2q,
// 2q+1; c2, c3: row g+8.
DEV void mma_s8(int (&c)[4], u32 a0, u32 a1, u32 b) {
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %8, %9, %10};"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a0), "r"(a1), "r"(b), "r"(0), "r"(0), "r"(0), "r"(0));
}

DEV u32 ld_w32(const u8* p) { return *(const u32*)p; }

// i2f: the float of an integer |i| < 2^22, exactly as a conversion gives
// it, with an integer add and a float add (full rate) instead of a
// conversion instruction (a quarter rate or less), which the epilogue would
// otherwise be bound by: 1.5·2^23 has a unit last place, so adding i to
// its bits adds i.
DEV float i2f(int i) { return __fadd_rn(__int_as_float(0x4B400000 + i), -12582912.0f); }

// ---- Q4_K ----------------------------------------------------------------
//
// One-row lane 8r+j (j = 2c+h) takes qs[32c+16h … +15] of super-blocks
// r, r+4, …: the low nibbles are 16 values of sub-block 2c (il), the high
// ones 16 of sub-block 2c+1 (ih). Here group s of pair c (s = 0…3) is the
// 16 values of qs[32c + 16(s&1) …], low nibbles for s < 2, high for s ≥ 2:
// j = 2c+h has il from group h and ih from group 2+h. Thread (g, q) holds
// bytes 4q…4q+3 of each group's 16 (the mma's k).

// q4k_ld: the header and this thread's code words (bytes 4q…4q+3 of each
// 16) of one super-block of rows g (pa) and g+8 (pb).
DEV void q4k_ld(const u8* pa, const u8* pb, int q, uint4& ha, uint4& hb, u32 (&qa)[8], u32 (&qb)[8]) {
  ha = *(const uint4*)pa;
  hb = *(const uint4*)pb;
#pragma unroll
  for (int m = 0; m < 8; m++) {
    qa[m] = ld_w32(pa + 16 + 16 * m + 4 * q);
    qb[m] = ld_w32(pb + 16 + 16 * m + 4 * q);
  }
}

// NT: 8-row tiles of x per block; PF: the next super-block's weights are
// loaded before this one's arithmetic.
template <int NT, bool PF>
DEV void mmq_q4_k_body(const u8* __restrict__ w, const i8* __restrict__ xq, const float* __restrict__ xd,
                       float* __restrict__ y, int rows, int cols, int nx, int row0, int x0) {
  // the warps' running sums at the end: [warp = residue][t][p][j][lane]
  // (lane-minor: a warp's stores hit 32 banks)
  __shared__ float red[4][NT][4][8][32];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int g = lane >> 2, q = lane & 3;
  int nsb = cols / 256, nbx = cols / 32;
  size_t rb = (size_t)nsb * 144;
  const u8* wa = w + (size_t)min(row0 + g, rows - 1) * rb;
  const u8* wb = w + (size_t)min(row0 + g + 8, rows - 1) * rb;
  const i8* xb[NT];        // the x row this thread gives the mma (column g)
  const float* xs[NT][2];  // the scales of the x rows of its outputs (columns 2q, 2q+1)
#pragma unroll
  for (int t = 0; t < NT; t++) {
    xb[t] = xq + (size_t)min(x0 + 8 * t + g, nx - 1) * cols;
    xs[t][0] = xd + (size_t)min(x0 + 8 * t + 2 * q, nx - 1) * nbx;
    xs[t][1] = xd + (size_t)min(x0 + 8 * t + 2 * q + 1, nx - 1) * nbx;
  }
  float acc[NT][4][8];
#pragma unroll
  for (int t = 0; t < NT; t++)
#pragma unroll
    for (int p = 0; p < 4; p++)
#pragma unroll
      for (int j = 0; j < 8; j++) acc[t][p][j] = 0.0f;

  uint4 nha, nhb;
  u32 nqa[8], nqb[8];
  if (PF) q4k_ld(wa + (size_t)min(warp, nsb - 1) * 144, wb + (size_t)min(warp, nsb - 1) * 144, q, nha, nhb, nqa, nqb);
  for (int sb = warp; sb < nsb; sb += 4) {
    uint4 ha, hb;
    u32 qa[8], qb[8];
    if (PF) {
      ha = nha;
      hb = nhb;
#pragma unroll
      for (int m = 0; m < 8; m++) {
        qa[m] = nqa[m];
        qb[m] = nqb[m];
      }
      if (sb + 4 < nsb) q4k_ld(wa + (size_t)(sb + 4) * 144, wb + (size_t)(sb + 4) * 144, q, nha, nhb, nqa, nqb);
    } else {
      q4k_ld(wa + (size_t)sb * 144, wb + (size_t)sb * 144, q, ha, hb, qa, qb);
    }
    float da = h2f(ha.x & 0xFFFF), dmina = h2f(ha.x >> 16);
    float db = h2f(hb.x & 0xFFFF), dminb = h2f(hb.x >> 16);
#pragma unroll
    for (int c = 0; c < 4; c++) {
      int p0 = 2 * c, sh = 8 * (p0 & 3);
      u32 sca1, ma1, sca2, ma2, scb1, mb1, scb2, mb2;
      q4k_scales(ha, p0, sh, sca1, ma1, sca2, ma2);
      q4k_scales(hb, p0, sh, scb1, mb1, scb2, mb2);
#pragma unroll
      for (int t = 0; t < NT; t++) {
        int ci[4][4], cs[4][4];
#pragma unroll
        for (int s = 0; s < 4; s++) {
          u32 bx = *(const u32*)(xb[t] + (size_t)sb * 256 + 64 * c + 32 * (s >> 1) + 16 * (s & 1) + 4 * q);
          u32 A0 = qa[2 * c + (s & 1)], A1 = qb[2 * c + (s & 1)];
          if (s >= 2) {
            A0 >>= 4;
            A1 >>= 4;
          }
          mma_s8(ci[s], A0 & 0x0F0F0F0Fu, A1 & 0x0F0F0F0Fu, bx);
          mma_s8(cs[s], 0x01010101u, 0x01010101u, bx);  // Σ qx of the group per column
        }
#pragma unroll
        for (int e = 0; e < 2; e++) {
          float dx1 = xs[t][e][sb * 8 + p0], dx2 = xs[t][e][sb * 8 + p0 + 1];
#pragma unroll
          for (int h = 0; h < 2; h++) {
            int j = 2 * c + h;
            float sxl = i2f(cs[h][e]), sxh = i2f(cs[2 + h][e]);
            float& a = acc[t][e][j];
            a = fadd_x(a, q4k_q8_floatf(da, dmina, sca1, ma1, sca2, ma2, dx1, dx2, i2f(ci[h][e]), i2f(ci[2 + h][e]),
                                        sxl, sxh));
            float& b = acc[t][2 + e][j];
            b = fadd_x(b, q4k_q8_floatf(db, dminb, scb1, mb1, scb2, mb2, dx1, dx2, i2f(ci[h][2 + e]),
                                        i2f(ci[2 + h][2 + e]), sxl, sxh));
          }
        }
      }
    }
  }
#pragma unroll
  for (int t = 0; t < NT; t++)
#pragma unroll
    for (int p = 0; p < 4; p++)
#pragma unroll
      for (int j = 0; j < 8; j++) red[warp][t][p][j][lane] = acc[t][p][j];
  __syncthreads();
  // warp_sum's order: lanes 8r+j and 8(r^2)+j first, then r^1, then j^4,
  // j^2, j^1. Output (weight row wr, x row xr) was thread (g, q) = (wr&7,
  // (xr&7)/2) of tile t = xr/8 at fragment position p.
  for (int o = threadIdx.x; o < 16 * 8 * NT; o += blockDim.x) {
    int wr = o & 15, xr = o >> 4;
    int t = xr >> 3, p = 2 * (wr >> 3) + (xr & 1), ln = 4 * (wr & 7) + ((xr & 7) >> 1);
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; j++)
      v[j] = (red[0][t][p][j][ln] + red[2][t][p][j][ln]) + (red[1][t][p][j][ln] + red[3][t][p][j][ln]);
    float s = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
    if (row0 + wr < rows && x0 + xr < nx) y[(size_t)(x0 + xr) * rows + row0 + wr] = s;
  }
}

// ---- Q6_K ----------------------------------------------------------------
//
// One-row lane 4r+v (v = 2n+t) takes super-blocks r, r+8, … and of each
// the values 128n + 32k + 16t + i (k = 0…3, i < 16): group G = 8n+2k+t of
// the super-block's sixteen groups of 16 (one scale each). Value 128n + l
// + 32m (l < 32) is ql[64n + l + 32(m&1)] (low nibble for m < 2, high
// for m ≥ 2) with bits 2m, 2m+1 of qh[32n + l] above it, less 32. Blocks
// are 210 bytes, so words are read as two 16-bit halves.
DEV u32 ld_h32(const u8* p) {
  const u16* h = (const u16*)p;
  return (u32)h[0] | ((u32)h[1] << 16);
}

// q6w: one weight row's share of one super-block for thread q: the
// ql words l[n][m&1][t], the qh words h[n][t], the 16 scales and d.
struct Q6W {
  u32 l[2][2][2], h[2][2], s[4];
  u32 d;
};
DEV void q6_ld(const u8* p, int q, Q6W& r) {
#pragma unroll
  for (int n = 0; n < 2; n++)
#pragma unroll
    for (int t = 0; t < 2; t++) {
#pragma unroll
      for (int m1 = 0; m1 < 2; m1++) r.l[n][m1][t] = ld_h32(p + 64 * n + 32 * m1 + 16 * t + 4 * q);
      r.h[n][t] = ld_h32(p + 128 + 32 * n + 16 * t + 4 * q);
    }
#pragma unroll
  for (int i = 0; i < 4; i++) r.s[i] = ld_h32(p + 192 + 4 * i);
  r.d = *(const u16*)(p + 208);
}

// q6_a: the A word of group 8n+2k+t (codes less 32, as signed bytes).
DEV u32 q6_a(const Q6W& r, int n, int k, int t) {
  u32 a = r.l[n][k & 1][t];
  if (k >= 2) a >>= 4;
  a = (a & 0x0F0F0F0Fu) | (((r.h[n][t] >> (2 * k)) & 0x03030303u) << 4);
  return __vsub4(a, 0x20202020u);
}

// q6_sc: scale i of 16 as a float (the signed byte b is 2^23+128+b less
// 2^23+128, as in q6_q8_term).
DEV float q6_sc(const Q6W& r, int i) {
  u32 b = ((r.s[i >> 2] >> (8 * (i & 3))) & 0xFFu) ^ 0x80u;
  return __fadd_rn(__uint_as_float(0x4B000000u | b), -(8388608.0f + 128.0f));
}

template <int NT, bool PF>
DEV void mmq_q6_k_body(const u8* __restrict__ w, const i8* __restrict__ xq, const float* __restrict__ xd,
                       float* __restrict__ y, int rows, int cols, int nx, int row0, int x0) {
  __shared__ float red[8][16][8 * NT][5];  // [warp = residue][weight row][x row][v], padded
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int g = lane >> 2, q = lane & 3;
  int nsb = cols / 256, nbx = cols / 32;
  size_t rb = (size_t)nsb * 210;
  const u8* wa = w + (size_t)min(row0 + g, rows - 1) * rb;
  const u8* wb = w + (size_t)min(row0 + g + 8, rows - 1) * rb;
  const i8* xb[NT];
  const float* xs[NT][2];
#pragma unroll
  for (int t = 0; t < NT; t++) {
    xb[t] = xq + (size_t)min(x0 + 8 * t + g, nx - 1) * cols;
    xs[t][0] = xd + (size_t)min(x0 + 8 * t + 2 * q, nx - 1) * nbx;
    xs[t][1] = xd + (size_t)min(x0 + 8 * t + 2 * q + 1, nx - 1) * nbx;
  }
  float acc[NT][4][4];
#pragma unroll
  for (int t = 0; t < NT; t++)
#pragma unroll
    for (int p = 0; p < 4; p++)
#pragma unroll
      for (int v = 0; v < 4; v++) acc[t][p][v] = 0.0f;

  Q6W na, nb;
  if (PF) {
    q6_ld(wa + (size_t)min(warp, nsb - 1) * 210, q, na);
    q6_ld(wb + (size_t)min(warp, nsb - 1) * 210, q, nb);
  }
  for (int sb = warp; sb < nsb; sb += 8) {
    Q6W ra, rbw;
    if (PF) {
      ra = na;
      rbw = nb;
      if (sb + 8 < nsb) {
        q6_ld(wa + (size_t)(sb + 8) * 210, q, na);
        q6_ld(wb + (size_t)(sb + 8) * 210, q, nb);
      }
    } else {
      q6_ld(wa + (size_t)sb * 210, q, ra);
      q6_ld(wb + (size_t)sb * 210, q, rbw);
    }
    float da = h2f((u16)ra.d), db = h2f((u16)rbw.d);
#pragma unroll
    for (int n = 0; n < 2; n++) {
#pragma unroll
      for (int tt = 0; tt < NT; tt++) {
        int ci[8][4];  // group 8n + 2k + t at [2k + t]
#pragma unroll
        for (int k = 0; k < 4; k++) {
#pragma unroll
          for (int t = 0; t < 2; t++) {
            u32 bx = *(const u32*)(xb[tt] + (size_t)sb * 256 + 128 * n + 32 * k + 16 * t + 4 * q);
            mma_s8(ci[2 * k + t], q6_a(ra, n, k, t), q6_a(rbw, n, k, t), bx);
          }
        }
#pragma unroll
        for (int e = 0; e < 2; e++) {
          float dxk[4];
#pragma unroll
          for (int k = 0; k < 4; k++) dxk[k] = xs[tt][e][sb * 8 + 4 * n + k];
#pragma unroll
          for (int t = 0; t < 2; t++) {
            int v = 2 * n + t;
            float ska[4], skb[4];
            float sa[4], sbb[4];
#pragma unroll
            for (int k = 0; k < 4; k++) {
              ska[k] = q6_sc(ra, 8 * n + 2 * k + t);
              skb[k] = q6_sc(rbw, 8 * n + 2 * k + t);
              sa[k] = i2f(ci[2 * k + t][e]);
              sbb[k] = i2f(ci[2 * k + t][2 + e]);
            }
            acc[tt][e][v] = fadd_x(acc[tt][e][v], q6_q8_floatf(da, ska, dxk, sa));
            acc[tt][2 + e][v] = fadd_x(acc[tt][2 + e][v], q6_q8_floatf(db, skb, dxk, sbb));
          }
        }
      }
    }
  }
#pragma unroll
  for (int t = 0; t < NT; t++)
#pragma unroll
    for (int p = 0; p < 4; p++)
#pragma unroll
      for (int v = 0; v < 4; v++) red[warp][g + 8 * (p >> 1)][8 * t + 2 * q + (p & 1)][v] = acc[t][p][v];
  __syncthreads();
  // warp_sum's order: residues r^4, then r^2, then r^1 (lanes 4r+v), then
  // v^2, v^1
  for (int o = threadIdx.x; o < 16 * 8 * NT; o += blockDim.x) {
    int wr = o & 15, xr = o >> 4;
    float u[4];
#pragma unroll
    for (int v = 0; v < 4; v++)
      u[v] = ((red[0][wr][xr][v] + red[4][wr][xr][v]) + (red[2][wr][xr][v] + red[6][wr][xr][v])) +
             ((red[1][wr][xr][v] + red[5][wr][xr][v]) + (red[3][wr][xr][v] + red[7][wr][xr][v]));
    float s = (u[0] + u[2]) + (u[1] + u[3]);
    if (row0 + wr < rows && x0 + xr < nx) y[(size_t)(x0 + xr) * rows + row0 + wr] = s;
  }
}
#endif  // MMQ_MMA
