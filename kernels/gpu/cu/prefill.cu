// prefill.cu: attention of a prompt piece over the paged KV pool (the rows
// of one sequence at consecutive positions in a batched step).
//
//   q, out [n][heads][D] f32; the pool per layer keys then values, each
//   [blocks·bs][kvDim] f16 (kvDim = kvHeads·D); row t is at position
//   pos0 + t of the sequence whose block table is tabs[toff[s] …], and
//   attends to its positions 0 … pos0 + t (its own new keys were stored by
//   kv_store_paged before this kernel runs).
//
// attn_paged (attn.cu) gives every row its own blocks, which read the whole
// prefix again for each row: right for decode rows, slow for a piece of a
// few hundred rows over a few thousand cached positions (a conversation's
// next turn). Here one block takes a tile of 64 rows of one head and reads
// each chunk of the prefix once for the whole tile, with an online softmax
// (running max m, sum l, output rescaled by e^(m_old − m_new)) so that
// shared memory does not grow with the prefix.
//
// Batch invariance: chunks start at multiples of the chunk size in absolute
// positions and each row keeps its own m, l and output, so a row's result
// depends on its own query, its sequence's keys and values and its
// position, never on which other rows share its tile or its piece. Chunks
// past a row's end add exact zeros (p = 0, e^0 = 1), or are skipped.
//
// NVIDIA sm_80 and later (attn_prefill_f16_*, prefill_pipe): four warps of
// 16 rows, scores and p·V with mma.sync m16n8k16 (f16 operands, f32
// accumulation; the query and the probabilities are rounded to f16 for the
// product). Chunks of PP_CH positions go through three stages of shared
// memory: while the warps multiply one chunk, cp.async brings the next two
// (and plain loads the block-table entries of the one after), so the
// prefix streams at the speed of the products rather than at one memory
// round trip per chunk. Keys and values are staged row-major, as the pool
// holds them (16-byte units permuted per row against bank conflicts), and
// read with ldmatrix (values with .trans, which gives the B fragment of
// p·V without a transposed copy).
//
// Elsewhere (HIP, older NVIDIA) the kernels run the plain path, two threads
// per row (prefill_plain), over chunks of PF_CH positions staged by
// pf_stage (values transposed). attn_prefill_plain_* is that plain path on
// every device and attn_prefill_v1_* the first sm_80 path (prefill_mma:
// chunks of PF_CH staged by pf_stage, synchronously), both for tests and
// comparisons. Under the wavefront emulator at warp 32 (FORGE_EMU_TENSOR,
// emu/wave.h) attn_prefill_emu_* runs prefill_pipe on the emulator's
// mma.sync, ldmatrix and cp.async (attn_prefill_emuv1_*: prefill_mma).
// A sliding window (window > 0: row t sees positions pos0+t−window+1 …
// pos0+t) masks the scores before it, as the causal mask masks those
// after; sinks (one logit per head, gpt-oss) join each row's softmax
// denominator at the end (sink_inv). window 0 and sinks null leave every
// path's arithmetic as it was.
//   grid (heads, ceil(n/64)), block 128, D = 64 or 128
#include "common.h"
#include "softmax.h"

#define PF_ROWS 64
#define PF_CH 64
// transposed value row stride: distinct banks for a fragment's 8 rows (the
// scalar stores that transpose them in pf_stage conflict 16-way, one
// reason prefill_pipe stages values row-major and reads them with .trans)
#define PF_VS (PF_CH + 8)

#if defined(FORGE_CUDA) && defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
#define PREFILL_MMA 1
#endif
#if defined(PREFILL_MMA) || defined(FORGE_EMU_TENSOR)
#define PREFILL_TENSOR 1  // the mma paths are compiled (on the device, or on the emulator's operations)
#endif

DEV size_t pf_row(const i32* tab, int p, int bs) { return (size_t)tab[p / bs] * bs + p % bs; }


DEV float2 pf_f2(float x, float y) {
  float2 v;
  v.x = x;
  v.y = y;
  return v;
}

DEV u32 pack_h2(float a, float b) { return (u32)f2h(a) | ((u32)f2h(b) << 16); }

// pf_stage copies positions c0 … c0+PF_CH−1 (zeros past L) of key/value
// head kvh into ks [PF_CH][D+8] and vt [D][PF_VS].
template <int D>
DEV void pf_stage(u16* ks, u16* vt, const u16* kc, const u16* vc, const i32* tab, int bs, int kvDim, int kvh,
                  int c0, int L) {
  constexpr int KS = D + 8;
  constexpr int V8 = D / 8;
  for (int i = threadIdx.x; i < PF_CH * V8; i += blockDim.x) {
    int j = i / V8, c8 = i % V8;
    int p = c0 + j;
    uint4 kv, vv;
    kv.x = kv.y = kv.z = kv.w = 0;
    vv = kv;
    if (p < L) {
      size_t o = pf_row(tab, p, bs) * kvDim + (size_t)kvh * D + c8 * 8;
      kv = *(const uint4*)(kc + o);
      vv = *(const uint4*)(vc + o);
    }
    *(uint4*)(ks + j * KS + c8 * 8) = kv;
    u16* vd = vt + (c8 * 8) * PF_VS + j;
    vd[0 * PF_VS] = vv.x & 0xFFFF;
    vd[1 * PF_VS] = vv.x >> 16;
    vd[2 * PF_VS] = vv.y & 0xFFFF;
    vd[3 * PF_VS] = vv.y >> 16;
    vd[4 * PF_VS] = vv.z & 0xFFFF;
    vd[5 * PF_VS] = vv.z >> 16;
    vd[6 * PF_VS] = vv.w & 0xFFFF;
    vd[7 * PF_VS] = vv.w >> 16;
  }
}

