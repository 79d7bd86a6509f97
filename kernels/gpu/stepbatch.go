package gpu

import (
	"fmt"

	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/rocm"
)

// A recorded batched decode step (kernels.BatchStepCapturer): the serving
// engine's step of n single-token rows, recorded once per shape and
// replayed. What changes from step to step lives in the layout buffer
// (batch.go), which the replay's one copy fills before the graph runs:
// the rows' token ids (read by Embed), positions (RoPEAt, PagedAttention)
// and block tables (PagedAttention). What the kernels take as arguments
// is fixed by the shape: the row count n, and attention's grid: fixed for
// attn_paged_fine (pagedFine, a decode group's); for attn_paged its splits of
// pagedSplit positions are rounded up to a power of two (the key). The
// splits past a row's end are empty and add exact zeros in the merge, so
// a row's numbers are those of the same step run op by op.

var _ kernels.BatchStepCapturer = (*Backend)(nil)

// batchGraph is what a recorded batched step was made for: its shape, and
// the buffers it reads that may move (the layout) or differ (the pool).
type batchGraph struct {
	rows, splits       int
	layDev             rocm.DevPtr
	rowCap, seqCap     int
	poolBase           rocm.DevPtr
	poolBlocks, poolBS int
}

// BatchStepKey implements kernels.BatchStepCapturer: the splits of
// attention's grid, a power of two covering the furthest row's positions
// for attn_paged; always 1 for attn_paged_fine (a decode group's, see
// pagedFine), whose grid does not depend on them.
func (b *Backend) BatchStepKey(l *kernels.Layout) int {
	if pagedFine && len(l.Tables) == len(l.Pos) { // see fineLayout
		return 1
	}
	maxPos := int32(0)
	for _, p := range l.Pos {
		maxPos = max(maxPos, p)
	}
	return pow2AtLeast(ceilDiv(int(maxPos)+1, pagedSplit), 1)
}

// CaptureBatchStep implements kernels.BatchStepCapturer: the layout and
// ids are set, step runs once for real in batched-step mode (which grows
// every scratch buffer it needs, so that nothing allocates during the
// capture), then once more into a graph.
func (b *Backend) CaptureBatchStep(ids []int32, l *kernels.Layout, step func() error) (kernels.StepGraph, error) {
	if l == nil || len(l.Pos) == 0 || len(ids) != len(l.Pos) {
		return nil, fmt.Errorf("gpu: capture batched step: %d ids for a layout of %d rows", len(ids), layoutRows(l))
	}
	splits := b.BatchStepKey(l)
	if err := b.setLayout(l, ids); err != nil {
		return nil, fmt.Errorf("gpu: capture batched step: %w", err)
	}
	mode := func(on bool) {
		b.step.batch = on
		if on {
			b.step.splits = splits
			b.step.poolBase, b.step.poolBlocks, b.step.poolBS = 0, 0, 0
		}
	}
	b.mu.Lock()
	if b.step.on || b.step.batch {
		b.mu.Unlock()
		return nil, fmt.Errorf("gpu: capture batched step: a step is already being run or captured")
	}
	mode(true)
	b.mu.Unlock()
	err := step()
	b.mu.Lock()
	b.step.batch = false
	b.mu.Unlock()
	if err != nil {
		return nil, err
	}

	var bg batchGraph
	sg, err := b.captureGraph(func(on bool) {
		if !on { // keep what the step's ops recorded of the pool
			bg.poolBase, bg.poolBlocks, bg.poolBS = b.step.poolBase, b.step.poolBlocks, b.step.poolBS
		}
		mode(on)
	}, step)
	if err != nil {
		return nil, fmt.Errorf("gpu: capture batched step: %w", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	bg.rows, bg.splits = len(l.Pos), splits
	bg.layDev, bg.rowCap, bg.seqCap = b.lay.dev, b.lay.rowCap, b.lay.seqCap
	sg.batch = &bg
	return sg, nil
}

func layoutRows(l *kernels.Layout) int {
	if l == nil {
		return 0
	}
	return len(l.Pos)
}

// RunBatchStep implements kernels.BatchStepCapturer. The rows are checked
// as PagedAttention checks them (the replayed kernels read positions and
// tables unchecked).
func (b *Backend) RunBatchStep(g kernels.StepGraph, p *kernels.KVPool, ids []int32, l *kernels.Layout) error {
	sg, ok := g.(*stepGraph)
	if !ok || sg == nil || sg.batch == nil {
		return fmt.Errorf("gpu: run batched step: not a batched step graph of this backend")
	}
	bg := sg.batch
	switch {
	case l == nil || len(l.Pos) != bg.rows:
		return fmt.Errorf("gpu: run batched step: a layout of %d rows for a step recorded for %d", layoutRows(l), bg.rows)
	case len(ids) != bg.rows:
		return fmt.Errorf("gpu: run batched step: %d ids for %d rows", len(ids), bg.rows)
	case b.BatchStepKey(l) != bg.splits:
		return fmt.Errorf("gpu: run batched step: the layout needs attention in %d splits, the step was recorded for %d", b.BatchStepKey(l), bg.splits)
	}
	if p == nil {
		return fmt.Errorf("gpu: run batched step: nil kv pool")
	}
	if kp, ok := p.Impl.(*kvPool); !ok || kp.base != bg.poolBase || p.Blocks != bg.poolBlocks || p.BlockSize != bg.poolBS {
		return fmt.Errorf("gpu: run batched step: not the kv pool the step was recorded with")
	}
	if len(l.Seq) != bg.rows {
		return fmt.Errorf("gpu: run batched step: %d positions for %d sequence ids", bg.rows, len(l.Seq))
	}
	for i, pos := range l.Pos {
		s := l.Seq[i]
		if s < 0 || int(s) >= len(l.Tables) {
			return fmt.Errorf("gpu: run batched step: row %d of sequence %d, but %d tables", i, s, len(l.Tables))
		}
		if pos < 0 || int(pos)/bg.poolBS >= len(l.Tables[s]) {
			return fmt.Errorf("gpu: run batched step: row %d at position %d of sequence %d, whose table holds %d blocks of %d",
				i, pos, s, len(l.Tables[s]), bg.poolBS)
		}
	}
	for s, tab := range l.Tables {
		for _, blk := range tab {
			if blk < 0 || int(blk) >= bg.poolBlocks {
				return fmt.Errorf("gpu: run batched step: sequence %d lists block %d of a pool of %d", s, blk, bg.poolBlocks)
			}
		}
	}
	b.mu.Lock()
	freed := !b.graphs[sg]
	b.mu.Unlock()
	if freed {
		return fmt.Errorf("gpu: run batched step: graph was freed")
	}
	if err := b.setLayout(l, ids); err != nil {
		return fmt.Errorf("gpu: run batched step: %w", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.lay.dev != bg.layDev || b.lay.rowCap != bg.rowCap || b.lay.seqCap != bg.seqCap {
		return fmt.Errorf("gpu: run batched step: the layout buffer has moved since the capture: %w", kernels.ErrStaleStep)
	}
	for key, p := range sg.scratch {
		if d, ok := b.scratch[key]; !ok || d.ptr != p {
			return fmt.Errorf("gpu: run batched step: scratch %q has moved since the capture: %w", key, kernels.ErrStaleStep)
		}
	}
	return b.do(func(c *rocm.Ctx) error {
		if b.prof != nil {
			return b.prof.timed(c, "batched step graph", b.stream, func() error { return c.LaunchGraph(sg.g, b.stream) })
		}
		return c.LaunchGraph(sg.g, b.stream)
	})
}
