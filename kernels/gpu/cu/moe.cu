// moe.cu: a mixture of experts' own kernels (pipeline/model/moe.go).
//
//   gather_rows   dst[i] = src[rows[i]]                          (prompt: each
//                 (token, expert) pair's input row, in expert order)
//   mix_rows      dst[t] = Σ_j w[t·k+j]·src[rows[t·k+j]]         (the weighted
//                 sum of the experts' outputs, rows and w from the host, or
//                 from moe_route on the device)
//   moe_route     one token's router logits -> its k experts' ids and
//                 weights, by the architecture's rule
//   moe_mv_*      the chosen experts' matrix-vector products, each expert's
//                 matrix found through a device table of addresses by the
//                 id moe_route wrote: gate and up of k experts in one
//                 launch, down in another; each the arithmetic of the
//                 kernel MatMul picks for one row of that matrix
//   moe_add_bias  each slot's expert's bias row added (gpt-oss)
#include "common.h"
#include "mvbody.h"
#include "norm.h"

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
  GRID_DEPEND();
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
  GRID_DEPEND();
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

// mix_add_rmsnorm_row: a decode step's weighted sum of its k experts'
// outputs fused with the residual add and the norm that follow it (the
// next block's pre-norm): r = Σ_j w[j]·src[j] (mix_rows' arithmetic, into
// r as mix_rows writes it), then rmsnorm_row's x += r, dst = norm(x) ⊙ nw
// and, with q, dst's 8-bit copy. One block of rmsnorm_row's size; each
// thread reads back only the r values it wrote.
//   src [k][cols], w [k], r, x, dst [cols]
KERNEL void __launch_bounds__(1024) mix_add_rmsnorm_row(float* dst, float* x, float* r, const float* src, const float* w,
                                                       int k, const float* nw, int cols, float eps, i8* q, float* d) {
  GRID_DEPEND();
  __shared__ float scratch[32];
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < k; j++) {
      float p = mul_rn(src[(size_t)j * cols + c], w[j]);
      acc = j == 0 ? p : add_rn(acc, p);
    }
    r[c] = acc;
  }
  rmsnorm_row_body(dst, x, r, nw, cols, eps, q, d, 0, scratch);
}

// moe_add_bias: dst [k][cols] += the bias row of slot j's expert, found
// through the table t of the experts' bias addresses by ids[j] (gpt-oss's
// per-expert biases, after the products by id); an add per value, as the
// AddBias kernel it replaces rounds it. grid (⌈cols/256⌉, k), block 256.
KERNEL void __launch_bounds__(256) moe_add_bias(float* dst, const u64* t, const i32* ids, int k, int cols) {
  GRID_DEPEND();
  int j = blockIdx.y;
  if (j >= k) return;
  const float* b = (const float*)t[ids[j]];
  float* d = dst + (size_t)j * cols;
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x) d[c] = add_rn(d[c], b[c]);
}

#define MOE_MAXE 512  // pipeline/model's maxExperts
#define RT_LANES 32   // the lanes that route: the sums' order is the same at either wave width

// rt_key orders a router value for the selection: a larger key is a better
// expert. The high word orders the value (NaN below any number, -0 as 0),
// the low word the index (the lower wins a tie); 0 is no expert. rt_value
// gives the value back (-0 as 0, NaN as the quiet NaN).
DEV u64 rt_key(float v, int e) {
  u32 o = 0;  // NaN
  if (v == v) {
    u32 b = __float_as_uint(v == 0.0f ? 0.0f : v);
    o = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  }
  return ((u64)o << 32) | (0xffffffffu - (u32)e);
}
DEV float rt_value(u64 key) {
  u32 o = (u32)(key >> 32);
  if (o == 0) return __uint_as_float(0x7fc00000u);
  return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}
DEV u64 rt_max(u64 a, u64 b) { return a > b ? a : b; }
DEV u64 rt_shfl_xor(u64 v, int o) {
  u32 lo = (u32)SHFL_XOR((int)(u32)v, o), hi = (u32)SHFL_XOR((int)(u32)(v >> 32), o);
  return ((u64)hi << 32) | lo;
}

