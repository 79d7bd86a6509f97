package model

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/forge-llm/forge/kernels"
)

// Recorded batched decode steps: the serving engine's common step is one
// decode group (every row one token of its own sequence). Run op by op,
// such a step costs a launch per op per layer, over a millisecond of host
// work on a GPU; where the backend can record it (kernels.
// BatchStepCapturer), it is recorded once per row count (and attention
// shape, the backend's key) on first use and replayed after: the token
// ids, positions and block tables go to the device before each replay,
// in one copy, and the recorded kernels read them there.

// maxBatchGraphs bounds the recorded steps a model keeps: a row count of
// 1…kernels.MaxBatchRows times a few attention shapes. Past it every graph
// is freed and the ones in use are recorded again.
const maxBatchGraphs = 4 * kernels.MaxBatchRows

// batchGraphs are a batched model's recorded decode steps.
type batchGraphs struct {
	sc  kernels.BatchStepCapturer // nil: none (CPU, NoGraph)
	off bool                      // a capture failed: op by op from then on
	// pool is the KV pool the graphs read: a step on another pool frees
	// them.
	pool *kernels.KVPool
	g    map[batchKey]kernels.StepGraph
	// recorded counts the steps recorded (again, where one went stale).
	recorded int
}

// batchKey is the shape a graph was recorded for.
type batchKey struct{ rows, key int }

// free releases every recorded step.
func (gs *batchGraphs) free() {
	for k, g := range gs.g {
		gs.sc.FreeStep(g)
		delete(gs.g, k)
	}
}

// graphable reports whether the planned step is one decode group that a
// recorded step can run: the backend records, no capture failed, and
// every layer's weights are known (an earlier step fetched them; the
// replay does not ask Weights again).
func (m *Model) graphable() bool {
	st := m.bat
	if st.graph.sc == nil || st.graph.off || len(st.groups) != 1 || st.groups[0].prompt {
		return false
	}
	for _, lw := range m.lws {
		if lw == nil {
			return false
		}
	}
	return true
}

// decodeGraph runs the planned step (one decode group) through its
// recorded graph, recording it first where there is none (or it is
// stale). It reports false, having run nothing that matters, where the
// capture failed: the caller then runs the step op by op, and so do the
// later steps.
func (m *Model) decodeGraph(ctx context.Context) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("model: %w", err)
	}
	st := m.bat
	gs := &st.graph
	g := &st.groups[0]
	ids := st.toks[:g.n]
	if gs.pool != st.pool {
		gs.free()
		gs.pool = st.pool
	}
	k := batchKey{g.n, gs.sc.BatchStepKey(&g.lay)}
	if sg := gs.g[k]; sg != nil {
		err := gs.sc.RunBatchStep(sg, st.pool, ids, &g.lay)
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, kernels.ErrStaleStep) {
			return false, fmt.Errorf("model: batched decode step of %d rows: %w", g.n, err)
		}
		gs.sc.FreeStep(sg) // recorded again below
		delete(gs.g, k)
	}
	if len(gs.g) >= maxBatchGraphs {
		gs.free()
	}
	sg, err := gs.sc.CaptureBatchStep(ids, &g.lay, func() error { return m.decodeOps(g) })
	if err != nil {
		slog.Warn("model: the batched decode step could not be recorded; running it op by op", "backend", m.be.Name(), "rows", g.n, "err", err)
		gs.off = true
		gs.free()
		return false, nil
	}
	if gs.g == nil {
		gs.g = map[batchKey]kernels.StepGraph{}
	}
	gs.g[k] = sg
	gs.recorded++
	return true, nil
}

// decodeOps queues the ops of a step that is one decode group g (rows
// 0…g.n-1, every one going on to the head), its layout already set, with
// the layers' weights of the last step: the ops StepBatch queues for such
// a step, in the same order.
func (m *Model) decodeOps(g *group) error {
	st, c := m.bat, m.Cfg
	m.s = st.full
	if err := m.embed(m.s.x.View(0, g.n*c.Embd), st.toks[:g.n]); err != nil {
		return err
	}
	m.pending, m.inPrompt = false, false
	for l := range c.Layers {
		m.err = nil
		if err := m.layer(m, m.lws[l], l, 0, g.n, g.n); err != nil {
			return fmt.Errorf("model: layer %d: %w", l, err)
		}
	}
	a := m.s.rows(0, g.n, c)
	m.err = nil
	xq := m.preNorm(a, m.g.OutputNorm, g.n)
	m.head(st.full.logits.View(0, g.n*c.Vocab), a.xb, xq, g.n)
	m.pending = false
	if m.err != nil {
		return fmt.Errorf("model: output head: %w", m.err)
	}
	return nil
}
