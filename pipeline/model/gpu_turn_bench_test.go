package model

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
	"time"
)

// TestGPUTurnStepBench measures a conversation turn's prompt step on the
// first file of FORGE_BIG_MODEL, as the serving engine runs it (a batched
// model, a paged pool of 16-position blocks, the piece its own group): 60,
// 150 and 330 new tokens (a short reply and question; a long one) at
// position 0 (the turn's text alone) and at position 2000 (after a cached
// history), the median wall time of one StepBatch (the
// last row's logits read back) over 8 steps, and a kernel profile of one
// step of each. A measurement, not a check: it asserts only that the
// steps run.
func TestGPUTurnStepBench(t *testing.T) {
	be, cfg, fw := bigDenseModel(t, "measure a turn's prompt step on the GPU")
	const bs, history, n, piece = 16, 2000, 330, 500
	m, err := NewBatched(be, cfg, fw, BatchOptions{MaxRows: DefaultBatch + 16, MaxSeqs: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	perSeq := (history + n + bs - 1) / bs
	pool, err := be.NewKVPool(cfg.Layers, 2*perSeq, bs, cfg.KVDim())
	if err != nil {
		t.Fatal(err)
	}
	defer be.FreeKVPool(pool)
	tables := [][]int32{make([]int32, perSeq), make([]int32, perSeq)}
	for s := range tables {
		for b := range perSeq {
			tables[s][b] = int32(s*perSeq + b)
		}
	}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(8, 9))
	tokens := func(k int) []int32 {
		toks := make([]int32, k)
		for i := range toks {
			toks[i] = int32(rng.IntN(cfg.Vocab))
		}
		return toks
	}
	for p := 0; p < history; p += piece {
		k := min(piece, history-p)
		if _, err := m.StepBatch(ctx, pool, []SeqRows{{Tokens: tokens(k), Pos0: p, Table: tables[0], Logits: p+k == history}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []int{60, 150, n} {
		turn := tokens(n)
		for _, c := range []struct {
			what string
			seq  int
			pos0 int
		}{{"alone", 1, 0}, {"after the history", 0, history}} {
			step := func() {
				if _, err := m.StepBatch(ctx, pool, []SeqRows{{Tokens: turn, Pos0: c.pos0, Table: tables[c.seq], Logits: true}}); err != nil {
					t.Fatal(err)
				}
			}
			var times []time.Duration
			for i := range 10 {
				start := time.Now()
				step()
				if i >= 2 {
					times = append(times, time.Since(start))
				}
			}
			sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
			t.Logf("GPU-TURN %d tokens at position %d (%s): step %v (median of %d)", n, c.pos0, c.what, times[len(times)/2].Round(time.Microsecond), len(times))
			be.StartProfile()
			step()
			prof, err := be.StopProfile()
			if err != nil {
				t.Fatal(err)
			}
			logProfile(t, fmt.Sprintf("turn step of %d tokens %s", n, c.what), prof)
		}
	}
}
