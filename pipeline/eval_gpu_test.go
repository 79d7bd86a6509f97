package pipeline

import (
	"context"
	"math"
	"testing"

	"github.com/forge-llm/forge/gguf/testmodels"
)

// TestGPUPerplexityMatchesCPU: forge perplexity's estimate on the GPU is
// the CPU's within 0.05 % (issue 20), for every file whose llama.cpp
// estimate is committed, over the same text and window.
func TestGPUPerplexityMatchesCPU(t *testing.T) {
	needGPU(t)
	want, text := loadPerplexityExpected(t)
	for name := range want.Models {
		t.Run(name, func(t *testing.T) {
			var ppl [2]float64
			for i, dev := range []string{"cpu", "gpu"} {
				m, err := Open(context.Background(), testmodels.Path(t, name), Options{Device: dev, Threads: 2, Ctx: want.Ctx})
				if err != nil {
					t.Fatal(err)
				}
				res, err := m.Perplexity(context.Background(), text, PerplexityOptions{Ctx: want.Ctx})
				m.Close()
				if err != nil {
					t.Fatalf("%s: %v", dev, err)
				}
				ppl[i] = res.PPL
			}
			rel := math.Abs(ppl[1]-ppl[0]) / ppl[0]
			t.Logf("%s: CPU %.4f, GPU %.4f (%.4f %%)", name, ppl[0], ppl[1], 100*rel)
			if rel > 5e-4 {
				t.Errorf("GPU %.4f differs from the CPU's %.4f by %.3f %%, over 0.05 %%", ppl[1], ppl[0], 100*rel)
			}
		})
	}
}
