package model

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/forge-llm/forge/kernels"
)

// Part is one device's share of a model split by layers: the backend that
// runs layers [Lo, Hi) and the weights it holds. The first part (Lo = 0)
// also embeds the tokens and runs the output head, so its Weights must
// have the globals; every part needs the rope frequencies where the model
// has them (RoPE runs on each device).
type Part struct {
	Backend kernels.Backend
	Weights Weights
	Lo, Hi  int
}

// PeerCopier is a backend that copies activations in from another
// backend's memory on its own queue, after the work already queued on
// src (a GPU: a peer copy between two devices or two contexts of one
// card, through the driver). It reports false, with no error, when it
// cannot reach src (another kind of backend); the split then copies
// through the host.
type PeerCopier interface {
	CopyPeer(dst kernels.Tensor, src kernels.Backend, s kernels.Tensor) (bool, error)
}

// splitState is what the first part of a split model holds: the parts
// (itself first), their layer bounds, the host staging of the copies
// that go through the host, and the recorded decode step of each stage.
//
// A step runs part 0 (embedding, its layers), then each later part, the
// residual stream crossing once per boundary, and comes back to part 0
// for the output head: the logits and the greedy argmax stay where a
// single-device model has them. The return costs one more crossing of
// one row per token; it saves holding the embedding (the head, when
// tied) on two devices.
type splitState struct {
	parts  []*Model
	bounds []int // parts[k] runs layers [bounds[k], bounds[k+1])
	host   []float32
	// stages[s] is the recorded decode step of stage s: s < len(parts)
	// the layers of parts[s] (stage 0 with the embedding), s ==
	// len(parts) the head on parts[0]. graphOff after a failed capture.
	stages   []kernels.StepGraph
	graphOff bool
	viaHost  int64 // copies that went through the host (tests, logs)
}

// NewSplit builds a model whose layers run on several backends: parts
// must cover [0, cfg.Layers) in order, each with at least one layer. Each
// part gets a KV cache for its own layers and its own scratch; the model
// returned is the first part's and runs the others (Forward, Greedy and
// Close cover them all). One part is New.
func NewSplit(cfg Config, parts []Part, o Options) (*Model, error) {
	if len(parts) == 0 {
		return nil, fmt.Errorf("model: split over no parts")
	}
	next := 0
	for k, p := range parts {
		if p.Lo != next || p.Hi <= p.Lo || p.Backend == nil || p.Weights == nil {
			return nil, fmt.Errorf("model: split part %d: layers [%d, %d) after layer %d (parts must cover the %d layers in order, each non-empty, with a backend and weights)", k, p.Lo, p.Hi, next, cfg.Layers)
		}
		next = p.Hi
	}
	if next != cfg.Layers {
		return nil, fmt.Errorf("model: split parts end at layer %d of %d", next, cfg.Layers)
	}
	if len(parts) == 1 {
		return New(parts[0].Backend, cfg, parts[0].Weights, o)
	}
	ms := make([]*Model, 0, len(parts))
	for k, p := range parts {
		mk, err := newSpan(p.Backend, cfg, p.Weights, o, p.Lo, p.Hi, k == 0)
		if err != nil {
			for _, m := range ms {
				m.Close()
			}
			return nil, fmt.Errorf("model: split part %d (layers %d–%d on %s): %w", k, p.Lo, p.Hi-1, p.Backend.Name(), err)
		}
		ms = append(ms, mk)
	}
	head := ms[0]
	sp := &splitState{parts: ms, stages: make([]kernels.StepGraph, len(parts)+1)}
	for _, p := range parts {
		sp.bounds = append(sp.bounds, p.Lo)
	}
	sp.bounds = append(sp.bounds, cfg.Layers)
	for _, p := range ms {
		if p.graphs == nil {
			sp.graphOff = true // every part records its stage, or none does
		}
	}
	head.split = sp
	return head, nil
}

// Parts is the number of devices the model runs on (1 unless split).
func (m *Model) Parts() int {
	if m.split == nil {
		return 1
	}
	return len(m.split.parts)
}

// HostCrossings is how many times activations crossed between parts
// through the host rather than a peer copy.
func (m *Model) HostCrossings() int64 {
	if m.split == nil {
		return 0
	}
	return m.split.viaHost
}

// closeSplit frees the recorded stages and the other parts (the first
// part is m, closed by its caller).
func (m *Model) closeSplit() {
	sp := m.split
	if sp == nil {
		return
	}
	sp.freeStages()
	for _, p := range sp.parts[1:] {
		p.Close()
	}
	m.split = nil
}

