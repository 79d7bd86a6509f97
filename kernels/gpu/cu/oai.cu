// oai.cu: gpt-oss's clamped SwiGLU (kernels.SwiGLUOAIer), as the CPU
// backend computes it:
//
//   g = min(gate, limit)   u = clamp(up, −limit, limit)
//   dst = g·σ(alpha·g)·(u + 1)
//
// (The attention sinks are a pointer argument of attn_ext, archops.cu.)
#include "common.h"

KERNEL void __launch_bounds__(256) swiglu_oai(float* dst, const float* gate, const float* up, int n, float alpha,
                                              float limit) {
  GRID_DEPEND();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    float g = fminf(gate[i], limit);
    float u = fminf(fmaxf(up[i], -limit), limit);
    dst[i] = g / (1.0f + expf(-alpha * g)) * (u + 1.0f);
  }
}
