// attn.cu: causal grouped-query attention over an f16 KV cache.
//
//   q, out [n][heads][D] f32; kc, vc [ctx][kvDim] f16 (one layer), kvDim = kvHeads·D
//   token i (position pos0+i) attends to positions 0…pos0+i.
//
// Both kernels walk the positions in chunks with an online softmax (running
// max m, running sum l, output rescaled by e^(m_old − m_new)), so shared
// memory does not grow with the context.
#include "common.h"
#include "softmax.h"
#include "rope.h"

#define ATT_CH 256

// Cache elements are f16 (the default) or f32 (exact, for checking against a
// float reference); ldkv widens either to float.
DEV float ldkv(const u16* p, size_t i) { return h2f(p[i]); }
DEV float ldkv(const float* p, size_t i) { return p[i]; }
// ld2kv reads elements 2i and 2i+1 with one load (rows are even-sized).
DEV void ld2kv(const u16* p, int i, float* a, float* b) {
  u32 v = ((const u32*)p)[i];
  *a = h2f(v & 0xFFFF);
  *b = h2f(v >> 16);
}
DEV void ld2kv(const float* p, int i, float* a, float* b) {
  float2 v = ((const float2*)p)[i];
  *a = v.x;
  *b = v.y;
}
// kdot_pairs is q·k two values at a time, for any row type ld2kv reads.
template <typename T>
DEV float kdot_pairs(const T* kr, const float* qs, int D) {
  float s0 = 0.0f, s1 = 0.0f;
#pragma unroll 8
  for (int d = 0; d < D / 2; d++) {
    float a, b;
    ld2kv(kr, d, &a, &b);
    s0 = fmaf(qs[2 * d], a, s0);
    s1 = fmaf(qs[2 * d + 1], b, s1);
  }
  return s0 + s1;
}
// kdot is q·k for one cached key row kr of D values (q in shared memory).
// f16 rows are read 16 bytes at a time, all loads of a row in flight at
// once (a decode step's blocks each score few positions, so the latency of
// one row's loads is the kernel's time).
DEV float kdot(const u16* kr, const float* qs, int D) {
  if ((D & 7) == 0) {
    const uint4* k4 = (const uint4*)kr;
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma unroll 8
    for (int i = 0; i < D / 8; i++) {
      uint4 v = k4[i];
      const float* qq = qs + 8 * i;
      s0 = fmaf(qq[0], h2f(v.x & 0xFFFF), s0);
      s1 = fmaf(qq[1], h2f(v.x >> 16), s1);
      s2 = fmaf(qq[2], h2f(v.y & 0xFFFF), s2);
      s3 = fmaf(qq[3], h2f(v.y >> 16), s3);
      s0 = fmaf(qq[4], h2f(v.z & 0xFFFF), s0);
      s1 = fmaf(qq[5], h2f(v.z >> 16), s1);
      s2 = fmaf(qq[6], h2f(v.w & 0xFFFF), s2);
      s3 = fmaf(qq[7], h2f(v.w >> 16), s3);
    }
    return (s0 + s1) + (s2 + s3);
  }
  return kdot_pairs(kr, qs, D);
}
DEV float kdot(const float* kr, const float* qs, int D) { return kdot_pairs(kr, qs, D); }

// Store n new keys and values at positions pos0… of one layer's cache
// ([ctx][kvDim] each).
template <class KT>
static __device__ void kv_store(KT* kc, KT* vc, const float* k, const float* v, int n, int kvDim, int pos0,
                                const i32* posp) {
  if (posp) pos0 = *posp;
  int total = n * kvDim;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    size_t o = (size_t)pos0 * kvDim + i;
    stkv(kc, o, k[i]);
    stkv(vc, o, v[i]);
  }
}

// put_out writes output element o (= head offset + d) of a one-token step,
// and with oq its 8-bit copy for the output projection (see q8_group: the
// caller keeps whole warps in or out, D a multiple of 32).
DEV void put_out(float* out, size_t o, float v, i8* oq, float* od) {
  out[o] = v;
  if (oq) q8_group(v, (int)o, 0x7fffffff, oq, od);
}