// route_lanes is route_token's selection for at most PER experts a lane:
// each of the first 32 lanes keeps experts lane, lane+32, … in registers
// as selection keys (mode 0: their probabilities, from the exponentials
// src holds; mode 1: the logits src holds); each of k rounds finds the
// best key by a butterfly over the lanes, its owner drops it, and lane 0
// writes its expert and value to sid and sv.
template <int PER>
static __device__ FORGE_INLINE void route_lanes(const volatile float* src, int experts, int k, int mode, int* sid, float* sv) {
  int lane = threadIdx.x;
  float v[PER];
#pragma unroll
  for (int i = 0; i < PER; i++) {
    int e = lane + i * RT_LANES;
    v[i] = e < experts ? src[e] : 0.0f;
  }
  if (mode == 0) {
    double s = 0.0;
#pragma unroll
    for (int i = 0; i < PER; i++)
      if (lane + i * RT_LANES < experts) s += (double)v[i];
    for (int o = RT_LANES / 2; o > 0; o >>= 1) s += SHFL_XOR(s, o);
    float inv = (float)(1.0 / s);
#pragma unroll
    for (int i = 0; i < PER; i++) {
      float q = v[i] * inv;
      v[i] = q >= 0.0f ? q : 0.0f;
    }
  }
  u64 key[PER];
#pragma unroll
  for (int i = 0; i < PER; i++) key[i] = lane + i * RT_LANES < experts ? rt_key(v[i], lane + i * RT_LANES) : 0;
  for (int j = 0; j < k; j++) {
    u64 b = key[0];
#pragma unroll
    for (int i = 1; i < PER; i++) b = rt_max(b, key[i]);
    for (int o = RT_LANES / 2; o > 0; o >>= 1) b = rt_max(b, rt_shfl_xor(b, o));
#pragma unroll
    for (int i = 0; i < PER; i++)
      if (key[i] == b) key[i] = 0;  // the owner's: keys are distinct
    if (lane == 0) {
      sid[j] = (int)(0xffffffffu - (u32)b);
      sv[j] = rt_value(b);
    }
  }
}

// moe_route: one block of one warp per token. mode 0 (Mixtral, Qwen3-MoE):
// p = softmax(logits) as moe.go's route computes it on the host (each
// exponential in double rounded to float; their sum in double, each of 32
// lanes adding experts lane, lane+32, … in turn, then a butterfly over the
// lanes; NaN probabilities taken as 0), the k largest best first (ties:
// the lower expert), weights p renormalised by their float sum clamped at
// 2⁻¹⁴. mode 1 (gpt-oss): the k largest logits (NaN below any number),
// weights the softmax over those k (routeTopK). ids, w [n][k].
// route_token is one token's routing from its logits row, in the calling
// block's first 32 threads (the others return). row may be another
// block's writes (moe_router_f32): read through volatile. The double
// exponentials are taken here, once in the code: in each of route_lanes'
// instances they kept a value on the stack (scratch) on AMD.
static __device__ FORGE_INLINE void route_token(const volatile float* row, i32* id, float* wt, int experts, int k, int mode) {
  __shared__ float sp[MOE_MAXE];  // mode 0: the exponentials
  __shared__ int sid[MOE_MAXE];
  __shared__ float sv[MOE_MAXE];
  int lane = threadIdx.x;
  if (lane >= RT_LANES) return;
  const volatile float* src = row;
  if (mode == 0) {
    // the largest logit, NaN if one is NaN (Go's max)
    float m = __uint_as_float(0xff800000u);
    int nan = 0;
    for (int e = lane; e < experts; e += RT_LANES) {
      float v = row[e];
      if (v != v)
        nan = 1;
      else
        m = fmaxf(m, v);
    }
    for (int o = RT_LANES / 2; o > 0; o >>= 1) {
      m = fmaxf(m, SHFL_XOR(m, o));
      nan |= SHFL_XOR(nan, o);
    }
    if (nan) m = __uint_as_float(0x7fc00000u);
    for (int e = lane; e < experts; e += RT_LANES) sp[e] = (float)exp((double)(row[e] - m));
    WARP_SYNC();
    src = sp;
  }
  int per = (experts + RT_LANES - 1) / RT_LANES;
  if (per <= 1)
    route_lanes<1>(src, experts, k, mode, sid, sv);
  else if (per <= 2)
    route_lanes<2>(src, experts, k, mode, sid, sv);
  else if (per <= 4)
    route_lanes<4>(src, experts, k, mode, sid, sv);
  else if (per <= 8)
    route_lanes<8>(src, experts, k, mode, sid, sv);
  else
    route_lanes<MOE_MAXE / RT_LANES>(src, experts, k, mode, sid, sv);
  if (mode != 0 && lane == 0) {  // the chosen logits' exponentials
    float mx = sv[0];
    for (int j = 0; j < k; j++) sv[j] = (float)exp((double)(sv[j] - mx));
  }
  WARP_SYNC();
  // mode 0's float sum of the chosen p, mode 1's of their exponentials,
  // in the order chosen (every lane alike)
  float total = 0.0f;
  for (int j = 0; j < k; j++) total += sv[j];
  if (mode == 0) total = fmaxf(total, 6.103515625e-5f);
  for (int j = lane; j < k; j += RT_LANES) {
    id[j] = sid[j];
    wt[j] = sv[j] / total;
  }
}

KERNEL void __launch_bounds__(64) moe_route(const float* logits, i32* ids, float* w, int experts, int k, int mode) {
  GRID_DEPEND();
  route_token(logits + (size_t)blockIdx.x * experts, ids + (size_t)blockIdx.x * k, w + (size_t)blockIdx.x * k, experts, k,
              mode);
}

