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

template <class T>
static __device__ void mv_plain(const u8* __restrict__ w, const float* __restrict__ x, float* __restrict__ y,
                                int rows, int cols, int nx) {
  int lane = threadIdx.x % warpSize;
  int row = blockIdx.x * (blockDim.x / warpSize) + threadIdx.x / warpSize;
  if (row >= rows) return;
  const u8* wr = w + (size_t)row * cols * T::ES;
  float acc[MV_MAXNX];
#pragma unroll
  for (int j = 0; j < MV_MAXNX; j++) acc[j] = 0.0f;
  for (int c = lane; c < cols; c += warpSize) {
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

#define MV_BLOCK(name, T)                                                                               \
  KERNEL void __launch_bounds__(128) mv_##name(const u8* w, const float* x, float* y, int rows, int cols, int nx) {            \
    mv_block<T>(w, x, y, rows, cols, nx);                                                               \
  }
#define MV_PLAIN(name, T)                                                                               \
  KERNEL void __launch_bounds__(128) mv_##name(const u8* w, const float* x, float* y, int rows, int cols, int nx) {            \
    mv_plain<T>(w, x, y, rows, cols, nx);                                                               \
  }
FOR_BLOCK_TYPES(MV_BLOCK)
FOR_PLAIN_TYPES(MV_PLAIN)

// ---- fast kernels -----------------------------------------------------------

// byte_f(w, i): byte i of w as a float offset by 2^23 (subtract 8388608).
#if defined(FORGE_CUDA)
#define BYTE_F(w, i) __uint_as_float(__byte_perm((w), 0x4B000000u, 0x7540u | (i)))
#else
#define BYTE_F(w, i) __uint_as_float((((w) >> (8 * (i))) & 0xFFu) | 0x4B000000u)
#endif

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

KERNEL void __launch_bounds__(128) mv_q4_k_p4(const u8* w, const float* x, float* y, int rows, int cols) { mv_q4_k_pipe<4>(w, x, y, rows, cols); }
KERNEL void __launch_bounds__(128) mv_q4_k_p1(const u8* w, const float* x, float* y, int rows, int cols) { mv_q4_k_pipe<1>(w, x, y, rows, cols); }
KERNEL void __launch_bounds__(128) mv_q4_k_p2(const u8* w, const float* x, float* y, int rows, int cols) { mv_q4_k_pipe<2>(w, x, y, rows, cols); }

#define MV_Q4K_FAST(R, U)                                                                         \
  KERNEL void __launch_bounds__(128) mv_q4_k_r##R##u##U(const u8* w, const float* x, float* y, int rows, int cols) {     \
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
DEV u32 ld2x16(const u8* p) {
  const u16* q = (const u16*)p;
  return (u32)q[0] | ((u32)q[1] << 16);
}

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

KERNEL void __launch_bounds__(128) mv_q6_k_p4(const u8* w, const float* x, float* y, int rows, int cols) { mv_q6_k_pipe<4>(w, x, y, rows, cols); }
KERNEL void __launch_bounds__(128) mv_q6_k_p1(const u8* w, const float* x, float* y, int rows, int cols) { mv_q6_k_pipe<1>(w, x, y, rows, cols); }
KERNEL void __launch_bounds__(128) mv_q6_k_p2(const u8* w, const float* x, float* y, int rows, int cols) { mv_q6_k_pipe<2>(w, x, y, rows, cols); }

