// The online softmax step shared by the attention kernels (attn.cu,
// pagedfine.cu, archops.cu): one chunk of scores at a time, so a block
// attends over any number of positions with a fixed shared buffer.
#pragma once
#include "common.h"

// softmax_chunk takes the cl scores in ps (shared), replaces each s with
// exp(s − m′), m′ the larger of the running maximum m and the chunk's,
// folds their sum into l, and rescales the value accumulators by
// exp(m − m′). Every thread of the block calls it; on return ps holds the
// weights, visible to all (block_sum's barriers), and the caller adds
// Σ ps[j]·v[j] into acc0/acc1.
DEV void softmax_chunk(float* ps, int cl, float& m, float& l, float& acc0, float& acc1, float* scratch) {
  float cm = -3.0e38f;
  for (int j = threadIdx.x; j < cl; j += blockDim.x) cm = fmaxf(cm, ps[j]);
  cm = block_max(cm, scratch);
  float mn = fmaxf(m, cm);
  float alpha = expf(m - mn);
  float ls = 0.0f;
  __syncthreads();
  for (int j = threadIdx.x; j < cl; j += blockDim.x) {
    float p = expf(ps[j] - mn);
    ps[j] = p;
    ls += p;
  }
  ls = block_sum(ls, scratch);  // its barriers make every ps[j] visible
  l = l * alpha + ls;
  m = mn;
  acc0 *= alpha;
  acc1 *= alpha;
}

// sink_fold adds an attention sink (gpt-oss: one more score s with no
// value) to a finished online softmax's running max m, sum l and value
// accumulators, as ggml does: the sum gains e^(s − m), or, where s is the
// larger, everything is rescaled by e^(m − s) and the sum gains 1, so
// nothing overflows. The output is then acc/l as without a sink.
DEV void sink_fold(float s, float& m, float& l, float& acc0, float& acc1) {
  if (s > m) {
    float r = expf(m - s);
    l = l * r + 1.0f;
    acc0 *= r;
    acc1 *= r;
    m = s;
  } else {
    l += expf(s - m);
  }
}

// sink_inv is the factor that normalises a row's output o (running max m,
// sum l): 1/l without sinks (sinks null, bit for bit the kernels' old
// arithmetic); with head h's sink sk (gpt-oss) one more score with no
// value, 1/(l + e^(sk−m)), computed as e^(m−sk)/(l·e^(m−sk) + 1) where the
// sink is the larger so that nothing overflows.
DEV float sink_inv(float l, float m, const float* sinks, int h) {
  if (!sinks) return 1.0f / l;
  float sk = sinks[h];
  if (sk > m) {
    float r = expf(m - sk);
    return r / (l * r + 1.0f);
  }
  return 1.0f / (l + expf(sk - m));
}
