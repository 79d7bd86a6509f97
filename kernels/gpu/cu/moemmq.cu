// moemmq.cu: a prompt's expert products grouped, every expert's rows of
// one kind of matrix (gate, up or down) in one launch on the tensor cores
// (pipeline/model/moe.go, kernels.ExpertGrouper).
//
// The prompt path of a mixture gathers every (token, expert) pair's input
// row in expert order: expert e's rows are [start[e], start[e+1]) of x,
// quantized to 8 bits once for all rows (quantize_q8). Each block here
// computes one tile of 16 weight rows of expert e (its matrix found
// through a device table of addresses, as the decode path's moe_mv_* find
// theirs) times one tile of 16 of e's rows of x, with the arithmetic of
// mmq.cu's kernels (mmqbody.h), and writes each row's output at the same
// row of y. A row's result depends on neither the tile nor the rows that
// share it (mmq.cu's header), so every row is bit for bit what MatMul of
// that expert over its rows alone gives it where MatMul takes the mmq or
// one-row kernels (at most kernels.MaxBatchRows rows).
//
// The host lists the tiles (it knows start after routing): tiles[2i] is
// the expert of x-tile i, tiles[2i+1] its first row within the expert, so
// no block is launched for an expert without rows; a tile past its
// expert's rows exits at once (never with the host's list).
//   grid (number of tiles, ⌈rows/16⌉, tables: 1 or 2), block 128 (Q4_K)
//   or 256 (Q6_K); table z writes y_z.
//   needs: cols % 256 == 0, every matrix 16-byte aligned (the decode
//   tables' moe_mv_q4_k / moe_mv_q6_k plan), x rows as quantize_q8 writes
//   them, y [start[E]][rows]
// Where there are no mma instructions (HIP, CUDA before sm_80) the kernels
// exist but do nothing: the backend never launches them there.

#include "common.h"
#include "mmqbody.h"

#define MOEMMQ_ARGS                                                                                              \
  const u64 *t0, const u64 *t1, const i8 *xq, const float *xd, float *y0, float *y1, const i32 *start,           \
      const i32 *tiles, int rows, int cols

#if MMQ_MMA
#define MOEMMQ_BODY(...)                                                                                        \
  int e = tiles[2 * blockIdx.x], x0 = tiles[2 * blockIdx.x + 1];                                                 \
  int lo = start[e], nx = start[e + 1] - lo;                                                                     \
  if (x0 >= nx) return;                                                                                          \
  const u8* w = (const u8*)(blockIdx.z ? t1 : t0)[e];                                                            \
  float* y = blockIdx.z ? y1 : y0;                                                                               \
  __VA_ARGS__(w, xq + (size_t)lo * cols, xd + (size_t)lo * (cols / 32), y + (size_t)lo * rows, rows, cols, nx,          \
       blockIdx.y * 16, x0)
#else
#define MOEMMQ_BODY(...) (void)0
#endif

KERNEL void __launch_bounds__(128) moemmq_q4_k(MOEMMQ_ARGS) { GRID_DEPEND(); MOEMMQ_BODY(mmq_q4_k_body<2, false>); }
KERNEL void __launch_bounds__(256) moemmq_q6_k(MOEMMQ_ARGS) { GRID_DEPEND(); MOEMMQ_BODY(mmq_q6_k_body<2, false>); }
