package loadbench

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/forge-llm/forge/pipeline/synth"
)

// TestRunOnceLazyMixture: a lazy mixture of experts is never all resident
// (its unrouted experts never load), so a run measures its first token and
// ends instead of waiting for residency: no resident time, the routed
// experts counted among all of them.
func TestRunOnceLazyMixture(t *testing.T) {
	path := filepath.Join(t.TempDir(), "moe.gguf")
	shape := synth.Presets["tiny-qwen3moe"]
	if err := synth.WriteFile(context.Background(), path, synth.Options{Shape: shape, Mix: synth.MixQ4_KM, Seed: 2}); err != nil {
		t.Fatal(err)
	}
	r := RunOnce(t.Context(), OnceConfig{Model: path, Strategy: "lazy", Device: "cpu", Threads: 2, PromptTokens: 3})
	if r.Err != "" {
		t.Fatal(r.Err)
	}
	if r.ResidentMs != 0 || r.FirstTokenMs <= 0 {
		t.Errorf("resident at %v ms, first token at %v ms: want no residency, a first token", r.ResidentMs, r.FirstTokenMs)
	}
	if all := shape.Layers * shape.Experts; r.Experts != all || r.ExpertsRouted <= 0 || r.ExpertsRouted >= all {
		t.Errorf("%d of %d experts routed (want some of %d)", r.ExpertsRouted, r.Experts, all)
	}
}
