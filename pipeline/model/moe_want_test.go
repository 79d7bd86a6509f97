package model_test

import (
	"context"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/pipeline/model"
	"github.com/forge-llm/forge/pipeline/synth"
)

// TestExpertsWantedBeforeWaits: where a layer's experts arrive one by one,
// the mixture tells the loader every expert its router chose
// (ExpertsWanted) before it waits for the first (ExpertReady), in the
// prompt's step and in each decode step, so that their loads run together.
func TestExpertsWantedBeforeWaits(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "moe.gguf")
	if err := synth.WriteFile(ctx, path, synth.Options{Shape: synth.Presets["tiny-qwen3moe"], Mix: synth.MixF32, Seed: 3}); err != nil {
		t.Fatal(err)
	}
	type event struct {
		lw   *model.LayerWeights
		want []int // nil: a wait for expert e
		e    int
	}
	var mu sync.Mutex
	var log []event
	mod := func(lw *model.LayerWeights) {
		lw.ExpertReady = func(_ context.Context, e int) error {
			mu.Lock()
			defer mu.Unlock()
			log = append(log, event{lw: lw, e: e})
			return nil
		}
		lw.ExpertsWanted = func(es []int) {
			mu.Lock()
			defer mu.Unlock()
			log = append(log, event{lw: lw, want: slices.Clone(es)})
		}
	}
	be := cpu.New(2)
	defer be.Close()
	m := openHooked(t, path, be, mod)
	greedyMargins(t, m, []int32{1, 5, 9, 13, 17, 21, 25, 29}, 4)
	last := map[*model.LayerWeights][]int{}
	waits, wants := 0, 0
	for _, ev := range log {
		if ev.want != nil {
			wants++
			last[ev.lw] = ev.want
			continue
		}
		waits++
		if !slices.Contains(last[ev.lw], ev.e) {
			t.Fatalf("a wait for expert %d that the layer's last ExpertsWanted (%v) did not name", ev.e, last[ev.lw])
		}
	}
	if waits == 0 || wants == 0 {
		t.Fatalf("%d waits, %d ExpertsWanted calls: the hooks were not used", waits, wants)
	}
}
