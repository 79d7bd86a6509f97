// mvbody.h: the bodies of the one-vector matrix-vector kernels that
// MatMul picks for one row (planMatvec): the generic float ones (mv_block,
// mv_plain), the 8-bit-activation Q4_K and Q6_K ones (mv_q4_k_q8,
// mv_q6_k_q8, with their per-lane super-block terms) and the 32-element
// block ones (mv_b32_q8).
// matvec.cu's kernels and the mixture of experts' per-expert products
// (moe.cu) both include it, so an expert's row comes out bit for bit as
// MatMul computes it.
#pragma once
#include "common.h"
#include "quants.h"
#include "q8terms.h"

// byte_f(w, i): byte i of w as a float offset by 2^23 (subtract 8388608).
#if defined(FORGE_CUDA)
#define BYTE_F(w, i) __uint_as_float(__byte_perm((w), 0x4B000000u, 0x7540u | (i)))
#else
#define BYTE_F(w, i) __uint_as_float((((w) >> (8 * (i))) & 0xFFu) | 0x4B000000u)
#endif

DEV u32 ld2x16(const u8* p) {
  const u16* q = (const u16*)p;
  return (u32)q[0] | ((u32)q[1] << 16);
}

struct Q6Words {
  u32 a[4], b[4], h[4], s01, s23, d;
};
DEV void q6_load(Q6Words& q, const u8* bp, int n, int t) {
  const u8* pa = bp + 64 * n + 16 * t;
  const u8* pb = pa + 32;
  const u8* ph = bp + 128 + 32 * n + 16 * t;
  const u8* ps = bp + 192 + 8 * n;
#pragma unroll
  for (int g = 0; g < 4; g++) {
    q.a[g] = ld2x16(pa + 4 * g);
    q.b[g] = ld2x16(pb + 4 * g);
    q.h[g] = ld2x16(ph + 4 * g);
  }
  q.s01 = ld2x16(ps);
  q.s23 = ld2x16(ps + 4);
  q.d = *(const u16*)(bp + 208);
}

// On AMD the four-way int8 dot product is an instruction where the target
// has one (v_dot4_i32_i8: CDNA and gfx906, RDNA2; v_dot4_i32_iu8 with
// signed operands: RDNA3/4); elsewhere four multiply-adds.
#if defined(FORGE_CUDA)
DEV int dp4a(int a, int b, int c) { return __dp4a(a, b, c); }
#elif defined(__gfx906__) || defined(__gfx908__) || defined(__gfx90a__) || defined(__gfx940__) || \
    defined(__gfx941__) || defined(__gfx942__) || defined(__gfx1030__) || defined(__gfx1031__) ||  \
    defined(__gfx1032__) || defined(__gfx1034__) || defined(__gfx1035__) || defined(__gfx1036__)
DEV int dp4a(int a, int b, int c) { return __builtin_amdgcn_sdot4(a, b, c, false); }
#elif defined(__gfx1100__) || defined(__gfx1101__) || defined(__gfx1102__) || defined(__gfx1103__) || \
    defined(__gfx1150__) || defined(__gfx1151__) || defined(__gfx1200__) || defined(__gfx1201__)
DEV int dp4a(int a, int b, int c) { return __builtin_amdgcn_sudot4(true, a, true, b, c, false); }
#else
DEV int dp4a(int a, int b, int c) {
  return c + (int)(i8)a * (int)(i8)b + (int)(i8)(a >> 8) * (int)(i8)(b >> 8) +
         (int)(i8)(a >> 16) * (int)(i8)(b >> 16) + (int)(i8)(a >> 24) * (int)(i8)(b >> 24);
}
#endif

// ld16w: a 16-byte load of weight data. NC: read-once stream, loaded
// through the non-coherent path without allocating in L1 (CUDA), so the
// weight stream does not push x out of L1; a plain load elsewhere.
template <bool NC>
DEV uint4 ld16w(const u8* p) {
#if defined(FORGE_CUDA)
  if (NC) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
  }
