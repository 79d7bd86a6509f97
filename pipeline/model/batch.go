package model

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/forge-llm/forge/kernels"
)

// Batched forward steps: one step over the rows of several sequences whose
// keys and values live in a shared paged pool (kernels.Batcher), for the
// serving engine's continuous batching (pipeline/batch schedules them).
//
// Batch invariance: a sequence's numbers must not depend on who else is in
// the step. The step is cut into groups, each run through the same block
// functions as the single-sequence path (llamaLayer, qwen2Layer): every
// single-token row (a decode step, or a one-token prompt piece) joins a
// decode group of at most kernels.MaxBatchRows rows, whose MatMuls give
// each row what it gets alone (the Batcher promise); every longer piece is
// a group of its own, so its MatMuls see exactly the rows they would see
// alone. The other ops are row-wise, and attention reads only the row's
// own sequence. A piece of a prompt computes what Forward computes for the
// same tokens at the same positions: the same ops on the same row counts.

// SeqRows is one sequence's part of a batched step: Tokens at positions
// Pos0, Pos0+1, …; the positions before Pos0 are already in the pool.
type SeqRows struct {
	Tokens []int32
	Pos0   int
	// Table is the sequence's block table: it covers every position up to
	// Pos0+len(Tokens)-1.
	Table []int32
	// Logits asks for the logits of the last token.
	Logits bool
	// Greedy (with Logits) asks only for the most likely next token: on a
	// backend that reduces on the device (kernels.Argmaxer) the row of
	// logits is not copied back, and StepBatch's row for it is nil; the
	// token is in Greedy's result (see Model.Picks).
	Greedy bool
}

// BatchOptions size a batched model's buffers.
type BatchOptions struct {
	// MaxRows is the most rows (tokens) one step evaluates; 0: DefaultBatch
	// plus kernels.MaxBatchRows.
	MaxRows int
	// MaxSeqs is the most sequences one step holds; 0: kernels.MaxBatchRows.
	MaxSeqs int
	// MergePrompts runs the prompt pieces of several sequences as one
	// group, so each weight is read once for all of them rather than once
	// per piece: 16 short prompts arriving together cost one pass, not 16,
	// and so do the next turns of several long conversations (a backend's
	// attention reads each piece's prefix once for the piece's rows, as
	// for a piece alone: the GPU's pieces kernel, prefill.cu).
	// A row's numbers may then depend on the other pieces of its step (a
	// GPU's prompt product changes with the row count), so a
	// deterministic server leaves it off.
	MergePrompts bool
	// NoGraph runs every batched decode step op by op even where the
	// backend can record it once per row count and replay it
	// (kernels.BatchStepCapturer); for comparisons (pipeline.Options.NoGraph,
	// forge run/serve --no-graph).
	NoGraph bool
}

// batchState is what a batched model keeps between steps.
type batchState struct {
	be               kernels.Batcher
	pool             *kernels.KVPool
	maxRows, maxSeqs int
	full             scratch // buffers for maxRows rows; m.s views one group of it
	groups           []group
	toks             []int32
	outRow           []int   // per sequence of the step: its logits row, or -1
	picks            []int32 // per sequence: the argmax of its logits row (Greedy), or -1
	merge            bool    // BatchOptions.MergePrompts
	graph            batchGraphs
	// queued is how long the last StepBatch took to queue its ops, from
	// its call to the logits' read-back (StepQueued).
	queued time.Duration
}

// group is a run of rows that go through the blocks together.
type group struct {
	first, n int
	nOut     int // rows at the end of the group that go on past the last block
	out0     int // logits row of the group's first output row
	pending  bool
	prompt   bool // a piece of a prompt (not the decode group)
	lay      kernels.Layout
}