#if defined(PREFILL_MMA)
DEV void mma16816(float* c, const u32* a, u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// pp_sa is an address in shared memory: the 32-bit one of the shared
// window here (taken once per array, then moved by 32-bit adds), a pointer
// on the emulator; pp_at moves it by a number of halves.
typedef u32 pp_sa;
DEV pp_sa pp_sa_of(u16* p) {
  u32 a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}
DEV pp_sa pp_at(pp_sa a, int halves) { return a + 2 * (u32)halves; }

// ldmatrix x4: lanes 8i … 8i+7 give the rows of 8×8 tile i; lane (g, t)
// gets row g, elements 2t and 2t+1 of each (.trans: rows 2t and 2t+1 of
// column g).
DEV void pp_ldsm4(u32* r, pp_sa a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}
DEV void pp_ldsm4t(u32* r, pp_sa a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}

// pp_cp16 copies 16 bytes from global to shared memory asynchronously,
// reading src_bytes of them (0 or 16) and zero-filling the rest.
DEV void pp_cp16(pp_sa dst, const u16* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
DEV void pp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// pp_wait_prev waits for every copy but those of the newest commit group.
DEV void pp_wait_prev() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
#elif defined(FORGE_EMU_TENSOR)
DEV void mma16816(float* c, const u32* a, u32 b0, u32 b1) { emu_mma16816(c, a, b0, b1); }
typedef u16* pp_sa;
DEV pp_sa pp_sa_of(u16* p) { return p; }
DEV pp_sa pp_at(pp_sa a, int halves) { return a + halves; }
DEV void pp_ldsm4(u32* r, pp_sa a) { emu_ldsm_x4(r, a, false); }
DEV void pp_ldsm4t(u32* r, pp_sa a) { emu_ldsm_x4(r, a, true); }
DEV void pp_cp16(pp_sa dst, const u16* src, int src_bytes) { emu_cp_async16(dst, src, src_bytes); }
DEV void pp_commit() { emu_cp_commit(); }
DEV void pp_wait_prev() { emu_cp_wait(1); }
#endif

#if defined(PREFILL_TENSOR)

// The mma path: warp w owns rows 16w … 16w+15 of the tile; lane (g, t) =
// (lane/4, lane%4) holds, in the fragment layout of m16n8k16, rows g and
// g+8 and columns 2t, 2t+1 of every 8-column tile.
template <int D>
DEV void prefill_mma(float* out, const float* q, const u16* kc, const u16* vc, int n, int heads, int kvHeads,
                     float scale, int bs, int pos0, const i32* tab, int window, const float* sinks,
                     int t0) {
  constexpr int KS = D + 8;
  __shared__ __attribute__((aligned(16))) u16 ks[PF_CH * KS];
  __shared__ __attribute__((aligned(16))) u16 vt[D * PF_VS];
  int h = blockIdx.x;
  int kvDim = kvHeads * D, kvh = h / (heads / kvHeads);
  int last = min(n, t0 + PF_ROWS) - 1;  // the tile's last row
  int L = pos0 + last + 1;              // positions the tile reads
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  int g = lane >> 2, t = lane & 3;
  int r0 = t0 + 16 * w + g, r1 = r0 + 8;  // this lane's rows
  int wlast = min(t0 + 16 * w + 15, last);  // the warp's last row (< its first: no rows)
  int P0 = pos0 + r0, P1 = pos0 + r1;
  // the rows' first positions (a sliding window; 0 without one)
  int F0 = window > 0 ? P0 - window + 1 : 0, F1 = window > 0 ? P1 - window + 1 : 0;

  u32 qa[D / 16][4];
  {
    const float* q0 = q + ((size_t)min(r0, n - 1) * heads + h) * D;
    const float* q1 = q + ((size_t)min(r1, n - 1) * heads + h) * D;
    bool v0 = r0 < n, v1 = r1 < n;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
      int c = 16 * kk + 2 * t;
      float2 a = v0 ? *(const float2*)(q0 + c) : pf_f2(0.0f, 0.0f);
      float2 b = v1 ? *(const float2*)(q1 + c) : pf_f2(0.0f, 0.0f);
      float2 a8 = v0 ? *(const float2*)(q0 + c + 8) : pf_f2(0.0f, 0.0f);
      float2 b8 = v1 ? *(const float2*)(q1 + c + 8) : pf_f2(0.0f, 0.0f);
      qa[kk][0] = pack_h2(a.x, a.y);
      qa[kk][1] = pack_h2(b.x, b.y);
      qa[kk][2] = pack_h2(a8.x, a8.y);
      qa[kk][3] = pack_h2(b8.x, b8.y);
    }
  }
  float m0 = -3.0e38f, m1 = -3.0e38f, l0 = 0.0f, l1 = 0.0f;
  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;

  for (int c0 = 0; c0 < L; c0 += PF_CH) {
    __syncthreads();
    pf_stage<D>(ks, vt, kc, vc, tab, bs, kvDim, kvh, c0, L);
    __syncthreads();
    if (wlast < t0 + 16 * w || c0 > pos0 + wlast) continue;  // no rows, or every position past them
    float s[PF_CH / 8][4];
#pragma unroll
    for (int nt = 0; nt < PF_CH / 8; nt++) {
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
      const u16* kr = ks + (nt * 8 + g) * KS + 2 * t;
#pragma unroll
      for (int kk = 0; kk < D / 16; kk++)
        mma16816(s[nt], qa[kk], *(const u32*)(kr + 16 * kk), *(const u32*)(kr + 16 * kk + 8));
    }
    float cm0 = -3.0e38f, cm1 = -3.0e38f;
#pragma unroll
    for (int nt = 0; nt < PF_CH / 8; nt++) {
      int p = c0 + nt * 8 + 2 * t;
      s[nt][0] = p <= P0 && p >= F0 ? s[nt][0] * scale : -3.0e38f;
      s[nt][1] = p + 1 <= P0 && p + 1 >= F0 ? s[nt][1] * scale : -3.0e38f;
      s[nt][2] = p <= P1 && p >= F1 ? s[nt][2] * scale : -3.0e38f;
      s[nt][3] = p + 1 <= P1 && p + 1 >= F1 ? s[nt][3] * scale : -3.0e38f;
      cm0 = fmaxf(cm0, fmaxf(s[nt][0], s[nt][1]));
      cm1 = fmaxf(cm1, fmaxf(s[nt][2], s[nt][3]));
    }
    cm0 = fmaxf(cm0, SHFL_XOR(cm0, 1));
    cm0 = fmaxf(cm0, SHFL_XOR(cm0, 2));
    cm1 = fmaxf(cm1, SHFL_XOR(cm1, 1));
    cm1 = fmaxf(cm1, SHFL_XOR(cm1, 2));
    float mn0 = fmaxf(m0, cm0), mn1 = fmaxf(m1, cm1);
    float a0 = expf(m0 - mn0), a1 = expf(m1 - mn1);
    float ls0 = 0.0f, ls1 = 0.0f;
    u32 pa[PF_CH / 16][4];
#pragma unroll
    for (int nt = 0; nt < PF_CH / 8; nt++) {
      float p0 = s[nt][0] <= -3.0e38f ? 0.0f : expf(s[nt][0] - mn0);
      float p1 = s[nt][1] <= -3.0e38f ? 0.0f : expf(s[nt][1] - mn0);
      float p2 = s[nt][2] <= -3.0e38f ? 0.0f : expf(s[nt][2] - mn1);
      float p3 = s[nt][3] <= -3.0e38f ? 0.0f : expf(s[nt][3] - mn1);
      ls0 += p0 + p1;
      ls1 += p2 + p3;
      // score tiles 2k and 2k+1 are the A fragment of p·V's k-step k
      pa[nt / 2][(nt & 1) * 2 + 0] = pack_h2(p0, p1);
      pa[nt / 2][(nt & 1) * 2 + 1] = pack_h2(p2, p3);
    }
    ls0 += SHFL_XOR(ls0, 1);
    ls0 += SHFL_XOR(ls0, 2);
    ls1 += SHFL_XOR(ls1, 1);
    ls1 += SHFL_XOR(ls1, 2);
    l0 = l0 * a0 + ls0;
    l1 = l1 * a1 + ls1;
    m0 = mn0;
    m1 = mn1;
#pragma unroll
    for (int dt = 0; dt < D / 8; dt++) {
      o[dt][0] *= a0;
      o[dt][1] *= a0;
      o[dt][2] *= a1;
      o[dt][3] *= a1;
      const u16* vr = vt + (dt * 8 + g) * PF_VS + 2 * t;
#pragma unroll
      for (int kk = 0; kk < PF_CH / 16; kk++)
        mma16816(o[dt], pa[kk], *(const u32*)(vr + 16 * kk), *(const u32*)(vr + 16 * kk + 8));
    }
  }
  float i0 = sink_inv(l0, m0, sinks, h), i1 = sink_inv(l1, m1, sinks, h);
#pragma unroll
  for (int dt = 0; dt < D / 8; dt++) {
    int c = dt * 8 + 2 * t;
    if (r0 < n) *(float2*)(out + ((size_t)r0 * heads + h) * D + c) = pf_f2(o[dt][0] * i0, o[dt][1] * i0);
    if (r1 < n) *(float2*)(out + ((size_t)r1 * heads + h) * D + c) = pf_f2(o[dt][2] * i1, o[dt][3] * i1);
  }
}

#define PP_CH 32     // positions per chunk of prefill_pipe
#define PP_STAGES 3  // chunks in shared memory: 3 × (keys + values) × 32 × D halves, 48 KB at D = 128
#if defined(FORGE_EMU_TENSOR)
#define PP_SPLIT 64  // the emulator's: several splits within the short prefixes it can afford
#else
#define PP_SPLIT 1024  // positions one block of attn_prefill_split_* walks (a multiple of PP_CH; prefill.go prefillSplit)
#endif

// pp_off is where row r, 16-byte unit u of a staged chunk lives (in
// halves): rows of D halves, unpadded, each row's units permuted by
// u ^ (r % 8), so that the 8 rows an ldmatrix phase reads at one unit
// fall in 8 distinct 16-byte bank groups, as do the 8 units of a row that
// 8 adjacent threads copy.
template <int D>
DEV int pp_off(int r, int u) {
  return r * D + ((u ^ (r & 7)) << 3);
}

// The block of position p and its place in it, for a block size bs whose
// log2 is bsh (−1: bs is no power of two, and these divide).
DEV int pp_blk(int p, int bs, int bsh) { return bsh >= 0 ? p >> bsh : (int)((unsigned)p / (unsigned)bs); }
DEV int pp_in(int p, int bs, int bsh) { return bsh >= 0 ? p & (bs - 1) : (int)((unsigned)p % (unsigned)bs); }

// pp_tab loads the block-table entries of the rows this thread copies in
// chunk c (rows past L: none, 0). Nothing uses them until the chunk's
// copies start, an iteration later, so the loads are in flight meanwhile.
template <int D>
DEV void pp_tab(i32* tb, const i32* tab, int bs, int bsh, int c, int L) {
  constexpr int U = D / 8, RSTEP = 128 / U, CP = PP_CH / RSTEP;
  int cj = (int)threadIdx.x / U;
#pragma unroll
  for (int k = 0; k < CP; k++) {
    int p = c * PP_CH + cj + k * RSTEP;
    tb[k] = p < L ? tab[pp_blk(p, bs, bsh)] : 0;
  }
}

// pp_issue starts the copies of chunk c's keys and values into the stage
// ks, vs (PP_CH rows each, laid out by pp_off), with the table entries tb
// from pp_tab; rows past L are zero-filled. Thread x copies 16-byte unit
// x % (D/8) of rows x / (D/8) + k·(128/(D/8)): a row's units are adjacent
// threads, so the reads of a row are one contiguous 2·D-byte run.
template <int D>
DEV void pp_issue(pp_sa ks, pp_sa vs, const u16* kc, const u16* vc, const i32* tb, int bs, int bsh, int kvDim, int kvh,
                  int c, int L) {
  constexpr int U = D / 8, RSTEP = 128 / U, CP = PP_CH / RSTEP;
  int cu = (int)threadIdx.x % U, cj = (int)threadIdx.x / U;
#pragma unroll
  for (int k = 0; k < CP; k++) {
    int j = cj + k * RSTEP, p = c * PP_CH + j;
    bool v = p < L;
    // (a pool's rows are counted in 32 bits: NewKVPool refuses more)
    size_t o = v ? (size_t)(tb[k] * bs + pp_in(p, bs, bsh)) * kvDim + (size_t)kvh * D + cu * 8 : 0;
    pp_cp16(pp_at(ks, pp_off<D>(j, cu)), kc + o, v ? 16 : 0);
    pp_cp16(pp_at(vs, pp_off<D>(j, cu)), vc + o, v ? 16 : 0);
  }
}

// The pipelined mma path. Warp w owns rows 16w … 16w+15 of the tile; lane
// (g, t) = (lane/4, lane%4) holds, in the fragment layout of m16n8k16, rows
// g and g+8 and columns 2t, 2t+1 of every 8-column tile. Chunk c lives in
// stage c % 3, and one commit group of copies per chunk is in flight
// ahead (an empty group past the last chunk keeps the count). Per chunk:
// wait for this thread's copies of c (all groups but the newest, c+1's),
// a barrier (every copy of c is visible, and every warp is done with c−1,
// whose stage c+2 takes), start c+2's copies and c+3's table loads, then
// the products of c, which overlap two chunks of copies.
//
// SPLIT (attn_prefill_split_*): block z of the grid's third dimension takes
// only the chunks of positions [z·PP_SPLIT, (z+1)·PP_SPLIT) and writes each
// row's running max, sum and unnormalised output to part [n][heads][splits]
// [D+2] for attn_paged_merge (attn.cu), as attn_paged does: a long prefix
// is walked by several blocks at once instead of one (at 2000 positions
// the one-split grid leaves an SM's schedulers about 1.5 warps, and the
// kernel waits on latency). The splits are fixed ranges of positions, so a
// row's result still depends only on its query, sequence and position;
// splits past a row's position hold m = −3e38, l = 0, o = 0 and add exact
// zeros in the merge.
template <int D, bool SPLIT>
DEV void prefill_pipe(float* out, const float* q, const u16* kc, const u16* vc, int n, int heads, int kvHeads,
                      float scale, int bs, int pos0, const i32* tab, int window, const float* sinks,
                      int t0) {
  constexpr int CP = PP_CH / (128 / (D / 8));
  constexpr int STAGE = PP_CH * D;
  __shared__ __attribute__((aligned(16))) u16 ks[PP_STAGES * STAGE];
  __shared__ __attribute__((aligned(16))) u16 vs[PP_STAGES * STAGE];
  pp_sa ksa = pp_sa_of(ks), vsa = pp_sa_of(vs);
  int h = blockIdx.x;
  int kvDim = kvHeads * D, kvh = h / (heads / kvHeads);
  int last = min(n, t0 + PF_ROWS) - 1;  // the tile's last row
  int L = pos0 + last + 1;              // positions the tile reads
  // chunks [cb, nc): every chunk, or this split's
  int cb = SPLIT ? (int)blockIdx.z * (PP_SPLIT / PP_CH) : 0;
  int nc = (L + PP_CH - 1) / PP_CH;
  if (SPLIT) nc = min(nc, cb + PP_SPLIT / PP_CH);
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  int g = lane >> 2, t = lane & 3;
  int r0 = t0 + 16 * w + g, r1 = r0 + 8;    // this lane's rows
  int wlast = min(t0 + 16 * w + 15, last);  // the warp's last row
  bool rows = wlast >= t0 + 16 * w;         // (a partial tile's last warps may have none)
  int P0 = pos0 + r0, P1 = pos0 + r1;
  // the rows' first positions (a sliding window; 0 without one)
  int F0 = window > 0 ? P0 - window + 1 : 0, F1 = window > 0 ? P1 - window + 1 : 0;

  int bsh = -1;  // log2 of the block size where it is a power of two (the serving pool's 16)
  if ((bs & (bs - 1)) == 0) {
    bsh = 0;
    while ((1 << bsh) < bs) bsh++;
  }
  i32 tb[CP];
  if (cb < nc) {
    pp_tab<D>(tb, tab, bs, bsh, cb, L);
    pp_issue<D>(ksa, vsa, kc, vc, tb, bs, bsh, kvDim, kvh, cb, L);
  }
  pp_commit();
  if (cb + 1 < nc) {
    pp_tab<D>(tb, tab, bs, bsh, cb + 1, L);
    pp_issue<D>(pp_at(ksa, STAGE), pp_at(vsa, STAGE), kc, vc, tb, bs, bsh, kvDim, kvh, cb + 1, L);
  }
  pp_commit();
  if (cb + 2 < nc) pp_tab<D>(tb, tab, bs, bsh, cb + 2, L);

  u32 qa[D / 16][4];
  {
    const float* q0 = q + ((size_t)min(r0, n - 1) * heads + h) * D;
    const float* q1 = q + ((size_t)min(r1, n - 1) * heads + h) * D;
    bool v0 = r0 < n, v1 = r1 < n;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
      int c = 16 * kk + 2 * t;
      float2 a = v0 ? *(const float2*)(q0 + c) : pf_f2(0.0f, 0.0f);
      float2 b = v1 ? *(const float2*)(q1 + c) : pf_f2(0.0f, 0.0f);
      float2 a8 = v0 ? *(const float2*)(q0 + c + 8) : pf_f2(0.0f, 0.0f);
      float2 b8 = v1 ? *(const float2*)(q1 + c + 8) : pf_f2(0.0f, 0.0f);
      qa[kk][0] = pack_h2(a.x, a.y);
      qa[kk][1] = pack_h2(b.x, b.y);
      qa[kk][2] = pack_h2(a8.x, a8.y);
      qa[kk][3] = pack_h2(b8.x, b8.y);
    }
  }
  float m0 = -3.0e38f, m1 = -3.0e38f, l0 = 0.0f, l1 = 0.0f;
  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;

  for (int c = cb; c < nc; c++) {
    pp_wait_prev();
    __syncthreads();
    if (c + 2 < nc) {
      int st = (c - cb + 2) % PP_STAGES;
      pp_issue<D>(pp_at(ksa, st * STAGE), pp_at(vsa, st * STAGE), kc, vc, tb, bs, bsh, kvDim, kvh, c + 2, L);
      if (c + 3 < nc) pp_tab<D>(tb, tab, bs, bsh, c + 3, L);
    }
    pp_commit();
    int c0 = c * PP_CH;
    if (!rows || c0 > pos0 + wlast) continue;  // no rows, or every position past them
    pp_sa K = pp_at(ksa, ((c - cb) % PP_STAGES) * STAGE);
    pp_sa V = pp_at(vsa, ((c - cb) % PP_STAGES) * STAGE);
    float s[PP_CH / 8][4];
#pragma unroll
    for (int nt = 0; nt < PP_CH / 8; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
    // scores: B of k-steps 2k2, 2k2+1 of score tile nt is keys nt·8 … +7,
    // dimensions 32·k2 … +31: one ldmatrix of four 8×8 tiles
#pragma unroll
    for (int k2 = 0; k2 < D / 32; k2++) {
#pragma unroll
      for (int nt = 0; nt < PP_CH / 8; nt++) {
        u32 b[4];
        pp_ldsm4(b, pp_at(K, pp_off<D>(nt * 8 + (lane & 7), k2 * 4 + (lane >> 3))));
        mma16816(s[nt], qa[2 * k2], b[0], b[1]);
        mma16816(s[nt], qa[2 * k2 + 1], b[2], b[3]);
      }
    }
    float cm0 = -3.0e38f, cm1 = -3.0e38f;
#pragma unroll
    for (int nt = 0; nt < PP_CH / 8; nt++) {
      int p = c0 + nt * 8 + 2 * t;
      s[nt][0] = p <= P0 && p >= F0 ? s[nt][0] * scale : -3.0e38f;
      s[nt][1] = p + 1 <= P0 && p + 1 >= F0 ? s[nt][1] * scale : -3.0e38f;
      s[nt][2] = p <= P1 && p >= F1 ? s[nt][2] * scale : -3.0e38f;
      s[nt][3] = p + 1 <= P1 && p + 1 >= F1 ? s[nt][3] * scale : -3.0e38f;
      cm0 = fmaxf(cm0, fmaxf(s[nt][0], s[nt][1]));
      cm1 = fmaxf(cm1, fmaxf(s[nt][2], s[nt][3]));
    }
    cm0 = fmaxf(cm0, SHFL_XOR(cm0, 1));
    cm0 = fmaxf(cm0, SHFL_XOR(cm0, 2));
    cm1 = fmaxf(cm1, SHFL_XOR(cm1, 1));
    cm1 = fmaxf(cm1, SHFL_XOR(cm1, 2));
    float mn0 = fmaxf(m0, cm0), mn1 = fmaxf(m1, cm1);
    float a0 = expf(m0 - mn0), a1 = expf(m1 - mn1);
    float ls0 = 0.0f, ls1 = 0.0f;
    u32 pa[PP_CH / 16][4];
#pragma unroll
    for (int nt = 0; nt < PP_CH / 8; nt++) {
      float p0 = s[nt][0] <= -3.0e38f ? 0.0f : expf(s[nt][0] - mn0);
      float p1 = s[nt][1] <= -3.0e38f ? 0.0f : expf(s[nt][1] - mn0);
      float p2 = s[nt][2] <= -3.0e38f ? 0.0f : expf(s[nt][2] - mn1);
      float p3 = s[nt][3] <= -3.0e38f ? 0.0f : expf(s[nt][3] - mn1);
      ls0 += p0 + p1;
      ls1 += p2 + p3;
      // score tiles 2k and 2k+1 are the A fragment of p·V's k-step k
      pa[nt / 2][(nt & 1) * 2 + 0] = pack_h2(p0, p1);
      pa[nt / 2][(nt & 1) * 2 + 1] = pack_h2(p2, p3);
    }
    ls0 += SHFL_XOR(ls0, 1);
    ls0 += SHFL_XOR(ls0, 2);
    ls1 += SHFL_XOR(ls1, 1);
    ls1 += SHFL_XOR(ls1, 2);
    l0 = l0 * a0 + ls0;
    l1 = l1 * a1 + ls1;
    m0 = mn0;
    m1 = mn1;
    // p·V: B of output tiles 2d2, 2d2+1 at k-step kk is values kk·16 … +15,
    // dimensions 16·d2 … +15, read transposed: one ldmatrix.trans
#pragma unroll
    for (int d2 = 0; d2 < D / 16; d2++) {
#pragma unroll
      for (int i = 0; i < 2; i++) {
        o[2 * d2 + i][0] *= a0;
        o[2 * d2 + i][1] *= a0;
        o[2 * d2 + i][2] *= a1;
        o[2 * d2 + i][3] *= a1;
      }
#pragma unroll
      for (int kk = 0; kk < PP_CH / 16; kk++) {
        u32 b[4];
        pp_ldsm4t(b, pp_at(V, pp_off<D>(kk * 16 + (lane & 15), d2 * 2 + (lane >> 4))));
        mma16816(o[2 * d2], pa[kk], b[0], b[1]);
        mma16816(o[2 * d2 + 1], pa[kk], b[2], b[3]);
      }
    }
  }
  if (SPLIT) {  // out is part: [n][heads][splits][D+2], this split's m, l and o
    size_t sd = (size_t)gridDim.z * (D + 2), zo = (size_t)blockIdx.z * (D + 2);
    float* p0 = out + ((size_t)r0 * heads + h) * sd + zo;
    float* p1 = out + ((size_t)r1 * heads + h) * sd + zo;
    if (t == 0 && r0 < n) p0[0] = m0, p0[1] = l0;
    if (t == 0 && r1 < n) p1[0] = m1, p1[1] = l1;
#pragma unroll
    for (int dt = 0; dt < D / 8; dt++) {
      int c = dt * 8 + 2 * t;
      if (r0 < n) p0[2 + c] = o[dt][0], p0[3 + c] = o[dt][1];
      if (r1 < n) p1[2 + c] = o[dt][2], p1[3 + c] = o[dt][3];
    }
    return;
  }
  if (!sinks) {
    // o / l, the division attn_paged_merge makes of a row whose positions
    // all lie in its first split: this form and the split one give such a
    // row the same bits, so prefill.go may choose by the piece's positions.
#pragma unroll
    for (int dt = 0; dt < D / 8; dt++) {
      int c = dt * 8 + 2 * t;
      if (r0 < n) *(float2*)(out + ((size_t)r0 * heads + h) * D + c) = pf_f2(o[dt][0] / l0, o[dt][1] / l0);
      if (r1 < n) *(float2*)(out + ((size_t)r1 * heads + h) * D + c) = pf_f2(o[dt][2] / l1, o[dt][3] / l1);
    }
    return;
  }
  float i0 = sink_inv(l0, m0, sinks, h), i1 = sink_inv(l1, m1, sinks, h);
#pragma unroll
  for (int dt = 0; dt < D / 8; dt++) {
    int c = dt * 8 + 2 * t;
    if (r0 < n) *(float2*)(out + ((size_t)r0 * heads + h) * D + c) = pf_f2(o[dt][0] * i0, o[dt][1] * i0);
    if (r1 < n) *(float2*)(out + ((size_t)r1 * heads + h) * D + c) = pf_f2(o[dt][2] * i1, o[dt][3] * i1);
  }
}
#endif

// The plain path: thread pair (2r, 2r+1) owns row r of the tile, each half
// of its dimensions; per chunk one pass for the row's maximum score, one
// for the probabilities and the output (the scores are computed twice:
// correct everywhere, not fast).
template <int D>
DEV void prefill_plain(float* out, const float* q, const u16* kc, const u16* vc, int n, int heads, int kvHeads,
                       float scale, int bs, int pos0, const i32* tab, int window, const float* sinks,
                       int t0) {
  constexpr int KS = D + 8;
  constexpr int H = D / 2;
  __shared__ __attribute__((aligned(16))) u16 ks[PF_CH * KS];
  __shared__ __attribute__((aligned(16))) u16 vt[D * PF_VS];
  int h = blockIdx.x;
  int kvDim = kvHeads * D, kvh = h / (heads / kvHeads);
  int last = min(n, t0 + PF_ROWS) - 1;
  int L = pos0 + last + 1;
  int r = t0 + (int)threadIdx.x / 2, half = threadIdx.x & 1;
  int P = pos0 + min(r, last);  // a row past the tile's end reads like the last (never written)
  int F = window > 0 ? P - window + 1 : 0;  // the row's first position (a sliding window)
  float qf[H], o[H];
  const float* qr = q + ((size_t)min(r, n - 1) * heads + h) * D + half * H;
#pragma unroll
  for (int d = 0; d < H; d++) {
    qf[d] = qr[d];
    o[d] = 0.0f;
  }
  float m = -3.0e38f, l = 0.0f;
  for (int c0 = 0; c0 < L; c0 += PF_CH) {
    __syncthreads();
    pf_stage<D>(ks, vt, kc, vc, tab, bs, kvDim, kvh, c0, L);
    __syncthreads();
    float cm = -3.0e38f;
    for (int j = 0; j < PF_CH; j++) {
      const u16* kr = ks + j * KS + half * H;
      float s = 0.0f;
#pragma unroll
      for (int d = 0; d < H; d++) s = fmaf(qf[d], h2f(kr[d]), s);
      s += SHFL_XOR(s, 1);
      if (c0 + j <= P && c0 + j >= F) cm = fmaxf(cm, s * scale);
    }
    float mn = fmaxf(m, cm);
    float a = expf(m - mn);
    l *= a;
#pragma unroll
    for (int d = 0; d < H; d++) o[d] *= a;
    for (int j = 0; j < PF_CH; j++) {
      const u16* kr = ks + j * KS + half * H;
      float s = 0.0f;
#pragma unroll
      for (int d = 0; d < H; d++) s = fmaf(qf[d], h2f(kr[d]), s);
      s += SHFL_XOR(s, 1);
      float p = c0 + j <= P && c0 + j >= F ? expf(s * scale - mn) : 0.0f;
      l += p;
#pragma unroll
      for (int d = 0; d < H; d++) o[d] = fmaf(p, h2f(vt[(half * H + d) * PF_VS + j]), o[d]);
    }
    m = mn;
  }
  if (r < n) {
    float* orow = out + ((size_t)r * heads + h) * D + half * H;
    float inv = sink_inv(l, m, sinks, h);
#pragma unroll
    for (int d = 0; d < H; d++) orow[d] = o[d] * inv;
  }
}

#if defined(PREFILL_MMA)
#define PREFILL_BODY(DD) prefill_pipe<DD, false>
#define PREFILL_V1_BODY prefill_mma
#else
#define PREFILL_BODY(DD) prefill_plain<DD>
#define PREFILL_V1_BODY prefill_plain
#endif

#define PREFILL_PARAMS                                                                                         \
  float *out, const float *q, const u16 *kc, const u16 *vc, int n, int heads, int kvHeads, float scale, int bs, \
      int pos0, int s, const i32 *toff, const i32 *tabs, int window, const float *sinks
#define PREFILL_ARGS out, q, kc, vc, n, heads, kvHeads, scale, bs, pos0, tabs + toff[s], window, sinks, (int)blockIdx.y * PF_ROWS

#define PREFILL_KERNELS(DD)                                                                                        \
  KERNEL void __launch_bounds__(128) attn_prefill_f16_d##DD(PREFILL_PARAMS) { GRID_DEPEND(); PREFILL_BODY(DD)(PREFILL_ARGS); }     \
  KERNEL void __launch_bounds__(128) attn_prefill_v1_f16_d##DD(PREFILL_PARAMS) { GRID_DEPEND(); PREFILL_V1_BODY<DD>(PREFILL_ARGS); } \
  KERNEL void __launch_bounds__(128) attn_prefill_plain_f16_d##DD(PREFILL_PARAMS) { GRID_DEPEND(); prefill_plain<DD>(PREFILL_ARGS); }
PREFILL_KERNELS(64)
PREFILL_KERNELS(128)

#if defined(PREFILL_MMA)
// The split form (out is the merge's part buffer): sm_80 on only; the
// runtime chooses it only there (prefill.go).
#define PREFILL_SPLIT_KERNEL(DD)                                                                                        \
  KERNEL void __launch_bounds__(128) attn_prefill_split_f16_d##DD(PREFILL_PARAMS) { GRID_DEPEND(); prefill_pipe<DD, true>(PREFILL_ARGS); }
PREFILL_SPLIT_KERNEL(64)
PREFILL_SPLIT_KERNEL(128)
#endif

// Several pieces in one launch (a merged group of a batched step: the
// prompt pieces of several sequences, each perhaps deep into its
// context). Block row y of the grid takes tile tiles[4y … 4y+3] = (its
// first row in q and out, its rows (1 … 64), the position of its first row,
// its sequence): prefill.go cuts each piece into tiles of 64 rows from its
// first row, as the one-piece kernels do, so a row's tile and its result
// are the same as if its piece were launched alone. (A piece whose last
// row the model moved to the end of the group is one more piece of a row.)
//   grid (heads, tiles, splits), block 128
#define PIECES_PARAMS                                                                                        \
  float *out, const float *q, const u16 *kc, const u16 *vc, int heads, int kvHeads, float scale, int bs, \
      const i32 *tiles, const i32 *toff, const i32 *tabs, int window, const float *sinks
// the tile's rows of out, whose rows hold W floats a head
#define PIECES_ARGS(W)                                                                                                   \
  out + (size_t)tiles[4 * blockIdx.y] * heads * (W), q + (size_t)tiles[4 * blockIdx.y] * heads * D, kc, vc,          \
      tiles[4 * blockIdx.y + 1], heads, kvHeads, scale, bs, tiles[4 * blockIdx.y + 2], tabs + toff[tiles[4 * blockIdx.y + 3]], \
      window, sinks, 0
#define PIECES_PASS out, q, kc, vc, heads, kvHeads, scale, bs, tiles, toff, tabs, window, sinks

template <int D>
DEV void prefill_pieces(PIECES_PARAMS) {
  PREFILL_BODY(D)(PIECES_ARGS(D));
}
#define PIECES_KERNELS(DD) \
  KERNEL void __launch_bounds__(128) attn_prefill_pieces_f16_d##DD(PIECES_PARAMS) { GRID_DEPEND(); prefill_pieces<DD>(PIECES_PASS); }
PIECES_KERNELS(64)
PIECES_KERNELS(128)

#if defined(PREFILL_TENSOR)
// the split form's part rows hold gridDim.z · (D+2) floats a head
template <int D>
DEV void prefill_pieces_split(PIECES_PARAMS) {
  prefill_pipe<D, true>(PIECES_ARGS(gridDim.z * (D + 2)));
}
#endif
#if defined(PREFILL_MMA)
#define PIECES_SPLIT_KERNEL(DD) \
  KERNEL void __launch_bounds__(128) attn_prefill_pieces_split_f16_d##DD(PIECES_PARAMS) { GRID_DEPEND(); prefill_pieces_split<DD>(PIECES_PASS); }
PIECES_SPLIT_KERNEL(64)
PIECES_SPLIT_KERNEL(128)
#endif

#if defined(FORGE_EMU_TENSOR)
// The emulator's own: prefill_pipe on its mma.sync, ldmatrix and cp.async,
// and prefill_mma (the path the H100 has run) on its mma.sync, a check of
// the emulator's fragment layouts against a kernel known to be right.
#define PREFILL_EMU_KERNEL(DD)                                                                  \
  KERNEL void attn_prefill_emu_f16_d##DD(PREFILL_PARAMS) { GRID_DEPEND(); prefill_pipe<DD, false>(PREFILL_ARGS); }     \
  KERNEL void attn_prefill_emusplit_f16_d##DD(PREFILL_PARAMS) { GRID_DEPEND(); prefill_pipe<DD, true>(PREFILL_ARGS); } \
  KERNEL void attn_prefill_emuv1_f16_d##DD(PREFILL_PARAMS) { GRID_DEPEND(); prefill_mma<DD>(PREFILL_ARGS); }
PREFILL_EMU_KERNEL(64)
PREFILL_EMU_KERNEL(128)
template <int D>
DEV void prefill_emupieces(PIECES_PARAMS) {
  prefill_pipe<D, false>(PIECES_ARGS(D));
}
#define PIECES_EMU_KERNEL(DD)                                                                                                        \
  KERNEL void attn_prefill_emupieces_f16_d##DD(PIECES_PARAMS) { GRID_DEPEND(); prefill_emupieces<DD>(PIECES_PASS); } \
  KERNEL void attn_prefill_emupiecessplit_f16_d##DD(PIECES_PARAMS) { GRID_DEPEND(); prefill_pieces_split<DD>(PIECES_PASS); }
PIECES_EMU_KERNEL(64)
PIECES_EMU_KERNEL(128)
#endif
