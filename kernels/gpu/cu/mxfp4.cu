// mxfp4.cu: matrix-vector products on 8-bit activations that stage rows
// of any whole number of 32-element blocks at any byte alignment through
// shared memory: MXFP4 (gpt-oss's experts) and, for the rows mvbody.h's
// mv_b32_q8 cannot take, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (gpt-oss's Q8_0
// output head and Q5_0 attention, rows of 90 blocks). One body (st_rows)
// over the block type (SMXFP4, S32Q4, S32Q5, S32Q8_0: see there); the
// 32-element types' kernels are at the end of the file.
//
//   mv_mxfp4_m{R}{U}   y [rows] = x · wᵀ, one x, R weight rows per warp,
//                      rows staged U runs at a time
//   mv_mxfp4_x8        y [nx][rows] = x [nx][cols] · wᵀ, nx ≤ 8 (a
//                      batched decode step), each row of x getting the
//                      bits the one-x kernels give it alone
//   moe_mv_mxfp4_{R}{U} the chosen experts' products by id (moe.cu's
//                      calling convention), each row the bits of the
//                      one-x kernels
//
// x is quantize_q8's copy: int8 codes, one float scale per 32 values. An
// MXFP4 block is 17 bytes: an E8M0 exponent e, then 16 bytes of E2M1
// codes, byte j holding element j (low nibble) and element j+16 (high).
// quants.h's kvalues_mxfp4 are the E2M1 values doubled, which are small
// integers (0…12 and their negatives), so a block's sum is an integer dot
// product of those against the x codes, times e8m0_half(e)·dx:
//   y += 2^(e−128)·dx · Σ_i kv[code_i]·qx_i
//
// Loads. Blocks of 17 bytes put rows (and runs of blocks) at any byte
// alignment: a row of gpt-oss (90 blocks, 1530 bytes) is only 2-byte
// aligned, and an odd number of blocks leaves rows at odd addresses. Each
// warp copies a run of up to warpSize whole blocks of a row into shared
// memory with 16-byte loads of the aligned chunks that cover it (the first
// and last chunk may hold bytes of the neighbouring data: a chunk is read
// only where it holds a byte of the run, so no load leaves a page the run
// is on), U runs at a time, the next U in flight during these ones'
// arithmetic; lane l then takes block l of each run, reading it back as
// 4-byte words. Rows of any number of blocks: the last run of a row is
// short, its idle lanes add nothing.
//
// Decoding. Four 4-bit codes become four int8 values with byte permutes:
// the codes, four nibbles of a word, select bytes of the table's first
// half (codes 0…7) and of its second half (8…15), and a third permute
// keeps the second where bit 3 of the code is set. The nibbles of a
// word's low half are elements j, j+16, j+1, j+17 (low and high nibble of
// two bytes), so x's codes are permuted into that order to match
// (mxfp4_x: once per block, shared by the R rows). Every kernel here adds
// exactly mxfp4_term to a lane's running sum, block after block in the
// same order, and reduces the warp with warp_sum: a row's result does not
// depend on the kernel, which is what MatMul's batch invariance and the
// experts' bit-for-bit equality with MatMul rest on.
#include "common.h"
#include "quants.h"
#include "mvbody.h"

// perm8: bytes of the eight-byte hi:lo picked by the low three bits of the
// four selector nibbles in the low 16 bits of s (byte i of the result by
// nibble i), as CUDA's __byte_perm defines it.
DEV u32 perm8(u32 lo, u32 hi, u32 s) {
#if defined(FORGE_CUDA)
  return __byte_perm(lo, hi, s);
#else
  u64 v = ((u64)hi << 32) | (u64)lo;
  u32 r = 0;
#pragma unroll
  for (int i = 0; i < 4; i++) r |= (u32)((v >> (8 * ((s >> (4 * i)) & 7u))) & 0xFFu) << (8 * i);
  return r;
#endif
}

