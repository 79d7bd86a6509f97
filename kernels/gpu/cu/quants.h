// quants.h: every GGUF block format the GPU reads, as one small decoder per
// type. A block of BS elements (BB bytes) is split into PARTS parts of
// PE = BS/PARTS elements; deq(blk, part, v) writes the PE floats of one part.
// A part is the unit of work of one thread in the generic kernels
// (matvec.cu, dequant.cu), so it is sized to what one thread can hold in
// registers (32 values) and, for the K-quants, to one 32-element sub-block.
// Layouts and formulas are documented in package dequant (blocks.go); these
// decoders follow them element for element.
#pragma once
#include "common.h"

// ---- 32-element blocks -------------------------------------------------------

struct TQ4_0 {  // d f16, qs[16]: y[j] = (lo(qs[j])-8)d, y[j+16] = (hi(qs[j])-8)d
  static constexpr int BS = 32, BB = 18, PE = 32, PARTS = 1;
  static DEVM void deq(const u8* b, int, float* v) {
    float d = h2f(ld_u16(b));
#pragma unroll
    for (int j = 0; j < 16; j++) {
      u32 q = b[2 + j];
      v[j] = ((int)(q & 15) - 8) * d;
      v[j + 16] = ((int)(q >> 4) - 8) * d;
    }
  }
};

struct TQ4_1 {  // d, m f16, qs[16]: y = q·d + m
  static constexpr int BS = 32, BB = 20, PE = 32, PARTS = 1;
  static DEVM void deq(const u8* b, int, float* v) {
    float d = h2f(ld_u16(b)), m = h2f(ld_u16(b + 2));
#pragma unroll
    for (int j = 0; j < 16; j++) {
      u32 q = b[4 + j];
      v[j] = (float)(q & 15) * d + m;
      v[j + 16] = (float)(q >> 4) * d + m;
    }
  }
};

struct TQ5_0 {  // d, qh u32, qs[16]: q = nibble | bit(qh,i)<<4, y = (q-16)d
  static constexpr int BS = 32, BB = 22, PE = 32, PARTS = 1;
  static DEVM void deq(const u8* b, int, float* v) {
    float d = h2f(ld_u16(b));
    u32 qh = ld_u32(b + 2);
#pragma unroll
    for (int j = 0; j < 16; j++) {
      u32 q = b[6 + j];
      u32 q0 = (q & 15) | (((qh >> j) & 1) << 4);
      u32 q1 = (q >> 4) | (((qh >> (j + 16)) & 1) << 4);
      v[j] = ((int)q0 - 16) * d;
      v[j + 16] = ((int)q1 - 16) * d;
    }
  }
};

struct TQ5_1 {  // d, m, qh, qs: y = q·d + m
  static constexpr int BS = 32, BB = 24, PE = 32, PARTS = 1;
  static DEVM void deq(const u8* b, int, float* v) {
    float d = h2f(ld_u16(b)), m = h2f(ld_u16(b + 2));
    u32 qh = ld_u32(b + 4);
#pragma unroll
    for (int j = 0; j < 16; j++) {
      u32 q = b[8 + j];
      u32 q0 = (q & 15) | (((qh >> j) & 1) << 4);
      u32 q1 = (q >> 4) | (((qh >> (j + 16)) & 1) << 4);
      v[j] = (float)q0 * d + m;
      v[j + 16] = (float)q1 * d + m;
    }
  }
};

struct TQ8_0 {  // d, qs[32] int8: y = q·d
  static constexpr int BS = 32, BB = 34, PE = 32, PARTS = 1;
  static DEVM void deq(const u8* b, int, float* v) {
    float d = h2f(ld_u16(b));
#pragma unroll
    for (int j = 0; j < 32; j++) v[j] = (float)(i8)b[2 + j] * d;
  }
};

// The 16 values of IQ4_NL / IQ4_XS codes, and of MXFP4's e2m1 codes doubled
// (MXFP4's scale is halved to match).
static __constant__ float kvalues_iq4[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                              1,    13,   25,  38,  53,  69,  89,  113};
static __constant__ float kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
DEV float kv_iq4(u32 q) { return kvalues_iq4[q]; }
DEV float kv_mxfp4(u32 q) { return kvalues_mxfp4[q]; }

struct TIQ4_NL {  // d, qs[16]: y[j] = d·kv[lo], y[j+16] = d·kv[hi]
  static constexpr int BS = 32, BB = 18, PE = 32, PARTS = 1;
  static DEVM void deq(const u8* b, int, float* v) {
    float d = h2f(ld_u16(b));
#pragma unroll
    for (int j = 0; j < 16; j++) {
      u32 q = b[2 + j];
      v[j] = d * kv_iq4(q & 15);
      v[j + 16] = d * kv_iq4(q >> 4);
    }
  }
};

