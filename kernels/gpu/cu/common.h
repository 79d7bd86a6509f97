// common.h: the name-mapping header that lets one kernel source build with
// nvrtc (CUDA) and hiprtc (HIP). It includes no system header, so it works
// with the bare run-time compilers: every type and conversion it needs is
// defined here. The Go side pastes it in front of each .cu file in place of
// its `#include "common.h"` line.
//
// Rules for the kernels:
//   - the warp size is never a constant: use warpSize (32 on NVIDIA and RDNA,
//     64 on CDNA); shared arrays sized per warp assume at least 32 lanes.
//   - every kernel is extern "C" so the launcher finds it by its plain name.
#pragma once

#if defined(__HIP__) || defined(__HIPCC_RTC__) || defined(__HIP_PLATFORM_AMD__)
#define FORGE_HIP 1
#else
#define FORGE_CUDA 1
#endif

// hiprtc and nvrtc pre-include their runtime's device declarations; an
// offline hipcc build (the quick syntax check) needs the header.
#if defined(FORGE_HIP) && !defined(__HIPCC_RTC__)
#include <hip/hip_runtime.h>
#endif

typedef decltype(sizeof(0)) size_t;  // same type as the runtime's, if it has one
typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef short i16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
typedef long long i64;

#define KERNEL extern "C" __global__

// GRID_DEPEND is the first statement of every kernel (TestKernelsStartWithGridDepend
// checks it). On Hopper and later the backend launches kernels with
// programmatic stream serialization (gpu.Backend.overlap): a kernel's blocks
// may then be scheduled while the kernel before it on the stream still runs,
// so that the launch and ramp-up of the next kernel hide behind the tail of
// this one; they are hundreds of kernels a decode step. The wait holds the
// whole kernel until the previous grid has finished and its writes are
// visible, so nothing a kernel reads or writes changes; the trigger after it
// lets the next kernel be scheduled as soon as every block of this one has
// started. Elsewhere (older GPUs, HIP, the emulator) it is nothing, and the
// backend launches normally.
//
// A small kernel whose own loads sit on the decode step's critical path
// (the norm, the decode attention, silu·mul) starts with GRID_WAIT() alone
// and triggers its dependents with GRID_TRIGGER() once those loads have
// returned. The next kernel's blocks, as soon as they are scheduled, ask
// L2 for their first weight rows (GRID_PREFETCH: megabytes at once), and
// the small kernel's loads then queued behind them; triggering after them
// made the 7B and 8B decode steps 2–4 % faster on the H100
// (bench/results/2026-11-26-trigger-h100.md). A kernel that never
// triggers lets its dependents go when it exits; either way the wait
// holds until the grid before has finished.
#if defined(FORGE_CUDA) && defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
#define GRID_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define GRID_TRIGGER() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#else
#define GRID_WAIT() ((void)0)
#define GRID_TRIGGER() ((void)0)
#endif
#define GRID_DEPEND() \
  do {                \
    GRID_WAIT();      \
    GRID_TRIGGER();   \
  } while (0)
// GRID_PREFETCH(p, n) may come before GRID_DEPEND(): the calling warp asks
// L2 for the n bytes at p, without waiting for them. Only for memory no
// kernel of the step writes (the weights), and only where GRID_DEPEND waits:
// the blocks of a matrix-vector kernel then start streaming their first
// weight rows from DRAM while the kernel before them (a norm, the
// attention, the tail of another product) still runs, instead of after it.
// The loads after the wait find those rows in L2; nothing read before the
// wait is used. Elsewhere it is nothing.
#if defined(FORGE_CUDA) && defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
#define GRID_PREFETCH(p, n) l2_prefetch_warp((const u8*)(p), (size_t)(n))
static __device__ __forceinline__ void l2_prefetch_warp(const u8* p, size_t n) {
  if (n == 0) return;
  // one 128-byte line per lane and round; the first line from p itself
  const u8* line = (const u8*)((size_t)p & ~(size_t)127);
  for (size_t o = (size_t)(threadIdx.x % warpSize) * 128; line + o < p + n; o += (size_t)warpSize * 128) {
    const u8* a = line + o < p ? p : line + o;
    asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
  }
}
// GRID_PREFETCH_ROWS(w, R, rows, rb): GRID_PREFETCH of the first group of R
// rows (of rows, rb bytes each) that the calling warp of a grid-strided
// matrix-vector kernel reads (warp v of the grid takes rows R·v …).
#define GRID_PREFETCH_ROWS(w, R, rows, rb) l2_prefetch_rows((const u8*)(w), (R), (rows), (size_t)(rb))
static __device__ __forceinline__ void l2_prefetch_rows(const u8* w, int R, int rows, size_t rb) {
  int row0 = (blockIdx.x * (blockDim.x / warpSize) + threadIdx.x / warpSize) * R;
  if (row0 < rows) l2_prefetch_warp(w + (size_t)row0 * rb, (size_t)min(R, rows - row0) * rb);
}
#else
#define GRID_PREFETCH(p, n) ((void)0)
#define GRID_PREFETCH_ROWS(w, R, rows, rb) ((void)0)
#endif
#if defined(FORGE_CUDA)
#define FORGE_INLINE __forceinline__
#else
#define FORGE_INLINE inline __attribute__((always_inline))
#endif
// DEV marks a file-local device helper; DEVM a static member function of a
// type-traits struct (quants.h).
#define DEV static __device__ FORGE_INLINE
#define DEVM __device__ FORGE_INLINE