// NewBatched makes a model that evaluates batched steps (StepBatch) on be,
// which must implement kernels.Batcher. It holds no KV cache of its own:
// the pool passed to each step does.
func NewBatched(be kernels.Backend, cfg Config, w Weights, o BatchOptions) (*Model, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	bt, ok := kernels.As[kernels.Batcher](be)
	if !ok {
		return nil, fmt.Errorf("model: backend %s cannot run batched steps (no kernels.Batcher)", be.Name())
	}
	m, err := newModel(be, cfg, w)
	if err != nil {
		return nil, err
	}
	// A sequence's length is the scheduler's business: LongRoPE's factors
	// are chosen for the model's default context.
	m.longRope(min(max(cfg.Ctx, 1), DefaultMaxCtx))
	st := &batchState{be: bt, maxRows: o.MaxRows, maxSeqs: o.MaxSeqs, merge: o.MergePrompts}
	if st.maxRows <= 0 {
		st.maxRows = DefaultBatch + kernels.MaxBatchRows
	}
	if st.maxSeqs <= 0 {
		st.maxSeqs = kernels.MaxBatchRows
	}
	m.bat = st
	m.batch = st.maxRows
	m.ctx = 0 // no context of its own: the scheduler bounds each sequence
	m.lws = make([]*LayerWeights, cfg.Layers)
	m.argmax, _ = kernels.As[kernels.Argmaxer](be)
	m.resNorm, _ = kernels.As[kernels.ResidualNormer](be)
	m.pairNorm, _ = kernels.As[kernels.NormPairer](be)
	m.multi, _ = kernels.As[kernels.SharedInputMatMuler](be)
	m.promptMM, _ = kernels.As[kernels.PromptMatMuler](be)
	m.promptMulti, _ = kernels.As[kernels.SharedInputPromptMatMuler](be)
	m.q8, _ = kernels.As[kernels.Q8Ops](be)
	// (A mixture-of-experts step reads its router logits back mid-step,
	// which a recording cannot hold: such a model runs its steps op by op.)
	if sc, ok := kernels.As[kernels.BatchStepCapturer](be); ok && !o.NoGraph && cfg.Experts == 0 {
		st.graph.sc = sc
	}
	if err := m.allocScratch(); err != nil {
		return nil, err
	}
	st.full = m.s
	return m, nil
}

// MaxRows is the most rows one batched step evaluates.
func (m *Model) MaxRows() int { return m.bat.maxRows }

// MaxSeqs is the most sequences one batched step holds.
func (m *Model) MaxSeqs() int { return m.bat.maxSeqs }

// from views the buffers of s from row first on (qk1 shared).
func (s *scratch) from(first int, c Config) scratch {
	r := func(t kernels.Tensor, w int) kernels.Tensor { return t.View(first*w, t.Len-first*w) }
	return scratch{
		all: s.all, x: r(s.x, c.Embd), xb: r(s.xb, c.Embd), xb2: r(s.xb2, c.Embd),
		q: r(s.q, c.QDim()), k: r(s.k, c.KVDim()), v: r(s.v, c.KVDim()), att: r(s.att, c.QDim()),
		gate: r(s.gate, c.FF), up: r(s.up, c.FF), hb: r(s.hb, c.FF),
		logits: s.logits, qk1: s.qk1, moe: s.moe,
		xbQ: q8From(s.xbQ, first), attQ: q8From(s.attQ, first), hbQ: q8From(s.hbQ, first),
	}
}

// q8From views the rows of q from row first on (none past its rows).
func q8From(q kernels.Q8, first int) kernels.Q8 {
	if first >= q.Rows {
		return kernels.Q8{}
	}
	return q.View(first, q.Rows-first)
}