func (sp *splitState) stagePart(s int) *Model {
	if s == len(sp.parts) {
		return sp.parts[0]
	}
	return sp.parts[s]
}

func (sp *splitState) freeStages() {
	for s, g := range sp.stages {
		if g != nil {
			sp.stagePart(s).graphs.FreeStep(g)
			sp.stages[s] = nil
		}
	}
}

// cross hands rows [row, row+rows) of the residual stream from src to
// dst: x, and with pending the last sub-block's output xb2 not yet added
// to it, which dst's next norm adds (fused where the backend can), as a
// single-device model does: the split runs exactly the ops of the whole
// model.
func (sp *splitState) cross(src, dst *Model, row, rows int, pending bool) error {
	e := src.Cfg.Embd
	if err := sp.copyRows(src, dst, src.s.x.View(row*e, rows*e), dst.s.x.View(row*e, rows*e)); err != nil {
		return err
	}
	if pending {
		if err := sp.copyRows(src, dst, src.s.xb2.View(row*e, rows*e), dst.s.xb2.View(row*e, rows*e)); err != nil {
			return err
		}
	}
	dst.pending = pending
	return nil
}

// copyRows copies from, of src, into to, of dst: a peer copy where dst's
// backend can reach src's, else through the host (Read waits for src's
// queue; Write lands before dst's next op).
func (sp *splitState) copyRows(src, dst *Model, from, to kernels.Tensor) error {
	e := to.Len
	if pc, ok := kernels.As[PeerCopier](dst.be); ok {
		done, err := pc.CopyPeer(to, src.be, from)
		if err != nil {
			return fmt.Errorf("model: activations from %s to %s: %w", src.be.Name(), dst.be.Name(), err)
		}
		if done {
			return nil
		}
	}
	buf := sp.host[:e]
	if err := src.be.Read(buf, from, 0); err != nil {
		return fmt.Errorf("model: activations from %s: %w", src.be.Name(), err)
	}
	if err := dst.be.Write(to, 0, buf); err != nil {
		return fmt.Errorf("model: activations to %s: %w", dst.be.Name(), err)
	}
	sp.viaHost++
	return nil
}

// evalSplit is eval for a split model (the arguments are checked).
func (m *Model) evalSplit(ctx context.Context, tokens []int32, pos0 int) error {
	sp := m.split
	if sp.host == nil {
		sp.host = make([]float32, m.batch*m.Cfg.Embd)
	}
	n := len(tokens)
	if n == 1 && !sp.graphOff && !m.allLogits {
		return m.decodeSplit(ctx, tokens[0], pos0)
	}
	for i := 0; i < n; i += m.batch {
		j := min(i+m.batch, n)
		nOut := 0
		if j == n {
			nOut = 1
			if m.allLogits {
				nOut = j - i
			}
		}
		if err := m.stepSplit(ctx, tokens[i:j], pos0+i, nOut); err != nil {
			return err
		}
	}
	return nil
}

// stepSplit is step over every part, op by op, fetching each layer's
// weights from its part's Weights.
func (m *Model) stepSplit(ctx context.Context, tokens []int32, pos0, nOut int) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("model: %w", err)
	}
	sp, n := m.split, len(tokens)
	if err := m.embedTokens(tokens); err != nil {
		return err
	}
	for k, p := range sp.parts {
		if k > 0 {
			prev := sp.parts[k-1]
			if err := sp.cross(prev, p, 0, n, prev.pending); err != nil {
				return err
			}
		}
		if err := p.runSpan(ctx, sp.bounds[k], sp.bounds[k+1], pos0, n, nOut, true); err != nil {
			return err
		}
	}
	if nOut == 0 {
		return nil
	}
	last := sp.parts[len(sp.parts)-1]
	if err := sp.cross(last, m, n-nOut, nOut, last.pending); err != nil {
		return err
	}
	return m.splitHead(n, nOut)
}

// embedTokens starts a step: x = token_embd[tokens].
func (m *Model) embedTokens(tokens []int32) error {
	m.pending, m.mix = false, deferredMix{}
	if err := m.be.Embed(m.s.x.View(0, len(tokens)*m.Cfg.Embd), m.g.Embed, tokens); err != nil {
		return fmt.Errorf("model: embedding: %w", err)
	}
	return nil
}