KERNEL void __launch_bounds__(128) mv_q6_k_r1u1(const u8* w, const float* x, float* y, int rows, int cols) {
  mv_q6_k_fast<1>(w, x, y, rows, cols);
}
KERNEL void __launch_bounds__(128) mv_q6_k_r2u1(const u8* w, const float* x, float* y, int rows, int cols) {
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
  mv_q6_k_stage<1>(w, x, y, rows, cols);
}
KERNEL void __launch_bounds__(128) mv_q6_k_s2(const u8* w, const float* x, float* y, int rows, int cols) {
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

// x [n] f32 -> q [n] int8, d [n/32] f32 with x ≈ q·d, d = max|x|/127.
// One thread per value; 32 consecutive threads share a block.
KERNEL void __launch_bounds__(256) quantize_q8(const float* x, i8* q, float* d, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  q8_group(i < n ? x[i] : 0.0f, i, n, q, d);
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

// Up to three Q4_K matrices of the same width on the same q8 input in one
// launch (Q, K and V; gate and up): the warps stride over the rows of all
// of them as one list (rows r0, then r1, then r2), so the small ones do not
// each pay a launch and a partly filled grid. One row per warp.
template <int U>
static __device__ void mv_q4_k_q8m(const u8* w0, float* y0, int r0, const u8* w1, float* y1, int r1, const u8* w2,
                                   float* y2, int r2, const i8* __restrict__ xq, const float* __restrict__ xd,
                                   int cols) {
  int lane = threadIdx.x % warpSize;
  size_t rb = (size_t)(cols / 256) * 144;
  int total = r0 + r1 + r2;
  for (int v = blockIdx.x * (blockDim.x / warpSize) + threadIdx.x / warpSize; v < total;
       v += gridDim.x * (blockDim.x / warpSize)) {
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
    float acc[1];
    q4k_q8_rows<1, U, true>(wr, xq, xd, cols, acc);
    if (lane == 0) y[row] = acc[0];
  }
}

KERNEL void __launch_bounds__(128) mv_q4_k_n12m(const u8* w0, float* y0, int r0, const u8* w1, float* y1, int r1, const u8* w2, float* y2,
                         int r2, const i8* xq, const float* xd, int cols) {
  mv_q4_k_q8m<2>(w0, y0, r0, w1, y1, r1, w2, y2, r2, xq, xd, cols);
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

#define MV_Q8X(R, U)                                                                                           \
  KERNEL void __launch_bounds__(128) mv_q4_k_q##R##U(const u8* w, const i8* xq, const float* xd, float* y, int rows, int cols) {      \
    mv_q4_k_q8<R, U, false>(w, xq, xd, y, rows, cols);                                                         \
  }                                                                                                            \
  KERNEL void __launch_bounds__(128) mv_q4_k_n##R##U(const u8* w, const i8* xq, const float* xd, float* y, int rows, int cols) {      \
    mv_q4_k_q8<R, U, true>(w, xq, xd, y, rows, cols);                                                          \
  }                                                                                                            \
  KERNEL void __launch_bounds__(128) mv_q6_k_q##R##U(const u8* w, const i8* xq, const float* xd, float* y, int rows, int cols) {      \
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
//   block 128 threads; shared 128/4·210·R bytes whatever the warp size
//   needs: rows 16-byte aligned, (cols/256) % (warpSize/4) == 0

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

// q6_run: the arithmetic of one staged run for lane (k, n, t): block k of
// each of the R runs at st (S blocks apart), super-block sb of x.
template <int R>
DEV void q6_run(const u8* st, int S, const i8* __restrict__ xq, const float* __restrict__ xd, int sb, int k, int n,
                int t, u32 sh, float* acc) {
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
    const u8* bp = st + r * S * 210 + k * 210;
    const u8* pal = bp - (sh >> 3);  // word-aligned
    u32 a[4], b[4], h[4], sc[2];
    sh_words<4>(pal + 64 * n + 16 * t, sh, a);
    sh_words<4>(pal + 64 * n + 16 * t + 32, sh, b);
    sh_words<4>(pal + 128 + 32 * n + 16 * t, sh, h);
    sh_words<2>(pal + 192 + 8 * n, sh, sc);
    acc[r] += q6_q8_term(a, b, h, sc[0], sc[1], h2f(*(const u16*)(bp + 208)), t, xv, dxk, sx);
  }
}

template <int R>
static __device__ void mv_q6_k_t8(const u8* __restrict__ w, const i8* __restrict__ xq, const float* __restrict__ xd,
                                  float* __restrict__ y, int rows, int cols) {
  __shared__ __attribute__((aligned(16))) u8 stage[R * 32 * 210 + 16];
  int lane = threadIdx.x % warpSize, warp = threadIdx.x / warpSize;
  int S = warpSize / 4;                 // super-blocks per run, one per 4 lanes
  int n16 = S * 210 / 16;               // 16-byte words per run (S % 8 == 0)
  u8* st = stage + warp * R * S * 210;  // this warp's R runs
  int nsb = cols / 256;
  size_t rb = (size_t)nsb * 210;
  int k = lane >> 2, t4 = lane & 3, n = t4 >> 1, t = t4 & 1;
  u32 sh = 16u * (u32)(k & 1);  // k·210 ≡ 2k (mod 4)
  for (int row0 = (blockIdx.x * (blockDim.x / warpSize) + warp) * R; row0 < rows;
       row0 += gridDim.x * (blockDim.x / warpSize) * R) {
    float acc[R];
    const u8* wr[R];
    uint4 buf[R][4];
#pragma unroll
    for (int r = 0; r < R; r++) {
      acc[r] = 0.0f;
      wr[r] = w + (size_t)min(row0 + r, rows - 1) * rb;
#pragma unroll
      for (int m = 0; m < 4; m++) {
        int i = lane + m * warpSize;
        if (i < n16) buf[r][m] = ld16w<true>(wr[r] + 16 * (size_t)i);
      }
    }
    for (int sb0 = 0; sb0 < nsb; sb0 += S) {
      WARP_SYNC();  // every lane is done reading the previous run
#pragma unroll
      for (int r = 0; r < R; r++) {
        uint4* dst = (uint4*)(st + r * S * 210);
#pragma unroll
        for (int m = 0; m < 4; m++) {
          int i = lane + m * warpSize;
          if (i < n16) dst[i] = buf[r][m];
        }
      }
      if (sb0 + S < nsb) {  // next run in flight during this one's arithmetic
#pragma unroll
        for (int r = 0; r < R; r++) {
          const u8* src = wr[r] + (size_t)(sb0 + S) * 210;
#pragma unroll
          for (int m = 0; m < 4; m++) {
            int i = lane + m * warpSize;
            if (i < n16) buf[r][m] = ld16w<true>(src + 16 * (size_t)i);
          }
        }
      }
      WARP_SYNC();
      q6_run<R>(st, S, xq, xd, sb0 + k, k, n, t, sh, acc);
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
      float s = warp_sum(acc[r]);
      if (lane == 0 && row0 + r < rows) y[row0 + r] = s;
    }
  }
}

