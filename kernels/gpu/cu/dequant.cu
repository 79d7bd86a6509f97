// dequant.cu: blocks to floats on the device, for the prompt GEMM (f16,
// rows padded to kpad columns with zeros), for types without a matvec kernel
// of their own (f32) and for embedding lookups (one quantized row per token).
#include "quants.h"

// One thread per part; grid-stride over rows·parts.
//   w [rows][cols] blocks -> out [rows][kpad] f16 (kpad == cols for block types)
template <class T>
static __device__ void deq16_block(const u8* __restrict__ w, u16* __restrict__ out, int rows, int cols, int kpad) {
  int nparts = cols / T::PE;
  size_t rb = (size_t)(cols / T::BS) * T::BB;
  size_t total = (size_t)rows * nparts;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
    size_t r = i / nparts;
    int p = (int)(i % nparts);
    float v[T::PE];
    T::deq(w + r * rb + (size_t)(p / T::PARTS) * T::BB, p % T::PARTS, v);
    // 16-byte stores: a part is 32 values = 64 bytes, 64-byte aligned
    // (kpad is a multiple of 32)
    uint4* o = (uint4*)(out + r * kpad + (size_t)p * T::PE);
#pragma unroll
    for (int k = 0; k < T::PE / 8; k++) {
      uint4 u;
      u.x = (u32)f2h(v[8 * k + 0]) | ((u32)f2h(v[8 * k + 1]) << 16);
      u.y = (u32)f2h(v[8 * k + 2]) | ((u32)f2h(v[8 * k + 3]) << 16);
      u.z = (u32)f2h(v[8 * k + 4]) | ((u32)f2h(v[8 * k + 5]) << 16);
      u.w = (u32)f2h(v[8 * k + 6]) | ((u32)f2h(v[8 * k + 7]) << 16);
      o[k] = u;
    }
  }
}

template <class T>
static __device__ void deq32_block(const u8* __restrict__ w, float* __restrict__ out, int rows, int cols) {
  int nparts = cols / T::PE;
  size_t rb = (size_t)(cols / T::BS) * T::BB;
  size_t total = (size_t)rows * nparts;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
    size_t r = i / nparts;
    int p = (int)(i % nparts);
    float v[T::PE];
    T::deq(w + r * rb + (size_t)(p / T::PARTS) * T::BB, p % T::PARTS, v);
    float4* o = (float4*)(out + r * cols + (size_t)p * T::PE);  // 128-byte aligned when out is
#pragma unroll
    for (int k = 0; k < T::PE / 4; k++) {
      float4 f;
      f.x = v[4 * k];
      f.y = v[4 * k + 1];
      f.z = v[4 * k + 2];
      f.w = v[4 * k + 3];
      o[k] = f;
    }
  }
}

// Embedding: block b copies row ids[b] (or id0 when ids is null, the
// one-token decode case that needs no upload) of the table into out[b].
template <class T>
static __device__ void embed_block(const u8* __restrict__ w, const i32* __restrict__ ids, int id0,
                                   float* __restrict__ out, int cols) {
  int id = ids ? ids[blockIdx.x] : id0;
  size_t rb = (size_t)(cols / T::BS) * T::BB;
  const u8* wr = w + (size_t)id * rb;
  float* o = out + (size_t)blockIdx.x * cols;
  for (int p = threadIdx.x; p < cols / T::PE; p += blockDim.x) {
    float v[T::PE];
    T::deq(wr + (size_t)(p / T::PARTS) * T::BB, p % T::PARTS, v);
#pragma unroll
    for (int k = 0; k < T::PE; k++) o[p * T::PE + k] = v[k];
  }
}

template <class T>
static __device__ void deq16_plain(const u8* __restrict__ w, u16* __restrict__ out, int rows, int cols, int kpad) {
  size_t total = (size_t)rows * kpad;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
    size_t r = i / kpad;
    int c = (int)(i % kpad);
    out[i] = c < cols ? f2h(T::get(w + r * cols * T::ES, c)) : (u16)0;
  }
}

template <class T>
static __device__ void deq32_plain(const u8* __restrict__ w, float* __restrict__ out, int rows, int cols) {
  size_t total = (size_t)rows * cols;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
    out[i] = T::get(w + (i / cols) * cols * T::ES, (int)(i % cols));
}

template <class T>
static __device__ void embed_plain(const u8* __restrict__ w, const i32* __restrict__ ids, int id0,
                                   float* __restrict__ out, int cols) {
  int id = ids ? ids[blockIdx.x] : id0;
  const u8* wr = w + (size_t)id * cols * T::ES;
  float* o = out + (size_t)blockIdx.x * cols;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) o[c] = T::get(wr, c);
}

#define DEQ_BLOCK(name, T)                                                                             \
  KERNEL void __launch_bounds__(256) deq16_##name(const u8* w, u16* out, int rows, int cols, int kpad) { GRID_DEPEND();       \
    deq16_block<T>(w, out, rows, cols, kpad);                                                          \
  }                                                                                                    \
  KERNEL void __launch_bounds__(256) deq32_##name(const u8* w, float* out, int rows, int cols) { GRID_DEPEND(); deq32_block<T>(w, out, rows, cols); } \
  KERNEL void __launch_bounds__(128) embed_##name(const u8* w, const i32* ids, int id0, float* out, int cols) { GRID_DEPEND();               \
    embed_block<T>(w, ids, id0, out, cols);                                                            \
  }
#define DEQ_PLAIN(name, T)                                                                             \
  KERNEL void __launch_bounds__(256) deq16_##name(const u8* w, u16* out, int rows, int cols, int kpad) { GRID_DEPEND();       \
    deq16_plain<T>(w, out, rows, cols, kpad);                                                          \
  }                                                                                                    \
  KERNEL void __launch_bounds__(256) deq32_##name(const u8* w, float* out, int rows, int cols) { GRID_DEPEND(); deq32_plain<T>(w, out, rows, cols); } \
  KERNEL void __launch_bounds__(128) embed_##name(const u8* w, const i32* ids, int id0, float* out, int cols) { GRID_DEPEND();               \
    embed_plain<T>(w, ids, id0, out, cols);                                                            \
  }
FOR_BLOCK_TYPES(DEQ_BLOCK)
FOR_PLAIN_TYPES(DEQ_PLAIN)

// Activations to f16 for the GEMM: x [n][cols] f32 -> out [n][kpad] f16,
// zero-padded.
KERNEL void __launch_bounds__(256) f32_to_f16(const float* x, u16* out, int n, int cols, int kpad) {
  GRID_DEPEND();
  size_t total = (size_t)n * kpad;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
    size_t r = i / kpad;
    int c = (int)(i % kpad);
    out[i] = c < cols ? f2h(x[r * cols + c]) : (u16)0;
  }
}
