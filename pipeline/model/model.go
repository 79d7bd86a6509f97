package model

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/forge-llm/forge/kernels"
)

// DefaultMaxCtx caps the KV cache when the caller does not ask for a
// context length: a model trained on 128K positions should not reserve a
// 128K-position cache to answer a short prompt.
const DefaultMaxCtx = 4096

// DefaultBatch is the most prompt tokens one forward step evaluates.
const DefaultBatch = 512

// Options size a Model's buffers.
type Options struct {
	Ctx   int // KV cache positions; 0: the model's context, at most DefaultMaxCtx
	Batch int // most tokens per forward step; 0: DefaultBatch (at most Ctx)
	// AllLogits keeps the logits of every token of a step (tests); normally
	// only the last token's row is computed.
	AllLogits bool
	// NoGraph runs every decode step op by op even where the backend can
	// record it once and replay it (kernels.StepCapturer); for comparisons
	// (pipeline.Options.NoGraph, forge run --no-graph).
	NoGraph bool
}

// scratch is the activation memory of one forward step, carved out of one
// backend allocation. B is the batch size.
type scratch struct {
	all    kernels.Tensor // the single allocation the others view
	x      kernels.Tensor // [B][Embd]  residual stream
	xb     kernels.Tensor // [B][Embd]  normalised input of a sub-layer
	xb2    kernels.Tensor // [B][Embd]  output of a sub-layer, before the residual add
	q      kernels.Tensor // [B][QDim]
	k      kernels.Tensor // [B][KVDim]
	v      kernels.Tensor // [B][KVDim]
	att    kernels.Tensor // [B][QDim]  attention output
	gate   kernels.Tensor // [B][FF]
	up     kernels.Tensor // [B][FF]
	hb     kernels.Tensor // [B][FF]    silu(gate)·up
	logits kernels.Tensor // [B][Vocab] with AllLogits, else [Vocab]
	// qk1 is the one-token step's query and key, [QDim + KVDim] in one
	// piece, so that one RoPE launch rotates both.
	qk1 kernels.Tensor
	// moe are a mixture of experts' buffers (empty for a dense model).
	moe moeScratch
	// xbQ, attQ and hbQ are the 8-bit copies of the first rows of xb, att
	// and hb (kernels.Q8, up to kernels.MaxBatchRows rows), in q8buf, on a
	// backend with kernels.Q8Ops and for widths of whole blocks of 32;
	// empty otherwise.
	xbQ, attQ, hbQ kernels.Q8
	// q8buf holds those copies, and a mixture's decode hb's (moe.hbQ).
	q8buf [4]kernels.Tensor
}

// layerFunc runs one transformer block on n tokens at positions pos0…,
// then keeps only the last nOut rows of the residual stream (the rest are
// not needed after the last block).
type layerFunc func(m *Model, lw *LayerWeights, layer, pos0, n, nOut int) error