// e8m0 exponent e as 2^(e-128): half of 2^(e-127), as ggml's
// GGML_E8M0_TO_FP32_HALF (e < 2 gives a subnormal).
DEV float e8m0_half(u32 e) {
  u32 bits = e < 2 ? (0x00200000u << e) : ((e - 1) << 23);
  return __uint_as_float(bits);
}

struct TMXFP4 {  // e u8, qs[16]: y[j] = kv[lo]·d, y[j+16] = kv[hi]·d
  static constexpr int BS = 32, BB = 17, PE = 32, PARTS = 1;
  static DEVM void deq(const u8* b, int, float* v) {
    float d = e8m0_half(b[0]);
#pragma unroll
    for (int j = 0; j < 16; j++) {
      u32 q = b[1 + j];
      v[j] = kv_mxfp4(q & 15) * d;
      v[j + 16] = kv_mxfp4(q >> 4) * d;
    }
  }
};

// ---- 256-element super-blocks (one part = 32 elements) -------------------

// Q2_K: scales[16] | qs[64] | d | dmin. Part p = 32s + 128h elements:
// q = bits 2s.. of qs[32h+l]; group g = 8h + 2s + l/16.
struct TQ2_K {
  static constexpr int BS = 256, BB = 84, PE = 32, PARTS = 8;
  static DEVM void deq(const u8* b, int p, float* v) {
    float d = h2f(ld_u16(b + 80)), dmin = h2f(ld_u16(b + 82));
    int h = p >> 2, s = p & 3;
    const u8* qs = b + 16 + 32 * h;
#pragma unroll
    for (int g2 = 0; g2 < 2; g2++) {
      u32 sc = b[8 * h + 2 * s + g2];
      float dl = d * (float)(sc & 15), ml = dmin * (float)(sc >> 4);
#pragma unroll
      for (int l = 0; l < 16; l++) v[16 * g2 + l] = dl * (float)((qs[16 * g2 + l] >> (2 * s)) & 3) - ml;
    }
  }
};

// Q3_K: hmask[32] | qs[64] | scales[12] | d. Element 128h+32s+l: low bits
// as Q2_K, high bit = bit (4h+s) of hmask[l] (clear means subtract 4); 6-bit
// signed scales (minus 32) packed as documented in dequant.
struct TQ3_K {
  static constexpr int BS = 256, BB = 110, PE = 32, PARTS = 8;
  static DEVM int scale(const u8* sc, int g) {
    u32 lo = g < 8 ? (sc[g] & 15u) : (u32)(sc[g - 8] >> 4);
    u32 hi = (sc[8 + (g & 3)] >> (2 * (g >> 2))) & 3u;
    return (int)(lo | (hi << 4)) - 32;
  }
  static DEVM void deq(const u8* b, int p, float* v) {
    float d = h2f(ld_u16(b + 108));
    int h = p >> 2, s = p & 3;
    const u8* qs = b + 32 + 32 * h;
    const u8* hm = b;
    u32 mbit = 1u << (4 * h + s);
#pragma unroll
    for (int g2 = 0; g2 < 2; g2++) {
      float dl = d * (float)scale(b + 96, 8 * h + 2 * s + g2);
#pragma unroll
      for (int l = 0; l < 16; l++) {
        int li = 16 * g2 + l;
        int q = (int)((qs[li] >> (2 * s)) & 3) - ((hm[li] & mbit) ? 0 : 4);
        v[li] = dl * (float)q;
      }
    }
  }
};