// kvalues_mxfp4 as int8 bytes: codes 0…7, then 8…15 (their negatives).
#define MX_T0 0x03020100u  // 0, 1, 2, 3
#define MX_T1 0x0C080604u  // 4, 6, 8, 12
#define MX_T2 0xFDFEFF00u  // 0, −1, −2, −3
#define MX_T3 0xF4F8FAFCu  // −4, −6, −8, −12

// mx_lut: the int8 values of the four codes in the low 16 bits of s; sel
// is 0x3210 with 4 added to each nibble whose code has bit 3 set.
DEV u32 mx_lut(u32 s, u32 sel) { return perm8(perm8(MX_T0, MX_T1, s), perm8(MX_T2, MX_T3, s), sel); }

// mxfp4_x: a block's x codes (xl: elements 0…15, xh: 16…31) in the order
// of the codes' nibbles: word 2k holds elements 4k, 4k+16, 4k+1, 4k+17,
// word 2k+1 elements 4k+2, 4k+18, 4k+3, 4k+19.
DEV void mxfp4_x(uint4 xl, uint4 xh, u32* xp) {
  const u32 l[4] = {xl.x, xl.y, xl.z, xl.w}, h[4] = {xh.x, xh.y, xh.z, xh.w};
#pragma unroll
  for (int k = 0; k < 4; k++) {
    xp[2 * k] = perm8(l[k], h[k], 0x5140u);
    xp[2 * k + 1] = perm8(l[k], h[k], 0x7362u);
  }
}

// mxfp4_term adds one block (exponent e, code bytes q[4]) against its x
// (xp from mxfp4_x, scale dx) to acc: the one term every kernel here adds.
DEV float mxfp4_term(float acc, u32 e, const u32* q, const u32* xp, float dx) {
  int s = 0;
#pragma unroll
  for (int k = 0; k < 4; k++) {
    u32 sel = ((q[k] >> 1) & 0x44444444u) | 0x32103210u;
    s = dp4a((int)mx_lut(q[k], sel), (int)xp[2 * k], s);
    s = dp4a((int)mx_lut(q[k] >> 16, sel >> 16), (int)xp[2 * k + 1], s);
  }
  return fmaf(e8m0_half(e) * dx, (float)s, acc);
}

// MX_SLICE(BB, U): shared bytes per warp and staged row (a group of U
// runs of warpSize blocks of BB bytes, plus the lead of its first chunk
// and the last word's overhang); MX_STAGE(BB, R, U): a block of 128
// threads' stage for R rows per warp (at most 128/32 warps).
#define MX_SLICE(BB, U) ((U) * warpSize * (BB) + 32)
#define MX_STAGE(BB, R, U) ((R) * ((U) * 128 * (BB) + 128))

// MxRun is one staged row's group of U runs of blocks of BB bytes: the
// chunks in flight (buf), how many, and where the group starts in its
// first chunk (lead). The chunks of U·warpSize blocks number at most
// ⌈(30 + BB·U·warpSize)/16⌉; per lane (warpSize ≥ 32) that is at most
// BB·U/16 + 1 loads (the fraction of BB·U/16 is at most 15/16, the lead's
// share at most 30/512).
template <int BB, int U>
struct MxRun {
  uint4 buf[BB * U / 16 + 1];
  int n, lead;
};

// mx_fetch issues the loads of blocks b0… (at most U·warpSize, nb in all)
// of the row at wr: the aligned 16-byte chunks that cover them.
template <int BB, int U>
DEV void mx_fetch(MxRun<BB, U>& m, const u8* wr, int b0, int nb, int lane) {
  const u8* p = wr + (size_t)b0 * BB;
  m.lead = (int)((size_t)p & 15);
  const u8* a = p - m.lead;
  m.n = (m.lead + BB * min(U * (int)warpSize, nb - b0) + 15) >> 4;
#pragma unroll
  for (int i = 0; i < BB * U / 16 + 1; i++) {
    int c = lane + i * warpSize;
    if (c < m.n) m.buf[i] = ld16w<true>(a + 16 * (size_t)c);
  }
}