// ---- half and bfloat16 <-> float --------------------------------------------

#if defined(FORGE_CUDA)
DEV float h2f(u16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
DEV u16 f2h(float f) {
  u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
#else
DEV float h2f(u16 h) {
  union { u16 u; _Float16 f; } c;
  c.u = h;
  return (float)c.f;
}
DEV u16 f2h(float f) {
  union { u16 u; _Float16 f; } c;
  c.f = (_Float16)f;
  return c.u;
}
#endif

DEV float bf2f(u16 h) { return __uint_as_float(((u32)h) << 16); }

// stkv stores element i of a KV cache row: f16 (the default) or f32 (exact,
// for checking against a float reference).
DEV void stkv(u16* p, size_t i, float v) { p[i] = f2h(v); }
DEV void stkv(float* p, size_t i, float v) { p[i] = v; }

// The float whose bits are 0x4B000000|q is 2^23+q for q < 2^23, so a small
// unsigned integer becomes a float with one OR and one subtraction instead of
// a conversion instruction (which runs at a quarter rate or less).
DEV float u2f_small(u32 q) { return __uint_as_float(0x4B000000u | q) - 8388608.0f; }

// ---- warp and block reductions ----------------------------------------------

#if defined(FORGE_CUDA)
#define SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m))
#else
#define SHFL_XOR(v, m) __shfl_xor((v), (m))
#endif

// WARP_SYNC orders shared-memory writes of one warp before its later reads.
// On AMD a wavefront runs in lock step, but the compiler may still move
// loads and stores across a bare wave barrier: the release fence before it
// and the acquire fence after it, both of wavefront scope, forbid that
// (they cost no instruction at that scope; they only bind the compiler).
#if defined(FORGE_CUDA)
#define WARP_SYNC() __syncwarp()
#else
#define WARP_SYNC()                                                                                        \
  do {                                                                                                     \
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");                                                 \
    __builtin_amdgcn_wave_barrier();                                                                       \
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");                                                 \
  } while (0)
#endif

DEV float warp_sum(float v) {
  for (int o = warpSize / 2; o > 0; o >>= 1) v += SHFL_XOR(v, o);
  return v;
}

DEV float warp_max(float v) {
  for (int o = warpSize / 2; o > 0; o >>= 1) v = fmaxf(v, SHFL_XOR(v, o));
  return v;
}

// block_sum returns the sum of v over the block to every thread. scratch
// holds one float per warp (32 is enough for 1024 threads at warp 32).
DEV float block_sum(float v, float* scratch) {
  int lane = threadIdx.x % warpSize, w = threadIdx.x / warpSize;
  int nw = (blockDim.x + warpSize - 1) / warpSize;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[w] = v;
  __syncthreads();
  v = lane < nw ? scratch[lane] : 0.0f;
  return warp_sum(v);
}

DEV float block_max(float v, float* scratch) {
  int lane = threadIdx.x % warpSize, w = threadIdx.x / warpSize;
  int nw = (blockDim.x + warpSize - 1) / warpSize;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[w] = v;
  __syncthreads();
  v = lane < nw ? scratch[lane] : -3.0e38f;
  return warp_max(v);
}

// q8_group quantizes v, one value per lane, in groups of 32 lanes exactly as
// quantize_q8 (matvec.cu) does: the decode matrix–vector kernels then find
// the 8-bit copy of their input already made by the op that wrote it.
// Element i of the vector goes to q[i], the scale of its group of 32 to
// d[i/32] (i < n only). Every lane of the warp must call it (the loops
// around it are uniform per warp).
DEV void q8_group(float v, int i, int n, i8* q, float* d) {
  float a = fabsf(v);
  for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, SHFL_XOR(a, o));
  float s = a / 127.0f;
  float inv = a > 0.0f ? 127.0f / a : 0.0f;
  if (i < n) {
    q[i] = (i8)(int)rintf(v * inv);
    if ((i & 31) == 0) d[i >> 5] = s;
  }
}

// Unaligned little-endian loads for block fields that are not naturally
// aligned (blocks of 18, 22, 34 bytes…).
DEV u32 ld_u16(const u8* p) { return (u32)p[0] | ((u32)p[1] << 8); }
DEV u32 ld_u32(const u8* p) {
  return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}