// Model runs one architecture's forward pass on a backend, for one
// sequence: it owns that sequence's KV cache. It is not safe for concurrent
// use.
type Model struct {
	Cfg   Config
	be    kernels.Backend
	w     Weights
	g     *GlobalWeights
	layer layerFunc
	ropes []kernels.Rope // per layer
	attns []kernels.Attn // per layer

	kv        *kernels.KVCache
	ctx       int
	batch     int
	allLogits bool
	s         scratch
	logits    []float32 // host copy: [B][Vocab] with AllLogits, else [Vocab]
	err       error     // first failed op of the current layer (see ops.go)

	// lws are the layers' weights as the last step got them; a recorded
	// decode step uses them without asking Weights again (which on a GPU
	// queues a wait on each layer's copy event: the replays come after
	// those waits on the same stream, so they see the weights).
	lws []*LayerWeights
	// The decode step recorded once and replayed per token, where the
	// backend can (graphs != nil); graphOff after a failed capture.
	graphs   kernels.StepCapturer
	graph    kernels.StepGraph
	graphOff bool
	tok1     [1]int32 // the token of a recorded step, so a step allocates nothing
	argmax   kernels.Argmaxer
	// resNorm fuses a residual add with the norm after it, where the
	// backend can; pending says that x still lacks the last sub-block's
	// output (xb2), which the next norm adds (see preNorm).
	resNorm kernels.ResidualNormer
	// pairNorm normalises the queries' and the keys' heads in one op
	// (rmsnormPair), where the backend can.
	pairNorm kernels.NormPairer
	// prep makes one token's queries, keys and values ready for attention
	// in one op (selfAttention), where the backend can.
	prep    kernels.QKVPreparer
	attend  kernels.QKVAttender
	pending bool
	// mix, where its norm is set, is a mixture's weighted sum that a
	// device-routed decode step left to the next preNorm, which fuses it
	// with the residual add and the norm (kernels.MixNormer): xb2 is not
	// written until then (settleMix writes it for other readers).
	mix       deferredMix
	mixNormed int // how many (tests)
	// multi multiplies one input by several weights at once, where the
	// backend can; mmDst and mmW hold the arguments (no allocation).
	multi kernels.SharedInputMatMuler
	mmDst [3]kernels.Tensor
	mmW   [3]*kernels.Weight
	// q8 makes and reads the 8-bit copies of activations, where the
	// backend can (see preNorm, matmul): nil on the CPU.
	q8 kernels.Q8Ops
	// promptMulti multiplies a prompt piece by several weights on one
	// input (with promptMM); mm1Dst and mm1W hold one weight's arguments.
	promptMulti kernels.SharedInputPromptMatMuler
	mm1Dst      [1]kernels.Tensor
	mm1W        [1]*kernels.Weight
	// bat is set on a model made by NewBatched: rope and attention read
	// the step's layout and the paged pool (batch.go).
	bat *batchState
	// promptMM multiplies the prompt pieces of a batched step where the
	// backend has a faster product for them; inPrompt says the group being
	// run is such a piece.
	promptMM kernels.PromptMatMuler
	inPrompt bool
	// moe is the host side of the mixture-of-experts op (moe.go): the
	// router's logits read back and each step's routing, sized once.
	moe *moeState
	// wctx is the context of the step being run, for the waits inside a
	// layer (an expert's weights: Model.expert); nil between steps.
	wctx context.Context
	// lo is the first layer of this model's KV cache (a segment of a model
	// split over devices holds layers lo… only); split, on the first
	// segment, runs the others (split.go).
	lo    int
	split *splitState
}

// newModel is what New and NewBatched share: the architecture's block
// function and the global weights.
func newModel(be kernels.Backend, cfg Config, w Weights) (*Model, error) {
	return newPart(be, cfg, w, true)
}

// newPart is newModel for one device of a split model: only the part
// that embeds tokens and runs the output head (head) needs those weights.
func newPart(be kernels.Backend, cfg Config, w Weights, head bool) (*Model, error) {
	m := &Model{Cfg: cfg, be: be, w: w, g: w.Globals()}
	a, err := Lookup(cfg.Arch)
	if err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	m.layer = a.Layer
	if a.Requires != nil {
		if err := a.Requires(be); err != nil {
			return nil, fmt.Errorf("model: %s on backend %s: %w", a.Name, be.Name(), err)
		}
	}
	if head && (m.g.Embed == nil || m.g.OutputNorm == nil || m.g.Output == nil) {
		return nil, fmt.Errorf("model: embedding, output norm or output weights missing")
	}
	// Each layer's attention and RoPE (they differ between the local and
	// global layers of Gemma), made once: a step allocates nothing.
	m.attns = make([]kernels.Attn, cfg.Layers)
	m.ropes = make([]kernels.Rope, cfg.Layers)
	for l := range cfg.Layers {
		m.attns[l] = cfg.LayerAttn(l)
		m.ropes[l] = cfg.LayerRope(l)
		m.ropes[l].Freqs = m.g.RopeFreqs
	}
	if f := yarnFreqs(cfg); f != nil {
		for l := range m.ropes {
			m.ropes[l].Freqs = f
		}
	}
	return m, nil
}

// New allocates a model's KV cache and scratch on be.
func New(be kernels.Backend, cfg Config, w Weights, o Options) (*Model, error) {
	return newSpan(be, cfg, w, o, 0, cfg.Layers, true)
}