#endif
  return *(const uint4*)p;
}

// q4k_q8_term is one lane's share of one Q4_K super-block (header hd,
// codes q: this lane's 16 bytes) against its 8-bit x (xl, xh with scales
// dx1, dx2). Every Q4_K kernel on 8-bit activations adds exactly this to
// its running sum, one super-block after another in the same order, so a
// row's result does not depend on the kernel (q4k_q8_rows for one vector,
// mv_q4_k_x for several): the batch invariance of MatMul rests on it.
//   = d·sc·(dx·Σ q·qx) − dmin·m·(dx·Σ qx) over the lane's two sub-blocks
DEV float q4k_q8_term(uint4 hd, uint4 q, uint4 xl, uint4 xh, float dx1, float dx2, int p0, int sh) {
  const int ones = 0x01010101;
  int sxl = dp4a(ones, xl.x, dp4a(ones, xl.y, dp4a(ones, xl.z, dp4a(ones, xl.w, 0))));
  int sxh = dp4a(ones, xh.x, dp4a(ones, xh.y, dp4a(ones, xh.z, dp4a(ones, xh.w, 0))));
  float d = h2f(hd.x & 0xFFFF), dmin = h2f(hd.x >> 16);
  u32 sc1, m1, sc2, m2;
  q4k_scales(hd, p0, sh, sc1, m1, sc2, m2);
  int il = dp4a((int)(q.x & 0x0F0F0F0Fu), (int)xl.x, 0);
  il = dp4a((int)(q.y & 0x0F0F0F0Fu), (int)xl.y, il);
  il = dp4a((int)(q.z & 0x0F0F0F0Fu), (int)xl.z, il);
  il = dp4a((int)(q.w & 0x0F0F0F0Fu), (int)xl.w, il);
  int ih = dp4a((int)((q.x >> 4) & 0x0F0F0F0Fu), (int)xh.x, 0);
  ih = dp4a((int)((q.y >> 4) & 0x0F0F0F0Fu), (int)xh.y, ih);
  ih = dp4a((int)((q.z >> 4) & 0x0F0F0F0Fu), (int)xh.z, ih);
  ih = dp4a((int)((q.w >> 4) & 0x0F0F0F0Fu), (int)xh.w, ih);
  return q4k_q8_float(d, dmin, sc1, m1, sc2, m2, dx1, dx2, il, ih, sxl, sxh);
}

