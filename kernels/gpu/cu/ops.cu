// ops.cu: the element-wise and per-row ops of the forward pass.
#include "common.h"
#include "norm.h"
#include "rope.h"

// RMSNorm, one block per row: dst[r] = x[r] / sqrt(mean(x[r]²) + eps) ⊙ w.
KERNEL void __launch_bounds__(256) rmsnorm(float* dst, const float* x, const float* w, int cols, float eps) {
  GRID_DEPEND();
  __shared__ float scratch[32];
  const float* xr = x + (size_t)blockIdx.x * cols;
  float* dr = dst + (size_t)blockIdx.x * cols;
  float s = 0.0f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) s = fmaf(xr[c], xr[c], s);
  s = block_sum(s, scratch);
  float inv = 1.0f / sqrtf(s / (float)cols + eps);
  for (int c = threadIdx.x; c < cols; c += blockDim.x) dr[c] = xr[c] * inv * w[c];
}

KERNEL void __launch_bounds__(1024) rmsnorm_row(float* dst, float* x, const float* r, const float* w, int cols,
                                                float eps, i8* q, float* d) {
  GRID_WAIT();  // rmsnorm_row_body triggers the next kernel once its loads are in
  __shared__ float scratch[32];
  rmsnorm_row_body(dst, x, r, w, cols, eps, q, d, blockIdx.x, scratch);
}

// rmsnorm_row2: rmsnorm_row over two sets of rows of one width, the first
// na rows of xa with wa, then those of xb with wb (the queries' and the
// keys' head norms in one launch); each row the bits rmsnorm_row gives it.
KERNEL void __launch_bounds__(1024) rmsnorm_row2(float* dsta, float* xa, const float* wa, int na, float* dstb, float* xb,
                                                 const float* wb, int cols, float eps) {
  GRID_DEPEND();
  __shared__ float scratch[32];
  int row = blockIdx.x;
  if (row < na)
    rmsnorm_row_body(dsta, xa, nullptr, wa, cols, eps, nullptr, nullptr, row, scratch);
  else
    rmsnorm_row_body(dstb, xb, nullptr, wb, cols, eps, nullptr, nullptr, row - na, scratch);
}

// x += r, then RMSNorm, one block per row (the prompt shape).
//   x, r, dst [rows][cols]
KERNEL void __launch_bounds__(256) add_rmsnorm(float* dst, float* x, const float* r, const float* w, int cols, float eps) {
  GRID_DEPEND();
  __shared__ float scratch[32];
  float* xr = x + (size_t)blockIdx.x * cols;
  const float* rr = r + (size_t)blockIdx.x * cols;
  float* dr = dst + (size_t)blockIdx.x * cols;
  float s = 0.0f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    float v = xr[c] + rr[c];
    xr[c] = v;
    s = fmaf(v, v, s);
  }
  s = block_sum(s, scratch);
  float inv = 1.0f / sqrtf(s / (float)cols + eps);
  for (int c = threadIdx.x; c < cols; c += blockDim.x) dr[c] = xr[c] * inv * w[c];
}

// dst = silu(gate) ⊙ up, silu(g) = g / (1 + e^-g).
KERNEL void __launch_bounds__(256) silu_mul(float* dst, const float* gate, const float* up, int n) {
  GRID_DEPEND();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    float g = gate[i];
    dst[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

// silu_mul that also writes dst quantized to 8-bit blocks of 32 (n a
// multiple of 32), the input of the down projection.
KERNEL void __launch_bounds__(256) silu_mul_q8(float* dst, const float* gate, const float* up, int n, i8* q, float* d) {
  GRID_WAIT();
  for (int i0 = blockIdx.x * blockDim.x; i0 < n; i0 += gridDim.x * blockDim.x) {
    int i = i0 + threadIdx.x;
    float v = 0.0f;
    if (i < n) {
      float g = gate[i];
      v = g / (1.0f + expf(-g)) * up[i];
      dst[i] = v;
    }
    GRID_TRIGGER();  // v holds this thread's loads (common.h: GRID_WAIT)
    q8_group(v, i, n, q, d);
  }
}

// dst = a + b.
KERNEL void __launch_bounds__(256) add(float* dst, const float* a, const float* b, int n) {
  GRID_DEPEND();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = a[i] + b[i];
}

// x [n][cols] += b [cols].
KERNEL void __launch_bounds__(256) add_bias(float* x, const float* b, int n, int cols) {
  GRID_DEPEND();
  int total = n * cols;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) x[i] += b[i % cols];
}

// RoPE in place, one thread per rotated pair.
//   x [n][heads][headDim]; pairs i < dim/2 of each head; token t at pos0+t.
// posp, when set, holds pos0 in device memory (a replayed decode graph).
// The angle (pos·scale·base^(-2i/dim) / freqs[i]) and its sine and cosine
// are computed in double: positions reach 10^5 and a float angle would be
// off by 10^-2 radians there.
KERNEL void __launch_bounds__(256) rope(float* x, int n, int heads, int headDim, int pos0, int dim, float base, float scale,
                 const float* freqs, int neox, const i32* posp) {
  GRID_DEPEND();
  if (posp) pos0 = *posp;
  int half = dim / 2;
  int total = n * heads * half;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    int p = i % half;
    int h = (i / half) % heads;
    int t = i / (half * heads);
    rope_pair(x, t, h, p, pos0 + t, heads, headDim, dim, base, scale, freqs, neox);
  }
}

