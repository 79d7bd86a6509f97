package pipeline

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/forge-llm/forge/pipeline/synth"
)

// TestGPUFirstTokenBeforeEveryExpert is TestFirstTokenBeforeEveryExpert on
// the GPU, with experts 256 wide (the width the grouped kernels take) so
// that the prompt's mixture runs routed on the device (its 3 tokens as
// products by id, mixtureRows) while the experts it did not route to are
// held back: the
// request asks for its own experts, waits for them only, and its first
// token is the one the GPU gives with every expert resident (eager).
func TestGPUFirstTokenBeforeEveryExpert(t *testing.T) {
	needGPU(t)
	shape := synth.Presets["tiny-qwen3moe"]
	shape.ExpertFF = 256
	path := filepath.Join(t.TempDir(), "moe-256.gguf")
	if err := synth.WriteFile(context.Background(), path, synth.Options{Shape: shape, Mix: synth.MixQ4_KM, Seed: 21}); err != nil {
		t.Fatal(err)
	}
	prompt := []int32{1, 5, 9}
	m, err := Open(context.Background(), path, Options{Strategy: Eager, Device: "gpu"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := m.Generate(context.Background(), "", GenerateOptions{PromptIDs: prompt, MaxTokens: 1, IgnoreEOG: true})
	m.Close()
	if err != nil {
		t.Fatal(err)
	}
	firstTokenBeforeEveryExpert(t, path, prompt, "gpu", routedExpertsOn(t, path, prompt, "gpu"), res.Tokens)
}
