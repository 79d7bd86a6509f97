// archops.cu: the ops that architectures beyond Llama and Qwen2 need.
//
//   gelu_mul      dst = gelu_tanh(gate) ⊙ up            (Gemma's feed-forward)
//   scale_f32     dst = x·s                             (Gemma's embedding ×√d)
//   softcap_f32   x = c·tanh(x/c) in place              (Gemma 2's final logits)
//   attn_ext_*    causal grouped-query attention with a sliding window, a
//                 score soft-cap and/or attention sinks (Mistral, Gemma 2/3,
//                 gpt-oss), over the same f16 or f32 KV cache layout as
//                 attn.cu.
#include "common.h"
#include "softmax.h"

// gelu_tanh is GELU in its tanh approximation, as ggml computes it:
// 0.5·x·(1 + tanh(z)), z = √(2/π)·(x + 0.044715·x³), written as the
// equal x / (1 + e^(−2z)): for x below about −3, 1 + tanh(z) cancels
// in float32 and kept only three or four digits of the result.
DEV float gelu_tanh(float x) {
  const float k = 0.7978845608028654f;  // √(2/π)
  float z = k * x * (1.0f + 0.044715f * x * x);
  return x / (1.0f + expf(-2.0f * z));
}

KERNEL void __launch_bounds__(256) gelu_mul(float* dst, const float* gate, const float* up, int n) {
  GRID_DEPEND();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    dst[i] = gelu_tanh(gate[i]) * up[i];
}

KERNEL void __launch_bounds__(256) scale_f32(float* dst, const float* x, float s, int n) {
  GRID_DEPEND();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = x[i] * s;
}

KERNEL void __launch_bounds__(256) softcap_f32(float* x, float c, int n) {
  GRID_DEPEND();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    x[i] = c * tanhf(x[i] / c);
}

DEV float ext_ld(const u16* p, size_t i) { return h2f(p[i]); }
DEV float ext_ld(const float* p, size_t i) { return p[i]; }

#define EXT_CH 128

// attn_ext: one block per (head, token). Token t sits at position pos0+t
// (pos0 from posp in a recorded decode step) and attends to positions
// first…pos0+t, first = pos0+t-window+1 clamped at 0 when window > 0; each
// scaled score s becomes cap·tanh(s/cap) when cap > 0. The positions are
// walked in chunks with an online softmax, as attn.cu does. sinks, when
// set, holds one logit per query head that joins the softmax's denominator
// with no value (gpt-oss; sink_fold in softmax.h).
//   q, out [n][heads][D]; kc, vc [ctx][kvHeads·D] (one layer)
//   grid (heads, n), block 128, D ≤ 256
template <class KT>
static __device__ void attn_ext(float* out, const float* q, const KT* kc, const KT* vc, int heads, int kvHeads, int D,
                                int pos0, float scale, int window, float cap, const i32* posp,
                                const float* sinks) {
  if (posp) pos0 = *posp;
  __shared__ float qs[256];
  __shared__ float ps[EXT_CH];
  __shared__ float scratch[32];
  int h = blockIdx.x, t = blockIdx.y;
  int kvDim = kvHeads * D;
  int kvh = h / (heads / kvHeads);
  int last = pos0 + t;
  int first = window > 0 ? max(0, last - window + 1) : 0;
  const float* qh = q + ((size_t)t * heads + h) * D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) qs[d] = qh[d];
  __syncthreads();
  float m = -3.0e38f, l = 0.0f;
  float acc0 = 0.0f, acc1 = 0.0f;
  int d0 = threadIdx.x, d1 = threadIdx.x + blockDim.x;
  const KT* kb = kc + (size_t)kvh * D;
  const KT* vb = vc + (size_t)kvh * D;
  for (int c0 = first; c0 <= last; c0 += EXT_CH) {
    int cl = min(EXT_CH, last + 1 - c0);
    for (int j = threadIdx.x; j < cl; j += blockDim.x) {
      const KT* kr = kb + (size_t)(c0 + j) * kvDim;
      float s = 0.0f;
      for (int d = 0; d < D; d++) s = fmaf(qs[d], ext_ld(kr, d), s);
      s *= scale;
      if (cap > 0.0f) s = cap * tanhf(s / cap);
      ps[j] = s;
    }
    __syncthreads();
    softmax_chunk(ps, cl, m, l, acc0, acc1, scratch);
    for (int j = 0; j < cl; j++) {
      const KT* vr = vb + (size_t)(c0 + j) * kvDim;
      float p = ps[j];
      if (d0 < D) acc0 = fmaf(p, ext_ld(vr, d0), acc0);
      if (d1 < D) acc1 = fmaf(p, ext_ld(vr, d1), acc1);
    }
    __syncthreads();
  }
  if (sinks) sink_fold(sinks[h], m, l, acc0, acc1);
  size_t o0 = ((size_t)t * heads + h) * D;
  float inv = 1.0f / l;
  if (d0 < D) out[o0 + d0] = acc0 * inv;
  if (d1 < D) out[o0 + d1] = acc1 * inv;
}

#define EXT_KERNELS(sfx, KT)                                                                                    \
  KERNEL void __launch_bounds__(128)                                                                            \
      attn_ext_##sfx(float* out, const float* q, const KT* kc, const KT* vc, int heads, int kvHeads, int D,     \
                     int pos0, float scale, int window, float cap, const i32* posp, const float* sinks) { GRID_DEPEND();      \
    attn_ext<KT>(out, q, kc, vc, heads, kvHeads, D, pos0, scale, window, cap, posp, sinks);                    \
  }
EXT_KERNELS(f16, u16)
EXT_KERNELS(f32, float)
