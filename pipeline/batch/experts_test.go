package batch

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/pipeline/internal/archtest"
	"github.com/forge-llm/forge/pipeline/model"
	"github.com/forge-llm/forge/pipeline/sample"
	"github.com/forge-llm/forge/pipeline/synth"
)

// expertWeights gives every block an ExpertReady that asks ready, as a
// loader with per-expert readiness does.
type expertWeights struct {
	model.Weights
	ready func(layer, expert int) error
}

func (w expertWeights) Layer(ctx context.Context, i int) (*model.LayerWeights, error) {
	lw, err := w.Weights.Layer(ctx, i)
	if err != nil {
		return nil, err
	}
	c := *lw
	c.ExpertReady = func(_ context.Context, e int) error { return w.ready(i, e) }
	return &c, nil
}

type expertKey struct{ layer, expert int }

// TestExpertFailureFailsOnlyItsSequences: in a batched step, an expert
// that cannot arrive fails the sequences routed to it and no other: the
// step runs again one sequence at a time, and a request beside the failed
// one, in the same steps, gets exactly its tokens alone.
func TestExpertFailureFailsOnlyItsSequences(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tiny-qwen3moe.gguf")
	if err := synth.WriteFile(context.Background(), path, synth.Options{Shape: synth.Presets["tiny-qwen3moe"], Mix: synth.MixQ8_0, Seed: 5}); err != nil {
		t.Fatal(err)
	}
	cfg, fw := archtest.OpenWeights(t, path)
	be := cpu.New(2)
	defer be.Close()
	const maxTokens = 6
	fx := &fixture{be: be, cfg: cfg}

	// routed runs prompt alone and returns the experts its steps asked for.
	routed := func(prompt []int32) (map[expertKey]bool, []int32) {
		var mu sync.Mutex
		asked := map[expertKey]bool{}
		fx.w = expertWeights{Weights: fw, ready: func(l, e int) error {
			mu.Lock()
			asked[expertKey{l, e}] = true
			mu.Unlock()
			return nil
		}}
		s := fx.scheduler(t, Config{Blocks: 64, BlockSize: 8, Ctx: 128})
		res, err := s.Generate(context.Background(), Request{Prompt: prompt, MaxTokens: maxTokens, Sampler: sample.New(sample.Params{}, cfg.Vocab)}, nil)
		s.Close()
		if err != nil {
			t.Fatal(err)
		}
		return asked, res.Tokens
	}
	rng := rand.New(rand.NewPCG(3, 4))
	promptA := randPrompt(rng, 5, cfg.Vocab)
	usedA, _ := routed(promptA)
	// B: a prompt whose whole run never asks for some expert A asks for.
	var promptB, wantB []int32
	var bad expertKey
	found := false
	for try := 0; try < 40 && !found; try++ {
		p := randPrompt(rng, 4, cfg.Vocab)
		usedB, toks := routed(p)
		for k := range usedA {
			if !usedB[k] {
				promptB, wantB, bad, found = p, toks, k, true
				break
			}
		}
	}
	if !found {
		t.Fatal("every prompt tried asks for every expert prompt A asks for")
	}

	errBad := errors.New("injected: expert unreadable")
	gate := make(chan struct{})
	fx.w = gatedWeights{Weights: expertWeights{Weights: fw, ready: func(l, e int) error {
		if (expertKey{l, e}) == bad {
			return errBad
		}
		return nil
	}}, gate: gate}
	s := fx.scheduler(t, Config{Blocks: 64, BlockSize: 8, Ctx: 128})
	var steps [][]model.SeqRows // written on the loop goroutine, read after both streams ended
	s.onStep = func(rs []model.SeqRows) { steps = append(steps, slices.Clone(rs)) }
	// B first: its first step waits at the gate while A queues, so A's
	// prompt runs beside B (in B's first step or beside its first decode
	// row), never alone before B starts.
	stB, err := s.Submit(context.Background(), Request{Prompt: promptB, MaxTokens: maxTokens, Sampler: sample.New(sample.Params{}, cfg.Vocab)})
	if err != nil {
		t.Fatal(err)
	}
	stA, err := s.Submit(context.Background(), Request{Prompt: promptA, MaxTokens: maxTokens, Sampler: sample.New(sample.Params{}, cfg.Vocab)})
	if err != nil {
		t.Fatal(err)
	}
	close(gate)
	for _, st := range []*Stream{stA, stB} {
		for {
			if _, ok := st.Next(context.Background()); !ok {
				break
			}
		}
	}
	_, errA := stA.Result()
	resB, errB := stB.Result()
	if !errors.Is(errA, errBad) || !errors.Is(errA, model.ErrExpertUnavailable) || !strings.Contains(errA.Error(), fmt.Sprintf("expert %d", bad.expert)) {
		t.Errorf("request A (routed to layer %d expert %d): %v, want the expert's error naming it", bad.layer, bad.expert, errA)
	}
	if errB != nil || !slices.Equal(resB.Tokens, wantB) {
		t.Errorf("request B: %v %v, alone %v", resB.Tokens, errB, wantB)
	}
	// A's prompt, where the expert fails, shared its step with a row of B
	// (the only other sequence): B's success is the fallback's, not a
	// schedule that kept them apart.
	shared := false
	for _, rs := range steps {
		hasA := slices.ContainsFunc(rs, func(r model.SeqRows) bool { return r.Pos0 == 0 && slices.Equal(r.Tokens, promptA) })
		shared = shared || (hasA && len(rs) > 1)
	}
	if !shared {
		t.Fatalf("A's prompt never ran beside B: %d steps", len(steps))
	}
	if st := s.Stats(); st.Held != 0 {
		t.Errorf("%d blocks still held after both ended", st.Held)
	}
}
