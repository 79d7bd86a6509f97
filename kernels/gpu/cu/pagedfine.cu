// pagedfine.cu: paged attention of a batched step (continuous batching,
// kernels.Batcher) in finer splits than attn.cu's attn_paged.
//
// attn_paged cuts a row's positions into splits of a fixed 256 (PAGED_SPLIT):
// a decode row short of 256 positions is one block per head, which walks
// all of them alone; at one row of a 32-head model that is 32 blocks on
// the whole GPU, and the step's attention costs several times the
// single-sequence kernel's, which spreads a head over many blocks. Here a
// row's positions are cut into at most PF_SPLITS splits of
// pf_split_len(L) positions, L the row's own length: the cut (and so the
// result) depends on that length alone, never on the other rows of the
// step (batch invariance), and the grid is PF_SPLITS deep whatever the
// positions, so a recorded step replays at any of them. Splits past a row's
// end write an empty part (m = -3e38, l = 0, acc = 0) that attn.cu's
// attn_paged_merge weighs by exact zeros.
//
//   part [n][heads][PF_SPLITS][D+2]; q [n][heads][D]; kc, vc: one layer of
//   the pool; pos, seq, toff, tabs: the step's layout (see attn.cu).
#include "common.h"
#include "softmax.h"

#define PF_SPLITS 16
#define PF_MIN 16
#define PF_CH 256

DEV float pf_ld(const u16* p, size_t i) { return h2f(p[i]); }
DEV float pf_ld(const float* p, size_t i) { return p[i]; }

// pf_dot is q·k for one key row kr of D values (q in shared memory); f16
// rows 16 bytes at a time where D allows, all of a row's loads in flight.
DEV float pf_dot(const u16* kr, const float* qs, int D) {
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
  float s0 = 0.0f, s1 = 0.0f;
  for (int d = 0; d + 1 < D; d += 2) {
    s0 = fmaf(qs[d], h2f(kr[d]), s0);
    s1 = fmaf(qs[d + 1], h2f(kr[d + 1]), s1);
  }
  if (D & 1) s0 = fmaf(qs[D - 1], h2f(kr[D - 1]), s0);
  return s0 + s1;
}
DEV float pf_dot(const float* kr, const float* qs, int D) {
  float s0 = 0.0f, s1 = 0.0f;
  for (int d = 0; d + 1 < D; d += 2) {
    s0 = fmaf(qs[d], kr[d], s0);
    s1 = fmaf(qs[d + 1], kr[d + 1], s1);
  }
  if (D & 1) s0 = fmaf(qs[D - 1], kr[D - 1], s0);
  return s0 + s1;
}

// pf_split_len is the positions per split of a row of L positions: a
// multiple of PF_MIN, at least PF_MIN, PF_SPLITS of them covering L.
DEV int pf_split_len(int L) {
  int s = (L + PF_SPLITS - 1) / PF_SPLITS;
  return (s + PF_MIN - 1) / PF_MIN * PF_MIN;
}

// pf_row is the pool row of position p of the sequence whose table is tab.
DEV size_t pf_row(const i32* tab, int p, int bs) { return (size_t)tab[p / bs] * bs + p % bs; }

// Attention of row t, head h over split z of its positions first…pos[t]
// (first = pos[t]−window+1 with a sliding window, window > 0, else 0: the
// splits cut the window alone; chunks of PF_CH with an online softmax
// where a split is longer): scores one thread per position, values one
// thread per dimension. attn_paged_merge adds the sinks, if any.
//   grid (heads, n, PF_SPLITS), block 128, D ≤ 256
template <class KT>
static __device__ void attn_paged_fine(float* part, const float* q, const KT* kc, const KT* vc, int heads, int kvHeads,
                                       int D, float scale, int bs, const i32* pos, const i32* seq, const i32* toff,
                                       const i32* tabs, int window) {
  __shared__ float qs[256];
  __shared__ float ps[PF_CH];
  __shared__ u32 rowi[PF_CH];
  __shared__ float scratch[32];
  int h = blockIdx.x, t = blockIdx.y, z = blockIdx.z;
  int kvDim = kvHeads * D;
  int kvh = h / (heads / kvHeads);
  int L = pos[t] + 1;
  int F = window > 0 ? max(0, L - window) : 0;
  int sl = pf_split_len(L - F);
  int p0 = F + z * sl, p1 = min(L, p0 + sl);
  float* pp = part + (((size_t)t * heads + h) * gridDim.z + z) * (D + 2);
  int d0 = threadIdx.x, d1 = threadIdx.x + blockDim.x;
  if (p0 >= p1) {  // past the row's end: an empty split
    if (threadIdx.x == 0) {
      pp[0] = -3.0e38f;
      pp[1] = 0.0f;
    }
    if (d0 < D) pp[2 + d0] = 0.0f;
    if (d1 < D) pp[2 + d1] = 0.0f;
    return;
  }
  const i32* tab = tabs + toff[seq[t]];
  const float* qh = q + ((size_t)t * heads + h) * D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) qs[d] = qh[d];
  const KT* kb = kc + (size_t)kvh * D;
  const KT* vb = vc + (size_t)kvh * D;
  float m = -3.0e38f, l = 0.0f;
  float acc0 = 0.0f, acc1 = 0.0f;
  for (int c0 = p0; c0 < p1; c0 += PF_CH) {
    int cl = min(PF_CH, p1 - c0);
    for (int j = threadIdx.x; j < cl; j += blockDim.x) rowi[j] = (u32)pf_row(tab, c0 + j, bs);
    __syncthreads();
    for (int j = threadIdx.x; j < cl; j += blockDim.x) ps[j] = pf_dot(kb + (size_t)rowi[j] * kvDim, qs, D) * scale;
    __syncthreads();
    softmax_chunk(ps, cl, m, l, acc0, acc1, scratch);
#pragma unroll 8
    for (int j = 0; j < cl; j++) {
      const KT* vr = vb + (size_t)rowi[j] * kvDim;
      float p = ps[j];
      if (d0 < D) acc0 = fmaf(p, pf_ld(vr, d0), acc0);
      if (d1 < D) acc1 = fmaf(p, pf_ld(vr, d1), acc1);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    pp[0] = m;
    pp[1] = l;
  }
  if (d0 < D) pp[2 + d0] = acc0;
  if (d1 < D) pp[2 + d1] = acc1;
}

KERNEL void __launch_bounds__(128)
    attn_paged_fine_f16(float* part, const float* q, const u16* kc, const u16* vc, int heads, int kvHeads, int D,
                        float scale, int bs, const i32* pos, const i32* seq, const i32* toff, const i32* tabs,
                        int window) {
  GRID_DEPEND();
  attn_paged_fine<u16>(part, q, kc, vc, heads, kvHeads, D, scale, bs, pos, seq, toff, tabs, window);
}
KERNEL void __launch_bounds__(128)
    attn_paged_fine_f32(float* part, const float* q, const float* kc, const float* vc, int heads, int kvHeads, int D,
                        float scale, int bs, const i32* pos, const i32* seq, const i32* toff, const i32* tabs,
                        int window) {
  GRID_DEPEND();
  attn_paged_fine<float>(part, q, kc, vc, heads, kvHeads, D, scale, bs, pos, seq, toff, tabs, window);
}