// Q4_K · q8 x, R rows per warp, lanes laid out as in mv_q4_k_fast (lane j
// of eight takes qs[16j…16j+15]: 16 values of sub-block 2c and 16 of 2c+1).
//   y = Σ_sub d·sc·(dx·Σ q·qx) − dmin·m·(dx·Σ qx)
// q4k_q8_rows is one warp's work: the dot products of R rows (wr) with x,
// summed over the warp into acc (every lane gets the sums).
template <int R, int U, bool NC>
DEV void q4k_q8_rows(const u8* const (&wr)[R], const i8* __restrict__ xq, const float* __restrict__ xd, int cols,
                     float (&acc)[R]) {
  int lane = threadIdx.x % warpSize;
  int nsb = cols / 256;
  int step = warpSize / 8;
  int j = lane & 7, c = j >> 1, p0 = 2 * c;
  int xo = 64 * c + 16 * (j & 1);
  int sh = 8 * (p0 & 3);
#pragma unroll
  for (int r = 0; r < R; r++) acc[r] = 0.0f;
  {
    for (int sb0 = lane >> 3; sb0 < nsb; sb0 += U * step) {
      // every load of the U super-blocks is issued before any arithmetic
      uint4 hdv[U][R], qv[U][R], xlv[U], xhv[U];
  #pragma unroll
      for (int u = 0; u < U; u++) {
        int sb = min(sb0 + u * step, nsb - 1);
  #pragma unroll
        for (int r = 0; r < R; r++) {
          const u8* bp = wr[r] + (size_t)sb * 144;
          hdv[u][r] = ld16w<NC>(bp);
          qv[u][r] = ld16w<NC>(bp + 16 + 16 * j);
        }
        xlv[u] = *(const uint4*)(xq + (size_t)sb * 256 + xo);
        xhv[u] = *(const uint4*)(xq + (size_t)sb * 256 + xo + 32);
      }
  #pragma unroll
      for (int u = 0; u < U; u++) {
        int sb = sb0 + u * step;
        if (sb >= nsb) break;
        uint4 xl = xlv[u], xh = xhv[u];
        float dx1 = xd[sb * 8 + p0], dx2 = xd[sb * 8 + p0 + 1];
  #pragma unroll
        for (int r = 0; r < R; r++) acc[r] += q4k_q8_term(hdv[u][r], qv[u][r], xl, xh, dx1, dx2, p0, sh);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; r++) acc[r] = warp_sum(acc[r]);
}

template <int R, int U, bool NC>
static __device__ void mv_q4_k_q8(const u8* __restrict__ w, const i8* __restrict__ xq, const float* __restrict__ xd,
                                  float* __restrict__ y, int rows, int cols) {
  int lane = threadIdx.x % warpSize;
  size_t rb = (size_t)(cols / 256) * 144;
  // grid-stride over groups of R rows: the launcher may size the grid to
  // one resident wave (no partial last wave)
  for (int row0 = (blockIdx.x * (blockDim.x / warpSize) + threadIdx.x / warpSize) * R; row0 < rows;
       row0 += gridDim.x * (blockDim.x / warpSize) * R) {
    const u8* wr[R];
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) wr[r] = w + (size_t)min(row0 + r, rows - 1) * rb;
    q4k_q8_rows<R, U, NC>(wr, xq, xd, cols, acc);
#pragma unroll
    for (int r = 0; r < R; r++)
      if (lane == 0 && row0 + r < rows) y[row0 + r] = acc[r];
  }
}

// q6_q8_term is one lane's share of one Q6_K super-block (its words of the
// low bits a, b, high bits h, scales s01, s23 and the block scale d)
// against its 8-bit x (xv with scales dxk and code sums sx). Every Q6_K
// kernel on 8-bit activations adds exactly this, super-block after
// super-block in the same order, so a row's result does not depend on the
// kernel (see q4k_q8_term).
DEV float q6_q8_term(const u32* a, const u32* b, const u32* h, u32 s01, u32 s23, float d, int t, const uint4* xv,
                     const float* dxk, const int* sx) {
  const float SB = 8388608.0f + 128.0f;
  float sck[4];
  sck[0] = BYTE_F(s01 ^ 0x80808080u, 0 + t) - SB;
  sck[1] = BYTE_F(s01 ^ 0x80808080u, 2 + t) - SB;
  sck[2] = BYTE_F(s23 ^ 0x80808080u, 0 + t) - SB;
  sck[3] = BYTE_F(s23 ^ 0x80808080u, 2 + t) - SB;
  int ik[4] = {0, 0, 0, 0};
#pragma unroll
  for (int g = 0; g < 4; g++) {
    u32 wa = a[g], wb = b[g], wh = h[g];
    u32 xg0 = g == 0 ? xv[0].x : g == 1 ? xv[0].y : g == 2 ? xv[0].z : xv[0].w;
    u32 xg1 = g == 0 ? xv[1].x : g == 1 ? xv[1].y : g == 2 ? xv[1].z : xv[1].w;
    u32 xg2 = g == 0 ? xv[2].x : g == 1 ? xv[2].y : g == 2 ? xv[2].z : xv[2].w;
    u32 xg3 = g == 0 ? xv[3].x : g == 1 ? xv[3].y : g == 2 ? xv[3].z : xv[3].w;
    ik[0] = dp4a((int)((wa & 0x0F0F0F0Fu) | ((wh << 4) & 0x30303030u)), (int)xg0, ik[0]);
    ik[1] = dp4a((int)((wb & 0x0F0F0F0Fu) | ((wh << 2) & 0x30303030u)), (int)xg1, ik[1]);
    ik[2] = dp4a((int)(((wa >> 4) & 0x0F0F0F0Fu) | (wh & 0x30303030u)), (int)xg2, ik[2]);
    ik[3] = dp4a((int)(((wb >> 4) & 0x0F0F0F0Fu) | ((wh >> 2) & 0x30303030u)), (int)xg3, ik[3]);
  }
  int sk[4];
#pragma unroll
  for (int k = 0; k < 4; k++) sk[k] = ik[k] - 32 * sx[k];
  return q6_q8_float(d, sck, dxk, sk);
}

// q6_q8_x loads one lane's 8-bit x of super-block sb (see mv_q6_k_q8).
DEV void q6_q8_x(const i8* __restrict__ xq, const float* __restrict__ xd, int sb, int n, int t, uint4* xv,
                 float* dxk, int* sx) {
  const i8* xb = xq + (size_t)sb * 256 + 128 * n + 16 * t;
  const int ones = 0x01010101;
#pragma unroll
  for (int k = 0; k < 4; k++) {
    xv[k] = *(const uint4*)(xb + 32 * k);
    dxk[k] = xd[sb * 8 + 4 * n + k];
    sx[k] = dp4a(ones, xv[k].x, dp4a(ones, xv[k].y, dp4a(ones, xv[k].z, dp4a(ones, xv[k].w, 0))));
  }
}

// Q6_K · q8 x, R rows per warp, lanes as in mv_q6_k_fast (lane 2n+t of
// four takes elements 128n + 32k + 16t + i). Codes are q − 32:
//   Σ (q−32)·qx = Σ q·qx − 32·Σ qx
template <int R, int U>
static __device__ void mv_q6_k_q8(const u8* __restrict__ w, const i8* __restrict__ xq, const float* __restrict__ xd,
                                  float* __restrict__ y, int rows, int cols) {
  int lane = threadIdx.x % warpSize;
  // grid-stride over groups of R rows: the launcher may size the grid to
  // one resident wave (no partial last wave)
  for (int row0 = (blockIdx.x * (blockDim.x / warpSize) + threadIdx.x / warpSize) * R; row0 < rows;
       row0 += gridDim.x * (blockDim.x / warpSize) * R) {
    int nsb = cols / 256;
    int step = warpSize / 4;
    size_t rb = (size_t)nsb * 210;
    int t4 = lane & 3, n = t4 >> 1, t = t4 & 1;
    float acc[R];
    const u8* wr[R];
  #pragma unroll
    for (int r = 0; r < R; r++) {
      acc[r] = 0.0f;
      wr[r] = w + (size_t)min(row0 + r, rows - 1) * rb;
    }
    for (int sb0 = lane >> 2; sb0 < nsb; sb0 += U * step) {
      Q6Words cur[U][R];
  #pragma unroll
      for (int u = 0; u < U; u++) {
        int sb = min(sb0 + u * step, nsb - 1);
  #pragma unroll
        for (int r = 0; r < R; r++) q6_load(cur[u][r], wr[r] + (size_t)sb * 210, n, t);
      }
  #pragma unroll
      for (int u = 0; u < U; u++) {
        int sb = sb0 + u * step;
        if (sb >= nsb) break;
        const i8* xb = xq + (size_t)sb * 256 + 128 * n + 16 * t;
        uint4 xv[4];
        float dxk[4];
        int sx[4];
        const int ones = 0x01010101;
  #pragma unroll
        for (int k = 0; k < 4; k++) {
          xv[k] = *(const uint4*)(xb + 32 * k);
          dxk[k] = xd[sb * 8 + 4 * n + k];
          sx[k] = dp4a(ones, xv[k].x, dp4a(ones, xv[k].y, dp4a(ones, xv[k].z, dp4a(ones, xv[k].w, 0))));
        }
  #pragma unroll
        for (int r = 0; r < R; r++) {
          const Q6Words& q = cur[u][r];
          acc[r] += q6_q8_term(q.a, q.b, q.h, q.s01, q.s23, h2f((u16)q.d), t, xv, dxk, sx);
        }
      }
    }
  #pragma unroll
    for (int r = 0; r < R; r++) {
      float s = warp_sum(acc[r]);
      if (lane == 0 && row0 + r < rows) y[row0 + r] = s;
    }
  }
}

#define MV_MAXNX 8

template <class T>
static __device__ void mv_block(const u8* __restrict__ w, const float* __restrict__ x, float* __restrict__ y,
                                int rows, int cols, int nx) {
  int lane = threadIdx.x % warpSize;
  int row = blockIdx.x * (blockDim.x / warpSize) + threadIdx.x / warpSize;
  if (row >= rows) return;
  const u8* wr = w + (size_t)row * (size_t)(cols / T::BS) * T::BB;
  int nparts = cols / T::PE;
  float acc[MV_MAXNX];
#pragma unroll
  for (int j = 0; j < MV_MAXNX; j++) acc[j] = 0.0f;
  for (int p = lane; p < nparts; p += warpSize) {
    float v[T::PE];
    T::deq(wr + (size_t)(p / T::PARTS) * T::BB, p % T::PARTS, v);
    const float* xp = x + (size_t)p * T::PE;
#pragma unroll
    for (int j = 0; j < MV_MAXNX; j++) {
      if (j < nx) {
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < T::PE; i++) s = fmaf(v[i], xp[(size_t)j * cols + i], s);
        acc[j] += s;
      }
    }
  }
#pragma unroll
  for (int j = 0; j < MV_MAXNX; j++) {
    if (j < nx) {
      float s = warp_sum(acc[j]);
      if (lane == 0) y[(size_t)j * rows + row] = s;
    }
  }
}