// rope_at is rope with token t at position pos[t] (a batched step's rows,
// each from its own sequence).
KERNEL void __launch_bounds__(256) rope_at(float* x, int n, int heads, int headDim, const i32* pos, int dim, float base, float scale,
                    const float* freqs, int neox) {
  GRID_DEPEND();
  int half = dim / 2;
  int total = n * heads * half;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    int p = i % half;
    int h = (i / half) % heads;
    int t = i / (half * heads);
    rope_pair(x, t, h, p, pos[t], heads, headDim, dim, base, scale, freqs, neox);
  }
}

// qkv_prep makes one token's queries, keys and values ready for attention
// in one launch (a decode step) with the bits of the three it replaces
// (rmsnorm_row2, rope over the adjacent queries and keys, kv_store): block
// h < nq takes query head h, block nq + j key head j and value head j. A
// head is normalised in place with qw (queries) or kw (keys) where set
// (rmsnorm_row's arithmetic: launch with rmsnorm_row's block), rotated at
// position pos (rope_pair), and a key head and its value head are stored
// in row pos of the layer's cache (kv_store's conversion).
//   q [nq][D], k, v [nk][D] f32; kc, vc [ctx][nk·D]; grid nq + nk
// posp, when set, holds pos in device memory (a replayed decode graph).
template <class KT>
static __device__ void qkv_prep(float* q, float* k, const float* v, const float* qw, const float* kw, int nq, int nk, int D,
                                float eps, KT* kc, KT* vc, int pos, const i32* posp, int dim, float base, float scale,
                                const float* freqs, int neox, float* scratch) {
  if (posp) pos = *posp;
  bool isq = (int)blockIdx.x < nq;
  int h = isq ? blockIdx.x : blockIdx.x - nq;
  float* x = isq ? q : k;
  const float* w = isq ? qw : kw;
  if (w) {
    rmsnorm_row_body(x, x, nullptr, w, D, eps, nullptr, nullptr, h, scratch);
    __syncthreads();  // the pairs below read values other threads normalised
  }
  for (int p = threadIdx.x; p < dim / 2; p += blockDim.x) rope_pair(x, 0, h, p, pos, isq ? nq : nk, D, dim, base, scale, freqs, neox);
  if (isq) return;
  __syncthreads();
  size_t o = (size_t)pos * nk * D + (size_t)h * D;
  const float* kh = x + (size_t)h * D;
  const float* vh = v + (size_t)h * D;
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    stkv(kc, o + i, kh[i]);
    stkv(vc, o + i, vh[i]);
  }
}

#define QKV_PREP(sfx, KT)                                                                                          \
  KERNEL void __launch_bounds__(1024) qkv_prep_##sfx(float* q, float* k, const float* v, const float* qw,          \
                                                     const float* kw, int nq, int nk, int D, float eps, KT* kc,    \
                                                     KT* vc, int pos, const i32* posp, int dim, float base,        \
                                                     float scale, const float* freqs, int neox) {                  \
    GRID_DEPEND();                                                                                                 \
    __shared__ float scratch[32];                                                                                  \
    qkv_prep<KT>(q, k, v, qw, kw, nq, nk, D, eps, kc, vc, pos, posp, dim, base, scale, freqs, neox, scratch);     \
  }
QKV_PREP(f16, u16)
QKV_PREP(f32, float)

// The token and position a replayed decode graph reads (step[0], step[1]).
KERNEL void __launch_bounds__(32) set_step(i32* step, int token, int pos) {
  GRID_DEPEND();
  if (threadIdx.x == 0) {
    step[0] = token;
    step[1] = pos;
  }
}

// argmax_merge keeps the better of (bv, bi) and (ov, oi): the larger
// value, the lower index among equals.
DEV void argmax_merge(float& bv, int& bi, float ov, int oi) {
  if (ov > bv || (ov == bv && oi < bi)) {
    bv = ov;
    bi = oi;
  }
}

