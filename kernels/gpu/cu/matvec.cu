// matvec.cu: matrix–vector products that read GGUF blocks directly.
//
//   w [rows][cols] in blocks, x [nx][cols] f32, y [nx][rows] f32
//   y[j][r] = Σ_c w[r][c]·x[j][c]
//
// Generic kernels (every type): one warp per row, lanes stride over the
// row's parts (quants.h) and decode them into registers; nx ≤ MV_MAXNX
// activation rows share one read of the weights.
//
// Fast kernels (Q4_K, Q6_K: the bulk of a Q4_K_M model): one warp per one
// or two rows, wide loads of whole 16-byte chunks, and integer codes turned
// into floats by byte permutes onto the 2^23 exponent (no conversion
// instructions, which run at a quarter rate).
//
// 8-bit-activation kernels (the decode path, n = 1): x quantized to int8
// blocks of 32, dp4a products. Q4_K "q/n" (16-byte loads straight from
// global), Q6_K "t/c" and the 32-element block types "b" (whole blocks
// copied through shared memory with 16-byte loads, since their blocks are
// only 2-byte aligned). Choices and timings: bench/results/.
#include "quants.h"
#include "q8terms.h"
#include "mvbody.h"



// The generic kernels take nx rows of x in chunks of MV_MAXNX, one chunk
// per blockIdx.y (grid.y = ceil(nx / MV_MAXNX)): a row's sum is the same
// whatever chunk it is in and however many rows share the launch, and a
// prompt's rows need one launch instead of one per chunk.
#define MV_CHUNK()                                                                                      \
  x += (size_t)blockIdx.y * MV_MAXNX * cols;                                                            \
  y += (size_t)blockIdx.y * MV_MAXNX * rows;                                                            \
  nx = min(nx - (int)blockIdx.y * MV_MAXNX, MV_MAXNX);
#define MV_BLOCK(name, T)                                                                               \
  KERNEL void __launch_bounds__(128) mv_##name(const u8* w, const float* x, float* y, int rows, int cols, int nx) { GRID_DEPEND();            \
    MV_CHUNK()                                                                                          \
    mv_block<T>(w, x, y, rows, cols, nx);                                                               \
  }
#define MV_PLAIN(name, T)                                                                               \
  KERNEL void __launch_bounds__(128) mv_##name(const u8* w, const float* x, float* y, int rows, int cols, int nx) { GRID_DEPEND();            \
    MV_CHUNK()                                                                                          \
    mv_plain<T>(w, x, y, rows, cols, nx);                                                               \
  }
FOR_BLOCK_TYPES(MV_BLOCK)
FOR_PLAIN_TYPES(MV_PLAIN)

// ---- fast kernels -----------------------------------------------------------


// dot4: Σ_i x[i]·(byte i of w − off), off folding in the 2^23 bias.
DEV float dot4(u32 w, float4 x, float off, float s) {
  s = fmaf(x.x, BYTE_F(w, 0) - off, s);
  s = fmaf(x.y, BYTE_F(w, 1) - off, s);
  s = fmaf(x.z, BYTE_F(w, 2) - off, s);
  s = fmaf(x.w, BYTE_F(w, 3) - off, s);
  return s;
}

DEV float sum4(float4 a) { return (a.x + a.y) + (a.z + a.w); }

