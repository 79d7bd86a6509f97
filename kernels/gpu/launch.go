package gpu

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/rocm"
)

// Launch choice as plain functions of the device's properties and the
// shape, so that it can be tested without a device: the wavefront emulator
// test (emu_test.go) runs every kernel with the launches chosen here for a
// wave32 and a wave64 device. The runtime (ops.go, batch.go, step.go) calls
// these and only adds the buffers.

// LaunchDevice is what launch choice depends on.
type LaunchDevice struct {
	Warp int // warp (wavefront) size: 32, or 64 on CDNA
	SMs  int // multiprocessors (compute units); 0 if unknown
}

// The devices the emulator test plans launches for, as issue 27 names
// them: gfx90a (CDNA2, wave64; 110 compute units, one MI250X die) and
// gfx1030 (RDNA2, wave32; 40 compute units).
var (
	DeviceGfx90a  = LaunchDevice{Warp: 64, SMs: 110}
	DeviceGfx1030 = LaunchDevice{Warp: 32, SMs: 40}
)

// mvBlock is the block size of every matrix–vector kernel.
const mvBlock = 128

// mvArgs says which argument list a matrix–vector kernel takes.
type mvArgs int

const (
	// mvArgsFloat: (w, x, y, rows, cols) on float activations.
	mvArgsFloat mvArgs = iota
	// mvArgsQ8: (w, xq, xd, y, rows, cols) on 8-bit activations
	// (quantize_q8 first).
	mvArgsQ8
	// mvArgsGeneric: (w, x, y, rows, cols, nx), the generic float kernel
	// mv_{type} for nx ≤ mvMaxN rows of x.
	mvArgsGeneric
)

// mvPlan is one matrix–vector launch: kernel, grid of mvBlock-thread blocks.
type mvPlan struct {
	Kernel string
	Grid   int
	Args   mvArgs
}

// mvOverrides are the test and benchmark knobs of Backend (mvVariant,
// mvBlocksPerSM); zero values choose automatically.
type mvOverrides struct {
	Variant     string
	BlocksPerSM int
}

// planMatvec chooses the kernel for y [nx][rows] = x [nx][cols]·wᵀ with
// weight type t. wAligned and xAligned: the weight and x start 16-byte
// aligned on the device.
func planMatvec(d LaunchDevice, t gguf.Type, rows, cols, nx int, wAligned, xAligned bool, o mvOverrides) (mvPlan, error) {
	kt, ok := kernelType(t)
	if !ok {
		return mvPlan{}, fmt.Errorf("gpu: matvec: type %s is not supported on the GPU", t)
	}
	wpb := mvBlock / d.Warp // warps (one row each) per block
	if nx == 1 && (t == gguf.TypeQ4_K || t == gguf.TypeQ6_K) && wAligned && o.Variant != "g" {
		v := o.Variant
		if v == "" {
			v = autoVariant(t, rows)
		}
		if strings.IndexByte("qntc", v[0]) >= 0 { // 8-bit activations: any x alignment (x is copied)
			return planQ8(d, kt, v, rows, cols, o.BlocksPerSM), nil
		}
		if xAligned {
			if v[0] == 's' && (cols/256)%8 != 0 {
				v = "p2" // staging copies 16-byte runs: rows must start 16-byte aligned
			}
			r := int(v[1] - '0') // rows per warp: "p2", "r2u1", "s2"
			return mvPlan{Kernel: "mv_" + kt + "_" + v, Grid: ceilDiv(rows, wpb*r), Args: mvArgsFloat}, nil
		}
	}
	if nx == 1 && mxfp4Q8(t, o.Variant) { // any alignment (mxfp4.go)
		return planMXFP4(d, rows, o), nil
	}
	if nx == 1 && o.Variant != "g" && b32Fits(d.Warp, t, cols, wAligned) {
		v := o.Variant
		if len(v) != 2 || v[0] != 'b' {
			v = "b2"
		}
		grid := ceilDiv(rows, wpb*int(v[1]-'0'))
		if o.BlocksPerSM > 0 { // the kernel grid-strides over rows
			grid = min(grid, o.BlocksPerSM*max(d.SMs, 1))
		}
		return mvPlan{Kernel: "mv_" + kt + "_" + v, Grid: grid, Args: mvArgsQ8}, nil
	}
	if nx == 1 && b32Staged(t, o.Variant) { // any alignment, any block count (b32any.go)
		return planStaged(d, kt, b32Variants, b32Default, rows, o), nil
	}
	return mvPlan{Kernel: "mv_" + kt, Grid: ceilDiv(rows, wpb), Args: mvArgsGeneric}, nil
}

