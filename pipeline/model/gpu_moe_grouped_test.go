package model_test

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"testing"

	"github.com/forge-llm/forge/pipeline/model"
	"github.com/forge-llm/forge/pipeline/synth"
)

// TestGPUMoEGroupedPrompt: on the GPU, a prompt's mixture with every
// expert's rows of a matrix in one launch (moemmq.cu, the grouped path)
// gives the logits of the same model run expert by expert, bit for bit,
// over a 40-token prompt (no expert chosen by more than kernels.
// MaxBatchRows of its tokens, where each expert's MatMul is row-invariant)
// and 4 greedy steps, for both softmax mixtures in a Q4_K/Q6_K mix; the
// grouped path runs in every layer of the prompt but the last (one row,
// routed on the device), and not at all for Q8_0 experts (no grouped
// kernel: the per-expert path). Over a 200-token prompt, where some
// experts get more rows than MaxBatchRows and the per-expert path
// multiplies those through a GEMM on f16 x, the last row's logits stay
// within 5 % (relative norm) of the per-expert path's.
func TestGPUMoEGroupedPrompt(t *testing.T) {
	be := model.OpenGPU(t)
	ctx := context.Background()
	dir := t.TempDir()
	short := make([]int32, 40)
	long := make([]int32, 200)
	for i := range long {
		v := int32(1 + (i*193+37*(i/7))%500)
		long[i] = v
		if i < len(short) {
			short[i] = v
		}
	}
	for _, preset := range []string{"tiny-qwen3moe", "tiny-mixtral"} {
		for _, mix := range []synth.Mix{synth.MixQ4_KM, synth.MixQ8_0} {
			s := synth.Presets[preset]
			s.ExpertFF = 256
			path := filepath.Join(dir, fmt.Sprintf("%s-%s.gguf", preset, mix))
			if err := synth.WriteFile(ctx, path, synth.Options{Shape: s, Mix: mix, Seed: 9}); err != nil {
				t.Fatal(err)
			}
			t.Run(preset+"/"+string(mix), func(t *testing.T) {
				grouped := model.OpenModel(t, path, be, model.Options{Ctx: 256})
				each := model.OpenModel(t, path, be, model.Options{Ctx: 256})
				model.MoENoGrouped(each)
				// these prompts would run as products by id
				// (mixtureRows): off in both, to compare these two
				model.MoENoRows(grouped)
				model.MoENoRows(each)
				sameLogitBits(t, grouped, each, short, 5, "expert by expert")
				want := s.Layers - 1
				if mix == synth.MixQ8_0 {
					want = 0
				}
				if got := model.MoEGroupedRuns(grouped); got != want {
					t.Errorf("%d layers grouped, want %d", got, want)
				}
				if mix != synth.MixQ4_KM {
					return
				}
				got, err := grouped.Forward(ctx, long, 0)
				if err != nil {
					t.Fatal(err)
				}
				ref, err := each.Forward(ctx, long, 0)
				if err != nil {
					t.Fatal(err)
				}
				var num, den float64
				for i, r := range ref {
					d := float64(got[i]) - float64(r)
					num += d * d
					den += float64(r) * float64(r)
				}
				rel := math.Sqrt(num / den)
				t.Logf("200-token prompt: last row's logits differ from the per-expert path's by %.3g (relative norm)", rel)
				if !(rel < 0.05) {
					t.Errorf("200-token prompt: relative difference %.3g of the logits, want < 0.05", rel)
				}
			})
		}
	}
}