// mv_run adds the products of U columns of one row, c, c+warpSize, …, of
// w (row wr) and x into a: every load first, then the multiply-adds in
// column order (mv_plain's rounds, whatever U).
template <class T, int U>
DEV float mv_run(const u8* __restrict__ wr, const float* __restrict__ x, int c, float a) {
  float v[U], xv[U];
#pragma unroll
  for (int u = 0; u < U; u++) {
    v[u] = T::get(wr, c + u * warpSize);
    xv[u] = x[c + u * warpSize];
  }
#pragma unroll
  for (int u = 0; u < U; u++) a = fmaf(v[u], xv[u], a);
  return a;
}

// wide (one row of x): 32 columns a lane in flight before eight, in the
// same column order (the same bits; a 2048-wide row in two round trips to
// memory instead of eight).
template <class T>
static __device__ void mv_plain(const u8* __restrict__ w, const float* __restrict__ x, float* __restrict__ y,
                                int rows, int cols, int nx, bool wide = false) {
  int lane = threadIdx.x % warpSize;
  int row = blockIdx.x * (blockDim.x / warpSize) + threadIdx.x / warpSize;
  if (row >= rows) return;
  const u8* wr = w + (size_t)row * cols * T::ES;
  if (nx == 1) {
    // One row of x (a decode step's router, a few rows of weight): eight
    // columns per lane loaded before their multiply-adds, which run in
    // the column order of the loop below, so the sum has the same bits.
    // The loop below, whose loads wait behind its per-row branches, kept
    // a 1 MB router at ~40 GB/s.
    float a = 0.0f;
    int c = lane;
    for (; wide && c + 31 * warpSize < cols; c += 32 * warpSize) a = mv_run<T, 32>(wr, x, c, a);
    for (; c + 7 * warpSize < cols; c += 8 * warpSize) a = mv_run<T, 8>(wr, x, c, a);
    for (; c < cols; c += warpSize) a = fmaf(T::get(wr, c), x[c], a);
    float s = warp_sum(a);
    if (lane == 0) y[row] = s;
    return;
  }
  float acc[MV_MAXNX];
#pragma unroll
  for (int j = 0; j < MV_MAXNX; j++) acc[j] = 0.0f;
  // Several rows of x (a prompt's router): eight columns per lane loaded
  // before their multiply-adds, each row's in the column order of the
  // loop below (the same bits). One column a step kept a 32×2880 router
  // at ~86 µs for 8 rows, its loads one round trip each.
  int c = lane;
  for (; c + 7 * warpSize < cols; c += 8 * warpSize) {
    float v[8];
#pragma unroll
    for (int u = 0; u < 8; u++) v[u] = T::get(wr, c + u * warpSize);
#pragma unroll
    for (int j = 0; j < MV_MAXNX; j++) {
      if (j < nx) {
        const float* xj = x + (size_t)j * cols + c;
        float xv[8];
#pragma unroll
        for (int u = 0; u < 8; u++) xv[u] = xj[u * warpSize];
#pragma unroll
        for (int u = 0; u < 8; u++) acc[j] = fmaf(v[u], xv[u], acc[j]);
      }
    }
  }
  for (; c < cols; c += warpSize) {
    float v = T::get(wr, c);
#pragma unroll
    for (int j = 0; j < MV_MAXNX; j++)
      if (j < nx) acc[j] = fmaf(v, x[(size_t)j * cols + c], acc[j]);
  }
#pragma unroll
  for (int j = 0; j < MV_MAXNX; j++) {
    if (j < nx) {
      float s = warp_sum(acc[j]);
      if (lane == 0) y[(size_t)j * rows + row] = s;
    }
  }
}