// t{R}: R rows per warp
KERNEL void __launch_bounds__(128) mv_q6_k_t1(const u8* w, const i8* xq, const float* xd, float* y, int rows, int cols) {
  mv_q6_k_t8<1>(w, xq, xd, y, rows, cols);
}
KERNEL void __launch_bounds__(128) mv_q6_k_t2(const u8* w, const i8* xq, const float* xd, float* y, int rows, int cols) {
  mv_q6_k_t8<2>(w, xq, xd, y, rows, cols);
}
KERNEL void __launch_bounds__(128) mv_q6_k_t4(const u8* w, const i8* xq, const float* xd, float* y, int rows, int cols) {
  mv_q6_k_t8<4>(w, xq, xd, y, rows, cols);
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
  u32 sh = 16u * (u32)(k & 1);
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
    q6_run<R>(st, S, xq, xd, c * S + k, k, n, t, sh, acc);
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
  mv_q6_k_c8<1>(w, xq, xd, y, rows, cols);
}
KERNEL void __launch_bounds__(128) mv_q6_k_c2(const u8* w, const i8* xq, const float* xd, float* y, int rows, int cols) {
  mv_q6_k_c8<2>(w, xq, xd, y, rows, cols);
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

// mv_{type}_b{R}: R rows per warp
#define MV_B32(name, B)                                                                                        \
  KERNEL void __launch_bounds__(128)                                                                           \
      mv_##name##_b1(const u8* w, const i8* xq, const float* xd, float* y, int rows, int cols) {               \
    mv_b32_q8<B, 1>(w, xq, xd, y, rows, cols);                                                                 \
  }                                                                                                            \
  KERNEL void __launch_bounds__(128)                                                                           \
      mv_##name##_b2(const u8* w, const i8* xq, const float* xd, float* y, int rows, int cols) {               \
    mv_b32_q8<B, 2>(w, xq, xd, y, rows, cols);                                                                 \
  }                                                                                                            \
  KERNEL void __launch_bounds__(128)                                                                           \
      mv_##name##_b4(const u8* w, const i8* xq, const float* xd, float* y, int rows, int cols) {               \
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
  mv_q4_k_xn<2, 8>(w, xq, xd, y, rows, cols, nx);
}
KERNEL void __launch_bounds__(128)
    mv_q4_k_x16r2(const u8* w, const i8* xq, const float* xd, float* y, int rows, int cols, int nx) {
  mv_q4_k_xn<2, 16>(w, xq, xd, y, rows, cols, nx);
}
KERNEL void __launch_bounds__(128)
    mv_q6_k_x8r2(const u8* w, const i8* xq, const float* xd, float* y, int rows, int cols, int nx) {
  mv_q6_k_xn<2, 8>(w, xq, xd, y, rows, cols, nx);
}
#define MV_B32X(name, B)                                                                                       \
  KERNEL void __launch_bounds__(128)                                                                           \
      mv_##name##_x8(const u8* w, const i8* xq, const float* xd, float* y, int rows, int cols, int nx) {       \
    mv_b32_xn<B, 8>(w, xq, xd, y, rows, cols, nx);                                                             \
  }
MV_B32X(q4_0, B8Q4_0)
MV_B32X(q4_1, B8Q4_1)
MV_B32X(q5_0, B8Q5_0)
MV_B32X(q5_1, B8Q5_1)
MV_B32X(q8_0, B8Q8_0)