// argmax_block reduces (bv, bi) over the block; thread 0 gets the result.
DEV void argmax_block(float& bv, int& bi) {
  __shared__ float sv[32];
  __shared__ int si[32];
  for (int o = warpSize / 2; o > 0; o >>= 1) argmax_merge(bv, bi, SHFL_XOR(bv, o), SHFL_XOR(bi, o));
  int lane = threadIdx.x % warpSize, w = threadIdx.x / warpSize, nw = blockDim.x / warpSize;
  if (lane == 0) {
    sv[w] = bv;
    si[w] = bi;
  }
  __syncthreads();
  if (w == 0) {
    bv = lane < nw ? sv[lane] : __int_as_float(0xff800000u);
    bi = lane < nw ? si[lane] : 0x7fffffff;
    for (int o = warpSize / 2; o > 0; o >>= 1) argmax_merge(bv, bi, SHFL_XOR(bv, o), SHFL_XOR(bi, o));
  }
}

// Argmax of one long row in two launches: block b reduces the slice
// [b·chunk, (b+1)·chunk) to part (value, index); argmax_parts reduces the
// parts (one block). A single block would walk a vocabulary of 10^5 with
// one load in flight per thread.
KERNEL void __launch_bounds__(256) argmax_slices(const float* x, int cols, int chunk, float* pv, i32* pi) {
  GRID_DEPEND();
  int c0 = blockIdx.x * chunk, c1 = min(cols, c0 + chunk);
  float bv = __int_as_float(0xff800000u);  // -inf: a row of -inf still has an argmax
  int bi = 0x7fffffff;
  for (int c = c0 + threadIdx.x; c < c1; c += blockDim.x) argmax_merge(bv, bi, x[c], c);
  argmax_block(bv, bi);
  if (threadIdx.x == 0) {
    pv[blockIdx.x] = bv;
    pi[blockIdx.x] = bi;
  }
}

KERNEL void __launch_bounds__(256) argmax_parts(const float* pv, const i32* pi, int parts, i32* out) {
  GRID_DEPEND();
  float bv = __int_as_float(0xff800000u);
  int bi = 0x7fffffff;
  for (int i = threadIdx.x; i < parts; i += blockDim.x) argmax_merge(bv, bi, pv[i], pi[i]);
  argmax_block(bv, bi);
  if (threadIdx.x == 0) out[0] = bi;
}

// Argmax of each row: one block per row; ties go to the lowest index.
//   x [rows][cols] -> out [rows]
KERNEL void __launch_bounds__(256) argmax_rows(const float* x, i32* out, int cols) {
  GRID_DEPEND();
  const float* xr = x + (size_t)blockIdx.x * cols;
  float bv = __int_as_float(0xff800000u);
  int bi = 0x7fffffff;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) argmax_merge(bv, bi, xr[c], c);
  argmax_block(bv, bi);
  if (threadIdx.x == 0) out[blockIdx.x] = bi;
}

// One top-k step: block b takes candidates [b·chunk, (b+1)·chunk) of
// (vals, idx) (idx null: the index is the position) and writes its k best,
// in descending order, to ovals/oidx [b·k…]. k rounds of a block argmax
// over the chunk held in shared memory; ties go to the lowest index.
#define TOPK_CHUNK 4096
KERNEL void __launch_bounds__(256) topk_step(const float* vals, const i32* idx, int count, int k, float* ovals, i32* oidx) {
  GRID_DEPEND();
  __shared__ float sv[TOPK_CHUNK];
  __shared__ float rv[32];
  __shared__ int ri[32];
  int base = blockIdx.x * TOPK_CHUNK;
  int m = min(TOPK_CHUNK, count - base);
  for (int i = threadIdx.x; i < TOPK_CHUNK; i += blockDim.x) sv[i] = i < m ? vals[base + i] : -3.4e38f;
  __syncthreads();
  int lane = threadIdx.x % warpSize, w = threadIdx.x / warpSize, nw = blockDim.x / warpSize;
  for (int r = 0; r < k; r++) {
    float bv = -3.4e38f;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < m; i += blockDim.x) {
      float v = sv[i];
      int gi = idx ? idx[base + i] : base + i;
      if (v > bv || (v == bv && gi < bi)) { bv = v; bi = gi; }
    }
    for (int o = warpSize / 2; o > 0; o >>= 1) {
      float ov = SHFL_XOR(bv, o);
      int oi = SHFL_XOR(bi, o);
      if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
    }
    if (lane == 0) { rv[w] = bv; ri[w] = bi; }
    __syncthreads();
    bv = lane < nw ? rv[lane] : -3.4e38f;
    bi = lane < nw ? ri[lane] : 0x7fffffff;
    for (int o = warpSize / 2; o > 0; o >>= 1) {
      float ov = SHFL_XOR(bv, o);
      int oi = SHFL_XOR(bi, o);
      if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
    }
    // bv, bi now the block's best in every thread; remove it from the chunk
    for (int i = threadIdx.x; i < m; i += blockDim.x) {
      int gi = idx ? idx[base + i] : base + i;
      if (gi == bi) sv[i] = -3.4e38f;
    }
    if (threadIdx.x == 0) {
      ovals[blockIdx.x * k + r] = bv;
      oidx[blockIdx.x * k + r] = bi;
    }
    __syncthreads();
  }
}