// mx_store puts the fetched chunks at st (16-byte aligned).
template <int BB, int U>
DEV void mx_store(const MxRun<BB, U>& m, u8* st, int lane) {
#pragma unroll
  for (int i = 0; i < BB * U / 16 + 1; i++) {
    int c = lane + i * warpSize;
    if (c < m.n) ((uint4*)st)[c] = m.buf[i];
  }
}

// mx_block reads the block at byte o of a staged run: exponent and codes.
DEV u32 mx_block(const u8* st, int o, u32* q) {
  sh_words<4>(st + ((o + 1) & ~3), 8u * (u32)((o + 1) & 3), q);
  return st[o];
}

// The block types of the staged kernels. Each names its bytes per block
// (BB), a block of weight read back from the stage (W, w: at any byte o),
// a block of 8-bit x prepared for it (X, x: once per block and row of x,
// shared by the R weight rows) and term, the one addition every kernel
// here makes per block: acc and the block's contribution.
//
// SMXFP4: mxfp4_term on the x codes in nibble order (mxfp4_x).
struct SMXFP4 {
  static constexpr int BB = 17;
  struct W {
    u32 e, q[4];
  };
  struct X {
    u32 xp[8];
  };
  static DEVM void w(const u8* st, int o, W& b) { b.e = mx_block(st, o, b.q); }
  static DEVM void x(const i8* xb, X& v) { mxfp4_x(*(const uint4*)xb, *(const uint4*)(xb + 16), v.xp); }
  static DEVM float term(float acc, const W& b, const X& v, float dx) { return mxfp4_term(acc, b.e, b.q, v.xp, dx); }
};

// The 32-element block types of mvbody.h (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0),
// for the rows mv_b32_q8 cannot take (b32Fits: not whole runs of warpSize
// blocks, or not 16-byte aligned; gpt-oss's Q8_0 output and Q5_0
// attention rows of 90 blocks). Their fields are read as words at any
// byte offset (sh_at), their codes summed with mvbody.h's nib_dot and
// bits5: acc + d·dx·Σ(q − z)·qx (Q4_0, Q5_0, Q8_0: z = 8, 16, 0) or
// acc + dx·(d·Σ q·qx + m·Σ qx) (Q4_1, Q5_1).

// sh_at: N little-endian words starting at byte o (any) of a staged run.
template <int N>
DEV void sh_at(const u8* st, int o, u32* out) {
  sh_words<N>(st + (o & ~3), 8u * (u32)(o & 3), out);
}

// SX8: a block of x codes (xl: elements 0…15, xh: 16…31) and their sum.
struct SX8 {
  uint4 xl, xh;
  int sx;
};
DEV void sx8_load(const i8* xb, SX8& v) {
  const int ones = 0x01010101;
  v.xl = *(const uint4*)xb;
  v.xh = *(const uint4*)(xb + 16);
  int s = dp4a(ones, v.xl.x, dp4a(ones, v.xl.y, dp4a(ones, v.xl.z, dp4a(ones, v.xl.w, 0))));
  v.sx = dp4a(ones, v.xh.x, dp4a(ones, v.xh.y, dp4a(ones, v.xh.z, dp4a(ones, v.xh.w, s))));
}

