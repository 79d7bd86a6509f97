package model

import (
	"context"
	"math"
	"testing"

	"github.com/forge-llm/forge/gguf/testmodels"
)

// TestGPUMergedPrompts runs four prompts that arrive together through two
// batched models on the GPU, one running each prompt piece as a group of
// its own and one merging them (MergePrompts: the rows go through one
// product of 71 rows instead of four small ones), then a decode step of
// all four: the logits agree within the relative error the kernels'
// a quantized product's error allows (5 %, relative L2 over a row of
// logits, after every layer's products).
// (Neither bit equality nor equal picks are promised: merged, the rows go
// through the prompt GEMM with f16 activations instead of the 8-bit
// tensor-core product, and on synth-kq, whose logits are sharp, a near tie
// can turn; a deterministic server leaves MergePrompts off.)
func TestGPUMergedPrompts(t *testing.T) {
	be := openGPU(t)
	ctx := context.Background()
	for _, file := range []string{"stories260K-Q4_K_M.gguf", "synth-kq-Q4_K_M.gguf"} {
		t.Run(file, func(t *testing.T) {
			_, cfg, w := openWeights(t, testmodels.Path(t, file))
			const bs, blocks = 16, 64
			lens := []int{5, 37, 20, 9}
			var logits [2][][]float32
			for mi, merge := range []bool{false, true} {
				bm, err := NewBatched(be, cfg, w, BatchOptions{MaxRows: 128, MaxSeqs: 8, MergePrompts: merge})
				if err != nil {
					t.Fatal(err)
				}
				pool, err := be.NewKVPool(cfg.Layers, blocks, bs, cfg.KVDim())
				if err != nil {
					t.Fatal(err)
				}
				var rows []SeqRows
				next := 0
				for i, n := range lens {
					toks := make([]int32, n)
					for k := range toks {
						toks[k] = int32(1 + (i*131+k*17)%(cfg.Vocab-1))
					}
					var table []int32
					for len(table)*bs < n+1 {
						table = append(table, int32(next))
						next++
					}
					rows = append(rows, SeqRows{Tokens: toks, Table: table, Logits: true})
				}
				out, err := bm.StepBatch(ctx, pool, rows)
				if err != nil {
					t.Fatal(err)
				}
				var step [][]float32
				for i, l := range out {
					step = append(step, append([]float32(nil), l...))
					rows[i] = SeqRows{Tokens: []int32{argmax(l)}, Pos0: lens[i], Table: rows[i].Table, Logits: true}
				}
				out, err = bm.StepBatch(ctx, pool, rows)
				if err != nil {
					t.Fatal(err)
				}
				for _, l := range out {
					step = append(step, append([]float32(nil), l...))
				}
				logits[mi] = step
				be.FreeKVPool(pool)
				bm.Close()
			}
			for i := range logits[0] {
				a, b := logits[0][i], logits[1][i]
				var num, den float64
				for j := range a {
					d := float64(a[j] - b[j])
					num += d * d
					den += float64(a[j]) * float64(a[j])
				}
				rel := math.Sqrt(num / den)
				t.Logf("row %d: merged logits differ by %.2g (relative); picks %d apart, %d merged", i, rel, argmax(a), argmax(b))
				if rel > 5e-2 {
					t.Errorf("row %d: merged logits differ by %.2g (relative), over 5 %%", i, rel)
				}
			}
		})
	}
}