// planQ8 is the Q4_K/Q6_K kernel on 8-bit activations ("q{R}{U}": R rows
// per warp, U super-blocks per lane in flight).
//
// "n{R}{U}" (Q4_K) is q{R}{U} with the weight loads skipping L1; "t{R}"
// (Q6_K) stages runs of whole super-blocks through shared memory with
// 16-byte loads, rows of any number of super-blocks (7B's ffn_down: 43);
// "c{R}" is t{R} streaming on across row groups, and needs warpSize/4 to
// divide the super-blocks of a row (else t{R} runs). A
// suffix "@N" caps the grid at N blocks per multiprocessor unless
// blocksPerSM is set.
func planQ8(d LaunchDevice, kt, v string, rows, cols, blocksPerSM int) mvPlan {
	v, capped, _ := strings.Cut(v, "@")
	perSM := blocksPerSM
	if perSM == 0 && capped != "" {
		perSM, _ = strconv.Atoi(capped)
	}
	switch {
	case (v[0] == 't' || v[0] == 'c') && kt != "q6_k":
		v = "q21"
	case v[0] == 'c' && (cols/256)%(d.Warp/4) != 0: // c streams whole runs of aligned rows
		v = "t" + v[1:]
	}
	r := int(v[1] - '0')
	grid := ceilDiv(rows, mvBlock/d.Warp*r)
	if perSM > 0 { // fewer blocks than row groups: the kernel loops over rows
		grid = min(grid, perSM*max(d.SMs, 1))
	}
	return mvPlan{Kernel: "mv_" + kt + "_" + v, Grid: grid, Args: mvArgsQ8}
}

// b32Fits reports whether the 8-bit-activation kernel for 32-element blocks
// (mv_{type}_b{R}: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) can run a weight of type
// t and cols columns: it copies runs of warpSize whole blocks with 16-byte
// loads, so rows must start 16-byte aligned and hold a whole number of
// runs.
func b32Fits(warp int, t gguf.Type, cols int, wAligned bool) bool {
	switch t {
	case gguf.TypeQ4_0, gguf.TypeQ4_1, gguf.TypeQ5_0, gguf.TypeQ5_1, gguf.TypeQ8_0:
	default:
		return false
	}
	nb := cols / 32
	return wAligned && nb%warp == 0 && (nb*t.BlockBytes())%16 == 0
}

// autoVariant picks the Q4_K/Q6_K matvec kernel, on 8-bit activations:
// the fastest variants on an H100 at Llama 8B shapes
// (bench/results/2026-11-22-kernels-h100.md). Q4_K: one row per warp, two
// super-blocks per lane in flight, L1-bypassing loads, the grid capped at
// 8 blocks per multiprocessor. Q6_K: two rows per warp staged through
// shared memory; with many rows (short ones, e.g. 14336×4096) a grid of 4
// blocks per multiprocessor whose warps stream on from one row pair to the
// next (c2), else one row pair per warp (t2).
func autoVariant(t gguf.Type, rows int) string {
	switch {
	case t == gguf.TypeQ4_K:
		return "n12@8"
	case rows >= 8192:
		return "c2@4"
	default:
		return "t2@12"
	}
}

// rowFamily names the matvec family a one-row product of w takes, so that
// more rows can take the family that computes each row the same way: "x8"
// where the one-row product is an 8-bit-activation kernel (Q4_K and Q6_K
// on 16-byte aligned weights of whole super-blocks, the default kernel
// choice; Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (the mv_b32_q8 family where
// b32Fits, the staged one of b32any.go elsewhere) and MXFP4 unless the
// variant is "g"), whose multi-row kernels (planRows) add the same terms
// in the same order; "" for the
// generic float kernel mv_{type}, which computes each of its activation
// rows independently whatever their number. Forcing a float-activation
// Q4_K/Q6_K kernel through mvVariant (tests, benchmarks) breaks the
// pairing.
func rowFamily(warp int, t gguf.Type, cols int, wAligned bool, variant string) string {
	switch t {
	case gguf.TypeQ4_K, gguf.TypeQ6_K:
		if wAligned && cols%256 == 0 {
			return "x8"
		}
		return ""
	}
	if mxfp4Q8(t, variant) { // mv_mxfp4_x8
		return "x8"
	}
	if b32Staged(t, variant) { // mv_{type}_x8 where b32Fits, else mv_{type}_mx8
		return "x8"
	}
	return ""
}

// rowsPlan is the launch of the multi-row matvec kernels: Kernel over
// groups of Group rows of x (one launch per group), Grid blocks of
// mvBlock threads.
type rowsPlan struct {
	Kernel string
	Group  int
	Grid   int
	Args   mvArgs // mvArgsGeneric (with nx) or mvArgsQ8 (with nx appended)
}