// newSpan is New for a model whose KV cache holds layers [lo, hi) only (a
// part of a split model; head: the part with the embedding and output
// head).
func newSpan(be kernels.Backend, cfg Config, w Weights, o Options, lo, hi int, head bool) (*Model, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	m, err := newPart(be, cfg, w, head)
	if err != nil {
		return nil, err
	}
	m.lo = lo
	m.allLogits = o.AllLogits
	m.ctx = o.Ctx
	if m.ctx <= 0 {
		m.ctx = cfg.Ctx
		if m.ctx <= 0 || m.ctx > DefaultMaxCtx {
			m.ctx = DefaultMaxCtx
		}
	}
	m.longRope(m.ctx)
	m.batch = o.Batch
	if m.batch <= 0 {
		m.batch = DefaultBatch
	}
	m.batch = min(m.batch, m.ctx)
	m.lws = make([]*LayerWeights, cfg.Layers)
	// A mixture of experts reads its router's choice back to the host
	// mid-step (moe.go), which a recorded step cannot replay, unless the
	// backend routes a decode step on the device (moe_gpu.go).
	if sc, ok := kernels.As[kernels.StepCapturer](be); ok && !o.NoGraph && (cfg.Experts == 0 || deviceRouted(be, cfg)) {
		m.graphs = sc
	}
	m.argmax, _ = kernels.As[kernels.Argmaxer](be)
	m.resNorm, _ = kernels.As[kernels.ResidualNormer](be)
	m.pairNorm, _ = kernels.As[kernels.NormPairer](be)
	m.prep, _ = kernels.As[kernels.QKVPreparer](be)
	m.attend, _ = kernels.As[kernels.QKVAttender](be)
	m.multi, _ = kernels.As[kernels.SharedInputMatMuler](be)
	m.q8, _ = kernels.As[kernels.Q8Ops](be)

	if m.kv, err = be.NewKVCache(hi-lo, m.ctx, cfg.KVDim()); err != nil {
		return nil, fmt.Errorf("model: KV cache for %d positions: %w", m.ctx, err)
	}
	if err := m.allocScratch(); err != nil {
		be.FreeKVCache(m.kv)
		return nil, err
	}
	return m, nil
}

// allocScratch makes the one scratch allocation and names its pieces.
func (m *Model) allocScratch() error {
	c, B := m.Cfg, m.batch
	logitRows := 1
	if m.allLogits {
		logitRows = B
	}
	if m.bat != nil {
		logitRows = m.bat.maxSeqs // one row per sequence of a step
	}
	q8Rows := 0
	if m.q8 != nil {
		q8Rows = min(B, kernels.MaxBatchRows)
	}
	pieces := m.s.pieces(c, B, logitRows, q8Rows)
	total := 0
	for _, p := range pieces {
		total += p.n
	}
	all, err := m.be.Alloc(total)
	if err != nil {
		return fmt.Errorf("model: scratch of %d floats: %w", total, err)
	}
	m.s.all = all
	off := 0
	for _, p := range pieces {
		*p.t = all.View(off, p.n)
		off += p.n
	}
	for i, q := range []*kernels.Q8{&m.s.xbQ, &m.s.attQ, &m.s.hbQ} {
		if m.s.q8buf[i].Len > 0 {
			if *q, err = kernels.Q8In(m.s.q8buf[i], q8Rows, q8Widths(c)[i]); err != nil {
				m.be.Free(all)
				return fmt.Errorf("model: scratch: %w", err)
			}
		}
	}
	if m.s.q8buf[3].Len > 0 && c.ExpertFF%32 == 0 { // a decode step's experts' rows, side by side
		if m.s.moe.hbQ, err = kernels.Q8In(m.s.q8buf[3], c.ExpertsUsed, c.ExpertFF); err != nil {
			m.be.Free(all)
			return fmt.Errorf("model: scratch: %w", err)
		}
	}
	m.logits = make([]float32, logitRows*c.Vocab)
	return nil
}

// q8Widths are the widths of xb, att and hb, whose 8-bit copies the
// scratch holds (for those of whole blocks of 32), and of a mixture's
// decode hb, its ExpertsUsed experts' rows side by side (0: dense).
func q8Widths(c Config) [4]int {
	return [4]int{c.Embd, c.QDim(), c.FF, c.ExpertsUsed * c.ExpertFF}
}