// moe_router_f32: a decode step's router product and its routing in one
// launch. Each block computes rows of logits = x · gateᵀ (+ bias where
// set), the generic float kernel's arithmetic for one row of x (mv_plain:
// a row per warp, 128 threads) and add_bias's add; the block that finishes
// last routes them (moe_route's body in its first warp) and sets count
// back to 0 for the next launch (a replayed step).
//   gate [experts][cols] f32, x [cols], logits [experts], ids, w [k]
// wide chooses mv_plain's way (the same bits either way).
KERNEL void __launch_bounds__(128) moe_router_f32(const u8* gate, const float* x, const float* bias, float* logits,
                                                  int experts, int cols, i32* ids, float* w, int k, int mode,
                                                  int* count, int wide) {
  GRID_DEPEND();
  __shared__ int last;
  mv_plain<TF32>(gate, x, logits, experts, cols, 1, wide != 0);
  if (bias) {
    int row = blockIdx.x * (blockDim.x / warpSize) + threadIdx.x / warpSize;
    if (row < experts && threadIdx.x % warpSize == 0) logits[row] = logits[row] + bias[row];
  }
  __threadfence();  // this block's logits before its count
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(count, 1) == (int)gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();  // every block's logits after the count
  if (threadIdx.x == 0) *count = 0;
  route_token(logits, ids, w, experts, k, mode);
}

// moe_mv_*: for table i < 2 (t1 null: one table) and slot j < k (blockIdx.y
// = i·k + j), y_i[j] [rows] = x_j · (expert ids[j]'s matrix of table i)ᵀ.
// Each body is the one-vector kernel's that MatMul picks for such a
// matrix alone (mvbody.h), so every row is MatMul's bit for bit:
//   moe_mv_q4_k, moe_mv_q6_k, moe_mv_{type}_b: on 8-bit activations, x_j at
//     xq + j·xstride, its scales at xd + j·xstride/32 (xstride 0: one
//     shared input)
//   moe_mv_g_{type}: the generic float kernel, x_j at x + j·xstride
// grid (row groups, k·tables), block 128.
#define MOE_SLOT()                                                                                           \
  int s = blockIdx.y, tab = s / k, j = s - tab * k;                                                         \
  const u8* w = (const u8*)(tab ? t1 : t0)[ids[j]];                                                         \
  float* y = (tab ? y1 : y0) + (size_t)j * rows;
#define MOE_MV(name, body)                                                                                   \
  KERNEL void __launch_bounds__(128) moe_mv_##name(const u64* t0, const u64* t1, float* y0, float* y1,        \
                                                    const i32* ids, const i8* xq, const float* xd, int rows,  \
                                                    int cols, int k, int xstride) { GRID_DEPEND();            \
    MOE_SLOT()                                                                                               \
    body(w, xq + (size_t)j * xstride, xd + (size_t)j * (xstride / 32), y, rows, cols);                       \
  }
MOE_MV(q4_k, (mv_q4_k_q8<1, 2, true>))
MOE_MV(q6_k, (mv_q6_k_q8<2, 1>))
MOE_MV(q4_0_b, (mv_b32_q8<B8Q4_0, 2>))
MOE_MV(q4_1_b, (mv_b32_q8<B8Q4_1, 2>))
MOE_MV(q5_0_b, (mv_b32_q8<B8Q5_0, 2>))
MOE_MV(q5_1_b, (mv_b32_q8<B8Q5_1, 2>))
MOE_MV(q8_0_b, (mv_b32_q8<B8Q8_0, 2>))

#define MOE_MV_G(name, body)                                                                                 \
  KERNEL void __launch_bounds__(128) moe_mv_g_##name(const u64* t0, const u64* t1, float* y0, float* y1,      \
                                                      const i32* ids, const float* x, int rows, int cols,     \
                                                      int k, int xstride) { GRID_DEPEND();                    \
    MOE_SLOT()                                                                                               \
    body(w, x + (size_t)j * xstride, y, rows, cols, 1);                                                      \
  }
#define MOE_MV_BLOCK(name, T) MOE_MV_G(name, mv_block<T>)
#define MOE_MV_PLAIN(name, T) MOE_MV_G(name, mv_plain<T>)
FOR_BLOCK_TYPES(MOE_MV_BLOCK)
FOR_PLAIN_TYPES(MOE_MV_PLAIN)

// moe_table fills a table of n addresses base + i·stride: the experts of
// a stacked tensor, back to back (NewExpertTable; the tests build their
// tables with it too).
KERNEL void __launch_bounds__(256) moe_table(u64* t, const u8* base, int stride, int n) {
  GRID_DEPEND();
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) t[i] = (u64)(base + (size_t)i * stride);
}