// Q4_K, R rows per warp, U super-blocks per lane in flight. Eight lanes
// share a super-block: lane j of the eight takes the 16 code bytes
// qs[16j…16j+15], which hold elements 64c + 16(j&1) + i (low nibbles,
// sub-block 2c) and 64c + 32 + 16(j&1) + i (high nibbles, sub-block 2c+1),
// c = j/2. With y = d·sc·q − dmin·m the min term needs only Σx per
// sub-block, shared by the R rows. All weight loads of an iteration are
// issued before any arithmetic, so R·U·32 bytes per lane are in flight.
// Needs w and x 16-byte aligned (every Q4_K row is 144·k bytes).
template <int R, int U>
static __device__ void mv_q4_k_fast(const u8* __restrict__ w, const float* __restrict__ x, float* __restrict__ y,
                                    int rows, int cols) {
  int lane = threadIdx.x % warpSize;
  int row0 = (blockIdx.x * (blockDim.x / warpSize) + threadIdx.x / warpSize) * R;
  if (row0 >= rows) return;
  int nsb = cols / 256;
  int step = warpSize / 8;
  size_t rb = (size_t)nsb * 144;
  int j = lane & 7, c = j >> 1, p0 = 2 * c;
  int xo = 64 * c + 16 * (j & 1);
  int sh = 8 * (p0 & 3);  // byte of each scales word for sub-blocks 2c (and 2c+1 at sh+8)
  float acc[R];
  const u8* wr[R];
#pragma unroll
  for (int r = 0; r < R; r++) {
    acc[r] = 0.0f;
    wr[r] = w + (size_t)min(row0 + r, rows - 1) * rb;
  }
  for (int sb0 = lane >> 3; sb0 < nsb; sb0 += U * step) {
    uint4 hdv[U][R], qv[U][R];
#pragma unroll
    for (int u = 0; u < U; u++) {
      int sb = min(sb0 + u * step, nsb - 1);
#pragma unroll
      for (int r = 0; r < R; r++) {
        const u8* bp = wr[r] + (size_t)sb * 144;
        hdv[u][r] = *(const uint4*)bp;
        qv[u][r] = *(const uint4*)(bp + 16 + 16 * j);
      }
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      int sb = sb0 + u * step;
      if (sb >= nsb) break;
      const float4* xp = (const float4*)(x + (size_t)sb * 256 + xo);
      float4 xl0 = xp[0], xl1 = xp[1], xl2 = xp[2], xl3 = xp[3];
      float4 xh0 = xp[8], xh1 = xp[9], xh2 = xp[10], xh3 = xp[11];
      float sl = (sum4(xl0) + sum4(xl1)) + (sum4(xl2) + sum4(xl3));
      float shx = (sum4(xh0) + sum4(xh1)) + (sum4(xh2) + sum4(xh3));
#pragma unroll
      for (int r = 0; r < R; r++) {
        uint4 hd = hdv[u][r], q = qv[u][r];
        float d = h2f(hd.x & 0xFFFF), dmin = h2f(hd.x >> 16);
        // scales bytes 0..3 = hd.y, 4..7 = hd.z, 8..11 = hd.w
        u32 sc1, m1, sc2, m2;
        {
          u32 Y = hd.y >> sh, Z = hd.z >> sh, W = hd.w >> sh;
          u32 Y2 = hd.y >> (sh + 8), Z2 = hd.z >> (sh + 8), W2 = hd.w >> (sh + 8);
          if (p0 < 4) {
            sc1 = Y & 63; m1 = Z & 63;
            sc2 = Y2 & 63; m2 = Z2 & 63;
          } else {
            sc1 = (W & 15) | (((Y >> 6) & 3) << 4); m1 = ((W >> 4) & 15) | (((Z >> 6) & 3) << 4);
            sc2 = (W2 & 15) | (((Y2 >> 6) & 3) << 4); m2 = ((W2 >> 4) & 15) | (((Z2 >> 6) & 3) << 4);
          }
        }
        const float B = 8388608.0f;
        float dl = 0.0f, dh = 0.0f;
        dl = dot4(q.x & 0x0F0F0F0Fu, xl0, B, dl);
        dl = dot4(q.y & 0x0F0F0F0Fu, xl1, B, dl);
        dl = dot4(q.z & 0x0F0F0F0Fu, xl2, B, dl);
        dl = dot4(q.w & 0x0F0F0F0Fu, xl3, B, dl);
        dh = dot4((q.x >> 4) & 0x0F0F0F0Fu, xh0, B, dh);
        dh = dot4((q.y >> 4) & 0x0F0F0F0Fu, xh1, B, dh);
        dh = dot4((q.z >> 4) & 0x0F0F0F0Fu, xh2, B, dh);
        dh = dot4((q.w >> 4) & 0x0F0F0F0Fu, xh3, B, dh);
        acc[r] += d * ((float)sc1 * dl + (float)sc2 * dh) - dmin * ((float)m1 * sl + (float)m2 * shx);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; r++) {
    float s = warp_sum(acc[r]);
    if (lane == 0 && row0 + r < rows) y[row0 + r] = s;
  }
}

// Q4_K, R rows per warp, software-pipelined: the blocks of the next
// iteration are loaded into registers before the arithmetic of this one, so
// every warp always has a load in flight (without it a warp alternates
// between waiting and computing and the memory pipe idles). Same lane
// layout and arithmetic as mv_q4_k_fast.
template <int R>
static __device__ void mv_q4_k_pipe(const u8* __restrict__ w, const float* __restrict__ x, float* __restrict__ y,
                                    int rows, int cols) {
  int lane = threadIdx.x % warpSize;
  int row0 = (blockIdx.x * (blockDim.x / warpSize) + threadIdx.x / warpSize) * R;
  if (row0 >= rows) return;
  int nsb = cols / 256;
  int step = warpSize / 8;
  size_t rb = (size_t)nsb * 144;
  int j = lane & 7, c = j >> 1, p0 = 2 * c;
  int xo = 64 * c + 16 * (j & 1);
  int sh = 8 * (p0 & 3);
  float acc[R];
  const u8* wr[R];
  uint4 hdn[R], qn[R];
  int sb = lane >> 3;
#pragma unroll
  for (int r = 0; r < R; r++) {
    acc[r] = 0.0f;
    wr[r] = w + (size_t)min(row0 + r, rows - 1) * rb;
    const u8* bp = wr[r] + (size_t)min(sb, nsb - 1) * 144;
    hdn[r] = *(const uint4*)bp;
    qn[r] = *(const uint4*)(bp + 16 + 16 * j);
  }
  for (; sb < nsb; sb += step) {
    uint4 hdv[R], qv[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
      hdv[r] = hdn[r];
      qv[r] = qn[r];
    }
    int sbn = min(sb + step, nsb - 1);
#pragma unroll
    for (int r = 0; r < R; r++) {
      const u8* bp = wr[r] + (size_t)sbn * 144;
      hdn[r] = *(const uint4*)bp;
      qn[r] = *(const uint4*)(bp + 16 + 16 * j);
    }
    const float4* xp = (const float4*)(x + (size_t)sb * 256 + xo);
    float4 xl0 = xp[0], xl1 = xp[1], xl2 = xp[2], xl3 = xp[3];
    float4 xh0 = xp[8], xh1 = xp[9], xh2 = xp[10], xh3 = xp[11];
    float sl = (sum4(xl0) + sum4(xl1)) + (sum4(xl2) + sum4(xl3));
    float shx = (sum4(xh0) + sum4(xh1)) + (sum4(xh2) + sum4(xh3));
#pragma unroll
    for (int r = 0; r < R; r++) {
      uint4 hd = hdv[r], q = qv[r];
      float d = h2f(hd.x & 0xFFFF), dmin = h2f(hd.x >> 16);
      u32 sc1, m1, sc2, m2;
      {
        u32 Y = hd.y >> sh, Z = hd.z >> sh, W = hd.w >> sh;
        u32 Y2 = hd.y >> (sh + 8), Z2 = hd.z >> (sh + 8), W2 = hd.w >> (sh + 8);
        if (p0 < 4) {
          sc1 = Y & 63; m1 = Z & 63;
          sc2 = Y2 & 63; m2 = Z2 & 63;
        } else {
          sc1 = (W & 15) | (((Y >> 6) & 3) << 4); m1 = ((W >> 4) & 15) | (((Z >> 6) & 3) << 4);
          sc2 = (W2 & 15) | (((Y2 >> 6) & 3) << 4); m2 = ((W2 >> 4) & 15) | (((Z2 >> 6) & 3) << 4);
        }
      }
      const float B = 8388608.0f;
      float dl = 0.0f, dh = 0.0f;
      dl = dot4(q.x & 0x0F0F0F0Fu, xl0, B, dl);
      dl = dot4(q.y & 0x0F0F0F0Fu, xl1, B, dl);
      dl = dot4(q.z & 0x0F0F0F0Fu, xl2, B, dl);
      dl = dot4(q.w & 0x0F0F0F0Fu, xl3, B, dl);
      dh = dot4((q.x >> 4) & 0x0F0F0F0Fu, xh0, B, dh);
      dh = dot4((q.y >> 4) & 0x0F0F0F0Fu, xh1, B, dh);
      dh = dot4((q.z >> 4) & 0x0F0F0F0Fu, xh2, B, dh);
      dh = dot4((q.w >> 4) & 0x0F0F0F0Fu, xh3, B, dh);
      acc[r] += d * (u2f_small(sc1) * dl + u2f_small(sc2) * dh) - dmin * (u2f_small(m1) * sl + u2f_small(m2) * shx);
    }
  }
#pragma unroll
  for (int r = 0; r < R; r++) {
    float s = warp_sum(acc[r]);
    if (lane == 0 && row0 + r < rows) y[row0 + r] = s;
  }
}

KERNEL void __launch_bounds__(128) mv_q4_k_p4(const u8* w, const float* x, float* y, int rows, int cols) { GRID_DEPEND(); mv_q4_k_pipe<4>(w, x, y, rows, cols); }
KERNEL void __launch_bounds__(128) mv_q4_k_p1(const u8* w, const float* x, float* y, int rows, int cols) { GRID_DEPEND(); mv_q4_k_pipe<1>(w, x, y, rows, cols); }
KERNEL void __launch_bounds__(128) mv_q4_k_p2(const u8* w, const float* x, float* y, int rows, int cols) { GRID_DEPEND(); mv_q4_k_pipe<2>(w, x, y, rows, cols); }

#define MV_Q4K_FAST(R, U)                                                                         \
  KERNEL void __launch_bounds__(128) mv_q4_k_r##R##u##U(const u8* w, const float* x, float* y, int rows, int cols) { GRID_DEPEND();     \
    mv_q4_k_fast<R, U>(w, x, y, rows, cols);                                                      \
  }
MV_Q4K_FAST(1, 1)
MV_Q4K_FAST(2, 1)
MV_Q4K_FAST(1, 2)
MV_Q4K_FAST(2, 2)

// Q6_K, R rows per warp. Four lanes share a super-block: lane t4 = 2n + t
// takes elements 128n + 32k + 16t + i (k = 0..3, i = 0..15): low bits from
// ql[64n + 16t + i] (k = 0 low nibble, k = 2 high) and ql[64n + 32 + 16t + i]
// (k = 1, 3), high bits from qh[32n + 16t + i] (bits 2k), scale
// sc[8n + 2k + t]. Blocks are 210 bytes, so only 2-byte loads are aligned.

template <int R>
static __device__ void mv_q6_k_fast(const u8* __restrict__ w, const float* __restrict__ x, float* __restrict__ y,
                                    int rows, int cols) {
  int lane = threadIdx.x % warpSize;
  int row0 = (blockIdx.x * (blockDim.x / warpSize) + threadIdx.x / warpSize) * R;
  if (row0 >= rows) return;
  int nsb = cols / 256;
  size_t rb = (size_t)nsb * 210;
  int t4 = lane & 3, n = t4 >> 1, t = t4 & 1;
  float acc[R];
  const u8* wr[R];
#pragma unroll
  for (int r = 0; r < R; r++) {
    acc[r] = 0.0f;
    wr[r] = w + (size_t)min(row0 + r, rows - 1) * rb;
  }
  for (int sb = lane >> 2; sb < nsb; sb += warpSize / 4) {
    const float* xb = x + (size_t)sb * 256 + 128 * n + 16 * t;
    float4 xv[4][4];
#pragma unroll
    for (int k = 0; k < 4; k++)
#pragma unroll
      for (int g = 0; g < 4; g++) xv[k][g] = ((const float4*)(xb + 32 * k))[g];
#pragma unroll
    for (int r = 0; r < R; r++) {
      const u8* bp = wr[r] + (size_t)sb * 210;
      const u8* pa = bp + 64 * n + 16 * t;
      const u8* pb = pa + 32;
      const u8* ph = bp + 128 + 32 * n + 16 * t;
      const u8* ps = bp + 192 + 8 * n;
      float d = h2f(*(const u16*)(bp + 208));
      u32 s01 = ld2x16(ps), s23 = ld2x16(ps + 4);  // scale bytes 8n + 0..7
      // scale for k: byte 2k + t of the 8
      float sck[4];
      sck[0] = (float)(i8)((s01 >> (8 * t)) & 0xFF);
      sck[1] = (float)(i8)((s01 >> (8 * (2 + t))) & 0xFF);
      sck[2] = (float)(i8)((s23 >> (8 * t)) & 0xFF);
      sck[3] = (float)(i8)((s23 >> (8 * (2 + t))) & 0xFF);
      float dk[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      const float B = 8388608.0f + 32.0f;
#pragma unroll
      for (int g = 0; g < 4; g++) {
        u32 wa = ld2x16(pa + 4 * g), wb = ld2x16(pb + 4 * g), wh = ld2x16(ph + 4 * g);
        u32 q0 = (wa & 0x0F0F0F0Fu) | ((wh << 4) & 0x30303030u);
        u32 q1 = (wb & 0x0F0F0F0Fu) | ((wh << 2) & 0x30303030u);
        u32 q2 = ((wa >> 4) & 0x0F0F0F0Fu) | (wh & 0x30303030u);
        u32 q3 = ((wb >> 4) & 0x0F0F0F0Fu) | ((wh >> 2) & 0x30303030u);
        dk[0] = dot4(q0, xv[0][g], B, dk[0]);
        dk[1] = dot4(q1, xv[1][g], B, dk[1]);
        dk[2] = dot4(q2, xv[2][g], B, dk[2]);
        dk[3] = dot4(q3, xv[3][g], B, dk[3]);
      }
      acc[r] += d * ((sck[0] * dk[0] + sck[1] * dk[1]) + (sck[2] * dk[2] + sck[3] * dk[3]));
    }
  }
#pragma unroll
  for (int r = 0; r < R; r++) {
    float s = warp_sum(acc[r]);
    if (lane == 0 && row0 + r < rows) y[row0 + r] = s;
  }
}

// Q6_K, R rows per warp, software-pipelined like mv_q4_k_pipe: the 2-byte
// words a lane needs from the next super-block (16 bytes each of the two
// ql runs and of qh, 8 scale bytes, d) are loaded before the arithmetic on
// the current one.

template <int R>
static __device__ void mv_q6_k_pipe(const u8* __restrict__ w, const float* __restrict__ x, float* __restrict__ y,
                                    int rows, int cols) {
  int lane = threadIdx.x % warpSize;
  int row0 = (blockIdx.x * (blockDim.x / warpSize) + threadIdx.x / warpSize) * R;
  if (row0 >= rows) return;
  int nsb = cols / 256;
  int step = warpSize / 4;
  size_t rb = (size_t)nsb * 210;
  int t4 = lane & 3, n = t4 >> 1, t = t4 & 1;
  float acc[R];
  const u8* wr[R];
  Q6Words nx[R];
  int sb = lane >> 2;
#pragma unroll
  for (int r = 0; r < R; r++) {
    acc[r] = 0.0f;
    wr[r] = w + (size_t)min(row0 + r, rows - 1) * rb;
    q6_load(nx[r], wr[r] + (size_t)min(sb, nsb - 1) * 210, n, t);
  }
  for (; sb < nsb; sb += step) {
    Q6Words cur[R];
#pragma unroll
    for (int r = 0; r < R; r++) cur[r] = nx[r];
    int sbn = min(sb + step, nsb - 1);
#pragma unroll
    for (int r = 0; r < R; r++) q6_load(nx[r], wr[r] + (size_t)sbn * 210, n, t);
    const float* xb = x + (size_t)sb * 256 + 128 * n + 16 * t;
    float4 xv[4][4];
#pragma unroll
    for (int k = 0; k < 4; k++)
#pragma unroll
      for (int g = 0; g < 4; g++) xv[k][g] = ((const float4*)(xb + 32 * k))[g];
#pragma unroll
    for (int r = 0; r < R; r++) {
      const Q6Words& q = cur[r];
      float d = h2f((u16)q.d);
      // signed scale bytes as floats without conversion instructions:
      // (b ^ 0x80) is b + 128 as an unsigned byte
      const float S = 8388608.0f + 128.0f;
      float sck[4];
      sck[0] = BYTE_F(q.s01 ^ 0x80808080u, 0 + t) - S;
      sck[1] = BYTE_F(q.s01 ^ 0x80808080u, 2 + t) - S;
      sck[2] = BYTE_F(q.s23 ^ 0x80808080u, 0 + t) - S;
      sck[3] = BYTE_F(q.s23 ^ 0x80808080u, 2 + t) - S;
      float dk[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      const float B = 8388608.0f + 32.0f;
#pragma unroll
      for (int g = 0; g < 4; g++) {
        u32 wa = q.a[g], wb = q.b[g], wh = q.h[g];
        dk[0] = dot4((wa & 0x0F0F0F0Fu) | ((wh << 4) & 0x30303030u), xv[0][g], B, dk[0]);
        dk[1] = dot4((wb & 0x0F0F0F0Fu) | ((wh << 2) & 0x30303030u), xv[1][g], B, dk[1]);
        dk[2] = dot4(((wa >> 4) & 0x0F0F0F0Fu) | (wh & 0x30303030u), xv[2][g], B, dk[2]);
        dk[3] = dot4(((wb >> 4) & 0x0F0F0F0Fu) | ((wh >> 2) & 0x30303030u), xv[3][g], B, dk[3]);
      }
      acc[r] += d * ((sck[0] * dk[0] + sck[1] * dk[1]) + (sck[2] * dk[2] + sck[3] * dk[3]));
    }
  }
#pragma unroll
  for (int r = 0; r < R; r++) {
    float s = warp_sum(acc[r]);
    if (lane == 0 && row0 + r < rows) y[row0 + r] = s;
  }
}

KERNEL void __launch_bounds__(128) mv_q6_k_p4(const u8* w, const float* x, float* y, int rows, int cols) { GRID_DEPEND(); mv_q6_k_pipe<4>(w, x, y, rows, cols); }
KERNEL void __launch_bounds__(128) mv_q6_k_p1(const u8* w, const float* x, float* y, int rows, int cols) { GRID_DEPEND(); mv_q6_k_pipe<1>(w, x, y, rows, cols); }
KERNEL void __launch_bounds__(128) mv_q6_k_p2(const u8* w, const float* x, float* y, int rows, int cols) { GRID_DEPEND(); mv_q6_k_pipe<2>(w, x, y, rows, cols); }

KERNEL void __launch_bounds__(128) mv_q6_k_r1u1(const u8* w, const float* x, float* y, int rows, int cols) {
  GRID_DEPEND();
  mv_q6_k_fast<1>(w, x, y, rows, cols);
}
KERNEL void __launch_bounds__(128) mv_q6_k_r2u1(const u8* w, const float* x, float* y, int rows, int cols) {
  GRID_DEPEND();
  mv_q6_k_fast<2>(w, x, y, rows, cols);
}

// Q6_K staged: the same arithmetic as mv_q6_k_fast, but each warp first
// copies the warpSize/4 super-blocks it is about to use (a contiguous,
// 16-byte aligned run of whole 210-byte blocks: warpSize/4·210 is a multiple
// of 16) into shared memory with 16-byte loads, then reads the fields from
// there. Global traffic becomes full-width loads instead of 2-byte ones.
//   block 128 threads; shared 128/4·210·R bytes whatever the warp size
template <int R>
static __device__ void mv_q6_k_stage(const u8* __restrict__ w, const float* __restrict__ x, float* __restrict__ y,
                                     int rows, int cols) {
  __shared__ __attribute__((aligned(16))) u8 stage[R * 32 * 210];
  int lane = threadIdx.x % warpSize, warp = threadIdx.x / warpSize;
  int row0 = (blockIdx.x * (blockDim.x / warpSize) + warp) * R;
  if (row0 >= rows) return;
  int S = warpSize / 4;                   // super-blocks per step
  u8* st = stage + warp * R * S * 210;    // this warp's R·S blocks
  int nsb = cols / 256;
  size_t rb = (size_t)nsb * 210;
  int t4 = lane & 3, n = t4 >> 1, t = t4 & 1;
  float acc[R];
  const u8* wr[R];
#pragma unroll
  for (int r = 0; r < R; r++) {
    acc[r] = 0.0f;
    wr[r] = w + (size_t)min(row0 + r, rows - 1) * rb;
  }
  for (int sb0 = 0; sb0 < nsb; sb0 += S) {
    int nb = min(S, nsb - sb0);
    int bytes = nb * 210;
    WARP_SYNC();
#pragma unroll
    for (int r = 0; r < R; r++) {
      const u8* src = wr[r] + (size_t)sb0 * 210;
      u8* dst = st + r * S * 210;
      int n16 = bytes >> 4;
      for (int i = lane; i < n16; i += warpSize) ((uint4*)dst)[i] = ((const uint4*)src)[i];
      for (int i = (n16 << 3) + lane; i < (bytes >> 1); i += warpSize) ((u16*)dst)[i] = ((const u16*)src)[i];
    }
    WARP_SYNC();
    int sb = sb0 + (lane >> 2);
    if (lane >> 2 < nb) {
      const float* xb = x + (size_t)sb * 256 + 128 * n + 16 * t;
      float4 xv[4][4];
#pragma unroll
      for (int k = 0; k < 4; k++)
#pragma unroll
        for (int g = 0; g < 4; g++) xv[k][g] = ((const float4*)(xb + 32 * k))[g];
#pragma unroll
      for (int r = 0; r < R; r++) {
        const u8* bp = st + r * S * 210 + (lane >> 2) * 210;
        const u8* pa = bp + 64 * n + 16 * t;
        const u8* pb = pa + 32;
        const u8* ph = bp + 128 + 32 * n + 16 * t;
        const u8* ps = bp + 192 + 8 * n;
        float d = h2f(*(const u16*)(bp + 208));
        u32 s01 = ld2x16(ps), s23 = ld2x16(ps + 4);
        float sck[4];
        sck[0] = (float)(i8)((s01 >> (8 * t)) & 0xFF);
        sck[1] = (float)(i8)((s01 >> (8 * (2 + t))) & 0xFF);
        sck[2] = (float)(i8)((s23 >> (8 * t)) & 0xFF);
        sck[3] = (float)(i8)((s23 >> (8 * (2 + t))) & 0xFF);
        float dk[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const float B = 8388608.0f + 32.0f;
#pragma unroll
        for (int g = 0; g < 4; g++) {
          u32 wa = ld2x16(pa + 4 * g), wb = ld2x16(pb + 4 * g), wh = ld2x16(ph + 4 * g);
          u32 q0 = (wa & 0x0F0F0F0Fu) | ((wh << 4) & 0x30303030u);
          u32 q1 = (wb & 0x0F0F0F0Fu) | ((wh << 2) & 0x30303030u);
          u32 q2 = ((wa >> 4) & 0x0F0F0F0Fu) | (wh & 0x30303030u);
          u32 q3 = ((wb >> 4) & 0x0F0F0F0Fu) | ((wh >> 2) & 0x30303030u);
          dk[0] = dot4(q0, xv[0][g], B, dk[0]);
          dk[1] = dot4(q1, xv[1][g], B, dk[1]);
          dk[2] = dot4(q2, xv[2][g], B, dk[2]);
          dk[3] = dot4(q3, xv[3][g], B, dk[3]);
        }
        acc[r] += d * ((sck[0] * dk[0] + sck[1] * dk[1]) + (sck[2] * dk[2] + sck[3] * dk[3]));
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; r++) {
    float s = warp_sum(acc[r]);
    if (lane == 0 && row0 + r < rows) y[row0 + r] = s;
  }
}

KERNEL void __launch_bounds__(128) mv_q6_k_s1(const u8* w, const float* x, float* y, int rows, int cols) {
  GRID_DEPEND();
  mv_q6_k_stage<1>(w, x, y, rows, cols);
}
KERNEL void __launch_bounds__(128) mv_q6_k_s2(const u8* w, const float* x, float* y, int rows, int cols) {
  GRID_DEPEND();
  mv_q6_k_stage<2>(w, x, y, rows, cols);
}

// ---- 8-bit activations ------------------------------------------------------
//
// Profiling the float kernels above on an H100 showed them bound by L1
// traffic, not DRAM: every lane reads 4 bytes of x per weight element
// (7 bytes of x per byte of Q4_K weight with two rows per warp). Here x is
// first quantized to int8 in blocks of 32 with one float scale (as
// llama.cpp's Q8_1), which cuts that traffic by four and lets a dp4a
// instruction do four multiply-adds. The rounding of x costs about 0.5 % of
// a dot product of random data (the conformance bound for quantized weights
// allows 2 %).


// x [n] f32 -> q [n] int8, d [n/32] f32 with x ≈ q·d, d = max|x|/127.
// One thread per value; 32 consecutive threads share a block.
KERNEL void __launch_bounds__(256) quantize_q8(const float* x, i8* q, float* d, int n) {
  GRID_DEPEND();
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  q8_group(i < n ? x[i] : 0.0f, i, n, q, d);
}




#define MV_Q8X(R, U)                                                                                           \
  KERNEL void __launch_bounds__(128) mv_q4_k_q##R##U(const u8* w, const i8* xq, const float* xd, float* y, int rows, int cols) { \
    GRID_PREFETCH_ROWS(w, R, rows, (cols / 256) * 144);                                                        \
    GRID_DEPEND();                                                                                             \
    mv_q4_k_q8<R, U, false>(w, xq, xd, y, rows, cols);                                                         \
  }                                                                                                            \
  KERNEL void __launch_bounds__(128) mv_q4_k_n##R##U(const u8* w, const i8* xq, const float* xd, float* y, int rows, int cols) { \
    GRID_PREFETCH_ROWS(w, R, rows, (cols / 256) * 144);                                                        \
    GRID_DEPEND();                                                                                             \
    mv_q4_k_q8<R, U, true>(w, xq, xd, y, rows, cols);                                                          \
  }                                                                                                            \
  KERNEL void __launch_bounds__(128) mv_q6_k_q##R##U(const u8* w, const i8* xq, const float* xd, float* y, int rows, int cols) { \
    GRID_PREFETCH_ROWS(w, R, rows, (cols / 256) * 210);                                                        \
    GRID_DEPEND();                                                                                             \
    mv_q6_k_q8<R, U>(w, xq, xd, y, rows, cols);                                                                \
  }
// q{R}{U}: R rows per warp, U super-blocks per lane in flight
MV_Q8X(1, 1)
MV_Q8X(2, 1)
MV_Q8X(1, 2)
MV_Q8X(2, 2)
MV_Q8X(1, 4)

// ---- Q6_K on 8-bit activations, staged through shared memory ----------------
//
// Q6_K blocks are 210 bytes, so a lane reading its fields straight from
// global memory can only use 2-byte loads: 29 load instructions per lane and
// super-block, each touching eight blocks, which keeps L1 busy long before
// DRAM is. Here each warp copies the S = warpSize/4 super-blocks it is about
// to use for each of its R rows (a contiguous, 16-byte aligned run of S·210
// bytes when the row starts aligned and S divides the row) with 16-byte
// loads into shared memory, and reads the fields back from there as 4-byte
// words (a block at an odd index sits 2 bytes off a word: two words and a
// funnel shift make each). The next run's 16-byte loads are issued before
// this run's arithmetic (a register double buffer), so every warp keeps
// loads in flight. Lanes and arithmetic as in mv_q6_k_q8.
//   block 128 threads; shared (128/4·210 + 64)·R bytes whatever the warp
//   size; needs: w 16-byte aligned (mv_q6_k_c8 also every row, and
//   (cols/256) % (warpSize/4) == 0)

// q6_run: the arithmetic of one staged run for lane (k, n, t): block k of
// each of the R runs, run r at st + r·stride + off[r] (off even, stride a
// multiple of 16 from a 16-byte aligned st), super-block sb of x.
template <int R>
DEV void q6_run(const u8* st, int stride, const int* off, const i8* __restrict__ xq, const float* __restrict__ xd,
                int sb, int k, int n, int t, float* acc) {
  const i8* xb = xq + (size_t)sb * 256 + 128 * n + 16 * t;
  uint4 xv[4];
  float dxk[4];
  int sx[4];
  const int ones = 0x01010101;
#pragma unroll
  for (int kk = 0; kk < 4; kk++) {
    xv[kk] = *(const uint4*)(xb + 32 * kk);
    dxk[kk] = xd[sb * 8 + 4 * n + kk];
    sx[kk] = dp4a(ones, xv[kk].x, dp4a(ones, xv[kk].y, dp4a(ones, xv[kk].z, dp4a(ones, xv[kk].w, 0))));
  }
#pragma unroll
  for (int r = 0; r < R; r++) {
    const u8* bp = st + r * stride + off[r] + k * 210;
    u32 sh = 8u * (u32)((off[r] + 2 * k) & 3);  // k·210 ≡ 2k (mod 4)
    const u8* pal = bp - (sh >> 3);             // word-aligned
    u32 a[4], b[4], h[4], sc[2];
    sh_words<4>(pal + 64 * n + 16 * t, sh, a);
    sh_words<4>(pal + 64 * n + 16 * t + 32, sh, b);
    sh_words<4>(pal + 128 + 32 * n + 16 * t, sh, h);
    sh_words<2>(pal + 192 + 8 * n, sh, sc);
    acc[r] += q6_q8_term(a, b, h, sc[0], sc[1], h2f(*(const u16*)(bp + 208)), t, xv, dxk, sx);
  }
}

// Rows of any whole number of super-blocks: a row (and so every run of
// it) may start 2·j bytes past a 16-byte boundary (off), and its last run
// may hold fewer than S super-blocks. Each run is copied from the 16-byte
// word holding its first byte to the one holding its last, off bytes into
// the warp's stage for that row (S·210 + 16 bytes); lanes whose block lies
// past the row's end add nothing, as in mv_q6_k_q8. A 16-byte word with
// one byte of the weight lies within its allocation.
// q6_staged_rows is one warp's R rows row0 … (the last row repeated past
// rows) of w, staged through st (R·(S·210 + 16) bytes, 16-byte aligned):
// each row's dot product with x, summed over the warp into acc.
template <int R>
DEV void q6_staged_rows(u8* st, const u8* __restrict__ w, int row0, int rows, int cols, const i8* __restrict__ xq,
                        const float* __restrict__ xd, float (&acc)[R]) {
  int lane = threadIdx.x % warpSize;
  int S = warpSize / 4;       // super-blocks per run, one per 4 lanes
  int stride = S * 210 + 16;  // stage bytes per row run
  int nsb = cols / 256;
  size_t rb = (size_t)nsb * 210;
  int k = lane >> 2, t4 = lane & 3, n = t4 >> 1, t = t4 & 1;
  const u8* wa[R];  // each row's start, rounded down to 16 bytes
  int off[R];
  uint4 buf[R][4];
#pragma unroll
  for (int r = 0; r < R; r++) {
    acc[r] = 0.0f;
    const u8* a = w + (size_t)min(row0 + r, rows - 1) * rb;
    off[r] = (int)((size_t)a & 15);
    wa[r] = a - off[r];
    int words = (off[r] + min(S, nsb) * 210 + 15) / 16;
#pragma unroll
    for (int m = 0; m < 4; m++) {
      int i = lane + m * warpSize;
      if (i < words) buf[r][m] = ld16w<true>(wa[r] + 16 * (size_t)i);
    }
  }
  for (int sb0 = 0; sb0 < nsb; sb0 += S) {
    WARP_SYNC();  // every lane is done reading the previous run
#pragma unroll
    for (int r = 0; r < R; r++) {
      uint4* dst = (uint4*)(st + r * stride);
      int words = (off[r] + min(S, nsb - sb0) * 210 + 15) / 16;
#pragma unroll
      for (int m = 0; m < 4; m++) {
        int i = lane + m * warpSize;
        if (i < words) dst[i] = buf[r][m];
      }
    }
    if (sb0 + S < nsb) {  // next run in flight during this one's arithmetic
#pragma unroll
      for (int r = 0; r < R; r++) {
        const u8* src = wa[r] + (size_t)(sb0 + S) * 210;
        int words = (off[r] + min(S, nsb - sb0 - S) * 210 + 15) / 16;
#pragma unroll
        for (int m = 0; m < 4; m++) {
          int i = lane + m * warpSize;
          if (i < words) buf[r][m] = ld16w<true>(src + 16 * (size_t)i);
        }
      }
    }
    WARP_SYNC();
    if (sb0 + k < nsb) q6_run<R>(st, stride, off, xq, xd, sb0 + k, k, n, t, acc);
  }
#pragma unroll
  for (int r = 0; r < R; r++) acc[r] = warp_sum(acc[r]);
}

template <int R>
static __device__ void mv_q6_k_t8(const u8* __restrict__ w, const i8* __restrict__ xq, const float* __restrict__ xd,
                                  float* __restrict__ y, int rows, int cols) {
  __shared__ __attribute__((aligned(16))) u8 stage[R * (32 * 210 + 64) + 16];
  int lane = threadIdx.x % warpSize, warp = threadIdx.x / warpSize;
  u8* st = stage + warp * R * (warpSize / 4 * 210 + 16);  // this warp's R runs
  for (int row0 = (blockIdx.x * (blockDim.x / warpSize) + warp) * R; row0 < rows;
       row0 += gridDim.x * (blockDim.x / warpSize) * R) {
    float acc[R];
    q6_staged_rows<R>(st, w, row0, rows, cols, xq, xd, acc);
#pragma unroll
    for (int r = 0; r < R; r++)
      if (lane == 0 && row0 + r < rows) y[row0 + r] = acc[r];
  }
}

// t{R}: R rows per warp
KERNEL void __launch_bounds__(128) mv_q6_k_t1(const u8* w, const i8* xq, const float* xd, float* y, int rows, int cols) {
  GRID_PREFETCH_ROWS(w, 1, rows, (cols / 256) * 210);
  GRID_DEPEND();
  mv_q6_k_t8<1>(w, xq, xd, y, rows, cols);
}
KERNEL void __launch_bounds__(128) mv_q6_k_t2(const u8* w, const i8* xq, const float* xd, float* y, int rows, int cols) {
  GRID_PREFETCH_ROWS(w, 2, rows, (cols / 256) * 210);
  GRID_DEPEND();
  mv_q6_k_t8<2>(w, xq, xd, y, rows, cols);
}
KERNEL void __launch_bounds__(128) mv_q6_k_t4(const u8* w, const i8* xq, const float* xd, float* y, int rows, int cols) {
  GRID_PREFETCH_ROWS(w, 4, rows, (cols / 256) * 210);
  GRID_DEPEND();
  mv_q6_k_t8<4>(w, xq, xd, y, rows, cols);
}

// Up to three Q4_K matrices of the same width on the same q8 input in one
// launch (Q, K and V; gate and up): the warps stride over the rows of all
// of them as one list (rows r0, then r1, then r2), so the small ones do not
// each pay a launch and a partly filled grid. One row per warp. With Q6,
// the third matrix is Q6_K, its rows staged through st as mv_q6_k_t{R}
// stages them (q6_staged_rows, one row): the same bits.
template <int U, bool Q6>
static __device__ void mv_q4_k_q8m(const u8* w0, float* y0, int r0, const u8* w1, float* y1, int r1, const u8* w2,
                                   float* y2, int r2, const i8* __restrict__ xq, const float* __restrict__ xd,
                                   int cols, u8* st) {
  int lane = threadIdx.x % warpSize;
  size_t rb = (size_t)(cols / 256) * 144;
  int total = r0 + r1 + r2;
  for (int v = blockIdx.x * (blockDim.x / warpSize) + threadIdx.x / warpSize; v < total;
       v += gridDim.x * (blockDim.x / warpSize)) {
    float acc[1];
    if (Q6 && v >= r0 + r1) {  // the same for the whole warp
      int row = v - r0 - r1;
      q6_staged_rows<1>(st, w2, row, r2, cols, xq, xd, acc);
      if (lane == 0) y2[row] = acc[0];
      continue;
    }
    const u8* w = w0;
    float* y = y0;
    int row = v;
    if (row >= r0) {
      row -= r0;
      w = w1;
      y = y1;
      if (row >= r1) {
        row -= r1;
        w = w2;
        y = y2;
      }
    }
    const u8* wr[1] = {w + (size_t)row * rb};
    q4k_q8_rows<1, U, true>(wr, xq, xd, cols, acc);
    if (lane == 0) y[row] = acc[0];
  }
}

// GRID_PREFETCH_LIST: GRID_PREFETCH of the calling warp's first row of a
// list of three weights (mv_q4_k_q8m's; mv_q4_k_n12m6's, whose third is
// Q6_K: bpb2, the bytes of its super-blocks).
#define GRID_PREFETCH_LIST(w0, r0, w1, r1, w2, r2, cols, bpb2) q4k_list_prefetch(w0, r0, w1, r1, w2, r2, cols, bpb2)
DEV void q4k_list_prefetch(const u8* w0, int r0, const u8* w1, int r1, const u8* w2, int r2, int cols, int bpb2) {
  size_t rb = (size_t)(cols / 256) * 144, rb2 = (size_t)(cols / 256) * bpb2;
  int v = blockIdx.x * (blockDim.x / warpSize) + threadIdx.x / warpSize;
  if (v < r0) {
    GRID_PREFETCH(w0 + (size_t)v * rb, rb);
  } else if (v < r0 + r1) {
    GRID_PREFETCH(w1 + (size_t)(v - r0) * rb, rb);
  } else if (v < r0 + r1 + r2) {
    GRID_PREFETCH(w2 + (size_t)(v - r0 - r1) * rb2, rb2);
  }
}

KERNEL void __launch_bounds__(128) mv_q4_k_n12m(const u8* w0, float* y0, int r0, const u8* w1, float* y1, int r1, const u8* w2, float* y2,
                         int r2, const i8* xq, const float* xd, int cols) {
  GRID_PREFETCH_LIST(w0, r0, w1, r1, w2, r2, cols, 144);
  GRID_DEPEND();
  mv_q4_k_q8m<2, false>(w0, y0, r0, w1, y1, r1, w2, y2, r2, xq, xd, cols, nullptr);
}

// mv_q4_k_n12m6: mv_q4_k_n12m whose third weight is Q6_K (Q, K of Q4_K
// and V of Q6_K: half the layers of a Q4_K_M file), so that V rides in the
// Q and K launch instead of one of its own.
//   needs: w2 16-byte aligned
KERNEL void __launch_bounds__(128) mv_q4_k_n12m6(const u8* w0, float* y0, int r0, const u8* w1, float* y1, int r1,
                                                  const u8* w2, float* y2, int r2, const i8* xq, const float* xd,
                                                  int cols) {
  GRID_PREFETCH_LIST(w0, r0, w1, r1, w2, r2, cols, 210);
  GRID_DEPEND();
  __shared__ __attribute__((aligned(16))) u8 stage[32 * 210 + 64 + 16];
  u8* st = stage + threadIdx.x / warpSize * (warpSize / 4 * 210 + 16);  // this warp's run
  mv_q4_k_q8m<2, true>(w0, y0, r0, w1, y1, r1, w2, y2, r2, xq, xd, cols, st);
}

// Q6_K staged, one continuous stream per warp: as mv_q6_k_t8, but when the
// grid is capped (a persistent grid, each warp looping over several groups
// of R rows) the first run of the warp's next row group is loaded during
// the last run of this one, so the loads never pause at a row boundary
// (rows of 4096 columns are only two runs long).
template <int R>
static __device__ void mv_q6_k_c8(const u8* __restrict__ w, const i8* __restrict__ xq, const float* __restrict__ xd,
                                  float* __restrict__ y, int rows, int cols) {
  __shared__ __attribute__((aligned(16))) u8 stage[R * 32 * 210 + 16];
  int lane = threadIdx.x % warpSize, warp = threadIdx.x / warpSize;
  int S = warpSize / 4;
  int n16 = S * 210 / 16;
  u8* st = stage + warp * R * S * 210;
  int nsb = cols / 256, nruns = nsb / S;
  size_t rb = (size_t)nsb * 210;
  int k = lane >> 2, t4 = lane & 3, n = t4 >> 1, t = t4 & 1;
  int zero[R];  // every row's runs start 16-byte aligned here
#pragma unroll
  for (int r = 0; r < R; r++) zero[r] = 0;
  int ngroups = (rows + R - 1) / R;
  int gstride = gridDim.x * (blockDim.x / warpSize);
  int g = blockIdx.x * (blockDim.x / warpSize) + warp;  // row group: rows R·g …
  if (g >= ngroups) return;
  uint4 buf[R][4];
#pragma unroll
  for (int r = 0; r < R; r++) {
    const u8* src = w + (size_t)min(g * R + r, rows - 1) * rb;
#pragma unroll
    for (int m = 0; m < 4; m++) {
      int i = lane + m * warpSize;
      if (i < n16) buf[r][m] = ld16w<true>(src + 16 * (size_t)i);
    }
  }
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; r++) acc[r] = 0.0f;
  for (int c = 0;;) {  // run c of group g
    WARP_SYNC();
#pragma unroll
    for (int r = 0; r < R; r++) {
      uint4* dst = (uint4*)(st + r * S * 210);
#pragma unroll
      for (int m = 0; m < 4; m++) {
        int i = lane + m * warpSize;
        if (i < n16) dst[i] = buf[r][m];
      }
    }
    int gn = g, cn = c + 1;  // the next run: this group's, or the next group's first
    if (cn == nruns) {
      gn = g + gstride;
      cn = 0;
    }
    if (gn < ngroups) {
#pragma unroll
      for (int r = 0; r < R; r++) {
        const u8* src = w + (size_t)min(gn * R + r, rows - 1) * rb + (size_t)cn * S * 210;
#pragma unroll
        for (int m = 0; m < 4; m++) {
          int i = lane + m * warpSize;
          if (i < n16) buf[r][m] = ld16w<true>(src + 16 * (size_t)i);
        }
      }
    }
    WARP_SYNC();
    q6_run<R>(st, S * 210, zero, xq, xd, c * S + k, k, n, t, acc);
    if (cn == 0) {  // group g done
#pragma unroll
      for (int r = 0; r < R; r++) {
        float v = warp_sum(acc[r]);
        if (lane == 0 && g * R + r < rows) y[g * R + r] = v;
        acc[r] = 0.0f;
      }
    }
    if (gn >= ngroups) break;
    g = gn;
    c = cn;
  }
}

// c{R}: R rows per warp
KERNEL void __launch_bounds__(128) mv_q6_k_c1(const u8* w, const i8* xq, const float* xd, float* y, int rows, int cols) {
  GRID_PREFETCH_ROWS(w, 1, rows, (cols / 256) * 210);
  GRID_DEPEND();
  mv_q6_k_c8<1>(w, xq, xd, y, rows, cols);
}
KERNEL void __launch_bounds__(128) mv_q6_k_c2(const u8* w, const i8* xq, const float* xd, float* y, int rows, int cols) {
  GRID_PREFETCH_ROWS(w, 2, rows, (cols / 256) * 210);
  GRID_DEPEND();
  mv_q6_k_c8<2>(w, xq, xd, y, rows, cols);
}

// mv_{type}_b{R}: R rows per warp
#define MV_B32(name, B)                                                                                        \
  KERNEL void __launch_bounds__(128)                                                                           \
      mv_##name##_b1(const u8* w, const i8* xq, const float* xd, float* y, int rows, int cols) { GRID_DEPEND();               \
    mv_b32_q8<B, 1>(w, xq, xd, y, rows, cols);                                                                 \
  }                                                                                                            \
  KERNEL void __launch_bounds__(128)                                                                           \
      mv_##name##_b2(const u8* w, const i8* xq, const float* xd, float* y, int rows, int cols) { GRID_DEPEND();               \
    mv_b32_q8<B, 2>(w, xq, xd, y, rows, cols);                                                                 \
  }                                                                                                            \
  KERNEL void __launch_bounds__(128)                                                                           \
      mv_##name##_b4(const u8* w, const i8* xq, const float* xd, float* y, int rows, int cols) { GRID_DEPEND();               \
    mv_b32_q8<B, 4>(w, xq, xd, y, rows, cols);                                                                 \
  }
