package model_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/pipeline/model"
	"github.com/forge-llm/forge/pipeline/synth"
)

// hostGrouper is hostRouter with kernels.ExpertGrouper composed of one
// MatMul per expert over its rows: the model's grouped prompt path
// (moe_grouped.go) runs on it without a GPU, so its wiring (which rows,
// which buffers, the in-place SiLUMul, the weighted sum) is checked
// against the per-expert path.
type hostGrouper struct{ hostRouter }

var _ kernels.ExpertGrouper = hostGrouper{}

func (hostGrouper) GroupsFit(kernels.ExpertTable) bool { return true }

func (g hostGrouper) GroupedMatMuls(dsts []kernels.Tensor, tables []kernels.ExpertTable, x kernels.Tensor, start []int32) error {
	for i, t := range tables {
		ws := t.([]*kernels.Weight)
		rows, cols := ws[0].Rows, ws[0].Cols
		for e := range len(start) - 1 {
			lo, n := int(start[e]), int(start[e+1]-start[e])
			if n == 0 {
				continue
			}
			if err := g.MatMul(dsts[i].View(lo*rows, n*rows), ws[e], x.View(lo*cols, n*cols), n); err != nil {
				return fmt.Errorf("hostGrouper: expert %d: %w", e, err)
			}
		}
	}
	return nil
}

// TestMoEGroupedPromptWiring: a prompt's mixture with its expert products
// grouped (run on the CPU through hostGrouper) gives the per-expert path's
// logits bit for bit over a 12-token prompt and 8 greedy decode steps,
// for both softmax mixtures in float and quantized mixes; it runs in every
// layer of the prompt but the last (whose feed-forward runs on the one row
// that needs logits, routed on the device as a decode step's), and not
// where the layer cannot say that all its experts are resident.
func TestMoEGroupedPromptWiring(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	prompt := []int32{1, 403, 407, 261, 378, 12, 99, 300, 17, 5, 250, 401}
	for _, preset := range []string{"tiny-qwen3moe", "tiny-mixtral"} {
		for _, mix := range []synth.Mix{synth.MixF32, synth.MixQ4_KM} {
			path := filepath.Join(dir, preset+"-"+string(mix)+".gguf")
			if err := synth.WriteFile(ctx, path, synth.Options{Shape: synth.Presets[preset], Mix: mix, Seed: 7}); err != nil {
				t.Fatal(err)
			}
			layers := synth.Presets[preset].Layers
			t.Run(preset+"/"+string(mix), func(t *testing.T) {
				dev := hostGrouper{hostRouter{cpu.New(2)}}
				defer dev.Close()
				for _, c := range []struct {
					name string
					mod  func(*model.LayerWeights)
					runs int
				}{
					{"resident", nil, layers - 1},
					{"readiness unknown", func(lw *model.LayerWeights) {
						lw.ExpertReady = func(context.Context, int) error { return nil }
					}, 0},
				} {
					grouped := openHooked(t, path, dev, c.mod)
					each := openHooked(t, path, dev, c.mod)
					model.MoENoGrouped(each)
					sameLogitBits(t, grouped, each, prompt, 9, "expert by expert")
					if got := model.MoEGroupedRuns(grouped); got != c.runs {
						t.Errorf("%s: %d layers grouped, want %d (the prompt's but its last)", c.name, got, c.runs)
					}
					if got := model.MoEGroupedRuns(each); got != 0 {
						t.Errorf("%s: %d layers grouped with the grouped path off", c.name, got)
					}
				}
			})
		}
	}
}