// combine_splits merges the splits of one (token, head) of attn_decode:
// out = Σ_z e^(m_z−M)·acc_z / Σ_z e^(m_z−M)·l_z into out[o0…o0+D). The
// parts were written by other blocks of the same launch: read them past L1
// (volatile).
// A sink (sink set, gpt-oss) joins as in paged_finish.
DEV void combine_splits(float* out, size_t o0, const volatile float* pp, int D, int splits, i8* oq, float* od,
                        const float* sink) {
  float M = -3.0e38f;
  for (int z = 0; z < splits; z++) M = fmaxf(M, pp[z * (D + 2)]);
  if (sink) M = fmaxf(M, *sink);
  float L = 0.0f;
  for (int z = 0; z < splits; z++) L += pp[z * (D + 2) + 1] * expf(pp[z * (D + 2)] - M);
  if (sink) L += expf(*sink - M);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float a = 0.0f;
    for (int z = 0; z < splits; z++) a += pp[z * (D + 2) + 2 + d] * expf(pp[z * (D + 2)] - M);
    put_out(out, o0 + d, a / L, oq, od);
  }
}

// Decode shape: one block per (head, token, split). Split z covers
// positions [z·splitLen, (z+1)·splitLen) of the token's 0…pos0+t, so a long
// context spreads over many blocks (flash-decoding); with one split the
// block writes the output, with several it writes its running max m, sum l
// and unnormalised output to part [n][heads][splits][D+2], and the last
// block of a (token, head) to finish (counted in count [n][heads], which it
// sets back to zero for the next launch) merges them: no second launch.
// With oq (one token, D a multiple of 32) the output is also quantized to
// 8-bit blocks (codes oq, scales od) for the output projection.
// Keys: one warp per position, lanes split the head dimension; values: one
// thread per output dimension.
// posp, when set, holds pos0 in device memory (a replayed decode graph,
// whose grid was fixed at capture): each split then covers
// ceil((pos0+n)/splits) positions, and splits past the end write an empty
// part (m = -3e38, l = 0) that the merge weighs by zero.
// sinks, when set, holds one logit per head (gpt-oss's attention sinks),
// folded in where the output is normalised (combine_splits, sink_inv).
//   grid (heads, n, splits), block 128, D ≤ 256
// RopeIn is what attn_decode_rope adds: the token's key and value heads
// (k, v [kvHeads·D] f32) before RoPE and the store, and the rotation's
// arguments (rope_pair's).
struct RopeIn {
  const float* k;
  const float* v;
  int dim;
  float base, scale;
  const float* freqs;
  int neox;
};