MV_B32(q4_0, B8Q4_0)
MV_B32(q4_1, B8Q4_1)
MV_B32(q5_0, B8Q5_0)
MV_B32(q5_1, B8Q5_1)
MV_B32(q8_0, B8Q8_0)

// ---- several activation rows on 8-bit activations (batched decode) ----------
//
// y [nx][rows] = x [nx][cols] · wᵀ for nx ≤ 8 rows of x quantized to 8 bits
// (row v's codes at xq + v·cols, its scales at xd + v·cols/32): one weight
// row per warp, each weight block read once for all nx rows, which is the
// throughput of continuous batching (16 decoding sequences cost two reads
// of the weights, not sixteen). Batch invariance (kernels.Batcher): every
// row of x gets the sum the one-vector kernel of its type gives it, bit for
// bit, because each lane visits the same super-blocks (or blocks) in the
// same order, adds the same term (q4k_q8_term, q6_q8_term, B::dot) to its
// running sum and the warp reduces the same way (warp_sum); which rows
// share a warp, or how many there are, changes none of it.
//   grid: any (grid-stride over rows), block 128

// Q4_K: lanes as in q4k_q8_rows, R weight rows per warp (each x load
// serves R rows: the x traffic through L1, eight times the weight traffic
// at eight rows of x, is what limits these kernels), the next super-block's
// weights loaded during this one's arithmetic. Always inlined (DEV): at
// NX = 16 AMD's compiler left it a called function, whose calling
// convention took 176 (gfx90a) to 332 (gfx1030) bytes of scratch per lane.
template <int R, int NX>
DEV void mv_q4_k_xn(const u8* __restrict__ w, const i8* __restrict__ xq, const float* __restrict__ xd,
                    float* __restrict__ y, int rows, int cols, int nx) {
  int lane = threadIdx.x % warpSize;
  int nsb = cols / 256;
  int step = warpSize / 8;
  int j = lane & 7, c = j >> 1, p0 = 2 * c;
  int xo = 64 * c + 16 * (j & 1);
  int sh = 8 * (p0 & 3);
  size_t rb = (size_t)nsb * 144;
  for (int row0 = (blockIdx.x * (blockDim.x / warpSize) + threadIdx.x / warpSize) * R; row0 < rows;
       row0 += gridDim.x * (blockDim.x / warpSize) * R) {
    const u8* wr[R];
    float acc[R][NX];
    uint4 hdn[R], qn[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
      wr[r] = w + (size_t)min(row0 + r, rows - 1) * rb;
#pragma unroll
      for (int v = 0; v < NX; v++) acc[r][v] = 0.0f;
      const u8* bp = wr[r] + (size_t)min(lane >> 3, nsb - 1) * 144;
      hdn[r] = ld16w<true>(bp);
      qn[r] = ld16w<true>(bp + 16 + 16 * j);
    }
    for (int sb = lane >> 3; sb < nsb; sb += step) {
      uint4 hd[R], q[R];
#pragma unroll
      for (int r = 0; r < R; r++) {
        hd[r] = hdn[r];
        q[r] = qn[r];
      }
      if (sb + step < nsb) {
#pragma unroll
        for (int r = 0; r < R; r++) {
          const u8* bp = wr[r] + (size_t)(sb + step) * 144;
          hdn[r] = ld16w<true>(bp);
          qn[r] = ld16w<true>(bp + 16 + 16 * j);
        }
      }
#pragma unroll
      for (int v = 0; v < NX; v++) {
        if (v < nx) {
          const i8* xr = xq + (size_t)v * cols + (size_t)sb * 256 + xo;
          const float* dr = xd + (size_t)v * (cols / 32) + sb * 8 + p0;
          uint4 xl = *(const uint4*)xr, xh = *(const uint4*)(xr + 32);
          float dx1 = dr[0], dx2 = dr[1];
#pragma unroll
          for (int r = 0; r < R; r++) acc[r][v] += q4k_q8_term(hd[r], q[r], xl, xh, dx1, dx2, p0, sh);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
#pragma unroll
      for (int v = 0; v < NX; v++) {
        if (v < nx) {
          float s = warp_sum(acc[r][v]);
          if (lane == 0 && row0 + r < rows) y[(size_t)v * rows + row0 + r] = s;
        }
      }
    }
  }
}

// Q6_K: lanes as in mv_q6_k_q8 (the fields loaded straight from global),
// R weight rows per warp.
template <int R, int NX>
DEV void mv_q6_k_xn(const u8* __restrict__ w, const i8* __restrict__ xq, const float* __restrict__ xd,
                    float* __restrict__ y, int rows, int cols, int nx) {
  int lane = threadIdx.x % warpSize;
  int nsb = cols / 256;
  int step = warpSize / 4;
  size_t rb = (size_t)nsb * 210;
  int t4 = lane & 3, n = t4 >> 1, t = t4 & 1;
  for (int row0 = (blockIdx.x * (blockDim.x / warpSize) + threadIdx.x / warpSize) * R; row0 < rows;
       row0 += gridDim.x * (blockDim.x / warpSize) * R) {
    const u8* wr[R];
    float acc[R][NX];
#pragma unroll
    for (int r = 0; r < R; r++) {
      wr[r] = w + (size_t)min(row0 + r, rows - 1) * rb;
#pragma unroll
      for (int v = 0; v < NX; v++) acc[r][v] = 0.0f;
    }
    for (int sb = lane >> 2; sb < nsb; sb += step) {
      Q6Words q[R];
      float d[R];
#pragma unroll
      for (int r = 0; r < R; r++) {
        q6_load(q[r], wr[r] + (size_t)sb * 210, n, t);
        d[r] = h2f((u16)q[r].d);
      }
#pragma unroll
      for (int v = 0; v < NX; v++) {
        if (v < nx) {
          uint4 xv[4];
          float dxk[4];
          int sx[4];
          q6_q8_x(xq + (size_t)v * cols, xd + (size_t)v * (cols / 32), sb, n, t, xv, dxk, sx);
#pragma unroll
          for (int r = 0; r < R; r++)
            acc[r][v] += q6_q8_term(q[r].a, q[r].b, q[r].h, q[r].s01, q[r].s23, d[r], t, xv, dxk, sx);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
#pragma unroll
      for (int v = 0; v < NX; v++) {
        if (v < nx) {
          float s = warp_sum(acc[r][v]);
          if (lane == 0 && row0 + r < rows) y[(size_t)v * rows + row0 + r] = s;
        }
      }
    }
  }
}

// 32-element blocks: as mv_b32_q8 with one weight row per warp (its runs
// staged through shared memory), every staged block used for all nx rows.
template <class B, int NX>
DEV void mv_b32_xn(const u8* __restrict__ w, const i8* __restrict__ xq, const float* __restrict__ xd,
                   float* __restrict__ y, int rows, int cols, int nx) {
  __shared__ __attribute__((aligned(16))) u8 stage[128 * B::BB + 16];
  int lane = threadIdx.x % warpSize, warp = threadIdx.x / warpSize;
  int run = warpSize * B::BB;
  int n16 = run / 16;
  u8* st = stage + warp * run;
  int nb = cols / 32;
  size_t rb = (size_t)nb * B::BB;
  for (int row = blockIdx.x * (blockDim.x / warpSize) + warp; row < rows; row += gridDim.x * (blockDim.x / warpSize)) {
    const u8* wr = w + (size_t)row * rb;
    float acc[NX];
    uint4 buf[3];
#pragma unroll
    for (int v = 0; v < NX; v++) acc[v] = 0.0f;
#pragma unroll
    for (int m = 0; m < 3; m++) {
      int i = lane + m * warpSize;
      if (i < n16) buf[m] = ld16w<true>(wr + 16 * (size_t)i);
    }
    for (int b0 = 0; b0 < nb; b0 += warpSize) {
      WARP_SYNC();
#pragma unroll
      for (int m = 0; m < 3; m++) {
        int i = lane + m * warpSize;
        if (i < n16) ((uint4*)st)[i] = buf[m];
      }
      if (b0 + warpSize < nb) {
#pragma unroll
        for (int m = 0; m < 3; m++) {
          int i = lane + m * warpSize;
          if (i < n16) buf[m] = ld16w<true>(wr + (size_t)(b0 + warpSize) * B::BB + 16 * (size_t)i);
        }
      }
      WARP_SYNC();
      int bi = b0 + lane;
      const int ones = 0x01010101;
#pragma unroll
      for (int v = 0; v < NX; v++) {
        if (v < nx) {
          const i8* xr = xq + (size_t)v * cols + (size_t)bi * 32;
          uint4 xl = *(const uint4*)xr, xh = *(const uint4*)(xr + 16);
          float dx = xd[(size_t)v * nb + bi];
          int sx = dp4a(ones, xl.x, dp4a(ones, xl.y, dp4a(ones, xl.z, dp4a(ones, xl.w, 0))));
          sx = dp4a(ones, xh.x, dp4a(ones, xh.y, dp4a(ones, xh.z, dp4a(ones, xh.w, sx))));
          acc[v] += B::dot(st, lane * B::BB, xl, xh, sx, dx);
        }
      }
    }
#pragma unroll
    for (int v = 0; v < NX; v++) {
      if (v < nx) {
        float s = warp_sum(acc[v]);
        if (lane == 0) y[(size_t)v * rows + row] = s;
      }
    }
  }
}

// mv_{type}_x8: up to 8 rows of 8-bit x per launch; Q4_K and Q6_K with two
// weight rows per warp (x{NX}r{R}: NX rows of x, R weight rows per warp).
// On the H100 at the 8B shapes, R = 2 beat R = 1 and R = 4 for both types
// (Q6_K by 1.4x), and 16 rows of x per launch beat 8 for Q4_K from 16 rows
// on (bench/results/2026-11-25-batch-matmul-h100.md).
KERNEL void __launch_bounds__(128)
    mv_q4_k_x8r2(const u8* w, const i8* xq, const float* xd, float* y, int rows, int cols, int nx) {
  GRID_PREFETCH_ROWS(w, 2, rows, (cols / 256) * 144);
  GRID_DEPEND();
  mv_q4_k_xn<2, 8>(w, xq, xd, y, rows, cols, nx);
}
KERNEL void __launch_bounds__(128)
    mv_q4_k_x16r2(const u8* w, const i8* xq, const float* xd, float* y, int rows, int cols, int nx) {
  GRID_PREFETCH_ROWS(w, 2, rows, (cols / 256) * 144);
  GRID_DEPEND();
  mv_q4_k_xn<2, 16>(w, xq, xd, y, rows, cols, nx);
}
KERNEL void __launch_bounds__(128)
    mv_q6_k_x8r2(const u8* w, const i8* xq, const float* xd, float* y, int rows, int cols, int nx) {
  GRID_PREFETCH_ROWS(w, 2, rows, (cols / 256) * 210);
  GRID_DEPEND();
  mv_q6_k_xn<2, 8>(w, xq, xd, y, rows, cols, nx);
}
#define MV_B32X(name, B)                                                                                       \
  KERNEL void __launch_bounds__(128)                                                                           \
      mv_##name##_x8(const u8* w, const i8* xq, const float* xd, float* y, int rows, int cols, int nx) { GRID_DEPEND();       \
    mv_b32_xn<B, 8>(w, xq, xd, y, rows, cols, nx);                                                             \
  }
MV_B32X(q4_0, B8Q4_0)
MV_B32X(q4_1, B8Q4_1)
MV_B32X(q5_0, B8Q5_0)
MV_B32X(q5_1, B8Q5_1)
MV_B32X(q8_0, B8Q8_0)