// fshr: the 32 bits of hi:lo starting at bit s (s < 32).
DEV u32 fshr(u32 lo, u32 hi, u32 s) {
#if defined(FORGE_CUDA)
  return __funnelshift_r(lo, hi, s);
#else
  return (u32)((((u64)hi << 32) | (u64)lo) >> s);
#endif
}

// sh_words: N little-endian words starting s/8 bytes after the 4-byte
// aligned shared address pal.
template <int N>
DEV void sh_words(const u8* pal, u32 s, u32* out) {
  const u32* q = (const u32*)pal;
  u32 v[N + 1];
#pragma unroll
  for (int i = 0; i <= N; i++) v[i] = q[i];
#pragma unroll
  for (int i = 0; i < N; i++) out[i] = fshr(v[i], v[i + 1], s);
}


// ---- 32-element blocks on 8-bit activations ---------------------------------
//
// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (token_embd/output in many models): one lane
// per block, x quantized to int8 blocks of 32 (the same blocks as the
// weight's), dp4a for the products. Blocks are 18…34 bytes, only 2-byte
// aligned, so as for Q6_K each warp copies a run of warpSize whole blocks
// per row (warpSize·BB bytes, a multiple of 16) into shared memory with
// 16-byte loads, the next run in flight during this one's arithmetic, and
// lanes read their block back as 4-byte words.
//   block 128 threads; needs rows 16-byte aligned, (cols/32) % warpSize == 0
//
// dot(st, o, xl, xh, sx, dx): the block at byte o of the run st against x
// codes xl (elements 0..15), xh (16..31) with Σ codes sx and scale dx.

