package model

import (
	"context"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/cpu"
)

// TestStepBatchMatchesForward runs several sequences of mixed prompt
// lengths through batched steps (joining at different steps, prompts
// split into pieces, decode rows of several sequences together, block
// tables shuffled through one pool) and requires every logit of every
// sequence to equal bit for bit what Forward gives that sequence alone;
// with MergePrompts too, where the prompt pieces of a step share one group
// (on the CPU a row's product does not depend on the others').
func TestStepBatchMatchesForward(t *testing.T) {
	for _, merge := range []bool{false, true} {
		for _, file := range []string{"stories260K-F32.gguf", "stories260K-Q4_0.gguf", "stories260K-Q4_K_M.gguf", "synth-kq-Q4_K_M.gguf"} {
			name := file
			if merge {
				name += "/merged"
			}
			t.Run(name, func(t *testing.T) { stepBatchMatchesForward(t, file, merge) })
		}
	}
}

func stepBatchMatchesForward(t *testing.T, file string, merge bool) {
	stepBatchMatchesForwardOn(t, file, merge, nil)
}

// stepBatchMatchesForwardOn is stepBatchMatchesForward with the models on
// wrap(the CPU backend) where wrap is set (the KV pool on the CPU itself).
func stepBatchMatchesForwardOn(t *testing.T, file string, merge bool, wrap func(kernels.Backend) kernels.Backend) {
	{
		{
			be := cpu.New(2)
			t.Cleanup(be.Close)
			var mbe kernels.Backend = be
			if wrap != nil {
				mbe = wrap(be)
			}
			path := file // a file of testdata, or a path (moe_test.go's synthetic files)
			if !filepath.IsAbs(file) {
				path = testmodels.Path(t, file)
			}
			_, cfg, w := openWeights(t, path)
			bm, err := NewBatched(mbe, cfg, w, BatchOptions{MaxRows: 96, MaxSeqs: 8, MergePrompts: merge})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(bm.Close)
			const bs, blocks = 8, 64
			pool, err := be.NewKVPool(cfg.Layers, blocks, bs, cfg.KVDim())
			if err != nil {
				t.Fatal(err)
			}
			defer be.FreeKVPool(pool)
			rng := rand.New(rand.NewPCG(7, 9))
			free := rng.Perm(blocks)
			type seq struct {
				prompt   []int32
				start    int // step at which it joins
				pieces   []int
				table    []int32
				done     int // prompt tokens done
				gen      []int32
				next     int32
				single   *Model
				wantNext []float32
			}
			mk := func(n, start int, pieces []int) *seq {
				p := make([]int32, n)
				for i := range p {
					p[i] = int32(1 + rng.IntN(cfg.Vocab-1))
				}
				return &seq{prompt: p, start: start, pieces: pieces}
			}
			seqs := []*seq{mk(5, 0, []int{5}), mk(1, 0, []int{1}), mk(30, 1, []int{12, 12, 6}), mk(9, 2, []int{9}), mk(17, 2, []int{1, 16})}
			ctx := context.Background()
			for _, s := range seqs {
				s.single, err = New(mbe, cfg, w, Options{Ctx: 64})
				if err != nil {
					t.Fatal(err)
				}
				defer s.single.Close()
			}
			const gen = 6
			mergedSteps := 0
			for step := 0; step < 20; step++ {
				var rows []SeqRows
				var who []*seq
				for _, s := range seqs {
					if step < s.start || len(s.gen) >= gen {
						continue
					}
					var r SeqRows
					if s.done < len(s.prompt) {
						n := s.pieces[0]
						s.pieces = s.pieces[1:]
						r = SeqRows{Tokens: s.prompt[s.done : s.done+n], Pos0: s.done, Logits: s.done+n == len(s.prompt)}
					} else {
						r = SeqRows{Tokens: []int32{s.next}, Pos0: len(s.prompt) + len(s.gen) - 1, Logits: true}
					}
					for len(s.table)*bs < r.Pos0+len(r.Tokens) {
						s.table = append(s.table, int32(free[0]))
						free = free[1:]
					}
					r.Table = s.table
					// The single-sequence reference for the same tokens.
					l, err := s.single.Forward(ctx, r.Tokens, r.Pos0)
					if err != nil {
						t.Fatal(err)
					}
					s.wantNext = slices.Clone(l)
					rows = append(rows, r)
					who = append(who, s)
				}
				if len(rows) == 0 {
					break
				}
				t0 := time.Now()
				logits, err := bm.StepBatch(ctx, pool, rows)
				wall := time.Since(t0)
				if err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				// The queueing of the step's ops is a part of its call.
				if q := bm.StepQueued(); q <= 0 || q > wall {
					t.Fatalf("step %d: ops queued in %v of a %v call", step, q, wall)
				}
				prompts := 0
				for _, g := range bm.bat.groups {
					if g.prompt {
						prompts++
						if len(g.lay.Tables) > 1 {
							mergedSteps++
						}
					}
				}
				if merge && prompts > 1 {
					t.Fatalf("step %d: %d prompt groups with MergePrompts", step, prompts)
				}
				k := 0
				for i, r := range rows {
					s := who[i]
					if r.Pos0 < len(s.prompt) {
						s.done = r.Pos0 + len(r.Tokens)
					}
					if !r.Logits {
						continue
					}
					got := logits[k]
					k++
					for j, v := range s.wantNext {
						if math.Float32bits(got[j]) != math.Float32bits(v) {
							t.Fatalf("step %d seq %d (pos %d, %d rows): logit %d = %g, alone %g", step, slices.Index(seqs, s), r.Pos0, len(r.Tokens), j, got[j], v)
						}
					}
					s.next = argmax(got)
					s.gen = append(s.gen, s.next)
				}
				if k != len(logits) {
					t.Fatalf("step %d: %d logit rows, %d asked", step, len(logits), k)
				}
			}
			for i, s := range seqs {
				if len(s.gen) != gen {
					t.Errorf("seq %d generated %d tokens, want %d", i, len(s.gen), gen)
				}
			}
			if merge != (mergedSteps > 0) {
				t.Errorf("MergePrompts %v, yet %d steps ran a group of several pieces", merge, mergedSteps)
			}
		}
	}
}

// TestStepBatchErrors: bad steps are refused with an error.
func TestStepBatchErrors(t *testing.T) {
	be := cpu.New(1)
	t.Cleanup(be.Close)
	_, cfg, w := openWeights(t, testmodels.Path(t, "stories260K-F32.gguf"))
	bm, err := NewBatched(be, cfg, w, BatchOptions{MaxRows: 8, MaxSeqs: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer bm.Close()
	pool, err := be.NewKVPool(cfg.Layers, 4, 4, cfg.KVDim())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tab := []int32{0, 1}
	for name, rows := range map[string][]SeqRows{
		"empty":       nil,
		"no tokens":   {{Table: tab}},
		"too many":    {{Tokens: make([]int32, 9), Table: []int32{0, 1, 2}}},
		"short table": {{Tokens: make([]int32, 5), Table: []int32{0}}},
		"bad token":   {{Tokens: []int32{int32(cfg.Vocab)}, Table: tab}},
		"three seqs":  {{Tokens: []int32{1}, Table: tab}, {Tokens: []int32{1}, Table: tab}, {Tokens: []int32{1}, Table: tab}},
	} {
		if _, err := bm.StepBatch(ctx, pool, rows); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := NewBatched(hostBackend{}, cfg, w, BatchOptions{}); err == nil {
		t.Errorf("NewBatched on a backend without kernels.Batcher: no error")
	}
	_ = kernels.MaxBatchRows
}
