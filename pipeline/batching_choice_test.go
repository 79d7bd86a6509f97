package pipeline

import (
	"testing"

	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/kernels/gpu"
	"github.com/forge-llm/forge/pipeline/model"
)

// TestCanBatchChoice: a GPU batches only where asked and only models whose
// attention its paged kernels run (no sliding window, no score soft-cap);
// the CPU batches every architecture.
func TestCanBatchChoice(t *testing.T) {
	plain := model.Config{Arch: "llama"}
	swa := model.Config{Arch: "llama", Window: 4096}
	gemma := model.Config{Arch: "gemma3", Window: 1024, SWAPattern: 6}
	capped := model.Config{Arch: "gemma2", AttnSoftcap: 50}
	c := cpu.New(1)
	defer c.Close()
	g := &gpu.Backend{} // canBatch looks only at its type
	for _, tc := range []struct {
		name string
		gpu  bool
		b    Batching
		cfg  model.Config
		want bool
	}{
		{"cpu plain", false, Batching{On: true}, plain, true},
		{"cpu window", false, Batching{On: true}, swa, true},
		{"cpu softcap", false, Batching{On: true}, capped, true},
		{"gpu not asked", true, Batching{On: true}, plain, false},
		{"gpu plain", true, Batching{On: true, GPU: true}, plain, true},
		{"gpu window", true, Batching{On: true, GPU: true}, swa, false},
		{"gpu local layers", true, Batching{On: true, GPU: true}, gemma, false},
		{"gpu softcap", true, Batching{On: true, GPU: true}, capped, false},
	} {
		var got bool
		if tc.gpu {
			got = canBatch(g, tc.b, tc.cfg)
		} else {
			got = canBatch(c, tc.b, tc.cfg)
		}
		if got != tc.want {
			t.Errorf("%s: canBatch = %v, want %v", tc.name, got, tc.want)
		}
	}
}
