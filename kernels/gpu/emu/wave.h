// wave.h: a CPU emulator of GPU wavefronts for the kernel sources in
// kernels/gpu/cu, used only by the tests (emu_test.go). It lets the
// UNMODIFIED kernel text (gpu.Source, the HIP branch of common.h) run as
// plain C++ on the host, so that wave-size semantics and indexing can be
// checked at warpSize 32 and 64 without an AMD GPU.
//
// Model:
//   - every GPU thread is a fiber (ucontext) with its own stack; the threads
//     of one block are scheduled cooperatively on one OS thread, and the
//     blocks of a grid run one after another;
//   - __syncthreads waits for every live (not exited) thread of the block;
//   - a shuffle or a wave barrier (__builtin_amdgcn_wave_barrier, the HIP
//     WARP_SYNC) blocks its lane until no thread of the block can run; the
//     lanes of a warp waiting at the same call site then meet: a lane reads
//     the value its source lane brought there. A source lane that is not at
//     that meeting (exited, or diverged to another site, or waiting at a
//     __syncthreads) is inactive: the read returns a poison value (a NaN
//     for floats) and is counted. Where a warp's lanes wait at different
//     sites, the site with the lowest code address meets first (for
//     structured code: the inner branch before the point where it
//     reconverges), the others wait for the next round;
//   - warpSize is WARP (-DWARP=32 or -DWARP=64); __shared__ variables are
//     per block (static storage, blocks run one at a time); atomics are
//     plain read-modify-writes (one OS thread).
//
// What it cannot check, plainly: the code AMD's compiler generates (this is
// x86 code from the same source; register use, spills, instruction
// selection, fp contraction and the precision of expf differ); memory
// ordering between lanes or blocks (every thread sees every store at once,
// and blocks never overlap, so a missing fence or a race between blocks
// goes unseen unless a lane reads another's shared data before the
// barrier that should precede it); the HIP runtime and hiprtc; performance.
// Lanes run one at a time between meeting points, so code that relies on
// lock-step execution without a WARP_SYNC shows up as wrong results here.
#pragma once

#ifndef WARP
#error "compile with -DWARP=32 or -DWARP=64"
#endif

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

// Fibers: a minimal context switch on x86-64 (callee-saved registers on the
// fiber's own stack; defined in driver.cpp), ucontext elsewhere (correct,
// but each switch costs a system call).
#if defined(__x86_64__)
extern "C" void emu_switch(void** save_sp, void* sp);
#define EMU_ASM_FIBERS 1
#else
#include <ucontext.h>
#endif

// Take the HIP branch of common.h without the runtime's header.
#define __HIPCC_RTC__ 1
#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __constant__
#define __launch_bounds__(...)
#define warpSize WARP
// The target's own code paths: gfx90a's at warp 64, gfx1030's at warp 32
// (both take the sdot4 dot product in matvec.cu).
#if WARP == 64
#define __gfx90a__ 1
#else
#define __gfx1030__ 1
#endif

struct uint4 { unsigned x, y, z, w; } __attribute__((aligned(16)));
struct int4 { int x, y, z, w; } __attribute__((aligned(16)));
struct float4 { float x, y, z, w; } __attribute__((aligned(16)));
struct uint2 { unsigned x, y; } __attribute__((aligned(8)));
struct float2 { float x, y; } __attribute__((aligned(8)));

