package pipeline

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/forge-llm/forge/pipeline/synth"
)

// TestLazyMixtureResident: under Lazy a mixture's experts load only when a
// router picks them, so Resident does not resolve after a request (the
// unrouted experts stay pending) and LazyExperts says so; a wait on it
// returns when its context is cancelled, and one with no deadline returns
// (failed) at Close: no caller hangs. Prefetch and a dense lazy model are
// not LazyExperts.
func TestLazyMixtureResident(t *testing.T) {
	path := writeMoE(t, "tiny-qwen3moe", synth.MixQ4_KM)
	m, err := Open(context.Background(), path, Options{Strategy: Lazy, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if !m.LazyExperts() {
		t.Fatal("a lazy mixture is not LazyExperts")
	}
	if _, err := m.Generate(context.Background(), "", GenerateOptions{PromptIDs: []int32{1, 5, 9}, MaxTokens: 2, IgnoreEOG: true}); err != nil {
		t.Fatal(err)
	}
	pending := 0
	for l := range m.Config().Layers {
		for e := range m.Experts(l) {
			if st, _ := m.Expert(l, e).State(); st == UnitPending {
				pending++
			}
		}
	}
	if pending == 0 {
		t.Fatal("every expert loaded: the test needs some no request routed to")
	}

	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan error, 1)
	go func() { got <- m.Resident().Wait(ctx) }()
	cancel()
	if err := <-got; !errors.Is(err, context.Canceled) {
		t.Fatalf("Resident's wait, its context cancelled: %v", err)
	}
	if st, _ := m.Resident().State(); st == UnitResident {
		t.Fatal("resident with experts pending")
	}

	go func() { got <- m.Resident().Wait(context.Background()) }()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err == nil {
		t.Fatal("Resident resolved without error at Close with experts never loaded")
	}

	for _, c := range []struct {
		name string
		path string
		o    Options
	}{
		{"prefetch mixture", path, Options{}},
		{"lazy dense", denseFile(t), Options{Strategy: Lazy}},
	} {
		c.o.Threads = 1
		m, err := Open(context.Background(), c.path, c.o)
		if err != nil {
			t.Fatal(err)
		}
		if m.LazyExperts() {
			t.Errorf("%s: LazyExperts", c.name)
		}
		m.Close()
	}
}

// denseFile writes a small dense model.
func denseFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "dense.gguf")
	if err := synth.WriteFile(context.Background(), path, synth.Options{Shape: synth.Presets["tiny"], Mix: synth.MixQ4_KM, Seed: 3}); err != nil {
		t.Fatal(err)
	}
	return path
}
