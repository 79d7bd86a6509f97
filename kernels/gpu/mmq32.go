package gpu

// The prompt product of Q4_0 and Q8_0 weights on 8-bit activations
// (cu/mmq32.cu): the integer dot products the CPU backend takes, on the
// tensor cores, for pieces of any number of rows. The dequantize + f16
// GEMM path it replaces for these types rounds the activations to f16
// instead, which moved stories260K-Q4_0's perplexity 0.1 % away from the
// CPU's (issue 20). MatMul's rows up to kernels.MaxBatchRows keep the
// multi-row matrix-vector kernels, whose rows are bit-identical to one-row
// products; this path serves only what went to the GEMM: MatMulPrompt's
// pieces of promptGEMMMinN rows on and MatMul's of more than
// kernels.MaxBatchRows.

import (
	"strconv"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/rocm"
)

// mmq32Fits reports whether the mmq32 kernels can multiply w: a CUDA
// device with mma.sync on 8-bit integers (sm_80 on), 32-lane warps, a Q4_0
// or Q8_0 weight of whole blocks, 2-byte aligned (the kernels read the
// blocks as 16-bit halves), of at most 65535 tiles of 64 rows (the grid's
// y). EnvNoMMQ turns it off with the other mmq kernels.
func (b *Backend) mmq32Fits(w *kernels.Weight, wp rocm.DevPtr) bool {
	if b.mmqOff || b.warp != 32 {
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
// depend on the tile).
func (b *Backend) mmq32(c *rocm.Ctx, kt string, w *kernels.Weight, wp rocm.DevPtr, dst, x kernels.Tensor, n int) error {
	xq, xd, err := b.quantizeX(c, dptr(x), n*w.Cols)
	if err != nil {
		return err
	}
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