// sh_field: N words of the field at even byte offset o of the 16-byte
// aligned shared run st.
template <int N>
DEV void sh_field(const u8* st, int o, u32* out) {
  int off = o & 3;
  sh_words<N>(st + (o - off), 8u * (u32)off, out);
}

// nib_dot: Σ lo-nibble·xl + hi-nibble·xh over 16 bytes q[4] of nibbles,
// with bit 4 of each code from hl/hh (0x10 per byte) when Q5.
DEV int nib_dot(const u32* q, uint4 xl, uint4 xh, const u32* hl, const u32* hh) {
  const u32 M = 0x0F0F0F0Fu;
  int s = dp4a((int)((q[0] & M) | hl[0]), (int)xl.x, 0);
  s = dp4a((int)((q[1] & M) | hl[1]), (int)xl.y, s);
  s = dp4a((int)((q[2] & M) | hl[2]), (int)xl.z, s);
  s = dp4a((int)((q[3] & M) | hl[3]), (int)xl.w, s);
  s = dp4a((int)(((q[0] >> 4) & M) | hh[0]), (int)xh.x, s);
  s = dp4a((int)(((q[1] >> 4) & M) | hh[1]), (int)xh.y, s);
  s = dp4a((int)(((q[2] >> 4) & M) | hh[2]), (int)xh.z, s);
  s = dp4a((int)(((q[3] >> 4) & M) | hh[3]), (int)xh.w, s);
  return s;
}

