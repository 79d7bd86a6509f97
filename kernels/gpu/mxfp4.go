package gpu

import "github.com/forge-llm/forge/gguf"

// The MXFP4 products on 8-bit activations (cu/mxfp4.cu): gpt-oss's experts
// are MXFP4, and the generic float kernel (mv_mxfp4, moe_mv_g_mxfp4)
// reached about a quarter of the H100's bandwidth on them
// (bench/results/2026-11-26-moe-h100.md). These kernels stage runs of
// whole 17-byte blocks through shared memory from the aligned 16-byte
// chunks that cover them, so they take any row of whole blocks at any
// byte alignment (gpt-oss's rows of 90 blocks are 1530 bytes).

// mxfp4Variants are mxfp4.cu's one-row kernels mv_mxfp4_m{R}{U}: R weight
// rows per warp, rows staged U runs of warpSize blocks at a time. Neither
// changes a row's arithmetic. On the H100 at gpt-oss's shapes, staging
// more than one run at a time (U = 2, 3) and four rows per warp were
// slower, and one row per warp within a few percent of two; m13 stays for
// comparison (bench/results/2026-11-26-mxfp4-h100.md).
var mxfp4Variants = map[string]bool{"m11": true, "m21": true, "m41": true, "m13": true}

// mxfp4Default is the one-row variant MatMul picks.
const mxfp4Default = "m21"

// mxfp4Moe is the experts' kernel, moe_mv_mxfp4_{R}{U} (mxfp4.cu builds
// 21: of 11, 21, 13 and 23, the fastest on gpt-oss's experts), and
// mxfp4MoeR its R. The rows per warp and runs per stage do not change a
// row's arithmetic, so the experts' rows are MatMul's bit for bit
// whatever mxfp4Default is.
const (
	mxfp4Moe  = "moe_mv_mxfp4_21"
	mxfp4MoeR = 2
)

// mxfp4Q8 reports whether a weight of type t takes the MXFP4 kernels on
// 8-bit x: every MXFP4 weight (its rows are whole blocks of 32), unless
// variant forces the generic float kernel ("g").
func mxfp4Q8(t gguf.Type, variant string) bool {
	return t == gguf.TypeMXFP4 && variant != "g"
}

// planMXFP4 is the one-row MXFP4 launch: mv_mxfp4_{v} over groups of R
// rows, v the variant forced (mxfp4Variants) or else mxfp4Default, the
// grid capped at blocksPerSM blocks per multiprocessor where set (the
// kernel grid-strides over row groups).
func planMXFP4(d LaunchDevice, rows int, o mvOverrides) mvPlan {
	return planStaged(d, "mxfp4", mxfp4Variants, mxfp4Default, rows, o)
}