// S32Q4 (Q4_0: HM false, Q4_1: HM true: a second f16, the minimum) and
// S32Q5 (Q5_0, Q5_1: the fifth bits qh before the nibbles).
template <bool HM>
struct S32Q4 {
  static constexpr int BB = HM ? 20 : 18;
  struct W {
    u32 h, q[4];
  };
  typedef SX8 X;
  static DEVM void w(const u8* st, int o, W& b) {
    sh_at<1>(st, o, &b.h);
    sh_at<4>(st, o + (HM ? 4 : 2), b.q);
  }
  static DEVM void x(const i8* xb, X& v) { sx8_load(xb, v); }
  static DEVM float term(float acc, const W& b, const X& v, float dx) {
    const u32 z[4] = {0, 0, 0, 0};
    float d = h2f((u16)(b.h & 0xFFFFu));
    int s = nib_dot(b.q, v.xl, v.xh, z, z);
    if (HM) return acc + dx * (d * (float)s + h2f((u16)(b.h >> 16)) * (float)v.sx);
    return acc + d * dx * (float)(s - 8 * v.sx);
  }
};
template <bool HM>
struct S32Q5 {
  static constexpr int BB = HM ? 24 : 22;
  struct W {
    u32 h, qh, q[4];
  };
  typedef SX8 X;
  static DEVM void w(const u8* st, int o, W& b) {
    sh_at<1>(st, o, &b.h);
    sh_at<1>(st, o + (HM ? 4 : 2), &b.qh);
    sh_at<4>(st, o + (HM ? 8 : 6), b.q);
  }
  static DEVM void x(const i8* xb, X& v) { sx8_load(xb, v); }
  static DEVM float term(float acc, const W& b, const X& v, float dx) {
    u32 hl[4], hh[4];
    bits5(b.qh, hl, hh);
    float d = h2f((u16)(b.h & 0xFFFFu));
    int s = nib_dot(b.q, v.xl, v.xh, hl, hh);
    if (HM) return acc + dx * (d * (float)s + h2f((u16)(b.h >> 16)) * (float)v.sx);
    return acc + d * dx * (float)(s - 16 * v.sx);
  }
};
struct S32Q8_0 {
  static constexpr int BB = 34;
  struct W {
    u32 h, q[8];
  };
  typedef SX8 X;
  static DEVM void w(const u8* st, int o, W& b) {
    sh_at<1>(st, o, &b.h);
    sh_at<8>(st, o + 2, b.q);
  }
  static DEVM void x(const i8* xb, X& v) { sx8_load(xb, v); }
  static DEVM float term(float acc, const W& b, const X& v, float dx) {
    int s = dp4a((int)b.q[0], (int)v.xl.x, 0);
    s = dp4a((int)b.q[1], (int)v.xl.y, s);
    s = dp4a((int)b.q[2], (int)v.xl.z, s);
    s = dp4a((int)b.q[3], (int)v.xl.w, s);
    s = dp4a((int)b.q[4], (int)v.xh.x, s);
    s = dp4a((int)b.q[5], (int)v.xh.y, s);
    s = dp4a((int)b.q[6], (int)v.xh.z, s);
    s = dp4a((int)b.q[7], (int)v.xh.w, s);
    return acc + h2f((u16)(b.h & 0xFFFFu)) * dx * (float)s;
  }
};

