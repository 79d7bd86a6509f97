// moe.cu: a mixture of experts' own kernels (pipeline/model/moe.go).
//
//   gather_rows   dst[i] = src[rows[i]]                          (prompt: each
//                 (token, expert) pair's input row, in expert order)
//   mix_rows      dst[t] = Σ_j w[t·k+j]·src[rows[t·k+j]]         (the weighted
//                 sum of the experts' outputs, rows and w from the host)
#include "common.h"

// The products and sums of mix_rows are rounded one by one, as the Scale
// and Add kernels they replace round them: no fused multiply-add.
#if defined(FORGE_CUDA)
DEV float mul_rn(float a, float b) { return __fmul_rn(a, b); }
DEV float add_rn(float a, float b) { return __fadd_rn(a, b); }
#else
#pragma clang fp contract(off)
DEV float mul_rn(float a, float b) { return a * b; }
DEV float add_rn(float a, float b) { return a + b; }
#endif

// grid (⌈cols/256⌉, min(nrows, 65535)), block 256; rows [nrows].
KERNEL void __launch_bounds__(256) gather_rows(float* dst, const float* src, const i32* rows, int nrows, int cols) {
  for (int i = blockIdx.y; i < nrows; i += gridDim.y) {
    const float* s = src + (size_t)rows[i] * cols;
    float* d = dst + (size_t)i * cols;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x) d[c] = s[c];
  }
}

// grid (⌈cols/256⌉, min(n, 65535)), block 256. rows null: token t's slot j
// is row t·k+j of src.
KERNEL void __launch_bounds__(256) mix_rows(float* dst, const float* src, const i32* rows, const float* w, int n, int k,
                                            int cols) {
  for (int t = blockIdx.y; t < n; t += gridDim.y) {
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x) {
      float acc = 0.0f;
      for (int j = 0; j < k; j++) {
        int i = t * k + j;
        size_t r = rows ? (size_t)rows[i] : (size_t)i;
        float p = mul_rn(src[r * cols + c], w[i]);
        acc = j == 0 ? p : add_rn(acc, p);
      }
      dst[(size_t)t * cols + c] = acc;
    }
  }
}
