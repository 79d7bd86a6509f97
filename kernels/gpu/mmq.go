package gpu

// The tensor-core product of Q4_K and Q6_K weights with up to
// kernels.MaxBatchRows rows of 8-bit x (cu/mmq.cu). It gives every row the
// bits of the one-row matrix-vector kernels (the same exact integer sums of
// 16 products, the same float steps in the same order, see mmq.cu), so
// MatMul may use it for any row count and stay row-invariant: it takes it
// from mmqMinRows rows on, and MatMulPrompt for pieces of up to
// kernels.MaxBatchRows rows (instead of dequantizing the weight for a GEMM).

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/rocm"
)

// ParseMMQ reads Options.MMQ: "" (the measured defaults, mmqDefault),
// "off" (MatMul keeps off the mmq kernels: the multi-row matrix-vector
// kernels and the prompt GEMM on f16 x, as before them), or variants per
// type such as "q4_k=p,q6_k=-" or "q8_0=q8,q4_0=f16" (a type without an
// entry keeps its default). Both are for comparisons in one build (forge
// --gpu-mmq).
func ParseMMQ(spec string) (off bool, choice map[gguf.Type]string, err error) {
	choice = maps.Clone(mmqDefault)
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return false, choice, nil
	}
	if spec == "off" {
		return true, choice, nil
	}
	for _, kv := range strings.Split(spec, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		found := false
		for typ, vs := range mmqVariants {
			if ok && strings.EqualFold(k, typ.String()) && slices.Contains(vs, v) {
				choice[typ], found = v, true
			}
		}
		if !found {
			return false, nil, fmt.Errorf("gpu: mmq setting %q: want off, or TYPE=VARIANT pairs (q4_k and q6_k: - or p; q4_0, q4_1, q5_0, q5_1, q8_0 and iq4_nl: q8 or f16)", kv)
		}
	}
	return false, choice, nil
}

// mmqMinRows is the fewest rows MatMul sends to the mmq kernels (fewer go
// to the multi-row matrix-vector kernels). Both give the same bits, so the
// choice is one of speed only: on the H100 at the 8B shapes the matrix-
// vector kernels were ahead at 2 rows for Q4_K (12 µs against 16 at
// 4096×4096), mmq from 4 rows on for every shape
// (bench/results/2026-11-25-mmq-h100.md).
const mmqMinRows = 3

// mmqVariants lists the kernel variants of each type. Q4_K and Q6_K
// (mmq.cu): "-" loads a super-block's weights, then does its arithmetic;
// "p" loads the next one's first; both give the same bits. The types of
// 32-value blocks the CPU multiplies on 8-bit activations choose their
// prompt product (mmq32.go): "q8" on the 8-bit form of x as the CPU, "f16"
// on f16 x (the dequantize + GEMM path).
var mmqVariants = map[gguf.Type][]string{
	gguf.TypeQ4_K:   {"-", "p"},
	gguf.TypeQ6_K:   {"-", "p"},
	gguf.TypeQ4_0:   {"q8", "f16"},
	gguf.TypeQ4_1:   {"q8", "f16"},
	gguf.TypeQ5_0:   {"q8", "f16"},
	gguf.TypeQ5_1:   {"q8", "f16"},
	gguf.TypeQ8_0:   {"q8", "f16"},
	gguf.TypeIQ4_NL: {"q8", "f16"},
}

// mmqDefault is the variant MatMul uses: "-", a few per cent ahead of "p"
// on the H100 in the batched step of the 8B shape
// (bench/results/2026-11-25-mmq-h100.md); the 8-bit prompt product for
// Q4_0 alone (mmq32.go says why).
var mmqDefault = map[gguf.Type]string{
	gguf.TypeQ4_K: "-", gguf.TypeQ6_K: "-",
	gguf.TypeQ4_0: "q8", gguf.TypeQ4_1: "f16", gguf.TypeQ5_0: "f16", gguf.TypeQ5_1: "f16", gguf.TypeQ8_0: "f16", gguf.TypeIQ4_NL: "f16",
}

// mmqFits reports whether the mmq kernels can multiply w with rows of x:
// a CUDA device with mma.sync on 8-bit integers (sm_80 on), 32-lane warps,
// a Q4_K or Q6_K weight that the one-row path multiplies on 8-bit x
// (rowKernel "x8": whole super-blocks, 16-byte aligned).
func (b *Backend) mmqFits(w *kernels.Weight, wp rocm.DevPtr) bool {
	if b.mmqOff || b.warp != 32 {
		return false
	}
	d := b.w.Device
	if d.Backend != rocm.CUDA || d.CCMajor < 8 {
		return false
	}
	if w.Type != gguf.TypeQ4_K && w.Type != gguf.TypeQ6_K || w.Rows > 65535*16 {
		return false // the grid's y counts tiles of 16 weight rows
	}
	return b.rowKernel(w, wp) == "x8"
}

// mmqUse reports whether MatMul takes the mmq kernels for n rows of w.
func (b *Backend) mmqUse(w *kernels.Weight, wp rocm.DevPtr, n int) bool {
	lo := mmqMinRows
	if b.mmqMin > 0 {
		lo = b.mmqMin
	}
	return n >= lo && n <= kernels.MaxBatchRows && b.mmqFits(w, wp)
}

// mmqRows queues dst [n][w.Rows] = x · wᵀ from x already quantized to
// 8 bits (xq, xd as quantizeX leaves them), 1 ≤ n ≤ 65535·16: 8 rows of x
// per block up to 8 rows, 16 from 9 on (the kernels' results do not depend
// on the tile).
func (b *Backend) mmqRows(c *rocm.Ctx, kt string, w *kernels.Weight, wp, xq, xd rocm.DevPtr, dst kernels.Tensor, n int) error {
	tile, sfx := 16, "_n16"
	if n <= 8 {
		tile, sfx = 8, "_n8"
	}
	threads := 128 // a warp per super-block residue: 4 for Q4_K
	if w.Type == gguf.TypeQ6_K {
		threads = 256 // 8 for Q6_K
	}
	v := b.mmqVariant
	if v == "" {
		v = b.mmqChoice[w.Type]
	}
	if v == "-" {
		v = ""
	}
	var a rocm.Args
	a.Ptr(wp).Ptr(xq).Ptr(xd).Ptr(dptr(dst)).I32(int32(w.Rows)).I32(int32(w.Cols)).I32(int32(n))
	grid := rocm.Dim3{X: uint32(ceilDiv(n, tile)), Y: uint32(ceilDiv(w.Rows, 16)), Z: 1}
	return b.launch(c, "mmq_"+kt+sfx+v, grid, rocm.D1(threads), &a)
}