// StepBatch evaluates one step over the rows of several sequences with
// their keys and values in pool, and returns the logits of every sequence
// that asked for them ([k][Vocab], in the order of seqs). The returned
// slice belongs to the model and is overwritten by the next step.
func (m *Model) StepBatch(ctx context.Context, pool *kernels.KVPool, seqs []SeqRows) ([][]float32, error) {
	st := m.bat
	if st == nil {
		return nil, fmt.Errorf("model: StepBatch on a model not made by NewBatched")
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	t0 := time.Now()
	if err := m.planGroups(pool, seqs); err != nil {
		return nil, err
	}
	st.pool = pool
	defer func() { st.pool = nil; m.s = st.full }()
	defer m.during(ctx)()
	c := m.Cfg
	if m.graphable() {
		ok, err := m.decodeGraph(ctx)
		if err != nil {
			return nil, err
		}
		if ok {
			return m.stepOutputs(seqs, st.groups[0].n, t0)
		}
	}
	for gi := range st.groups {
		g := &st.groups[gi]
		m.s = st.full.from(g.first, c)
		if err := m.embed(m.s.x.View(0, g.n*c.Embd), st.toks[g.first:g.first+g.n]); err != nil {
			return nil, err
		}
		g.pending = false
	}
	// One group (the common case: every row a decode row) keeps its layout
	// for the whole step: set it once, not once per layer (on a GPU each
	// SetLayout is a copy to the device).
	one := len(st.groups) == 1
	if one {
		if err := st.be.SetLayout(&st.groups[0].lay); err != nil {
			return nil, fmt.Errorf("model: layout: %w", err)
		}
	}
	for l := range c.Layers {
		lw, err := m.w.Layer(ctx, l)
		if err != nil {
			return nil, fmt.Errorf("model: waiting for layer %d: %w", l, err)
		}
		m.lws[l] = lw
		for gi := range st.groups {
			g := &st.groups[gi]
			keep := g.n
			if l == c.Layers-1 {
				keep = g.nOut
			}
			if !one {
				if err := st.be.SetLayout(&g.lay); err != nil {
					return nil, fmt.Errorf("model: layer %d: layout: %w", l, err)
				}
			}
			m.s = st.full.from(g.first, c)
			m.pending, m.err, m.inPrompt = g.pending, nil, g.prompt
			if err := m.layer(m, lw, l, 0, g.n, keep); err != nil {
				return nil, fmt.Errorf("model: layer %d: %w", l, err)
			}
			g.pending = m.pending
		}
	}
	outRows := 0
	for gi := range st.groups {
		g := &st.groups[gi]
		if g.nOut == 0 {
			continue
		}
		m.s = st.full.from(g.first, c)
		a := m.s.rows(g.n-g.nOut, g.nOut, c)
		m.pending, m.err, m.inPrompt = g.pending, nil, g.prompt
		xq := m.preNorm(a, m.g.OutputNorm, g.nOut)
		m.head(st.full.logits.View(g.out0*c.Vocab, g.nOut*c.Vocab), a.xb, xq, g.nOut)
		if m.err != nil {
			return nil, fmt.Errorf("model: output head: %w", m.err)
		}
		outRows = max(outRows, g.out0+g.nOut)
	}
	m.pending, m.inPrompt = false, false
	return m.stepOutputs(seqs, outRows, t0)
}

// StepQueued is how long the last StepBatch took to queue its ops (the
// rest of its time is the wait for the device and the logits' read-back):
// on a GPU, a step whose queueing takes most of its time is bound by the
// host's launches, not by the kernels.
func (m *Model) StepQueued() time.Duration { return m.bat.queued }

// stepOutputs reduces or copies back the outRows rows of logits a step
// left on the backend and returns StepBatch's result; the step's ops,
// begun at t0, are all queued (StepQueued).
func (m *Model) stepOutputs(seqs []SeqRows, outRows int, t0 time.Time) ([][]float32, error) {
	st, c := m.bat, m.Cfg
	st.queued = time.Since(t0)
	// Greedy rows reduce on the device where the backend can; the rows are
	// copied back only if some sequence samples (or there is no Argmaxer).
	read, greedy := m.argmax == nil, false
	for _, s := range seqs {
		if s.Logits {
			greedy = greedy || s.Greedy
			read = read || !s.Greedy
		}
	}
	st.picks = st.picks[:0]
	for range seqs {
		st.picks = append(st.picks, -1)
	}
	host := m.logits[:outRows*c.Vocab]
	if outRows > 0 && greedy && m.argmax != nil {
		ids, err := m.argmax.Argmax(st.full.logits.View(0, outRows*c.Vocab), outRows, c.Vocab)
		if err != nil {
			return nil, fmt.Errorf("model: argmax of the logits: %w", err)
		}
		for i, s := range seqs {
			if s.Logits && s.Greedy {
				st.picks[i] = ids[st.outRow[i]]
			}
		}
	}
	if outRows > 0 && read {
		if err := m.be.Read(host, st.full.logits, 0); err != nil {
			return nil, fmt.Errorf("model: reading logits: %w", err)
		}
	}
	var out [][]float32
	for i, s := range seqs {
		if !s.Logits {
			continue
		}
		r := st.outRow[i]
		if s.Greedy && m.argmax != nil {
			out = append(out, nil)
			continue
		}
		row := host[r*c.Vocab : (r+1)*c.Vocab]
		if s.Greedy {
			st.picks[i] = hostArgmax(row)
		}
		out = append(out, row)
	}
	return out, nil
}

// Picks returns, for each sequence of the last StepBatch, the most likely
// next token of those that asked with Greedy (ties: the lowest id), -1 for
// the others. The slice belongs to the model.
func (m *Model) Picks() []int32 { return m.bat.picks }

// planGroups checks the step and cuts it into groups: single-token rows
// together, up to kernels.MaxBatchRows a group, every longer piece alone.
func (m *Model) planGroups(pool *kernels.KVPool, seqs []SeqRows) error {
	st := m.bat
	if pool == nil {
		return fmt.Errorf("model: batched step without a kv pool")
	}
	if pool.Layers != m.Cfg.Layers || pool.KVDim != m.Cfg.KVDim() {
		return fmt.Errorf("model: kv pool of %d layers × %d values, the model needs %d × %d", pool.Layers, pool.KVDim, m.Cfg.Layers, m.Cfg.KVDim())
	}
	if len(seqs) == 0 {
		return fmt.Errorf("model: batched step of no sequences")
	}
	if len(seqs) > st.maxSeqs {
		return fmt.Errorf("model: %d sequences in a step, at most %d", len(seqs), st.maxSeqs)
	}
	rows := 0
	for i, s := range seqs {
		n := len(s.Tokens)
		if n == 0 {
			return fmt.Errorf("model: sequence %d of the step has no tokens", i)
		}
		if s.Pos0 < 0 {
			return fmt.Errorf("model: sequence %d: negative position %d", i, s.Pos0)
		}
		if need := (s.Pos0 + n + pool.BlockSize - 1) / pool.BlockSize; len(s.Table) < need {
			return fmt.Errorf("model: sequence %d: %d positions need %d blocks, its table has %d", i, s.Pos0+n, need, len(s.Table))
		}
		for _, t := range s.Tokens {
			if t < 0 || int(t) >= m.Cfg.Vocab {
				return fmt.Errorf("model: sequence %d: token %d outside the vocabulary of %d", i, t, m.Cfg.Vocab)
			}
		}
		rows += n
	}
	if rows > st.maxRows {
		return fmt.Errorf("model: %d rows in a step, at most %d", rows, st.maxRows)
	}
	// Rows: the single-token sequences first (in groups of up to
	// MaxBatchRows), then each longer piece.
	st.groups = st.groups[:0]
	st.toks = st.toks[:0]
	st.outRow = st.outRow[:0]
	for range seqs {
		st.outRow = append(st.outRow, -1)
	}
	out := 0
	newGroup := func() *group {
		st.groups = append(st.groups, group{first: len(st.toks)})
		return &st.groups[len(st.groups)-1]
	}
	var dg *group
	for i, s := range seqs {
		if len(s.Tokens) != 1 {
			continue
		}
		if dg == nil || dg.n == kernels.MaxBatchRows {
			dg = newGroup()
			dg.out0 = out
		}
		m.addRows(dg, s)
		dg.nOut = dg.n // every row of a decode group goes on to the head
		st.outRow[i] = out
		out++
	}
	// Pieces to merge (MergePrompts): one group whose rows are every
	// piece's rows but its last, then the last rows of the pieces that
	// want logits, in order, so those are the group's final rows (the
	// ones that go on past the last block). Row order inside a group
	// does not matter: every row's key and value are stored before any
	// row attends, and each attends by its own sequence and position.
	var merged []int
	if st.merge {
		for i, s := range seqs {
			if len(s.Tokens) > 1 {
				merged = append(merged, i)
			}
		}
		if len(merged) < 2 {
			merged = nil
		}
	}
	if merged != nil {
		g := newGroup()
		g.prompt = true
		var lasts, lastQ []int32
		for _, i := range merged {
			s := seqs[i]
			q := int32(len(g.lay.Tables))
			g.lay.Tables = append(g.lay.Tables, s.Table)
			if s.Logits {
				m.addRowsFrom(g, s, q, 0, len(s.Tokens)-1)
				lasts, lastQ = append(lasts, int32(i)), append(lastQ, q)
			} else {
				m.addRowsFrom(g, s, q, 0, len(s.Tokens))
			}
		}
		g.out0 = out
		for k, i := range lasts {
			s := seqs[i]
			m.addRowsFrom(g, s, lastQ[k], len(s.Tokens)-1, len(s.Tokens))
			st.outRow[i] = out
			out++
		}
		g.nOut = len(lasts)
	}
	for i, s := range seqs {
		if len(s.Tokens) == 1 || slices.Contains(merged, i) {
			continue
		}
		g := newGroup()
		g.prompt = true
		m.addRows(g, s)
		if s.Logits {
			g.nOut, g.out0 = 1, out
			st.outRow[i] = out
			out++
		}
	}
	return nil
}

// addRows appends a sequence's rows to g, with its table.
func (m *Model) addRows(g *group, s SeqRows) {
	q := int32(len(g.lay.Tables))
	g.lay.Tables = append(g.lay.Tables, s.Table)
	m.addRowsFrom(g, s, q, 0, len(s.Tokens))
}

// addRowsFrom appends rows [from, to) of a sequence's piece to g, reading
// its keys and values through g's table q.
func (m *Model) addRowsFrom(g *group, s SeqRows, q int32, from, to int) {
	st := m.bat
	for j := from; j < to; j++ {
		st.toks = append(st.toks, s.Tokens[j])
		g.lay.Pos = append(g.lay.Pos, int32(s.Pos0+j))
		g.lay.Seq = append(g.lay.Seq, q)
	}
	g.n += to - from
}