template <class KT, bool ROPE>
static __device__ void attn_decode(float* out, float* part, const float* q, const KT* kc, const KT* vc, int heads,
                                   int kvHeads, int D, int pos0, float scale, int splitLen, const i32* posp,
                                   int* count, i8* oq, float* od, const float* sinks, int minSplit, RopeIn ro) {
  if (posp) {
    pos0 = *posp;
    splitLen = max(minSplit, (pos0 + (int)gridDim.y + (int)gridDim.z - 1) / (int)gridDim.z);
  }
  __shared__ float qs[256];
  __shared__ float ps[ATT_CH];
  __shared__ float scratch[32];
  __shared__ float kf[ROPE ? 256 : 1];                             // the new key, rotated
  __shared__ __attribute__((aligned(16))) KT kcur[ROPE ? 256 : 8];  // it and the new value as the cache holds them
  __shared__ __attribute__((aligned(16))) KT vcur[ROPE ? 256 : 8];
  int h = blockIdx.x, t = blockIdx.y, z = blockIdx.z;
  int kvDim = kvHeads * D;
  int kvh = h / (heads / kvHeads);
  int L = pos0 + t + 1;
  int p0 = z * splitLen, p1 = min(L, p0 + splitLen);
  const float* qh = q + ((size_t)t * heads + h) * D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) qs[d] = qh[d];
  bool mine = ROPE && p0 <= pos0 && pos0 < p1;  // this split holds the new position
  if (mine)
    for (int d = threadIdx.x; d < D; d += blockDim.x) kf[d] = ro.k[(size_t)kvh * D + d];
  __syncthreads();
  if (ROPE) {  // qkv_prep's rotation, in shared memory (one token: t = 0)
    for (int p = threadIdx.x; p < ro.dim / 2; p += blockDim.x) {
      rope_pair(qs, 0, 0, p, pos0, 1, D, ro.dim, ro.base, ro.scale, ro.freqs, ro.neox);
      if (mine) rope_pair(kf, 0, 0, p, pos0, 1, D, ro.dim, ro.base, ro.scale, ro.freqs, ro.neox);
    }
    __syncthreads();
    if (mine) {  // the cache's rounding of the new row; the group's first head stores it
      size_t o = (size_t)pos0 * kvDim + (size_t)kvh * D;
      for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float vv = ro.v[(size_t)kvh * D + d];
        stkv(kcur, d, kf[d]);
        stkv(vcur, d, vv);
        if (h % (heads / kvHeads) == 0) {
          stkv((KT*)kc, o + d, kf[d]);
          stkv((KT*)vc, o + d, vv);
        }
      }
      __syncthreads();
    }
  }
  float m = -3.0e38f, l = 0.0f;
  float acc0 = 0.0f, acc1 = 0.0f;
  int d0 = threadIdx.x, d1 = threadIdx.x + blockDim.x;
  const KT* kb = kc + (size_t)kvh * D;
  const KT* vb = vc + (size_t)kvh * D;
  for (int c0 = p0; c0 < p1; c0 += ATT_CH) {
    int cl = min(ATT_CH, p1 - c0);
    // scores: one thread per position, its whole key row read in pairs
    // (many independent loads in flight, unlike a warp reduction per key)
    for (int j = threadIdx.x; j < cl; j += blockDim.x) {
      const KT* kr = mine && c0 + j == pos0 ? kcur : kb + (size_t)(c0 + j) * kvDim;  // the new key: not yet in the cache
      ps[j] = kdot(kr, qs, D) * scale;
    }
    __syncthreads();
    softmax_chunk(ps, cl, m, l, acc0, acc1, scratch);
#pragma unroll 8
    for (int j = 0; j < cl; j++) {
      const KT* vr = mine && c0 + j == pos0 ? vcur : vb + (size_t)(c0 + j) * kvDim;
      float p = ps[j];
      if (d0 < D) acc0 = fmaf(p, ldkv(vr, d0), acc0);
      if (d1 < D) acc1 = fmaf(p, ldkv(vr, d1), acc1);
    }
    __syncthreads();
  }
  GRID_TRIGGER();  // the keys and values are read (common.h: GRID_WAIT)
  if (part) {
    float* pp = part + (((size_t)t * heads + h) * gridDim.z + z) * (D + 2);
    if (threadIdx.x == 0) {
      pp[0] = m;
      pp[1] = l;
    }
    if (d0 < D) pp[2 + d0] = acc0;
    if (d1 < D) pp[2 + d1] = acc1;
    __shared__ int last;
    __threadfence();  // this block's part is visible before it is counted
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&count[t * heads + h], 1) == (int)gridDim.z - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    combine_splits(out, ((size_t)t * heads + h) * D, part + ((size_t)t * heads + h) * gridDim.z * (D + 2), D,
                   gridDim.z, oq, od, sinks ? sinks + h : nullptr);
    if (threadIdx.x == 0) count[t * heads + h] = 0;
    return;
  }
  size_t o0 = ((size_t)t * heads + h) * D;
  float inv = sink_inv(l, m, sinks, h);
  if (d0 < D) put_out(out, o0 + d0, acc0 * inv, oq, od);
  if (d1 < D) put_out(out, o0 + d1, acc1 * inv, oq, od);
}


