package gpu

import "github.com/forge-llm/forge/gguf"

// The staged 32-element block kernels (cu/mxfp4.cu, mv_{type}_m{R}1,
// mv_{type}_mx8, moe_mv_{type}_m21): Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 rows
// that mvbody.h's mv_b32_q8 cannot take (b32Fits: rows not 16-byte
// aligned, or not a whole number of warp-wide runs of blocks). They went
// to the generic float kernel, which on gpt-oss-20b's Q8_0 output head
// (201088×2880: 90 blocks a row) reached 245 GB/s on the H100, a third of
// the decode step (bench/results/2026-11-26-mxfp4-h100.md). The MXFP4
// kernels' staging (runs of whole blocks copied from the aligned 16-byte
// chunks that cover them) takes any row of whole blocks at any alignment,
// so these share its body over the block type.
//
// A weight takes one family for every n: the one-row kernels for n = 1,
// mv_{type}_mx8 for 2 to 8 rows of x per launch, both adding each block's
// term in the same order (batch invariance), and the experts' kernel with
// the one-row kernels' bits.

// b32Variants are the one-row staged kernels mv_{type}_m{R}1 (R weight
// rows per warp); neither changes a row's arithmetic.
var b32Variants = map[string]bool{"m11": true, "m21": true}

// b32Default is the one-row variant MatMul picks: two rows per warp, as
// the MXFP4 kernels' m21 and mv_b32_q8's b2.
const b32Default = "m21"

// b32Staged reports whether a weight of type t takes the staged kernels
// where b32Fits refuses it: every weight of a 32-element block type
// (its rows are whole blocks), unless variant forces the generic float
// kernel ("g").
func b32Staged(t gguf.Type, variant string) bool {
	switch t {
	case gguf.TypeQ4_0, gguf.TypeQ4_1, gguf.TypeQ5_0, gguf.TypeQ5_1, gguf.TypeQ8_0:
		return variant != "g"
	}
	return false
}

// planStaged is the one-row launch of the staged kernels of type kt:
// mv_{kt}_{v} over groups of R rows, v the variant forced (one of
// variants) or else def, the grid capped at blocksPerSM blocks per
// multiprocessor where set (the kernels grid-stride over row groups).
func planStaged(d LaunchDevice, kt string, variants map[string]bool, def string, rows int, o mvOverrides) mvPlan {
	v := o.Variant
	if !variants[v] {
		v = def
	}
	grid := ceilDiv(rows, mvBlock/d.Warp*int(v[1]-'0'))
	if o.BlocksPerSM > 0 {
		grid = min(grid, o.BlocksPerSM*max(d.SMs, 1))
	}
	return mvPlan{Kernel: "mv_" + kt + "_" + v, Grid: grid, Args: mvArgsQ8}
}