// planRows chooses the launches for dst [n][rows] = x [n][cols]·wᵀ, 2 ≤ n ≤
// kernels.MaxBatchRows, each row bit for bit what n = 1 gives it. Q4_K and
// Q6_K kernels are named x{NX}r{R}: NX rows of x per launch, R weight rows
// per warp (each x load serves R weight rows). On the H100 at the Llama 3
// 8B shapes, R = 2 was the fastest (R = 1 and 4 were measured too), and
// for Q4_K 16 rows of x per launch from 16 rows on
// (bench/results/2026-11-25-batch-matmul-h100.md). Every variant gives
// every row the bits of n = 1, so the choice may depend on n. mxVariant
// overrides it (tests, benchmarks).
func planRows(d LaunchDevice, t gguf.Type, rows, cols, n int, wAligned bool, mvVariant, mxVariant string) (rowsPlan, error) {
	kt, ok := kernelType(t)
	if !ok {
		return rowsPlan{}, fmt.Errorf("gpu: matvec rows: type %s is not supported on the GPU", t)
	}
	wpb := mvBlock / d.Warp
	if rowFamily(d.Warp, t, cols, wAligned, mvVariant) == "" {
		return rowsPlan{Kernel: "mv_" + kt, Group: mxRows, Grid: ceilDiv(rows, wpb), Args: mvArgsGeneric}, nil
	}
	name, nx, r := "mv_"+kt+"_x8", 8, 1
	if t != gguf.TypeMXFP4 && !b32Fits(d.Warp, t, cols, wAligned) && b32Staged(t, mvVariant) {
		name = "mv_" + kt + "_mx8" // the staged family (b32any.go)
	}
	if t == gguf.TypeQ4_K || t == gguf.TypeQ6_K {
		v := "x8r2"
		if t == gguf.TypeQ4_K && n > 8 {
			v = "x16r2"
		}
		if mxVariant != "" {
			v = mxVariant
		}
		if _, err := fmt.Sscanf(v, "x%dr%d", &nx, &r); err != nil || nx <= 0 || r <= 0 {
			nx, r, v = 8, 2, "x8r2"
		}
		name = "mv_" + kt + "_" + v
	}
	grid := ceilDiv(rows, wpb*r)
	if d.SMs > 0 { // a grid-strided wave, as the one-row Q4_K kernel
		grid = min(grid, 8*d.SMs)
	}
	return rowsPlan{Kernel: name, Group: nx, Grid: grid, Args: mvArgsQ8}, nil
}

// planQ4KMulti is the grid of mv_q4_k_n12m over total rows of two or
// three Q4_K weights (as n12@8; perSM > 0 caps it there instead).
func planQ4KMulti(d LaunchDevice, total, perSM int) int {
	if perSM <= 0 {
		perSM = 8
	}
	return min(ceilDiv(total, mvBlock/d.Warp), perSM*max(d.SMs, 1))
}

// planAttnDecodeSplits is how many blocks per head and token the decode
// attention splits a cache of ctx positions over: about four blocks per
// multiprocessor, each split at least 64 positions of a full cache.
func planAttnDecodeSplits(d LaunchDevice, heads, n, ctx int) int {
	splits := ceilDiv(4*max(d.SMs, 1), heads*n)
	return max(1, min(splits, ceilDiv(ctx, 64)))
}

// kLaunch is the geometry of one launch of Kernel.
type kLaunch struct {
	Kernel      string
	Grid, Block rocm.Dim3
}

// planNorm is the RMSNorm launch for n rows of cols (residual: the
// AddRMSNorm form; fuse: the one-row form may also write the 8-bit copy).
// One row, the decode shape, goes to rmsnorm_row (1024 threads), which
// also quantizes the row where q8 is returned; 2 to kernels.MaxBatchRows
// rows (a batched step) to one block of rmsnorm_row each, so that every
// row gets the bits it gets alone; more rows to one 256-thread block each
// of rmsnorm or add_rmsnorm.
func planNorm(n, cols int, residual, fuse bool) (l kLaunch, q8 bool) {
	switch {
	case n == 1:
		return kLaunch{"rmsnorm_row", rocm.D1(1), rocm.D1(1024)}, fuse && cols%32 == 0
	case n <= kernels.MaxBatchRows:
		return kLaunch{"rmsnorm_row", rocm.D1(n), rocm.D1(1024)}, false
	case residual:
		return kLaunch{"add_rmsnorm", rocm.D1(n), rocm.D1(256)}, false
	}
	return kLaunch{"rmsnorm", rocm.D1(n), rocm.D1(256)}, false
}

