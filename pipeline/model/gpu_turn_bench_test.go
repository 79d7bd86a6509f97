package model

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
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
// step of each. Then several conversations' turns in one step, as a
// server that merges prompt pieces runs them (MergePrompts; the pieces
// kernel for their attention): four turns of 120 tokens after the same
// 2000-token history (shared blocks), against four texts of 120 tokens at
// position 0 in one step, and against the four turns as separate groups.
// A measurement, not a check: it asserts only that the steps run.
func TestGPUTurnStepBench(t *testing.T) {
	be, cfg, fw := bigDenseModel(t, "measure a turn's prompt step on the GPU")
	const bs, history, n, piece = 16, 2000, 330, 500
	m, err := NewBatched(be, cfg, fw, BatchOptions{MaxRows: DefaultBatch + 16, MaxSeqs: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	perSeq := (history + n + bs - 1) / bs
	const k, kn = 4, 120 // the merged turns: k pieces of kn tokens
	kb := (kn + bs - 1) / bs
	pool, err := be.NewKVPool(cfg.Layers, 2*perSeq+2*k*kb, bs, cfg.KVDim())
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
	// median: the median wall time of 8 steps (after 2 unmeasured), and
	// of the time they took to queue their ops (Model.StepQueued).
	median := func(step func(), m *Model) (time.Duration, time.Duration) {
		var times, queued []time.Duration
		for i := range 10 {
			start := time.Now()
			step()
			if i >= 2 {
				times = append(times, time.Since(start))
				queued = append(queued, m.StepQueued())
			}
		}
		slices.Sort(times)
		slices.Sort(queued)
		return times[len(times)/2].Round(time.Microsecond), queued[len(queued)/2].Round(time.Microsecond)
	}
	profile := func(what string, step func()) {
		be.StartProfile()
		step()
		prof, err := be.StopProfile()
		if err != nil {
			t.Fatal(err)
		}
		logProfile(t, what, prof)
	}
	for _, n := range []int{9, 60, 150, n} { // (9: a short chat turn, the serving bench's 10-token prompt)
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
			took, queued := median(step, m)
			t.Logf("GPU-TURN %d tokens at position %d (%s): step %v, its ops queued in %v (medians of 8)", n, c.pos0, c.what, took, queued)
			profile(fmt.Sprintf("turn step of %d tokens %s", n, c.what), step)
		}
	}
	mm, err := NewBatched(be, cfg, fw, BatchOptions{MaxRows: DefaultBatch + 16, MaxSeqs: 16, MergePrompts: true})
	if err != nil {
		t.Fatal(err)
	}
	defer mm.Close()
	var deep, fresh []SeqRows
	for j := range k {
		own := func(first int) []int32 {
			var b []int32
			for i := range kb {
				b = append(b, int32(first+i))
			}
			return b
		}
		toks := tokens(kn)
		// (2000 is a whole number of blocks: the turns share the history's)
		deep = append(deep, SeqRows{Tokens: toks, Pos0: history, Table: append(append([]int32(nil), tables[0][:history/bs]...), own(2*perSeq+j*kb)...), Logits: true})
		fresh = append(fresh, SeqRows{Tokens: toks, Table: own(2*perSeq + (k+j)*kb), Logits: true})
	}
	for _, c := range []struct {
		what string
		m    *Model
		rows []SeqRows
	}{{"at position 0, merged", mm, fresh}, {"after the history, merged", mm, deep}, {"after the history, separate groups", m, deep}} {
		step := func() {
			if _, err := c.m.StepBatch(ctx, pool, c.rows); err != nil {
				t.Fatal(err)
			}
		}
		took, queued := median(step, c.m)
		t.Logf("GPU-TURNS %d × %d tokens %s: step %v, its ops queued in %v (medians of 8)", k, kn, c.what, took, queued)
		profile(fmt.Sprintf("%d turns of %d tokens %s", k, kn, c.what), step)
	}
}
