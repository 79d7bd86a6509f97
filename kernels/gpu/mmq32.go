package gpu

// Prompt products on 8-bit activations for the weight types the CPU
// backend multiplies that way (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL: x in
// blocks of 32 codes with an f16 scale). The dequantize + f16 GEMM path
// rounds x to f16 instead, which moved stories260K-Q4_0's perplexity
// 0.1 % away from the CPU's (issue 20). Two ways, chosen by n alone:
//
//   - pieces of up to mmq32MaxRows rows of Q4_0 and Q8_0 weights on CUDA
//     sm_80 on: the mmq32 kernels (cu/mmq32.cu), integer block sums on the
//     tensor cores, then acc += d_w·d_x·Σ block after block (the CPU
//     backend's plain-Go order; its AVX-512 kernels, like llama.cpp's
//     AVX2 ones, keep 8 lanes of 4-value sums with a fused multiply-add
//     each and add the lanes at the end, so the last bits differ);
//   - longer pieces, and the other types: the GEMM, its x operand the f16
//     of the 8-bit form q·d (q8_to_f16) instead of x itself, so the 8-bit
//     rounding the CPU applies is applied here too and only the (much
//     smaller) f16 rounding of q·d and of the weights differs.
//
// Which types take them is a choice per type (Options.MMQ, "q8" or "f16",
// mmqDefault): Q4_0 alone by default. Measured on the H100
// (bench/results/2026-11-25-night-perplexity-h100.md), the 8-bit path for
// every such type put Q4_0 within 0.004 % of the CPU but Q8_0 at 0.055 %
// and Q4_K_M (Q5_0 and Q8_0 tensors in stories260K) at 0.106 %, against
// 0.031 / 0.039 % on f16 x: with 8-bit activations on both sides these
// files are chaotic at that level (another summation order of the very
// same exact products moves the CPU's own estimate by 0.03 %), while
// Q4_0's 0.1 % on f16 x was systematic.
//
// Row invariance. MatMul's rows up to kernels.MaxBatchRows keep the
// multi-row matrix-vector kernels, whose rows are bit-identical to one-row
// products; this serves only what went to the GEMM: MatMulPrompt's pieces
// of promptGEMMMinN rows on and MatMul's of more than kernels.MaxBatchRows.
// So a Q4_0 row gets one of three arithmetics by its piece's length n:
// the matrix-vector kernels (n < promptGEMMMinN, and every decode row: on
// 8-bit x where b32Fits, on float x otherwise, e.g. stories260K's 64
// columns), mmq32 (promptGEMMMinN ≤ n ≤ mmq32MaxRows) or the q8 GEMM
// (beyond). They cannot be one: mmq32 is 3 to 7 times slower than cuBLAS
// at 128 to 512 rows, and cuBLAS has no per-block scales. A batched
// server's rows still do not depend on their step's other rows: a piece's
// length is a function of its own sequence (the scheduler cuts prompts at
// multiples of its chunk from position 0, and with Deterministic computes
// a preempted sequence again in the pieces and decode rows it first took:
// batch.Config.ReplayPreempted; without that the recomputed piece of
// prompt and generated tokens took other kernels than alone, which is
// what broke TestGPUBatchInvariant with these paths on).
// Options.MMQ "off" turns both off with the other mmq kernels.

import (
	"strconv"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/rocm"
)

// mmq32MaxRows is the longest piece the mmq32 kernels take. On the H100
// at the 8B shapes (BenchmarkMMQ32,
// bench/results/2026-11-25-night-perplexity-h100.md) they were level with
// the dequantize + GEMM path at 64 rows (133 against 132 µs at 4096×4096,
// 169 against 208 at 14336×4096, 477 against 450 at 4096×14336), about 3
// times slower at 128 rows and 5 to 7 times at 512, where cuBLAS takes the
// GEMM (a whole-prompt product through them cut pp512 of the 8B Q4_0 file
// from 11243 to 3319 tokens/s).
const mmq32MaxRows = kernels.MaxBatchRows

// q8Prompt reports whether w's prompt products take the 8-bit form of x
// (Options.MMQ's variant "q8" for its type).
func (b *Backend) q8Prompt(w *kernels.Weight) bool {
	return !b.mmqOff && b.mmqChoice[w.Type] == "q8"
}

// q8GEMM reports whether the prompt GEMM multiplies w by the 8-bit form
// of x (q8_to_f16): the types the CPU backend multiplies on 8-bit
// activations in blocks of 32, weights of whole blocks, where chosen.
func (b *Backend) q8GEMM(w *kernels.Weight) bool {
	if !b.q8Prompt(w) || w.Cols%32 != 0 {
		return false
	}
	switch w.Type {
	case gguf.TypeQ4_0, gguf.TypeQ4_1, gguf.TypeQ5_0, gguf.TypeQ5_1, gguf.TypeQ8_0, gguf.TypeIQ4_NL:
		return true
	}
	return false
}

// mmq32Fits reports whether the mmq32 kernels can multiply w: a CUDA
// device with mma.sync on 8-bit integers (sm_80 on), 32-lane warps, a Q4_0
// or Q8_0 weight of whole blocks whose prompt products are chosen 8-bit,
// 2-byte aligned (the kernels read the blocks as 16-bit halves), of at
// most 65535 tiles of 64 rows (the grid's y).
func (b *Backend) mmq32Fits(w *kernels.Weight, wp rocm.DevPtr) bool {
	if !b.q8Prompt(w) || b.warp != 32 {
		return false
	}
	d := b.w.Device
	if d.Backend != rocm.CUDA || d.CCMajor < 8 {
		return false
	}
	if w.Type != gguf.TypeQ4_0 && w.Type != gguf.TypeQ8_0 {
		return false
	}
	return w.Cols%32 == 0 && uintptr(wp)%2 == 0 && ceilDiv(w.Rows, 64) <= 65535
}

// mmq32 queues dst [n][w.Rows] = x [n][w.Cols] · wᵀ through the mmq32
// kernels: x quantized to 8 bits row by row (groups of 32 within a row, as
// for one row), then 16, 32 or 64 rows of x per block (the results do not
// depend on the tile). x's 8-bit copy is q's (q8For).
func (b *Backend) mmq32(c *rocm.Ctx, kt string, w *kernels.Weight, wp rocm.DevPtr, dst, x kernels.Tensor, n int, q *q8x) error {
	x8, err := b.q8For(c, dptr(x), n*w.Cols, q)
	if err != nil {
		return err
	}
	xq, xd := x8.codes, x8.scales
	tile := 64
	switch {
	case n <= 16:
		tile = 16
	case n <= 32:
		tile = 32
	}
	var a rocm.Args
	a.Ptr(wp).Ptr(xq).Ptr(xd).Ptr(dptr(dst)).I32(int32(w.Rows)).I32(int32(w.Cols)).I32(int32(n))
	grid := rocm.Dim3{X: uint32(ceilDiv(n, tile)), Y: uint32(ceilDiv(w.Rows, 64)), Z: 1}
	return b.launch(c, "mmq32_"+kt+"_n"+strconv.Itoa(tile), grid, rocm.D1(128), &a)
}