// Prompt shape: one block per (head, tile of QT tokens). Each chunk of PCH
// keys and values is staged once in shared memory and used by all QT
// queries of the tile, which cuts cache reads by QT against the decode
// shape. Rows are padded by 4 bytes so the PCH threads scoring one query
// read distinct banks. sinks, when set, holds one logit per head
// (gpt-oss), folded in at the end (sink_inv).
//   grid (heads, ceil(n/QT)), block 256, D ≤ 256
#define QT 8
template <class KT>
static __device__ void attn_prompt(float* out, const float* q, const KT* kc, const KT* vc, int n, int heads,
                                   int kvHeads, int D, int pos0, float scale, const float* sinks) {
  constexpr int PCH = 64 / (int)sizeof(KT);  // 32 positions of f16, 16 of f32: 33 KB either way
  constexpr int PAD = 4 / (int)sizeof(KT);
  __shared__ float qs[QT][256];
  __shared__ __attribute__((aligned(16))) KT ks[PCH * (256 + PAD)];
  __shared__ __attribute__((aligned(16))) KT vs[PCH * (256 + PAD)];
  __shared__ float ps[QT][PCH];
  __shared__ float alph[QT];
  __shared__ float lsum[QT];
  __shared__ float mfin[QT];  // each row's final running max (for its sink)
  int h = blockIdx.x, t0 = blockIdx.y * QT;
  int qn = min(QT, n - t0);
  int kvDim = kvHeads * D;
  int kvh = h / (heads / kvHeads);
  int RS = D + PAD;  // shared row stride in elements
  int nt = blockDim.x;
  for (int i = threadIdx.x; i < QT * D; i += nt) {
    int qi = i / D, d = i % D;
    qs[qi][d] = qi < qn ? q[((size_t)(t0 + qi) * heads + h) * D + d] : 0.0f;
  }
  int lane = threadIdx.x % warpSize, w = threadIdx.x / warpSize, nw = nt / warpSize;
  // running max of query rows w and w+nw (nw ≥ 4 warps of a 256-thread block)
  float mrow[2] = {-3.0e38f, -3.0e38f};
  if (threadIdx.x < QT) lsum[threadIdx.x] = 0.0f;
  float acc[8];  // element threadIdx.x + nt·j of the QT×D output tile
#pragma unroll
  for (int j = 0; j < 8; j++) acc[j] = 0.0f;
  int L = pos0 + t0 + qn;  // positions the last query of the tile sees
  const KT* kb = kc + (size_t)kvh * D;
  const KT* vb = vc + (size_t)kvh * D;
  for (int c0 = 0; c0 < L; c0 += PCH) {
    int cl = min(PCH, L - c0);
    __syncthreads();
    for (int i = threadIdx.x; i < PCH * D; i += nt) {
      int j = i / D, d = i % D;
      KT kv = (KT)0, vv = (KT)0;
      if (j < cl) {
        kv = kb[(size_t)(c0 + j) * kvDim + d];
        vv = vb[(size_t)(c0 + j) * kvDim + d];
      }
      ks[j * RS + d] = kv;
      vs[j * RS + d] = vv;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < QT * PCH; i += nt) {
      int qi = i / PCH, j = i % PCH;
      float s = -3.0e38f;
      if (qi < qn && j < cl && c0 + j <= pos0 + t0 + qi) {
        s = 0.0f;
        const KT* kr = ks + j * RS;
        for (int d = 0; d < D; d++) s = fmaf(qs[qi][d], ldkv(kr, d), s);
        s *= scale;
      }
      ps[qi][j] = s;
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < 2; r++) {  // online softmax, one warp per query row
      int qi = w + nw * r;
      if (qi >= QT) break;
      float cm = -3.0e38f;
      for (int j = lane; j < PCH; j += warpSize) cm = fmaxf(cm, ps[qi][j]);
      cm = warp_max(cm);
      float mn = fmaxf(mrow[r], cm);
      float ls = 0.0f;
      for (int j = lane; j < PCH; j += warpSize) {
        float s = ps[qi][j];
        float p = s <= -3.0e38f ? 0.0f : expf(s - mn);
        ps[qi][j] = p;
        ls += p;
      }
      ls = warp_sum(ls);
      float a = expf(mrow[r] - mn);
      mrow[r] = mn;
      if (lane == 0) {
        alph[qi] = a;
        lsum[qi] = lsum[qi] * a + ls;
      }
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < 8; j++) {
      int o = threadIdx.x + nt * j;
      if (o < QT * D) {
        int qi = o / D, d = o % D;
        float a = acc[j] * alph[qi];
        for (int c = 0; c < cl; c++) a = fmaf(ps[qi][c], ldkv(vs + c * RS, d), a);
        acc[j] = a;
      }
    }
  }
  if (sinks && lane == 0) {
#pragma unroll
    for (int r = 0; r < 2; r++)
      if (w + nw * r < QT) mfin[w + nw * r] = mrow[r];
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < 8; j++) {
    int o = threadIdx.x + nt * j;
    if (o < QT * D) {
      int qi = o / D, d = o % D;
      if (qi < qn)
        out[((size_t)(t0 + qi) * heads + h) * D + d] =
            sinks ? acc[j] * sink_inv(lsum[qi], mfin[qi], sinks, h) : acc[j] / lsum[qi];
    }
  }
}

