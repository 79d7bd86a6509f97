package model

import (
	"fmt"
	"math"
	"testing"

	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/cpu"
)

// recorder is a CPU backend that "records" a batched step by keeping its
// function and "replays" it by calling it again after setting the layout:
// the model's side of recorded batched steps (which shapes it records,
// when it records again, what it frees) on a machine without a GPU.
type recorder struct {
	*cpu.Backend
	live     map[*recorded]bool
	stale    bool // the next replay reports ErrStaleStep
	failNext bool // the next capture fails
}

type recorded struct {
	rows, key int
	step      func() error
}

var _ kernels.BatchStepCapturer = (*recorder)(nil)

func (r *recorder) BatchStepKey(l *kernels.Layout) int {
	maxPos := int32(0)
	for _, p := range l.Pos {
		maxPos = max(maxPos, p)
	}
	k := 1
	for k*256 < int(maxPos)+1 {
		k *= 2
	}
	return k
}

func (r *recorder) CaptureBatchStep(ids []int32, l *kernels.Layout, step func() error) (kernels.StepGraph, error) {
	if r.failNext {
		r.failNext = false
		return nil, fmt.Errorf("recorder: capture refused")
	}
	if err := r.SetLayout(l); err != nil {
		return nil, err
	}
	if err := step(); err != nil {
		return nil, err
	}
	g := &recorded{rows: len(ids), key: r.BatchStepKey(l), step: step}
	r.live[g] = true
	return g, nil
}

func (r *recorder) RunBatchStep(g kernels.StepGraph, p *kernels.KVPool, ids []int32, l *kernels.Layout) error {
	rg := g.(*recorded)
	switch {
	case !r.live[rg]:
		return fmt.Errorf("recorder: replay of a freed step")
	case rg.rows != len(ids) || rg.key != r.BatchStepKey(l):
		return fmt.Errorf("recorder: a step of %d rows, key %d replayed for %d rows, key %d", rg.rows, rg.key, len(ids), r.BatchStepKey(l))
	case r.stale:
		r.stale = false
		return fmt.Errorf("recorder: %w", kernels.ErrStaleStep)
	}
	if err := r.SetLayout(l); err != nil {
		return err
	}
	return rg.step()
}

func (r *recorder) FreeStep(g kernels.StepGraph) {
	rg := g.(*recorded)
	if !r.live[rg] {
		panic("recorder: step freed twice")
	}
	delete(r.live, rg)
}

// TestBatchGraphSteps runs graphSchedule through a batched model on a
// backend that records steps (recorder) and one that does not, and
// requires the same logits bit for bit at every step; the shapes recorded
// are the decode groups' (rows, key); a stale step is recorded again; a
// failed capture leaves the model running op by op, with the same
// numbers; Close frees every recorded step.
func TestBatchGraphSteps(t *testing.T) {
	_, cfg, w := openWeights(t, testmodels.Path(t, "stories260K-Q4_K_M.gguf"))
	const bs = 16
	s := newGraphSchedule(bs)
	be := cpu.New(2)
	t.Cleanup(be.Close)
	run := func(b kernels.Backend, setup func(m *Model, step int)) ([]graphStep, *Model) {
		bm, err := NewBatched(b, cfg, w, BatchOptions{MaxRows: 512, MaxSeqs: kernels.MaxBatchRows})
		if err != nil {
			t.Fatal(err)
		}
		pool, err := be.NewKVPool(cfg.Layers, s.blocks, bs, cfg.KVDim())
		if err != nil {
			t.Fatal(err)
		}
		defer be.FreeKVPool(pool)
		steps, _ := runGraphSchedule(t, bm, pool, s, cfg.Vocab, nil, func(step int) { setup(bm, step) })
		return steps, bm
	}
	plain, pm := run(be, func(*Model, int) {})
	pm.Close()

	rec := &recorder{Backend: be, live: map[*recorded]bool{}}
	got, rm := run(rec, func(m *Model, step int) {
		if step == 22 {
			rec.stale = true // the 64-row step of key 2, recorded at step 17
		}
	})
	sameSteps(t, "recorded", plain, got)
	want := map[batchKey]bool{{1, 1}: true, {2, 1}: true, {3, 1}: true, {16, 1}: true, {64, 1}: true, {64, 2}: true, {20, 2}: true, {3, 2}: true, {1, 2}: true}
	for k := range rm.bat.graph.g {
		if !want[k] {
			t.Errorf("recorded a step of %d rows, key %d, which the schedule has no decode group of", k.rows, k.key)
		}
		delete(want, k)
	}
	for k := range want {
		t.Errorf("no step of %d rows, key %d recorded", k.rows, k.key)
	}
	if rm.bat.graph.recorded != len(rm.bat.graph.g)+1 {
		t.Errorf("%d recordings of %d shapes, want one more (the stale one)", rm.bat.graph.recorded, len(rm.bat.graph.g))
	}
	rm.Close()
	if len(rec.live) != 0 {
		t.Errorf("%d recorded steps live after Close", len(rec.live))
	}

	// A capture that fails (at the 16-row step) turns recording off, the
	// steps before and after giving the same numbers.
	rec = &recorder{Backend: be, live: map[*recorded]bool{}}
	got, rm = run(rec, func(m *Model, step int) { rec.failNext = step == 13 })
	sameSteps(t, "after a failed capture", plain, got)
	if !rm.bat.graph.off || len(rm.bat.graph.g) != 0 || len(rec.live) != 0 {
		t.Errorf("after a failed capture: off %v, %d steps kept, %d live", rm.bat.graph.off, len(rm.bat.graph.g), len(rec.live))
	}
	rm.Close()

	// NoGraph records nothing.
	nm, err := NewBatched(rec, cfg, w, BatchOptions{NoGraph: true})
	if err != nil {
		t.Fatal(err)
	}
	if nm.bat.graph.sc != nil {
		t.Error("NoGraph: the model records batched steps")
	}
	nm.Close()
}

// sameSteps requires every step's picks and logits of got to equal want's
// bit for bit.
func sameSteps(t *testing.T, what string, want, got []graphStep) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d steps, want %d", what, len(got), len(want))
	}
	for step := range want {
		a, b := want[step], got[step]
		for j, i := range a.seqs {
			if a.picks[j] != b.picks[j] {
				t.Errorf("%s: step %d (%d rows), sequence %d: picked %d, want %d", what, step, a.rows, i, b.picks[j], a.picks[j])
			}
			if a.logits[j] == nil {
				continue
			}
			for v := range a.logits[j] {
				if math.Float32bits(a.logits[j][v]) != math.Float32bits(b.logits[j][v]) {
					t.Errorf("%s: step %d (%d rows), sequence %d: logit %d is %v, want %v", what, step, a.rows, i, v, b.logits[j][v], a.logits[j][v])
					break
				}
			}
		}
	}
}
