// q8terms.h: the float arithmetic of the Q4_K and Q6_K products on 8-bit
// activations, shared by the matrix-vector kernels (matvec.cu, integer sums
// by dp4a) and the tensor-core matrix product (mmq.cu, integer sums by
// mma). Both get the same exact integer sums of 16 products; what keeps a
// row's result independent of the kernel (and so of the batch it runs in)
// is that the float steps after them are the same operations in the same
// order. Every multiply, add and fused multiply-add here is written out
// with its rounding (CUDA's __fmul_rn, __fadd_rn, __fmaf_rn), so the
// compiler cannot contract or reorder them differently in the two
// contexts.
#pragma once
#include "common.h"

#if defined(FORGE_CUDA)
DEV float fmul_x(float a, float b) { return __fmul_rn(a, b); }
DEV float fadd_x(float a, float b) { return __fadd_rn(a, b); }
DEV float fma_x(float a, float b, float c) { return __fmaf_rn(a, b, c); }
#else
// HIP keeps the matrix-vector kernels only (one context per formula).
DEV float fmul_x(float a, float b) { return a * b; }
DEV float fadd_x(float a, float b) { return a + b; }
DEV float fma_x(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
#endif

// q4k_scales decodes the 6-bit scales and mins of sub-blocks p0 and p0+1
// (p0 even) of a Q4_K super-block from its 16-byte header hd; sh is
// 8·(p0 & 3).
DEV void q4k_scales(uint4 hd, int p0, int sh, u32& sc1, u32& m1, u32& sc2, u32& m2) {
  u32 Y = hd.y >> sh, Z = hd.z >> sh, W = hd.w >> sh;
  u32 Y2 = hd.y >> (sh + 8), Z2 = hd.z >> (sh + 8), W2 = hd.w >> (sh + 8);
  if (p0 < 4) {
    sc1 = Y & 63;
    m1 = Z & 63;
    sc2 = Y2 & 63;
    m2 = Z2 & 63;
  } else {
    sc1 = (W & 15) | (((Y >> 6) & 3) << 4);
    m1 = ((W >> 4) & 15) | (((Z >> 6) & 3) << 4);
    sc2 = (W2 & 15) | (((Y2 >> 6) & 3) << 4);
    m2 = ((W2 >> 4) & 15) | (((Z2 >> 6) & 3) << 4);
  }
}

// q4k_q8_float is one lane's term of a Q4_K super-block from its integer
// sums: il = Σ q·qx over its 16 values of sub-block p0, ih over its 16 of
// p0+1, sxl and sxh the sums of those qx, here as floats (exact: they are
// integers below 2^15).
//   d·(sc1·dx1·il + sc2·dx2·ih) − dmin·(m1·dx1·sxl + m2·dx2·sxh)
DEV float q4k_q8_floatf(float d, float dmin, u32 sc1, u32 m1, u32 sc2, u32 m2, float dx1, float dx2, float il,
                        float ih, float sxl, float sxh) {
  float fl = fmul_x(dx1, sxl), fh = fmul_x(dx2, sxh);
  float x = fma_x(fmul_x(u2f_small(sc2), dx2), ih, fmul_x(fmul_x(u2f_small(sc1), dx1), il));
  float y = fma_x(u2f_small(m2), fh, fmul_x(u2f_small(m1), fl));
  return fma_x(d, x, -fmul_x(dmin, y));
}
DEV float q4k_q8_float(float d, float dmin, u32 sc1, u32 m1, u32 sc2, u32 m2, float dx1, float dx2, int il, int ih,
                       int sxl, int sxh) {
  return q4k_q8_floatf(d, dmin, sc1, m1, sc2, m2, dx1, dx2, (float)il, (float)ih, (float)sxl, (float)sxh);
}

// q6_q8_float is one lane's term of a Q6_K super-block from its four
// integer sums s[k] = Σ (q−32)·qx over 16 values (as floats, exact below
// 2^17), their scales sck and the scales dxk of their blocks of x:
// d·Σ_k sck·dxk·s[k], k in order.
DEV float q6_q8_floatf(float d, const float* sck, const float* dxk, const float* s) {
  float a = 0.0f;
#pragma unroll
  for (int k = 0; k < 4; k++) a = fma_x(fmul_x(sck[k], dxk[k]), s[k], a);
  return fmul_x(d, a);
}
DEV float q6_q8_float(float d, const float* sck, const float* dxk, const int* s) {
  float f[4];
#pragma unroll
  for (int k = 0; k < 4; k++) f[k] = (float)s[k];
  return q6_q8_floatf(d, sck, dxk, f);
}