// runSpan runs layers [lo, hi) of a step on this part, from the residual
// stream as the previous part left it (m.pending set by the crossing;
// false after the embedding). With fetch the layers' weights are asked of
// Weights, else the ones kept from an earlier step are used (a recorded
// step).
func (m *Model) runSpan(ctx context.Context, lo, hi, pos0, n, nOut int, fetch bool) error {
	defer m.during(ctx)()
	c := m.Cfg
	for l := lo; l < hi; l++ {
		if fetch {
			lw, err := m.w.Layer(ctx, l)
			if err != nil {
				return fmt.Errorf("model: waiting for layer %d: %w", l, err)
			}
			m.lws[l] = lw
		}
		keep := n
		if l == c.Layers-1 {
			keep = nOut
		}
		m.err = nil
		if err := m.layer(m, m.lws[l], l, pos0, n, keep); err != nil {
			return fmt.Errorf("model: layer %d: %w", l, err)
		}
	}
	// The pending output crosses to the next part as xb2 (cross): a
	// weighted sum left to the next norm is computed here, in the stage.
	return m.settleMix()
}

// splitHead runs the output norm and head on the last nOut of n rows of x
// (the last block's output still pending, as the crossing left it).
func (m *Model) splitHead(n, nOut int) error {
	c := m.Cfg
	a := m.s.rows(n-nOut, nOut, c)
	m.err = nil
	xq := m.preNorm(a, m.g.OutputNorm, nOut)
	m.head(m.s.logits.View(0, nOut*c.Vocab), a.xb, xq, nOut)
	if m.err != nil {
		return fmt.Errorf("model: output head: %w", m.err)
	}
	return nil
}

// known reports whether every part has every layer's weights from an
// earlier step (a recorded step uses those).
func (sp *splitState) known() bool {
	for k, p := range sp.parts {
		for l := sp.bounds[k]; l < sp.bounds[k+1]; l++ {
			if p.lws[l] == nil {
				return false
			}
		}
	}
	return true
}

// stage queues the ops of stage s of a one-token step at pos (see
// splitState.stages), with the kept weights. A stage after the first
// starts with the last block's output pending (every block of a
// one-token step leaves it so): set here, not left from the previous call,
// since a capture runs the stage twice.
func (m *Model) stage(ctx context.Context, s, pos int) error {
	sp := m.split
	if s == len(sp.parts) {
		m.pending = true
		return m.splitHead(1, 1)
	}
	if s == 0 {
		if err := m.embedTokens(m.tok1[:]); err != nil {
			return err
		}
	} else {
		sp.parts[s].pending = true
	}
	return sp.parts[s].runSpan(ctx, sp.bounds[s], sp.bounds[s+1], pos, 1, 1, false)
}

// decodeSplit is decodeStep for a split model: each stage is recorded
// once on its part's backend and replayed per token; the crossings are
// queued between the replays. A stage whose capture fails leaves the
// model running op by op, as an unsplit model does.
func (m *Model) decodeSplit(ctx context.Context, tok int32, pos int) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("model: %w", err)
	}
	if tok < 0 || int(tok) >= m.Cfg.Vocab {
		return fmt.Errorf("model: token %d outside the vocabulary of %d", tok, m.Cfg.Vocab)
	}
	sp := m.split
	m.tok1[0] = tok
	if !sp.known() {
		return m.stepSplit(ctx, m.tok1[:], pos, 1)
	}
	last := len(sp.parts) - 1
	for s := 0; s <= len(sp.parts); s++ {
		p := sp.stagePart(s)
		if s > 0 {
			if err := sp.cross(sp.stagePart(min(s-1, last)), p, 0, 1, true); err != nil {
				return err
			}
		}
		if sp.graphOff {
			if err := m.stage(ctx, s, pos); err != nil {
				return err
			}
			continue
		}
		if g := sp.stages[s]; g != nil {
			err := p.graphs.RunStep(g, tok, pos)
			if err == nil {
				continue
			}
			if !errors.Is(err, kernels.ErrStaleStep) {
				return fmt.Errorf("model: decode stage %d at position %d: %w", s, pos, err)
			}
			p.graphs.FreeStep(g) // recorded again below
			sp.stages[s] = nil
		}
		g, err := p.graphs.CaptureStep(tok, pos, func() error { return m.stage(ctx, s, pos) })
		if err == nil {
			sp.stages[s] = g
			continue
		}
		if ctx.Err() != nil {
			return fmt.Errorf("model: %w", ctx.Err())
		}
		slog.Warn("model: a split decode stage could not be recorded; running it op by op", "stage", s, "backend", p.be.Name(), "err", err)
		sp.graphOff = true
		sp.freeStages()
		// The stage may have run part way in place: start it again from
		// its input.
		if s > 0 {
			if err := sp.cross(sp.stagePart(min(s-1, last)), p, 0, 1, true); err != nil {
				return err
			}
		}
		if err := m.stage(ctx, s, pos); err != nil {
			return err
		}
	}
	return nil
}