// scratchPiece is one named buffer of the scratch and its length.
type scratchPiece struct {
	t *kernels.Tensor
	n int
}

// pieces lists the scratch buffers of a model of shape c for batches of B
// rows and logitRows rows of logits, with 8-bit copies of q8Rows rows, in
// allocation order: the copies first, each a whole number of 256-byte
// units (kernels.Q8Floats), so that every piece starts aligned as the
// allocation does.
func (s *scratch) pieces(c Config, B, logitRows, q8Rows int) []scratchPiece {
	var q8 []scratchPiece
	for i, w := range q8Widths(c) {
		if q8Rows > 0 && w > 0 && w%32 == 0 {
			q8 = append(q8, scratchPiece{&s.q8buf[i], kernels.Q8Floats(q8Rows, w)})
		}
	}
	return append(append(q8, []scratchPiece{
		{&s.x, B * c.Embd}, {&s.xb, B * c.Embd}, {&s.xb2, B * c.Embd},
		{&s.q, B * c.QDim()}, {&s.k, B * c.KVDim()}, {&s.v, B * c.KVDim()},
		{&s.att, B * c.QDim()},
		{&s.gate, B * c.FF}, {&s.up, B * c.FF}, {&s.hb, B * c.FF},
		{&s.logits, logitRows * c.Vocab},
		{&s.qk1, c.QDim() + c.KVDim()},
	}...), s.moe.pieces(c, B)...)
}

// ScratchFloats is the size in float32 of the one scratch allocation a
// model of shape c makes for batches of rows rows with logitRows rows of
// logits (the Engine's memory estimate uses it before a load), on a
// backend that makes 8-bit copies of activations (kernels.Q8Ops: a GPU;
// the CPU's is smaller by those). A mixture's count includes the buffer
// of its grouped prompt products (groupedFloats), which a backend with
// those kernels makes at the first prompt.
func ScratchFloats(c Config, rows, logitRows int) int64 {
	var n int64
	for _, p := range (&scratch{}).pieces(c, rows, logitRows, min(rows, kernels.MaxBatchRows)) {
		n += int64(p.n)
	}
	return n + groupedFloats(c, rows)
}

// Close releases the recorded decode steps, the KV cache and scratch (of
// every part of a split model).
func (m *Model) Close() {
	m.closeSplit()
	if m.graph != nil {
		m.graphs.FreeStep(m.graph)
		m.graph = nil
	}
	m.freeTables() // after the graph that reads them
	if m.kv != nil {
		m.be.FreeKVCache(m.kv)
		m.be.Free(m.s.all)
		m.kv = nil
	}
	if m.bat != nil {
		m.bat.graph.free() // before the scratch its kernels use
	}
	if m.bat != nil && m.bat.full.all.Len > 0 {
		m.be.Free(m.bat.full.all)
		m.bat.full = scratch{}
	}
}

// Ctx is the number of positions the KV cache holds.
func (m *Model) Ctx() int { return m.ctx }

// Batch is the most tokens one forward step evaluates.
func (m *Model) Batch() int { return m.batch }

// Backend is the backend the model runs on.
func (m *Model) Backend() kernels.Backend { return m.be }

// Forward evaluates tokens at positions pos0, pos0+1, … (positions before
// pos0 must already be in the KV cache) and returns the logits of the last
// token ([Vocab]), or with AllLogits of every token ([len(tokens)][Vocab]).
// A prompt longer than Batch is evaluated in batches. The returned slice
// belongs to the model and is overwritten by the next call.
func (m *Model) Forward(ctx context.Context, tokens []int32, pos0 int) ([]float32, error) {
	if err := m.eval(ctx, tokens, pos0); err != nil {
		return nil, err
	}
	return m.readLogits(len(tokens))
}