// st_rows: one warp's dot products of R rows (wr) of block type B with
// the 8-bit x (xq, xd) of NX activation rows (row v at xq + v·cols, xd +
// v·cols/32; the first nx of them), into acc[r][v], summed over the warp
// (every lane gets the sums). The rows are staged U runs at a time (the
// next U in flight meanwhile); lane l takes blocks l, l + warpSize, l +
// 2·warpSize… whatever U and R, so neither changes a row's arithmetic.
// st: the warp's stage, R slices of MX_SLICE(B::BB, U) bytes.
template <class B, int R, int U, int NX>
DEV void st_rows(const u8* const (&wr)[R], const i8* __restrict__ xq, const float* __restrict__ xd, int cols, int nx,
                 u8* st, float (&acc)[R][NX]) {
  int lane = threadIdx.x % warpSize;
  int nb = cols / 32, gb = U * warpSize;
  MxRun<B::BB, U> run[R];
#pragma unroll
  for (int r = 0; r < R; r++) {
#pragma unroll
    for (int v = 0; v < NX; v++) acc[r][v] = 0.0f;
    mx_fetch<B::BB, U>(run[r], wr[r], 0, nb, lane);
  }
  for (int g0 = 0; g0 < nb; g0 += gb) {
    int lead[R];
    WARP_SYNC();  // every lane is done reading the previous group
#pragma unroll
    for (int r = 0; r < R; r++) {
      mx_store<B::BB, U>(run[r], st + r * MX_SLICE(B::BB, U), lane);
      lead[r] = run[r].lead;
      if (g0 + gb < nb) mx_fetch<B::BB, U>(run[r], wr[r], g0 + gb, nb, lane);  // in flight meanwhile
    }
    WARP_SYNC();
#pragma unroll
    for (int u = 0; u < U; u++) {
      int bi = g0 + u * warpSize + lane;
      if (bi < nb) {
        typename B::W wb[R];
#pragma unroll
        for (int r = 0; r < R; r++) B::w(st + r * MX_SLICE(B::BB, U), lead[r] + B::BB * (u * warpSize + lane), wb[r]);
#pragma unroll
        for (int v = 0; v < NX; v++) {
          if (v < nx) {
            typename B::X xv;
            B::x(xq + (size_t)v * cols + (size_t)bi * 32, xv);
            float dx = xd[(size_t)v * nb + bi];
#pragma unroll
            for (int r = 0; r < R; r++) acc[r][v] = B::term(acc[r][v], wb[r], xv, dx);
          }
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; r++) {
#pragma unroll
    for (int v = 0; v < NX; v++)
      if (v < nx) acc[r][v] = warp_sum(acc[r][v]);
  }
}

// st_mv: y [nx][rows] = x [nx][cols] · wᵀ, R weight rows of block type B
// per warp staged U runs at a time, grid-striding over groups of R rows
// (any grid), block 128.
template <class B, int R, int U, int NX>
DEV void st_mv(const u8* __restrict__ w, const i8* __restrict__ xq, const float* __restrict__ xd,
               float* __restrict__ y, int rows, int cols, int nx) {
  __shared__ __attribute__((aligned(16))) u8 stage[MX_STAGE(B::BB, R, U)];
  int lane = threadIdx.x % warpSize, warp = threadIdx.x / warpSize;
  u8* st = stage + warp * R * MX_SLICE(B::BB, U);
  size_t rb = (size_t)(cols / 32) * B::BB;
  for (int row0 = (blockIdx.x * (blockDim.x / warpSize) + warp) * R; row0 < rows;
       row0 += gridDim.x * (blockDim.x / warpSize) * R) {
    const u8* wr[R];
    float acc[R][NX];
#pragma unroll
    for (int r = 0; r < R; r++) wr[r] = w + (size_t)min(row0 + r, rows - 1) * rb;
    st_rows<B, R, U, NX>(wr, xq, xd, cols, nx, st, acc);
#pragma unroll
    for (int r = 0; r < R; r++) {
#pragma unroll
      for (int v = 0; v < NX; v++)
        if (v < nx && lane == 0 && row0 + r < rows) y[(size_t)v * rows + row0 + r] = acc[r][v];
    }
  }
}

// mv_mxfp4_m{R}{U}: one x (quantize_q8's copy), R weight rows per warp
// staged U runs at a time.
#define MV_MXFP4(R, U)                                                                                       \
  KERNEL void __launch_bounds__(128)                                                                         \
      mv_mxfp4_m##R##U(const u8* w, const i8* xq, const float* xd, float* y, int rows, int cols) { GRID_DEPEND();           \
    st_mv<SMXFP4, R, U, 1>(w, xq, xd, y, rows, cols, 1);                                                          \
  }
MV_MXFP4(1, 1)
MV_MXFP4(2, 1)
MV_MXFP4(4, 1)
MV_MXFP4(1, 3)

// mv_mxfp4_x8: nx ≤ 8 rows of 8-bit x (row v's codes at xq + v·cols, its
// scales at xd + v·cols/32), one weight row per warp staged a run at a
// time, each staged block used for every row of x.
KERNEL void __launch_bounds__(128)
    mv_mxfp4_x8(const u8* w, const i8* xq, const float* xd, float* y, int rows, int cols, int nx) {
  GRID_DEPEND();
  st_mv<SMXFP4, 1, 1, 8>(w, xq, xd, y, rows, cols, nx);
}

// moe_mv_mxfp4_{R}{U}: for table i < 2 (t1 null: one table) and slot j <
// k (blockIdx.y = i·k + j), y_i[j] [rows] = x_j · (expert ids[j]'s matrix
// of table i)ᵀ, x_j at xq + j·xstride, its scales at xd + j·xstride/32
// (xstride 0: one shared input), as moe.cu's moe_mv_* take them; R weight
// rows per warp staged U runs at a time (moe.go's planMoe).
// grid (row groups, k·tables), block 128.
#define MOE_MXFP4(R, U)                                                                                      \
  KERNEL void __launch_bounds__(128)                                                                         \
      moe_mv_mxfp4_##R##U(const u64* t0, const u64* t1, float* y0, float* y1, const i32* ids, const i8* xq,  \
                          const float* xd, int rows, int cols, int k, int xstride) { GRID_DEPEND();          \
    int s = blockIdx.y, tab = s / k, j = s - tab * k;                                                        \
    const u8* w = (const u8*)(tab ? t1 : t0)[ids[j]];                                                        \
    float* y = (tab ? y1 : y0) + (size_t)j * rows;                                                           \
    st_mv<SMXFP4, R, U, 1>(w, xq + (size_t)j * xstride, xd + (size_t)j * (xstride / 32), y, rows, cols, 1);       \
  }
MOE_MXFP4(2, 1)

// The 32-element block types on rows mv_b32_q8 cannot take (b32.go's
// b32Staged): mv_{type}_m{R}1 (one x, R rows per warp), mv_{type}_mx8 (2–8
// rows of x, each row the bits of the one-x kernels) and
// moe_mv_{type}_m21 (the experts, moe.cu's calling convention), as the
// MXFP4 kernels above.
#define ST32(name, B)                                                                                        \
  KERNEL void __launch_bounds__(128)                                                                         \
      mv_##name##_m11(const u8* w, const i8* xq, const float* xd, float* y, int rows, int cols) { GRID_DEPEND();            \
    st_mv<B, 1, 1, 1>(w, xq, xd, y, rows, cols, 1);                                                          \
  }                                                                                                          \
  KERNEL void __launch_bounds__(128)                                                                         \
      mv_##name##_m21(const u8* w, const i8* xq, const float* xd, float* y, int rows, int cols) { GRID_DEPEND();            \
    st_mv<B, 2, 1, 1>(w, xq, xd, y, rows, cols, 1);                                                          \
  }                                                                                                          \
  KERNEL void __launch_bounds__(128)                                                                         \
      mv_##name##_mx8(const u8* w, const i8* xq, const float* xd, float* y, int rows, int cols, int nx) { GRID_DEPEND();    \
    st_mv<B, 1, 1, 8>(w, xq, xd, y, rows, cols, nx);                                                         \
  }                                                                                                          \
  KERNEL void __launch_bounds__(128)                                                                         \
      moe_mv_##name##_m21(const u64* t0, const u64* t1, float* y0, float* y1, const i32* ids, const i8* xq,  \
                          const float* xd, int rows, int cols, int k, int xstride) { GRID_DEPEND();          \
    int s = blockIdx.y, tab = s / k, j = s - tab * k;                                                        \
    const u8* w = (const u8*)(tab ? t1 : t0)[ids[j]];                                                        \
    float* y = (tab ? y1 : y0) + (size_t)j * rows;                                                           \
    st_mv<B, 2, 1, 1>(w, xq + (size_t)j * xstride, xd + (size_t)j * (xstride / 32), y, rows, cols, 1);       \
  }
ST32(q4_0, S32Q4<false>)
ST32(q4_1, S32Q4<true>)
ST32(q5_0, S32Q5<false>)
ST32(q5_1, S32Q5<true>)
ST32(q8_0, S32Q8_0)
