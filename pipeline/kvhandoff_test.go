package pipeline

import (
	"slices"
	"testing"
	"time"

	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/kernels"
)

// TestKVHandoff: a pool of the shape asked for is handed over once; one
// of another shape is freed and not handed; after close an offered pool
// is refused (its model frees it) and an untaken one is freed.
func TestKVHandoff(t *testing.T) {
	var freed []*kernels.KVPool
	h := &kvHandoff{free: func(p *kernels.KVPool) { freed = append(freed, p) }}
	p := &kernels.KVPool{Layers: 2, Blocks: 8, BlockSize: 16, KVDim: 64}
	if !h.offer(p) {
		t.Fatal("offer refused")
	}
	if h.offer(&kernels.KVPool{}) {
		t.Error("a second pool accepted while one waits")
	}
	if got := h.take(2, 8, 16, 64); got != p || len(freed) != 0 {
		t.Errorf("take of the same shape: %p (want %p), %d freed", got, p, len(freed))
	}
	if got := h.take(2, 8, 16, 64); got != nil {
		t.Error("the pool was handed over twice")
	}
	q := &kernels.KVPool{Layers: 2, Blocks: 8, BlockSize: 16, KVDim: 64}
	h.offer(q)
	if got := h.take(2, 9, 16, 64); got != nil || !slices.Equal(freed, []*kernels.KVPool{q}) {
		t.Errorf("take of another shape: got %v, freed %v", got, freed)
	}
	r := &kernels.KVPool{Layers: 2}
	h.offer(r)
	h.close()
	h.close()
	if !slices.Equal(freed, []*kernels.KVPool{q, r}) {
		t.Errorf("close freed %v, want the untaken pool", freed)
	}
	if h.offer(p) {
		t.Error("offer accepted after close")
	}
}

// TestEngineSwapHandsOverKVPool: with batching on and a budget for one of
// two models of one shape, each swap hands the evicted model's KV pool to
// the model loaded in its place, and the swapped-in model answers as it
// did on its own pool (a greedy request gives the same tokens), though
// the pool holds the other model's keys and values.
func TestEngineSwapHandsOverKVPool(t *testing.T) {
	a := testmodels.Path(t, "stories260K-Q4_0.gguf")
	b := testmodels.Path(t, "stories260K-Q8_0.gguf")
	o := Options{Batching: Batching{On: true}}
	ea, _, err := estimate(a, o)
	if err != nil {
		t.Fatal(err)
	}
	eb, _, _ := estimate(b, o)
	// References: both models loaded side by side, each on its own pool.
	ref := map[string][]int32{}
	e0 := newTestEngine(t, EngineOptions{KeepAlive: new(time.Duration(-1))})
	for _, p := range []string{a, b} {
		res, err := e0.Generate(t.Context(), EngineRequest{Model: p, Prompt: "Once upon a time", MaxTokens: 12, IgnoreEOG: true})
		if err != nil {
			t.Fatal(err)
		}
		ref[p] = res.Tokens
	}
	if err := e0.Close(); err != nil {
		t.Fatal(err)
	}
	e := newTestEngine(t, EngineOptions{Budget: max(ea, eb) + min(ea, eb)/2, KeepAlive: new(time.Duration(-1))})
	gen := func(p string) []int32 {
		t.Helper()
		res, err := e.Generate(t.Context(), EngineRequest{Model: p, Prompt: "Once upon a time", MaxTokens: 12, IgnoreEOG: true})
		if err != nil {
			t.Fatal(err)
		}
		return res.Tokens
	}
	took := func(p string) bool {
		t.Helper()
		l, err := e.Acquire(t.Context(), p)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release()
		h := l.Model().kvFrom
		if h == nil {
			return false
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.taken
	}
	if got := gen(a); !slices.Equal(got, ref[a]) {
		t.Errorf("a alone: %v, want %v", got, ref[a])
	}
	if took(a) {
		t.Error("the first load took a pool over: nothing was evicted for it")
	}
	for round := range 3 {
		for _, p := range []string{b, a} {
			if round == 2 && p == a {
				continue
			}
			got := gen(p)
			if !slices.Equal(got, ref[p]) {
				t.Errorf("round %d, %s on the evicted model's pool: %v, on its own %v", round, p, got, ref[p])
			}
			if !took(p) {
				t.Errorf("round %d: %s did not take the evicted model's pool", round, p)
			}
			if e.InUse() > e.o.Budget {
				t.Errorf("in use %d over the budget %d", e.InUse(), e.o.Budget)
			}
		}
	}
}