#define ATTN_KERNELS(sfx, KT)                                                                               \
  KERNEL void __launch_bounds__(256) kv_store_##sfx(KT* kc, KT* vc, const float* k, const float* v, int n, int kvDim, int pos0,   \
                             const i32* posp) { GRID_DEPEND();                                              \
    kv_store<KT>(kc, vc, k, v, n, kvDim, pos0, posp);                                                       \
  }                                                                                                         \
  KERNEL void __launch_bounds__(128) attn_decode_##sfx(float* out, float* part, const float* q, const KT* kc, const KT* vc,      \
                                int heads, int kvHeads, int D, int pos0, float scale, int splitLen,          \
                                const i32* posp, int* count, i8* oq, float* od, const float* sinks,          \
                                int minSplit) { GRID_WAIT();                                                  \
    attn_decode<KT, false>(out, part, q, kc, vc, heads, kvHeads, D, pos0, scale, splitLen, posp, count, oq, od, sinks,  \
                           minSplit, RopeIn{});                                                               \
  }                                                                                                         \
  KERNEL void __launch_bounds__(128) attn_decode_rope_##sfx(float* out, float* part, const float* q, KT* kc, KT* vc,      \
                                int heads, int kvHeads, int D, int pos0, float scale, int splitLen,          \
                                const i32* posp, int* count, i8* oq, float* od, const float* sinks,          \
                                int minSplit, const float* k, const float* v, int dim, float base,           \
                                float rscale, const float* freqs, int neox) { GRID_WAIT();                    \
    attn_decode<KT, true>(out, part, q, kc, vc, heads, kvHeads, D, pos0, scale, splitLen, posp, count, oq, od, sinks,  \
                          minSplit, RopeIn{k, v, dim, base, rscale, freqs, neox});                            \
  }                                                                                                         \
  KERNEL void __launch_bounds__(256) attn_prompt_##sfx(float* out, const float* q, const KT* kc,            \
                                                       const KT* vc, int n, int heads, int kvHeads, int D,   \
                                                       int pos0, float scale, const float* sinks) { GRID_DEPEND();          \
    attn_prompt<KT>(out, q, kc, vc, n, heads, kvHeads, D, pos0, scale, sinks);                              \
  }
ATTN_KERNELS(f16, u16)
ATTN_KERNELS(f32, float)

// ---- paged KV (continuous batching) -----------------------------------------
//
// The pool holds, per layer, keys then values, each [blocks·bs][kvDim]: row
// blk·bs + slot is position slot of a block. A step's layout (SetLayout)
// gives each of its n rows a position pos[i] and a sequence seq[i], and each
// sequence s its block table tabs[toff[s] …]: position p of s is slot p%bs
// of block tabs[toff[s] + p/bs].

