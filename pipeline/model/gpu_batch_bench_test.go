package model

import (
	"context"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/forge-llm/forge/kernels"
)

// TestGPUBatchStepBench measures the batched decode step (continuous
// batching's hot loop) on the first file of FORGE_BIG_MODEL: for n
// sequences at position ~64 each, the wall time of one StepBatch (logits
// read back included, as the scheduler does) over 20 steps (median), the
// tokens/s it gives (n per step), and a kernel profile of one step. A
// measurement, not a check: it asserts only that the steps run.
func TestGPUBatchStepBench(t *testing.T) {
	be, cfg, fw := bigDenseModel(t, "measure batched decode steps on the GPU")
	const bs, prompt = 16, 64
	maxSeqs := kernels.MaxBatchRows
	m, err := NewBatched(be, cfg, fw, BatchOptions{MaxRows: DefaultBatch + maxSeqs, MaxSeqs: maxSeqs})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	blocksPer := (prompt + 64 + bs - 1) / bs
	pool, err := be.NewKVPool(cfg.Layers, maxSeqs*blocksPer, bs, cfg.KVDim())
	if err != nil {
		t.Fatal(err)
	}
	defer be.FreeKVPool(pool)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(3, 4))
	tables := make([][]int32, maxSeqs)
	for s := range maxSeqs {
		for b := range blocksPer {
			tables[s] = append(tables[s], int32(s*blocksPer+b))
		}
		toks := make([]int32, prompt)
		for i := range toks {
			toks[i] = int32(rng.IntN(cfg.Vocab))
		}
		if _, err := m.StepBatch(ctx, pool, []SeqRows{{Tokens: toks, Pos0: 0, Table: tables[s], Logits: true}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []int{1, 4, 16, 64} {
		seqs := make([]SeqRows, n)
		step := func(pos int) {
			for s := range seqs {
				seqs[s] = SeqRows{Tokens: []int32{int32(rng.IntN(cfg.Vocab))}, Pos0: pos, Table: tables[s], Logits: true}
			}
			if _, err := m.StepBatch(ctx, pool, seqs); err != nil {
				t.Fatal(err)
			}
		}
		var times []time.Duration
		for i := range 24 {
			start := time.Now()
			step(prompt + i)
			if i >= 4 {
				times = append(times, time.Since(start))
			}
		}
		sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
		med := times[len(times)/2]
		t.Logf("GPU-BATCH %d sequences: step %v (median of %d), %.0f tok/s", n, med.Round(time.Microsecond), len(times), float64(n)/med.Seconds())
		if n == 16 {
			// A new request's 37-token prompt joining 15 decoding ones.
			mixed := func(pos int) {
				for s := range 15 {
					seqs[s] = SeqRows{Tokens: []int32{int32(rng.IntN(cfg.Vocab))}, Pos0: pos, Table: tables[s], Logits: true}
				}
				toks := make([]int32, 37)
				for i := range toks {
					toks[i] = int32(rng.IntN(cfg.Vocab))
				}
				seqs[15] = SeqRows{Tokens: toks, Pos0: 0, Table: tables[maxSeqs-1], Logits: true}
				if _, err := m.StepBatch(ctx, pool, seqs); err != nil {
					t.Fatal(err)
				}
			}
			var mt []time.Duration
			for i := range 12 {
				start := time.Now()
				mixed(prompt + 24 + i)
				if i >= 2 {
					mt = append(mt, time.Since(start))
				}
			}
			sort.Slice(mt, func(i, j int) bool { return mt[i] < mt[j] })
			t.Logf("GPU-BATCH 15 decoding + a 37-token prompt: step %v (median of %d)", mt[len(mt)/2].Round(time.Microsecond), len(mt))
		}
		if n == 1 || n == 16 {
			be.StartProfile()
			step(prompt + 30)
			prof, err := be.StopProfile()
			if err != nil {
				t.Fatal(err)
			}
			logProfile(t, "batched decode step", prof)
		}
	}
}