// bits5: 0x10 in byte i of word g where bit 4g+i of qh is set (the fifth
// bit of Q5 codes 4g..4g+3): the multiply spreads four bits a byte apart.
DEV void bits5(u32 qh, u32* hl, u32* hh) {
#pragma unroll
  for (int g = 0; g < 4; g++) {
    hl[g] = ((((qh >> (4 * g)) & 15u) * 0x00204081u) & 0x01010101u) << 4;
    hh[g] = ((((qh >> (16 + 4 * g)) & 15u) * 0x00204081u) & 0x01010101u) << 4;
  }
}

struct B8Q4_0 {  // Σ (q−8)·x
  static constexpr int BB = 18;
  static DEVM float dot(const u8* st, int o, uint4 xl, uint4 xh, int sx, float dx) {
    float d = h2f(*(const u16*)(st + o));
    u32 q[4];
    sh_field<4>(st, o + 2, q);
    const u32 z[4] = {0, 0, 0, 0};
    return d * dx * (float)(nib_dot(q, xl, xh, z, z) - 8 * sx);
  }
};
struct B8Q4_1 {  // Σ (q·d + m)·x
  static constexpr int BB = 20;
  static DEVM float dot(const u8* st, int o, uint4 xl, uint4 xh, int sx, float dx) {
    float d = h2f(*(const u16*)(st + o)), m = h2f(*(const u16*)(st + o + 2));
    u32 q[4];
    sh_field<4>(st, o + 4, q);
    const u32 z[4] = {0, 0, 0, 0};
    return dx * (d * (float)nib_dot(q, xl, xh, z, z) + m * (float)sx);
  }
};
struct B8Q5_0 {  // Σ (q−16)·x
  static constexpr int BB = 22;
  static DEVM float dot(const u8* st, int o, uint4 xl, uint4 xh, int sx, float dx) {
    float d = h2f(*(const u16*)(st + o));
    u32 qh[1], q[4], hl[4], hh[4];
    sh_field<1>(st, o + 2, qh);
    sh_field<4>(st, o + 6, q);
    bits5(qh[0], hl, hh);
    return d * dx * (float)(nib_dot(q, xl, xh, hl, hh) - 16 * sx);
  }
};
struct B8Q5_1 {  // Σ (q·d + m)·x
  static constexpr int BB = 24;
  static DEVM float dot(const u8* st, int o, uint4 xl, uint4 xh, int sx, float dx) {
    float d = h2f(*(const u16*)(st + o)), m = h2f(*(const u16*)(st + o + 2));
    u32 qh[1], q[4], hl[4], hh[4];
    sh_field<1>(st, o + 4, qh);
    sh_field<4>(st, o + 8, q);
    bits5(qh[0], hl, hh);
    return dx * (d * (float)nib_dot(q, xl, xh, hl, hh) + m * (float)sx);
  }
};
struct B8Q8_0 {  // Σ q·x
  static constexpr int BB = 34;
  static DEVM float dot(const u8* st, int o, uint4 xl, uint4 xh, int, float dx) {
    float d = h2f(*(const u16*)(st + o));
    u32 q[8];
    sh_field<8>(st, o + 2, q);
    int s = dp4a((int)q[0], (int)xl.x, 0);
    s = dp4a((int)q[1], (int)xl.y, s);
    s = dp4a((int)q[2], (int)xl.z, s);
    s = dp4a((int)q[3], (int)xl.w, s);
    s = dp4a((int)q[4], (int)xh.x, s);
    s = dp4a((int)q[5], (int)xh.y, s);
    s = dp4a((int)q[6], (int)xh.z, s);
    s = dp4a((int)q[7], (int)xh.w, s);
    return d * dx * (float)s;
  }
};

