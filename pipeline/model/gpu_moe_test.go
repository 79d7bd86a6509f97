package model_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/forge-llm/forge/pipeline/model"
	"github.com/forge-llm/forge/pipeline/synth"
)

// TestGPUMoEDeviceRoutedDecode: on the GPU, a mixture's decode steps
// routed on the device (moe_route, the experts' products by id in one
// launch each, the weighted sum from device weights) and recorded as a
// graph give the logits of the host-routed path run expert by expert op
// by op, bit for bit, over a prompt and 8 greedy steps, for both
// softmax-routed mixtures and gpt-oss (its router bias, top-k softmax,
// expert biases and clamped SwiGLU; MXFP4 experts) in a Q4_K/Q6_K mix and a
// Q8_0 one (experts 256 wide).
func TestGPUMoEDeviceRoutedDecode(t *testing.T) {
	be := model.OpenGPU(t)
	ctx := context.Background()
	dir := t.TempDir()
	for _, preset := range []string{"tiny-qwen3moe", "tiny-mixtral", "tiny-gpt-oss"} {
		for _, mix := range []synth.Mix{synth.MixQ4_KM, synth.MixQ8_0} {
			s := synth.Presets[preset]
			s.ExpertFF = 256
			path := filepath.Join(dir, fmt.Sprintf("%s-%s.gguf", preset, mix))
			if err := synth.WriteFile(ctx, path, synth.Options{Shape: s, Mix: mix, Seed: 5}); err != nil {
				t.Fatal(err)
			}
			t.Run(preset+"/"+string(mix), func(t *testing.T) {
				dev := model.OpenModel(t, path, be, model.Options{Ctx: 64})
				host := model.OpenModel(t, path, be, model.Options{Ctx: 64, NoGraph: true})
				model.MoEPerExpert(host)
				sameGreedy(t, dev, host)
				steps, recorded := model.MoEDeviceSteps(dev), model.DecodeGraphRecorded(dev)
				// the recorded step counts its layers twice (run, then recorded)
				if steps < s.Layers || !recorded {
					t.Errorf("%d layers routed on the device, graph recorded %v; want every decode step's, recorded", steps, recorded)
				}
			})
		}
	}
}