// Greedy evaluates tokens like Forward and returns the most likely next
// token: the index of the largest logit of the last token (ties: the
// lowest id), as a greedy sampler picks it. On a backend that reduces on
// the device (kernels.Argmaxer) only that id is copied back, not the row
// of logits.
func (m *Model) Greedy(ctx context.Context, tokens []int32, pos0 int) (int32, error) {
	if err := m.eval(ctx, tokens, pos0); err != nil {
		return 0, err
	}
	v := m.Cfg.Vocab
	if m.argmax != nil {
		row := m.s.logits.View(0, v)
		if m.allLogits {
			row = m.s.logits.View((len(tokens)-1)*v, v)
		}
		ids, err := m.argmax.Argmax(row, 1, v)
		if err != nil {
			return 0, fmt.Errorf("model: argmax of the logits: %w", err)
		}
		return ids[0], nil
	}
	logits, err := m.readLogits(len(tokens))
	if err != nil {
		return 0, err
	}
	return hostArgmax(logits[len(logits)-v:]), nil
}

// hostArgmax is the index of the largest value (ties: the lowest index).
func hostArgmax(v []float32) int32 {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return int32(best)
}

// eval runs the forward pass of tokens at pos0…, leaving the logits in the
// scratch on the backend.
func (m *Model) eval(ctx context.Context, tokens []int32, pos0 int) error {
	n := len(tokens)
	switch {
	case n == 0:
		return fmt.Errorf("model: forward of no tokens")
	case pos0 < 0 || pos0+n > m.ctx:
		return fmt.Errorf("model: positions [%d, %d) outside the %d-position context", pos0, pos0+n, m.ctx)
	case m.allLogits && n > m.batch:
		return fmt.Errorf("model: %d tokens with all logits exceed the batch of %d", n, m.batch)
	}
	if m.split != nil {
		return m.evalSplit(ctx, tokens, pos0)
	}
	if n == 1 && m.graphs != nil && !m.graphOff && !m.allLogits {
		return m.decodeStep(ctx, tokens[0], pos0)
	}
	for i := 0; i < n; i += m.batch {
		j := min(i+m.batch, n)
		nOut := 0 // rows that need logits in this step
		if j == n {
			nOut = 1
			if m.allLogits {
				nOut = j - i
			}
		}
		if err := m.step(ctx, tokens[i:j], pos0+i, nOut); err != nil {
			return err
		}
	}
	return nil
}

// decodeStep evaluates one token through the recorded step: the first
// single-token step whose layers are all known (the prompt fetched them)
// is run and recorded, the later ones replay it. A capture that fails
// (a backend op that cannot be recorded) leaves the model running op by
// op, as before.
func (m *Model) decodeStep(ctx context.Context, tok int32, pos int) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("model: %w", err)
	}
	if tok < 0 || int(tok) >= m.Cfg.Vocab {
		// The recorded embedding reads the row on the device, unchecked.
		return fmt.Errorf("model: token %d outside the vocabulary of %d", tok, m.Cfg.Vocab)
	}
	if m.graph != nil {
		err := m.graphs.RunStep(m.graph, tok, pos)
		if err == nil {
			return nil
		}
		if !errors.Is(err, kernels.ErrStaleStep) {
			return fmt.Errorf("model: decode step at position %d: %w", pos, err)
		}
		m.graphs.FreeStep(m.graph) // record it again below
		m.graph = nil
	}
	for _, lw := range m.lws {
		if lw == nil { // a layer not fetched yet: this step fetches it
			m.tok1[0] = tok
			return m.step(ctx, m.tok1[:], pos, 1)
		}
	}
	m.tok1[0] = tok
	g, err := m.graphs.CaptureStep(tok, pos, func() error { return m.run(ctx, m.tok1[:], pos, 1, false) })
	if err != nil {
		slog.Warn("model: the decode step could not be recorded; running it op by op", "backend", m.be.Name(), "err", err)
		m.graphOff = true
		return m.step(ctx, m.tok1[:], pos, 1)
	}
	m.graph = g
	return nil
}

// readLogits copies the logits of the last step to the host.
func (m *Model) readLogits(n int) ([]float32, error) {
	rows := 1
	if m.allLogits {
		rows = n
	}
	out := m.logits[:rows*m.Cfg.Vocab]
	if err := m.be.Read(out, m.s.logits, 0); err != nil {
		return nil, fmt.Errorf("model: reading logits: %w", err)
	}
	return out, nil
}