// kv_row is the pool row of position p of the sequence whose table is tab.
DEV size_t kv_row(const i32* tab, int p, int bs) { return (size_t)tab[p / bs] * bs + p % bs; }

// Store row i's key and value at its position.
template <class KT>
static __device__ void kv_store_paged(KT* kc, KT* vc, const float* k, const float* v, int n, int kvDim, int bs,
                                      const i32* pos, const i32* seq, const i32* toff, const i32* tabs) {
  int total = n * kvDim;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    int r = i / kvDim, e = i % kvDim;
    size_t o = kv_row(tabs + toff[seq[r]], pos[r], bs) * kvDim + e;
    stkv(kc, o, k[i]);
    stkv(vc, o, v[i]);
  }
}

// PAGED_SPLIT is how many positions one block of attn_paged covers. It is a
// constant, not a share of the grid, so the way a row's positions are cut
// (and so its result) depends on its own length only, never on the other
// rows of the step (batch invariance, kernels.Batcher).
#define PAGED_SPLIT ATT_CH

// paged_finish merges the splits of one (row, head): out = Σ_z e^(m_z−M)·
// acc_z / Σ_z e^(m_z−M)·l_z, z in order, over part [splits][D+2]. Splits
// past the row's end hold m = −3e38, l = 0, acc = 0 and add exact zeros:
// the result is that of the row's own splits, however many the grid has.
// A sink logit sk (gpt-oss; sinks set) joins as one more score with no
// value: M includes it and L gains e^(sk−M); without one (sinks null) the
// arithmetic is the same as before sinks existed.
DEV void paged_finish(float* out, const float* pp, int D, int splits, const float* sink) {
  float M = -3.0e38f;
  for (int z = 0; z < splits; z++) M = fmaxf(M, pp[z * (D + 2)]);
  if (sink) M = fmaxf(M, *sink);
  float L = 0.0f;
  for (int z = 0; z < splits; z++) L += pp[z * (D + 2) + 1] * expf(pp[z * (D + 2)] - M);
  if (sink) L += expf(*sink - M);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float a = 0.0f;
    for (int z = 0; z < splits; z++) a += pp[z * (D + 2) + 2 + d] * expf(pp[z * (D + 2)] - M);
    out[d] = a / L;
  }
}