// Q4_K / Q5_K 6-bit scale and min of sub-block j from the 12 packed bytes.
DEV void scale_min_k4(const u8* q, int j, float* sc, float* m) {
  u32 a, b;
  if (j < 4) {
    a = q[j] & 63;
    b = q[j + 4] & 63;
  } else {
    a = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
    b = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
  *sc = (float)a;
  *m = (float)b;
}

// Q4_K: d | dmin | scales[12] | qs[128]. Sub-block p (32 elements) is nibble
// p&1 of qs[32(p/2) + l]: y = d·sc·q - dmin·m.
struct TQ4_K {
  static constexpr int BS = 256, BB = 144, PE = 32, PARTS = 8;
  static DEVM void deq(const u8* b, int p, float* v) {
    float d = h2f(ld_u16(b)), dmin = h2f(ld_u16(b + 2)), sc, m;
    scale_min_k4(b + 4, p, &sc, &m);
    float dl = d * sc, ml = dmin * m;
    const u8* qs = b + 16 + 32 * (p >> 1);
    int sh = 4 * (p & 1);
#pragma unroll
    for (int l = 0; l < 32; l++) v[l] = dl * (float)((qs[l] >> sh) & 15) - ml;
  }
};

// Q5_K: d | dmin | scales[12] | qh[32] | qs[128]; fifth bit of element
// 32p+l is bit p of qh[l].
struct TQ5_K {
  static constexpr int BS = 256, BB = 176, PE = 32, PARTS = 8;
  static DEVM void deq(const u8* b, int p, float* v) {
    float d = h2f(ld_u16(b)), dmin = h2f(ld_u16(b + 2)), sc, m;
    scale_min_k4(b + 4, p, &sc, &m);
    float dl = d * sc, ml = dmin * m;
    const u8* qh = b + 16;
    const u8* qs = b + 48 + 32 * (p >> 1);
    int sh = 4 * (p & 1);
#pragma unroll
    for (int l = 0; l < 32; l++) {
      u32 q = ((qs[l] >> sh) & 15) | (((qh[l] >> p) & 1) << 4);
      v[l] = dl * (float)q - ml;
    }
  }
};

// Q6_K: ql[128] | qh[64] | scales[16] int8 | d. Part p = 4n + k covers
// elements 128n + 32k + l: low 4 bits from ql[64n + 32(k&1) + l] (nibble
// k>>1), high 2 bits = bits 2k.. of qh[32n + l], scale sc[8n + 2k + l/16].
struct TQ6_K {
  static constexpr int BS = 256, BB = 210, PE = 32, PARTS = 8;
  static DEVM void deq(const u8* b, int p, float* v) {
    float d = h2f(ld_u16(b + 208));
    int n = p >> 2, k = p & 3;
    const u8* ql = b + 64 * n + 32 * (k & 1);
    const u8* qh = b + 128 + 32 * n;
    const i8* sc = (const i8*)(b + 192 + 8 * n + 2 * k);
    int shl = 4 * (k >> 1), shh = 2 * k;
#pragma unroll
    for (int l = 0; l < 32; l++) {
      int q = (int)(((ql[l] >> shl) & 15) | (((qh[l] >> shh) & 3) << 4)) - 32;
      v[l] = d * (float)sc[l >> 4] * (float)q;
    }
  }
};

// IQ4_XS: d | scales_h u16 | scales_l[4] | qs[128]. Sub-block ib has 6-bit
// scale ls (minus 32); y[j] = d·(ls-32)·kv[lo(qs[16ib+j])], y[j+16] = …hi.
struct TIQ4_XS {
  static constexpr int BS = 256, BB = 136, PE = 32, PARTS = 8;
  static DEVM void deq(const u8* b, int ib, float* v) {
    float d = h2f(ld_u16(b));
    u32 sh = ld_u16(b + 2);
    u32 ls = ((b[4 + (ib >> 1)] >> (4 * (ib & 1))) & 15) | (((sh >> (2 * ib)) & 3) << 4);
    float dl = d * (float)((int)ls - 32);
    const u8* qs = b + 8 + 16 * ib;
#pragma unroll
    for (int j = 0; j < 16; j++) {
      v[j] = dl * kv_iq4(qs[j] & 15);
      v[j + 16] = dl * kv_iq4(qs[j] >> 4);
    }
  }
};

// ---- plain types: one element at a time -------------------------------------

struct TF32 {
  static DEVM float get(const u8* row, int i) { return ((const float*)row)[i]; }
  static constexpr int ES = 4;
};
struct TF16 {
  static DEVM float get(const u8* row, int i) { return h2f(((const u16*)row)[i]); }
  static constexpr int ES = 2;
};
struct TBF16 {
  static DEVM float get(const u8* row, int i) { return bf2f(((const u16*)row)[i]); }
  static constexpr int ES = 2;
};

// Apply M(name, traits) to every block type and P(name, traits) to every
// plain type, to stamp out one extern "C" kernel per type.
#define FOR_BLOCK_TYPES(M) \
  M(q4_0, TQ4_0)           \
  M(q4_1, TQ4_1)           \
  M(q5_0, TQ5_0)           \
  M(q5_1, TQ5_1)           \
  M(q8_0, TQ8_0)           \
  M(q2_k, TQ2_K)           \
  M(q3_k, TQ3_K)           \
  M(q4_k, TQ4_K)           \
  M(q5_k, TQ5_K)           \
  M(q6_k, TQ6_K)           \
  M(iq4_nl, TIQ4_NL)       \
  M(iq4_xs, TIQ4_XS)       \
  M(mxfp4, TMXFP4)

#define FOR_PLAIN_TYPES(P) \
  P(f32, TF32)             \
  P(f16, TF16)             \
  P(bf16, TBF16)