// planArgmax is the argmax of rows rows of cols: one long row (a
// vocabulary) in slices of argmaxChunk on many blocks (parts > 0), then
// one block over their winners; otherwise a block per row.
func planArgmax(rows, cols int) (parts int, l []kLaunch) {
	if rows == 1 && cols >= 2*argmaxChunk {
		parts = ceilDiv(cols, argmaxChunk)
		return parts, []kLaunch{{"argmax_slices", rocm.D1(parts), rocm.D1(256)}, {"argmax_parts", rocm.D1(1), rocm.D1(256)}}
	}
	return 0, []kLaunch{{"argmax_rows", rocm.D1(rows), rocm.D1(256)}}
}

// planAttnPrompt is the prompt attention: a block per head and 8 tokens
// (the kernel's QT).
func planAttnPrompt(sfx string, heads, n int) kLaunch {
	return kLaunch{"attn_prompt_" + sfx, rocm.Dim3{X: uint32(heads), Y: uint32(ceilDiv(n, 8)), Z: 1}, rocm.D1(256)}
}

// planAttnDecode is the decode attention for n ≤ 2 tokens over a cache of
// ctx positions: splits blocks per head and token
// (planAttnDecodeSplits), each covering splitLen of the pos0+n positions
// in use, at least minSplit (the kernel computes the same from the
// position a replayed step reads: pass it minSplit too). With minSplit, a
// short context leaves most splits empty and runs in few blocks.
func planAttnDecode(d LaunchDevice, sfx string, heads, n, pos0, ctx, minSplit int) (l kLaunch, splits, splitLen int) {
	splits = planAttnDecodeSplits(d, heads, n, ctx)
	return kLaunch{"attn_decode_" + sfx, rocm.Dim3{X: uint32(heads), Y: uint32(n), Z: uint32(splits)}, rocm.D1(128)},
		splits, max(minSplit, ceilDiv(pos0+n, splits))
}

// planPaged is the paged attention of n rows whose largest position is
// maxPos: a block per (head, row, split of pagedSplit positions), then a
// block per (head, row) to merge the splits.
func planPaged(sfx string, heads, n, maxPos int) (splits int, attn, merge kLaunch) {
	splits = ceilDiv(maxPos+1, pagedSplit)
	return splits, kLaunch{"attn_paged_" + sfx, rocm.Dim3{X: uint32(heads), Y: uint32(n), Z: uint32(splits)}, rocm.D1(128)},
		kLaunch{"attn_paged_merge", rocm.Dim3{X: uint32(heads), Y: uint32(n), Z: 1}, rocm.D1(128)}
}

// planPagedFine is pagedfine.cu's attention of n rows, pagedFineSplits
// blocks per (head, row) whatever the positions, and attn.cu's merge.
func planPagedFine(sfx string, heads, n int) (splits int, attn, merge kLaunch) {
	return pagedFineSplits, kLaunch{"attn_paged_fine_" + sfx, rocm.Dim3{X: uint32(heads), Y: uint32(n), Z: pagedFineSplits}, rocm.D1(128)},
		kLaunch{"attn_paged_merge", rocm.Dim3{X: uint32(heads), Y: uint32(n), Z: 1}, rocm.D1(128)}
}

// planGEMM is gemm.cu's launch for C [n][m]: a 256-thread block per tile
// of 128×128.
func planGEMM(kernel string, m, n int) kLaunch {
	return kLaunch{kernel, rocm.Dim3{X: uint32(ceilDiv(m, 128)), Y: uint32(ceilDiv(n, 128)), Z: 1}, rocm.D1(256)}
}

// dequantItems is how many threads deq16 and deq32 run for a weight of
// type t: one per 32-value part of a block type, one per value (of a
// kpad-wide row for deq16) of a plain type.
func dequantItems(t gguf.Type, rows, cols, kpad int) (deq16, deq32 int) {
	if t.BlockSize() > 1 {
		return rows * (cols / 32), rows * cols / 32
	}
	return rows * kpad, rows * cols
}

// planPrefill is the paged prefill attention of a prompt piece of n rows
// (prefill.cu): a block of 128 threads per head and prefillRows rows.
func planPrefill(kernel string, heads, n, splits int) kLaunch {
	return planPrefillTiles(kernel, heads, ceilDiv(n, prefillRows), splits)
}

// planPrefillTiles is attn_prefill_pieces_* (prefill.cu): a block of 128
// threads per (head, tile, split).
func planPrefillTiles(kernel string, heads, tiles, splits int) kLaunch {
	return kLaunch{kernel, rocm.Dim3{X: uint32(heads), Y: uint32(tiles), Z: uint32(max(splits, 1))}, rocm.D1(128)}
}

// planAttnExt is attention with a sliding window and/or a score soft-cap
// (archops.cu): a block of 128 threads per (head, token).
func planAttnExt(sfx string, heads, n int) kLaunch {
	return kLaunch{"attn_ext_" + sfx, rocm.Dim3{X: uint32(heads), Y: uint32(n), Z: 1}, rocm.D1(128)}
}
