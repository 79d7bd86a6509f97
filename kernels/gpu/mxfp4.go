package gpu

import "github.com/forge-llm/forge/gguf"

// The MXFP4 products on 8-bit activations (cu/mxfp4.cu): gpt-oss's experts
// are MXFP4, and the generic float kernel (mv_mxfp4, moe_mv_g_mxfp4)
// reached about a quarter of the H100's bandwidth on them
// (bench/results/2026-11-26-moe-h100.md). These kernels stage runs of
// whole 17-byte blocks through shared memory from the aligned 16-byte
// chunks that cover them, so they take any row of whole blocks at any
// byte alignment (gpt-oss's rows of 90 blocks are 1530 bytes).

// mxfp4Default is the one-row variant MatMul picks: R weight rows per warp
// ("m{R}", R = 1, 2, 4); timings in bench/results/2026-11-26-mxfp4-h100.md.
const mxfp4Default = "m2"

// mxfp4MoeR is moe_mv_mxfp4's rows per warp (mxfp4.cu's MOE_MXFP4_R). The
// rows per warp do not change a row's arithmetic, so the experts' rows
// are MatMul's bit for bit whatever mxfp4Default is.
const mxfp4MoeR = 2

// mxfp4Q8 reports whether a weight of type t takes the MXFP4 kernels on
// 8-bit x: every MXFP4 weight (its rows are whole blocks of 32), unless
// variant forces the generic float kernel ("g").
func mxfp4Q8(t gguf.Type, variant string) bool {
	return t == gguf.TypeMXFP4 && variant != "g"
}

// planMXFP4 is the one-row MXFP4 launch: mv_mxfp4_m{R} over groups of R
// rows (variant "m1", "m2" or "m4" forces R; anything else takes
// mxfp4Default), the grid capped at blocksPerSM blocks per multiprocessor
// where set (the kernel grid-strides over row groups).
func planMXFP4(d LaunchDevice, rows int, o mvOverrides) mvPlan {
	v := o.Variant
	if v != "m1" && v != "m2" && v != "m4" {
		v = mxfp4Default
	}
	grid := ceilDiv(rows, mvBlock/d.Warp*int(v[1]-'0'))
	if o.BlocksPerSM > 0 {
		grid = min(grid, o.BlocksPerSM*max(d.SMs, 1))
	}
	return mvPlan{Kernel: "mv_mxfp4_" + v, Grid: grid, Args: mvArgsQ8}
}