// Attention of row t, head h over positions [z·PAGED_SPLIT, (z+1)·
// PAGED_SPLIT) ∩ [first, pos[t]] of its sequence (first = pos[t]−window+1
// with a sliding window, window > 0, else 0), as attn_decode's split
// (scores one thread per position, values one thread per dimension, one
// online-softmax chunk); its running max, sum and unnormalised output go to
// part [n][heads][splits][D+2], which attn_paged_merge reduces. One block
// per (head, row, split): decode rows are the hot case; a prompt chunk's
// rows each read their prefix again (correct, not fast).
//   grid (heads, n, splits), block 128, D ≤ 256
template <class KT>
static __device__ void attn_paged(float* part, const float* q, const KT* kc, const KT* vc, int heads, int kvHeads,
                                  int D, float scale, int bs, const i32* pos, const i32* seq, const i32* toff,
                                  const i32* tabs, int window) {
  __shared__ float qs[256];
  __shared__ float ps[PAGED_SPLIT];
  __shared__ u32 rowi[PAGED_SPLIT];
  __shared__ float scratch[32];
  int h = blockIdx.x, t = blockIdx.y, z = blockIdx.z;
  int kvDim = kvHeads * D;
  int kvh = h / (heads / kvHeads);
  int L = pos[t] + 1;
  const i32* tab = tabs + toff[seq[t]];
  int p0 = z * PAGED_SPLIT, cl = min(L, p0 + PAGED_SPLIT);
  if (window > 0) p0 = max(p0, L - window);  // the window's first position
  cl -= p0;
  float* pp = part + (((size_t)t * heads + h) * gridDim.z + z) * (D + 2);
  int d0 = threadIdx.x, d1 = threadIdx.x + blockDim.x;
  if (cl <= 0) {  // past the row's end: an empty split
    if (threadIdx.x == 0) {
      pp[0] = -3.0e38f;
      pp[1] = 0.0f;
    }
    if (d0 < D) pp[2 + d0] = 0.0f;
    if (d1 < D) pp[2 + d1] = 0.0f;
    return;
  }
  const float* qh = q + ((size_t)t * heads + h) * D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) qs[d] = qh[d];
  for (int j = threadIdx.x; j < cl; j += blockDim.x) rowi[j] = (u32)kv_row(tab, p0 + j, bs);
  __syncthreads();
  const KT* kb = kc + (size_t)kvh * D;
  const KT* vb = vc + (size_t)kvh * D;
  for (int j = threadIdx.x; j < cl; j += blockDim.x) ps[j] = kdot(kb + (size_t)rowi[j] * kvDim, qs, D) * scale;
  __syncthreads();
  float cm = -3.0e38f;
  for (int j = threadIdx.x; j < cl; j += blockDim.x) cm = fmaxf(cm, ps[j]);
  float m = block_max(cm, scratch);
  float ls = 0.0f;
  __syncthreads();
  for (int j = threadIdx.x; j < cl; j += blockDim.x) {
    float p = expf(ps[j] - m);
    ps[j] = p;
    ls += p;
  }
  float l = block_sum(ls, scratch);  // its barriers make every ps[j] visible
  float acc0 = 0.0f, acc1 = 0.0f;
#pragma unroll 8
  for (int j = 0; j < cl; j++) {
    const KT* vr = vb + (size_t)rowi[j] * kvDim;
    float p = ps[j];
    if (d0 < D) acc0 = fmaf(p, ldkv(vr, d0), acc0);
    if (d1 < D) acc1 = fmaf(p, ldkv(vr, d1), acc1);
  }
  if (threadIdx.x == 0) {
    pp[0] = m;
    pp[1] = l;
  }
  if (d0 < D) pp[2 + d0] = acc0;
  if (d1 < D) pp[2 + d1] = acc1;
}

// attn_paged_merge: out [n][heads][D] from the splits of attn_paged (and
// attn_paged_fine), with head h's sink sinks[h] where sinks is set.
//   grid (heads, n), block 128
KERNEL void __launch_bounds__(128)
    attn_paged_merge(float* out, const float* part, int heads, int D, int splits, const float* sinks) {
  GRID_DEPEND();
  size_t th = (size_t)blockIdx.y * heads + blockIdx.x;
  paged_finish(out + th * D, part + th * splits * (D + 2), D, splits, sinks ? sinks + blockIdx.x : nullptr);
}

#define PAGED_KERNELS(sfx, KT)                                                                               \
  KERNEL void __launch_bounds__(256) kv_store_paged_##sfx(KT* kc, KT* vc, const float* k, const float* v, int n, int kvDim, int bs, \
                                   const i32* pos, const i32* seq, const i32* toff, const i32* tabs) { GRID_DEPEND();       \
    kv_store_paged<KT>(kc, vc, k, v, n, kvDim, bs, pos, seq, toff, tabs);                                    \
  }                                                                                                          \
  KERNEL void __launch_bounds__(128)                                                                         \
      attn_paged_##sfx(float* part, const float* q, const KT* kc, const KT* vc, int heads, int kvHeads, int D, \
                       float scale, int bs, const i32* pos, const i32* seq, const i32* toff, const i32* tabs,  \
                       int window) { GRID_DEPEND();                                                          \
    attn_paged<KT>(part, q, kc, vc, heads, kvHeads, D, scale, bs, pos, seq, toff, tabs, window);             \
  }
PAGED_KERNELS(f16, u16)
PAGED_KERNELS(f32, float)
