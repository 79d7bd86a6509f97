// norm.h: the one-row RMSNorm body of the decode shape, shared by the
// kernels that normalise a row on the way (ops.cu: rmsnorm_row,
// rmsnorm_row2, qkv_prep; moe.cu: mix_add_rmsnorm_row), so that each gives
// the row rmsnorm_row's bits.
#pragma once
#include "common.h"

// RMSNorm of one row, the decode shape, in one block of 1024 threads (a
// block per row leaves one row's work to a quarter of the threads and to
// one chain of dependent loads; this keeps four loads in flight per
// thread). With r, the residual is added first, in place: x += r (the add
// that always comes before a norm in a block). With q, the normalised row
// is also quantized to 8-bit blocks of 32 (codes q, scales d; cols a
// multiple of 32), the input of the matrix–vector products that follow.
// Block b takes row b of [gridDim.x][cols]: a batched step's rows each get
// exactly the arithmetic of a row alone (batch invariance).
//
// NORM_KEEP: the values a thread keeps in registers between the two passes
// (rows of up to NORM_KEEP·blockDim.x columns: 4096 at 1024 threads). The
// second pass then reads neither x again nor w after the barrier (w is
// loaded with x): in the decode step that took a global round trip off
// each of a layer's two norms. Longer rows read them again; either way
// every value goes through the same arithmetic.
#define NORM_KEEP 4

// rmsnorm_row_body is one such row (row of dst, x, r, q, d). A thread
// handles columns threadIdx.x, threadIdx.x + blockDim.x, …: a caller that
// wrote r in that pattern itself needs no barrier before.
DEV void rmsnorm_row_body(float* dst, float* x, const float* r, const float* w, int cols, float eps, i8* q, float* d,
                          int row, float* scratch) {
  size_t ro = (size_t)row * cols;
  dst += ro;
  x += ro;
  if (r) r += ro;
  if (q) {
    q += ro;
    d += ro / 32;
  }
  float s = 0.0f;
  bool keep = cols <= NORM_KEEP * (int)blockDim.x;
  float xv[NORM_KEEP], wv[NORM_KEEP];
  if (keep) {
    // Every load is issued before the first store: x, r and w are not
    // restrict, so a load written after a store of x could not be moved
    // above it (one round trip to memory a column instead of one in all),
    // and the trigger after the sum below then follows every load.
    float rv[NORM_KEEP];
#pragma unroll
    for (int k = 0; k < NORM_KEEP; k++) {
      int c = threadIdx.x + k * blockDim.x;
      xv[k] = c < cols ? x[c] : 0.0f;
      rv[k] = c < cols && r ? r[c] : 0.0f;
      wv[k] = c < cols ? w[c] : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < NORM_KEEP; k++) {
      int c = threadIdx.x + k * blockDim.x;
      if (c < cols) {
        float v = xv[k];
        if (r) {
          v = v + rv[k];
          x[c] = v;
        }
        xv[k] = v;
        s = fmaf(v, v, s);
      }
    }
  } else if (r) {
#pragma unroll 4
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
      float v = x[c] + r[c];
      x[c] = v;
      s = fmaf(v, v, s);
    }
  } else {
#pragma unroll 4
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s = fmaf(x[c], x[c], s);
  }
  s = block_sum(s, scratch);
  GRID_TRIGGER();  // every load of the row is in (common.h: GRID_WAIT)
  float inv = 1.0f / sqrtf(s / (float)cols + eps);
  if (keep) {
#pragma unroll
    for (int k = 0; k < NORM_KEEP; k++) {
      if (k * (int)blockDim.x >= cols) break;  // the same for the whole block
      int c = threadIdx.x + k * blockDim.x;
      float v = 0.0f;
      if (c < cols) {
        v = xv[k] * inv * wv[k];
        dst[c] = v;
      }
      if (q) q8_group(v, c, cols, q, d);
    }
    return;
  }
#pragma unroll 4
  for (int c0 = 0; c0 < cols; c0 += blockDim.x) {
    int c = c0 + threadIdx.x;
    float v = 0.0f;
    if (c < cols) {
      v = x[c] * inv * w[c];  // x[c] was written by this thread, if at all
      dst[c] = v;
    }
    if (q) q8_group(v, c, cols, q, d);
  }
}
