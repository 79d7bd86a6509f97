// mmq.cu: Q4_K and Q6_K weights times 8-bit activations (the q8 blocks of
// quantize_q8: per 32 values one float scale) for 1 to 64 rows of x on the
// tensor cores (mma.sync m16n8k16, s8·s8 → s32; CUDA sm_80 and later).
//
// The decode step of a batch multiplies every weight by up to 64 rows of
// x. The multi-row matrix-vector kernels (matvec.cu, mv_*_x8r2) do that
// with dp4a and cost about eight times one row at sixteen rows: they are
// bound by their arithmetic. Here the integer products go through mma.
//
// Batch invariance by construction. A row of x must come out bit for bit
// as the one-row kernel computes it alone (kernels.Batcher). The one-row
// kernels give each lane of a warp a fixed share of every super-block
// (Q4_K: lane 8r+j takes super-blocks r, r+4, r+8, … and 16 values of each
// of two sub-blocks; Q6_K: lane 4r+v super-blocks r, r+8, … and four
// groups of 16 values), add that share's term (q8terms.h) to the lane's
// running sum super-block after super-block, then sum the lanes with a
// butterfly (warp_sum). Each term's integers are sums of 16 products,
// exact whatever computes them, so the kernels below get them from mma
// tiles of 16 values (k16, not k32, whose sums would span two lanes'
// shares), then keep one running sum per (weight row, x row, lane of the
// one-row kernel), in the same super-block order, and add them up in the
// butterfly's order at the end. Which rows share a tile, and how many
// there are, changes none of this.
//
// Layout: a block computes 16 weight rows × 8·NT rows of x; its warps
// split the super-blocks by residue (warp r takes the super-blocks of the
// one-row lanes of residue r), so each warp keeps 32/warps running sums
// per output, and the block adds the warps' sums through shared memory.
// grid (ceil(nx/(8·NT)), ceil(rows/16)): the blocks of one weight tile are
// neighbours, so the weights are read from DRAM about once.
//   needs: cols % 256 == 0, w 4-byte aligned (Q4_K 16), x rows as written
//   by quantize_q8 (row v at xq + v·cols, its scales at xd + v·cols/32)
//   y [nx][rows]

#include "mmqbody.h"

// mmq_{type}_n{8·NT}{variant}: 8·NT rows of x per block; variant "" loads
// a super-block's weights, then does its arithmetic; "p" loads the next
// one's first (the H100 measured both about the same, "" ahead by a few
// per cent; variants with the running sums in shared memory for more
// resident warps, or capped at 128 registers, spilled and were slower:
// bench/results/2026-11-25-mmq-h100.md). Where there are no mma
// instructions (HIP, CUDA before sm_80) the kernels exist but do nothing:
// the backend never launches them there.
#if MMQ_MMA
#define MMQ_CALL(NT, ...) __VA_ARGS__(w, xq, xd, y, rows, cols, nx, blockIdx.y * 16, blockIdx.x * 8 * NT)
#else
#define MMQ_CALL(NT, ...) (void)0
#endif
#define MMQ_ARGS const u8 *w, const i8 *xq, const float *xd, float *y, int rows, int cols, int nx
KERNEL void __launch_bounds__(128) mmq_q4_k_n8(MMQ_ARGS) { GRID_DEPEND(); MMQ_CALL(1, mmq_q4_k_body<1, false>); }
KERNEL void __launch_bounds__(128) mmq_q4_k_n8p(MMQ_ARGS) { GRID_DEPEND(); MMQ_CALL(1, mmq_q4_k_body<1, true>); }
KERNEL void __launch_bounds__(128) mmq_q4_k_n16(MMQ_ARGS) { GRID_DEPEND(); MMQ_CALL(2, mmq_q4_k_body<2, false>); }
KERNEL void __launch_bounds__(128) mmq_q4_k_n16p(MMQ_ARGS) { GRID_DEPEND(); MMQ_CALL(2, mmq_q4_k_body<2, true>); }
KERNEL void __launch_bounds__(256) mmq_q6_k_n8(MMQ_ARGS) { GRID_DEPEND(); MMQ_CALL(1, mmq_q6_k_body<1, false>); }
KERNEL void __launch_bounds__(256) mmq_q6_k_n8p(MMQ_ARGS) { GRID_DEPEND(); MMQ_CALL(1, mmq_q6_k_body<1, true>); }
KERNEL void __launch_bounds__(256) mmq_q6_k_n16(MMQ_ARGS) { GRID_DEPEND(); MMQ_CALL(2, mmq_q6_k_body<2, false>); }
KERNEL void __launch_bounds__(256) mmq_q6_k_n16p(MMQ_ARGS) { GRID_DEPEND(); MMQ_CALL(2, mmq_q6_k_body<2, true>); }