// step runs every block on at most Batch tokens and, when nOut > 0, the
// output head on the last nOut of them.
func (m *Model) step(ctx context.Context, tokens []int32, pos0, nOut int) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("model: %w", err)
	}
	return m.run(ctx, tokens, pos0, nOut, true)
}

// run queues the ops of a step. With fetch, each layer's weights are asked
// of Weights just before its block (which may wait for them to arrive) and
// kept in m.lws; without, the kept ones are used (a recorded step).
func (m *Model) run(ctx context.Context, tokens []int32, pos0, nOut int, fetch bool) error {
	defer m.during(ctx)()
	c, n := m.Cfg, len(tokens)
	m.pending, m.mix = false, deferredMix{}
	// x [n][Embd] = token_embd[tokens]
	if err := m.embed(m.s.x.View(0, n*c.Embd), tokens); err != nil {
		return err
	}
	for l := range c.Layers {
		if fetch {
			lw, err := m.w.Layer(ctx, l)
			if err != nil {
				return fmt.Errorf("model: waiting for layer %d: %w", l, err)
			}
			m.lws[l] = lw
		}
		lw := m.lws[l]
		keep := n
		if l == c.Layers-1 {
			keep = nOut // after the last block only the rows that need logits matter
		}
		m.err = nil
		if err := m.layer(m, lw, l, pos0, n, keep); err != nil {
			return fmt.Errorf("model: layer %d: %w", l, err)
		}
	}
	if nOut == 0 {
		return nil
	}
	// The last block left the rows that need logits at the end of the batch
	// (its feed-forward output still to be added: preNorm does).
	//   xb [nOut][Embd] = rmsnorm(x) ⊙ output_norm
	//   logits [nOut][Vocab] = xb · outputᵀ
	a := m.s.rows(n-nOut, nOut, c)
	m.err = nil
	xq := m.preNorm(a, m.g.OutputNorm, nOut)
	m.head(m.s.logits.View(0, nOut*c.Vocab), a.xb, xq, nOut)
	if m.err != nil {
		return fmt.Errorf("model: output head: %w", m.err)
	}
	return nil
}

// during makes ctx the step's context (wctx) until the returned func runs.
func (m *Model) during(ctx context.Context) func() {
	m.wctx = ctx
	return func() { m.wctx = nil }
}

// embed looks the tokens up into x [len(tokens)][Embd] and scales them
// where the architecture does (Gemma: √Embd).
func (m *Model) embed(x kernels.Tensor, tokens []int32) error {
	if err := m.be.Embed(x, m.g.Embed, tokens); err != nil {
		return fmt.Errorf("model: embedding: %w", err)
	}
	if s := m.Cfg.EmbedScale; s > 0 {
		if err := m.be.Scale(x, x, s, len(tokens)*m.Cfg.Embd); err != nil {
			return fmt.Errorf("model: embedding scale: %w", err)
		}
	}
	return nil
}

// head computes the logits of n normalised rows xb (xq: their 8-bit copy,
// or the zero Q8) into dst [n][Vocab], soft-capped where the architecture
// does (Gemma 2).
func (m *Model) head(dst, xb kernels.Tensor, xq kernels.Q8, n int) {
	m.matmul(dst, m.g.Output, xb, xq, n)
	if c := m.Cfg.FinalSoftcap; c > 0 && m.err == nil {
		if err := m.be.Softcap(dst, c, n*m.Cfg.Vocab); err != nil {
			m.err = fmt.Errorf("logit soft-cap: %w", err)
		}
	}
}

// longRope gives every layer LongRoPE's long or short factors, where the
// model has them, as llama.cpp chooses: the long ones when the context
// (ctx positions per sequence) exceeds the original one.
func (m *Model) longRope(ctx int) {
	if m.Cfg.RopeOrigCtx <= 0 || (m.g.RopeLong == nil && m.g.RopeShort == nil) {
		return
	}
	f := m.g.RopeShort
	if ctx > m.Cfg.RopeOrigCtx || f == nil {
		f = m.g.RopeLong
	}
	for l := range m.ropes {
		m.ropes[l].Freqs = f
	}
}
