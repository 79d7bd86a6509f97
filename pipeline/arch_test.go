package pipeline

import (
	"slices"
	"testing"

	"github.com/forge-llm/forge/pipeline/internal/archtest"
)

// TestArchitecturesThroughPipeline: every architecture's tiny preset,
// opened through the loading pipeline (the actors, the pipeline's weights
// view of the registry's tables, Phi-3's row views, its LongRoPE factors)
// under each strategy, gives llama.cpp's greedy tokens.
func TestArchitecturesThroughPipeline(t *testing.T) {
	exp := archtest.Read(t)
	dir := t.TempDir()
	for _, preset := range archtest.Presets {
		t.Run(preset, func(t *testing.T) {
			c := exp.Case(t, preset)
			path := archtest.WriteFile(t, dir, preset, c)
			ref := expected{Prompt: c.PromptIDs, Generated: c.GeneratedIDs[:archtest.Tokens]}
			for _, s := range []Strategy{Prefetch, Eager, Lazy, HostF32} {
				if got := generateWith(t, path, Options{Strategy: s, Ctx: 64}, ref); !slices.Equal(got, ref.Generated) {
					t.Errorf("%s: got %v\nwant (llama.cpp) %v", s, got, ref.Generated)
				}
			}
		})
	}
}