template <class B, int R>
static __device__ void mv_b32_q8(const u8* __restrict__ w, const i8* __restrict__ xq, const float* __restrict__ xd,
                                 float* __restrict__ y, int rows, int cols) {
  __shared__ __attribute__((aligned(16))) u8 stage[R * 128 * B::BB + 16];
  int lane = threadIdx.x % warpSize, warp = threadIdx.x / warpSize;
  int run = warpSize * B::BB;   // bytes of one run: warpSize blocks
  int n16 = run / 16;           // ≤ 3 per lane (BB ≤ 48)
  u8* st = stage + warp * R * run;
  int nb = cols / 32;
  size_t rb = (size_t)nb * B::BB;
  for (int row0 = (blockIdx.x * (blockDim.x / warpSize) + warp) * R; row0 < rows;
       row0 += gridDim.x * (blockDim.x / warpSize) * R) {
    float acc[R];
    const u8* wr[R];
    uint4 buf[R][3];
#pragma unroll
    for (int r = 0; r < R; r++) {
      acc[r] = 0.0f;
      wr[r] = w + (size_t)min(row0 + r, rows - 1) * rb;
#pragma unroll
      for (int m = 0; m < 3; m++) {
        int i = lane + m * warpSize;
        if (i < n16) buf[r][m] = ld16w<true>(wr[r] + 16 * (size_t)i);
      }
    }
    for (int b0 = 0; b0 < nb; b0 += warpSize) {
      WARP_SYNC();  // every lane is done reading the previous run
#pragma unroll
      for (int r = 0; r < R; r++) {
        uint4* dst = (uint4*)(st + r * run);
#pragma unroll
        for (int m = 0; m < 3; m++) {
          int i = lane + m * warpSize;
          if (i < n16) dst[i] = buf[r][m];
        }
      }
      if (b0 + warpSize < nb) {  // next run in flight during this one's arithmetic
#pragma unroll
        for (int r = 0; r < R; r++) {
          const u8* src = wr[r] + (size_t)(b0 + warpSize) * B::BB;
#pragma unroll
          for (int m = 0; m < 3; m++) {
            int i = lane + m * warpSize;
            if (i < n16) buf[r][m] = ld16w<true>(src + 16 * (size_t)i);
          }
        }
      }
      WARP_SYNC();
      int bi = b0 + lane;
      uint4 xl = *(const uint4*)(xq + (size_t)bi * 32), xh = *(const uint4*)(xq + (size_t)bi * 32 + 16);
      float dx = xd[bi];
      const int ones = 0x01010101;
      int sx = dp4a(ones, xl.x, dp4a(ones, xl.y, dp4a(ones, xl.z, dp4a(ones, xl.w, 0))));
      sx = dp4a(ones, xh.x, dp4a(ones, xh.y, dp4a(ones, xh.z, dp4a(ones, xh.w, sx))));
#pragma unroll
      for (int r = 0; r < R; r++) acc[r] += B::dot(st + r * run, lane * B::BB, xl, xh, sx, dx);
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
      float s = warp_sum(acc[r]);
      if (lane == 0 && row0 + r < rows) y[row0 + r] = s;
    }
  }
}