namespace emu {

struct dim3 { unsigned x = 1, y = 1, z = 1; };

enum State { RUN, MEET, SYNC, DONE };

struct Thread {
#if EMU_ASM_FIBERS
  void* sp;
#else
  ucontext_t ctx;
#endif
  char* stack;
  dim3 idx;
  int lane, warp;
  State st;
  const void* site;  // the call site of the meeting it waits at
  uint64_t val;      // the value it brings (shuffles)
  int src;           // the lane it reads (-1: a barrier)
  uint64_t res;
  bool poisoned;
  // warp_gather: what this lane publishes, and how many gathers it made
  const void* pub;
  uint64_t ngather;
  // cp.async: the copies this lane issued and not yet waited for
  struct Copy {
    void* dst;
    const void* src;
    int bytes, src_bytes;
    int64_t group;  // the commit group (-1: not yet committed)
  } copies[64];
  int ncopies;
  int64_t committed;
};

// The state of the launch in progress (one at a time).
struct Launch {
  dim3 grid, block, bidx;
  int nthreads = 0;
  Thread* threads = nullptr;
  int cap = 0;
  Thread* cur = nullptr;
#if EMU_ASM_FIBERS
  void* sched;
#else
  ucontext_t sched;
#endif
  void (*body)(void*) = nullptr;
  void* arg = nullptr;
  uint64_t poison = 0;  // reads from inactive lanes
};
inline Launch L;

constexpr size_t kStack = 256 * 1024;

// to_sched switches from the current lane to the scheduler; to_lane back.
inline void to_sched() {
#if EMU_ASM_FIBERS
  emu_switch(&L.cur->sp, L.sched);
#else
  swapcontext(&L.cur->ctx, &L.sched);
#endif
}
inline void to_lane(Thread* t) {
  L.cur = t;
#if EMU_ASM_FIBERS
  emu_switch(&L.sched, t->sp);
#else
  swapcontext(&L.sched, &t->ctx);
#endif
}

inline void entry() {
  L.body(L.arg);
  L.cur->st = DONE;
  to_sched();
  abort();  // a finished lane is never resumed
}

// start makes t's fiber begin at entry() on its own stack.
inline void start(Thread& t) {
#if EMU_ASM_FIBERS
  // emu_switch pops six callee-saved registers, then returns into entry()
  // with the stack aligned as at a call.
  uintptr_t top = ((uintptr_t)t.stack + kStack) & ~(uintptr_t)15;
  void** sp = (void**)(top - 64);
  for (int i = 0; i < 6; i++) sp[i] = nullptr;
  sp[6] = (void*)&entry;
  sp[7] = nullptr;
  t.sp = sp;
#else
  getcontext(&t.ctx);
  t.ctx.uc_stack.ss_sp = t.stack;
  t.ctx.uc_stack.ss_size = kStack;
  t.ctx.uc_link = nullptr;
  makecontext(&t.ctx, entry, 0);
#endif
}

// wait parks the current lane until the scheduler releases it.
inline void wait(State s) {
  L.cur->st = s;
  to_sched();
}

// meet brings v to the meeting of the caller's warp at site and returns
// the value of lane src there (poison if src is not at the meeting).
__attribute__((noinline)) inline uint64_t meet(uint64_t v, int src, const void* site) {
  Thread* t = L.cur;
  t->val = v;
  t->src = src;
  t->site = site;
  wait(MEET);
  return t->res;
}

// resolve lets the lanes of warp w waiting at the lowest site meet.
inline bool resolve(int w) {
  Thread* lanes = L.threads + w * WARP;
  int n = L.nthreads - w * WARP < WARP ? L.nthreads - w * WARP : WARP;
  const void* site = nullptr;
  for (int i = 0; i < n; i++)
    if (lanes[i].st == MEET && (site == nullptr || lanes[i].site < site)) site = lanes[i].site;
  if (site == nullptr) return false;
  for (int i = 0; i < n; i++) {
    Thread& t = lanes[i];
    if (t.st != MEET || t.site != site) continue;
    if (t.src >= 0) {
      if (t.src < n && lanes[t.src].st == MEET && lanes[t.src].site == site) {
        t.res = lanes[t.src].val;
      } else {
        t.res = 0x7FBADBAD7FBADBADull;  // a NaN as float, huge as an integer
        L.poison++;
      }
    }
  }
  for (int i = 0; i < n; i++)
    if (lanes[i].st == MEET && lanes[i].site == site) lanes[i].st = RUN;
  return true;
}

inline void run_block() {
  for (int i = 0; i < L.nthreads; i++) {
    Thread& t = L.threads[i];
    start(t);
    t.st = RUN;
    t.pub = nullptr;
    t.ngather = 0;
    t.ncopies = 0;
    t.committed = 0;
  }
  for (;;) {
    for (int i = 0; i < L.nthreads; i++) {
      if (L.threads[i].st == RUN) to_lane(&L.threads[i]);
    }
    bool met = false;
    for (int w = 0; w * WARP < L.nthreads; w++) met |= resolve(w);
    if (met) continue;
    bool synced = false;
    for (int i = 0; i < L.nthreads; i++)
      if (L.threads[i].st == SYNC) L.threads[i].st = RUN, synced = true;
    if (!synced) return;  // every thread is done
  }
}

// launch runs body(arg) on every thread of the grid; it returns the number
// of poisoned shuffle reads.
inline uint64_t launch(dim3 grid, dim3 block, void (*body)(void*), void* arg) {
  L.grid = grid;
  L.block = block;
  L.body = body;
  L.arg = arg;
  L.poison = 0;
  L.nthreads = (int)(block.x * block.y * block.z);
  if (L.nthreads > L.cap) {
    for (int i = 0; i < L.cap; i++) free(L.threads[i].stack);
    free(L.threads);
    L.threads = (Thread*)calloc(L.nthreads, sizeof(Thread));
    for (int i = 0; i < L.nthreads; i++) L.threads[i].stack = (char*)malloc(kStack);
    L.cap = L.nthreads;
  }
  for (int i = 0; i < L.nthreads; i++) {
    Thread& t = L.threads[i];
    t.idx.x = i % block.x;
    t.idx.y = i / block.x % block.y;
    t.idx.z = i / (block.x * block.y);
    t.lane = i % WARP;
    t.warp = i / WARP;
  }
  for (unsigned z = 0; z < grid.z; z++)
    for (unsigned y = 0; y < grid.y; y++)
      for (unsigned x = 0; x < grid.x; x++) {
        L.bidx.x = x, L.bidx.y = y, L.bidx.z = z;
        run_block();
      }
  return L.poison;
}

template <class T>
inline uint64_t bits(T v) {
  static_assert(sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
  uint64_t u = 0;
  memcpy(&u, &v, sizeof(T));
  return u;
}
template <class T>
inline T unbits(uint64_t u) {
  T v;
  memcpy(&v, &u, sizeof(T));
  return v;
}

}  // namespace emu

// The meeting site is the code address of the call in the kernel: the
// shuffles are always inlined down to the noinline meet_here(), whose
// return address is then a distinct place in the kernel's code per call
// site of the source. The HIP shuffles read the caller's own value where
// the source lane falls outside its width-sized segment, as HIP defines.
namespace emu {
__attribute__((noinline)) inline uint64_t meet_here(uint64_t v, int src) {
  return meet(v, src, __builtin_return_address(0));
}
template <class T>
__attribute__((always_inline)) inline T shfl_src(T v, int src) {
  return unbits<T>(meet_here(bits(v), src));
}
__attribute__((always_inline)) inline int seg_src(int idx, int width) {
  int self = L.cur->lane, base = self & ~(width - 1);
  return (idx < 0 || idx >= width) ? self : base + idx;
}
}  // namespace emu

template <class T>
__attribute__((always_inline)) inline T __shfl(T v, int src, int width = WARP) {
  return emu::shfl_src(v, emu::seg_src(((src % width) + width) % width, width));
}
template <class T>
__attribute__((always_inline)) inline T __shfl_xor(T v, int mask, int width = WARP) {
  int self = emu::L.cur->lane;
  return emu::shfl_src(v, emu::seg_src((self & (width - 1)) ^ mask, width));
}
template <class T>
__attribute__((always_inline)) inline T __shfl_down(T v, unsigned d, int width = WARP) {
  int self = emu::L.cur->lane;
  return emu::shfl_src(v, emu::seg_src((self & (width - 1)) + (int)d, width));
}
template <class T>
__attribute__((always_inline)) inline T __shfl_up(T v, unsigned d, int width = WARP) {
  int self = emu::L.cur->lane;
  return emu::shfl_src(v, emu::seg_src((self & (width - 1)) - (int)d, width));
}

#define threadIdx (emu::L.cur->idx)
#define blockIdx (emu::L.bidx)
#define blockDim (emu::L.block)
#define gridDim (emu::L.grid)

inline void __syncthreads() { emu::wait(emu::SYNC); }
inline void __threadfence() {}
#define __builtin_amdgcn_wave_barrier() ((void)emu::meet_here(0, -1))
#define __builtin_amdgcn_fence(order, scope) ((void)0)
#define __builtin_amdgcn_s_barrier() __syncthreads()

// sdot4: the sum of the four signed byte products plus c (clamp false).
inline int emu_sdot4(int a, int b, int c, bool) {
  int s = c;
  for (int i = 0; i < 4; i++) s += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
  return s;
}
#define __builtin_amdgcn_sdot4(a, b, c, clamp) emu_sdot4((a), (b), (c), (clamp))
// sudot4: as sdot4, each operand signed or unsigned as its flag says.
inline int emu_sudot4(bool as, int a, bool bs, int b, int c, bool) {
  int s = c;
  for (int i = 0; i < 4; i++) {
    int x = as ? (int)(signed char)(a >> (8 * i)) : (int)(unsigned char)(a >> (8 * i));
    int y = bs ? (int)(signed char)(b >> (8 * i)) : (int)(unsigned char)(b >> (8 * i));
    s += x * y;
  }
  return s;
}
#define __builtin_amdgcn_sudot4(as, a, bs, b, c, clamp) emu_sudot4((as), (a), (bs), (b), (c), (clamp))

#define EMU_MINMAX(T)                               \
  inline T min(T a, T b) { return a < b ? a : b; } \
  inline T max(T a, T b) { return a > b ? a : b; }
EMU_MINMAX(int)
EMU_MINMAX(unsigned)
EMU_MINMAX(long long)
EMU_MINMAX(unsigned long long)
EMU_MINMAX(float)
#undef EMU_MINMAX

inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
inline int __float_as_int(float f) { int u; memcpy(&u, &f, 4); return u; }

template <class T>
inline T atomicAdd(T* p, T v) { T o = *p; *p = o + v; return o; }
template <class T>
inline T atomicMax(T* p, T v) { T o = *p; *p = o > v ? o : v; return o; }
template <class T>
inline T atomicExch(T* p, T v) { T o = *p; *p = v; return o; }
template <class T>
inline T atomicCAS(T* p, T cmp, T v) { T o = *p; if (o == cmp) *p = v; return o; }

// ---- NVIDIA warp-level matrix operations (warp 32 only) -------------------
//
// A kernel's sm_80 path that uses mma.sync, ldmatrix and cp.async takes
// these in place of its inline PTX where FORGE_EMU_TENSOR is defined (the
// emulator at warp 32), so that its fragment layouts, its masking and its
// copy pipeline run here too. What they model:
//   - warp_gather: the lanes of a warp meet at one call, each publishes
//     its operands, and each copies every lane's; a lane absent from the
//     meeting (exited, diverged, or at another gather) gives poison bytes
//     and is counted like a shuffle from an inactive lane;
//   - mma m16n8k16 (f16 A row-major, f16 B column-major, f32 C): the
//     fragment layouts of the PTX ISA, each output the f32 sum of its 16
//     products in k order, added to the accumulator (the hardware's order of
//     additions is its own: results agree to rounding, not to the bit);
//   - ldmatrix m8n8 x4 (and .trans): lanes 8i … 8i+7 give the row addresses
//     of matrix i (16-byte aligned, checked); lane (g, t) receives row g,
//     elements 2t and 2t+1 (with .trans: rows 2t and 2t+1 of column g);
//   - cp.async of 16 bytes with a source size (the rest zero-filled): the
//     copy is queued and lands only when its lane waits for its commit
//     group (cp.async.wait_group), so a read before that wait, or before
//     the barrier after other lanes' waits, sees the old bytes.
#if WARP == 32
#define FORGE_EMU_TENSOR 1

namespace emu {

// warp_gather copies n bytes at mine from every lane of the caller's warp
// into all (lane i's at all + i·n).
__attribute__((noinline)) inline void warp_gather(const void* mine, void* all, size_t n) {
  Thread* self = L.cur;
  self->pub = mine;
  uint64_t gen = ++self->ngather;
  (void)meet_here(0, -1);
  Thread* lanes = L.threads + self->warp * WARP;
  int nl = L.nthreads - self->warp * WARP < WARP ? L.nthreads - self->warp * WARP : WARP;
  for (int i = 0; i < WARP; i++) {
    char* d = (char*)all + i * n;
    if (i < nl && lanes[i].st != DONE && lanes[i].ngather == gen && lanes[i].pub != nullptr) {
      memcpy(d, lanes[i].pub, n);
    } else {
      memset(d, 0xFF, n);
      L.poison++;
    }
  }
  // every lane has copied before any goes on (and changes what it published)
  (void)meet_here(0, -1);
}

inline float tensor_h2f(unsigned h) {
  uint16_t u = (uint16_t)h;
  _Float16 f;
  memcpy(&f, &u, 2);
  return (float)f;
}

inline void check_align(const void* p, const char* what) {
  if (((uintptr_t)p & 15) != 0) {
    fprintf(stderr, "emulator: %s address %p is not 16-byte aligned\n", what, p);
    abort();
  }
}

}  // namespace emu

inline void emu_mma16816(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  struct Op {
    unsigned a[4], b[2];
  } mine = {{a[0], a[1], a[2], a[3]}, {b0, b1}}, all[WARP];
  emu::warp_gather(&mine, all, sizeof(Op));
  float A[16][16], B[16][8];
  for (int l = 0; l < WARP; l++) {
    int g = l >> 2, t = l & 3;
    const Op& o = all[l];
    for (int h = 0; h < 2; h++) {
      A[g][2 * t + h] = emu::tensor_h2f(o.a[0] >> (16 * h));
      A[g + 8][2 * t + h] = emu::tensor_h2f(o.a[1] >> (16 * h));
      A[g][2 * t + 8 + h] = emu::tensor_h2f(o.a[2] >> (16 * h));
      A[g + 8][2 * t + 8 + h] = emu::tensor_h2f(o.a[3] >> (16 * h));
      B[2 * t + h][g] = emu::tensor_h2f(o.b[0] >> (16 * h));
      B[2 * t + 8 + h][g] = emu::tensor_h2f(o.b[1] >> (16 * h));
    }
  }
  int lane = emu::L.cur->lane, g = lane >> 2, t = lane & 3;
  for (int i = 0; i < 4; i++) {
    int r = g + (i >> 1) * 8, col = 2 * t + (i & 1);
    float s = 0.0f;
    for (int k = 0; k < 16; k++) s += A[r][k] * B[k][col];
    c[i] += s;
  }
}

inline void emu_ldsm_x4(unsigned* r, const void* p, bool trans) {
  emu::check_align(p, "ldmatrix row");
  const void* all[WARP];
  emu::warp_gather(&p, all, sizeof(p));
  static const uint16_t nan_row[8] = {0x7E00, 0x7E00, 0x7E00, 0x7E00, 0x7E00, 0x7E00, 0x7E00, 0x7E00};
  for (int i = 0; i < WARP; i++)
    if (all[i] == (const void*)~(uintptr_t)0) all[i] = nan_row;  // poisoned (counted)
  int lane = emu::L.cur->lane, g = lane >> 2, t = lane & 3;
  for (int i = 0; i < 4; i++) {
    uint16_t lo, hi;
    if (!trans) {
      const uint16_t* row = (const uint16_t*)all[8 * i + g];
      lo = row[2 * t], hi = row[2 * t + 1];
    } else {
      lo = ((const uint16_t*)all[8 * i + 2 * t])[g];
      hi = ((const uint16_t*)all[8 * i + 2 * t + 1])[g];
    }
    r[i] = (unsigned)lo | ((unsigned)hi << 16);
  }
}

inline void emu_cp_async16(void* dst, const void* src, int src_bytes) {
  emu::check_align(dst, "cp.async destination");
  if (src_bytes > 0) emu::check_align(src, "cp.async source");
  emu::Thread* t = emu::L.cur;
  if (t->ncopies == (int)(sizeof(t->copies) / sizeof(t->copies[0]))) {
    fprintf(stderr, "emulator: more than %d cp.async copies pending in one lane\n", t->ncopies);
    abort();
  }
  t->copies[t->ncopies++] = {dst, src, 16, src_bytes, -1};
}

inline void emu_cp_commit() {
  emu::Thread* t = emu::L.cur;
  t->committed++;
  for (int i = 0; i < t->ncopies; i++)
    if (t->copies[i].group < 0) t->copies[i].group = t->committed;
}

// emu_cp_wait lands the copies of every group but the newest n committed.
inline void emu_cp_wait(int n) {
  emu::Thread* t = emu::L.cur;
  int k = 0;
  for (int i = 0; i < t->ncopies; i++) {
    auto& c = t->copies[i];
    if (c.group >= 0 && c.group <= t->committed - n) {
      memcpy(c.dst, c.src, c.src_bytes);
      memset((char*)c.dst + c.src_bytes, 0, c.bytes - c.src_bytes);
    } else {
      t->copies[k++] = c;
    }
  }
  t->ncopies = k;
}
#endif

// ---- the kernel registry -----------------------------------------------------
//
// The test appends EMU_KERNEL(name) for every extern "C" kernel of a module
// after its source; the driver (driver.cpp) finds kernels by name and calls
// them with arguments decoded from a job file, each converted to the
// kernel's own parameter type.
#include <type_traits>
#include <utility>

namespace emu {

struct Arg {
  void* p;
  int i;
  float f;
};

template <class T>
T arg_as(const Arg& a) {
  if constexpr (std::is_pointer_v<T>) {
    return (T)a.p;
  } else if constexpr (std::is_floating_point_v<T>) {
    return (T)a.f;
  } else {
    return (T)a.i;
  }
}

template <class... A, size_t... I>
void invoke_impl(void (*f)(A...), const Arg* a, std::index_sequence<I...>) {
  f(arg_as<A>(a[I])...);
}
template <class... A>
void invoke(void (*f)(A...), const Arg* a) {
  invoke_impl(f, a, std::index_sequence_for<A...>{});
}
template <class... A>
constexpr int nargs(void (*)(A...)) {
  return sizeof...(A);
}

struct Entry {
  const char* name;
  void (*fn)(const Arg*);
  int nargs;
  Entry* next;
  static Entry*& head() {
    static Entry* h = nullptr;
    return h;
  }
  Entry(const char* n, void (*f)(const Arg*), int na) : name(n), fn(f), nargs(na), next(head()) { head() = this; }
};

}  // namespace emu

#define EMU_KERNEL(name)                                                   \
  static void emu_call_##name(const emu::Arg* a) { emu::invoke(name, a); } \
  static emu::Entry emu_entry_##name(#name, emu_call_##name, emu::nargs(name));
