// rope.h: the rotation of one pair of a head (RoPE), shared by the kernels
// that rotate queries and keys (ops.cu: rope, rope_at, qkv_prep; attn.cu:
// attn_decode_rope), so that each gives a value rope's bits.
#pragma once
#include "common.h"

// rope_pair rotates pair p of head h of token t at position pos (the
// arithmetic of both rope and rope_at, so the two agree bit for bit).
DEV void rope_pair(float* x, int t, int h, int p, int pos, int heads, int headDim, int dim, float base, float scale,
                   const float* freqs, int neox) {
  int half = dim / 2;
  double ang = (double)pos * (double)scale * pow((double)base, -2.0 * p / (double)dim);
  if (freqs) ang /= (double)freqs[p];
  double s, c;
  sincos(ang, &s, &c);
  float* hx = x + ((size_t)t * heads + h) * headDim;
  int i0 = neox ? p : 2 * p;
  int i1 = neox ? p + half : 2 * p + 1;
  float x0 = hx[i0], x1 = hx[i1];
  hx[i0] = (float)(x0 * c - x1 * s);
  hx[i1] = (float)(x0 * s + x1 * c);
}
