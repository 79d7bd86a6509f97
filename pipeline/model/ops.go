package model

import (
	"fmt"

	"github.com/forge-llm/forge/kernels"
)

// act is the scratch seen as n token rows starting at row first: the
// buffers a block reads and writes for those tokens.
type act struct {
	x, xb, xb2   kernels.Tensor // [n][Embd]
	q, att       kernels.Tensor // [n][QDim]
	k, v         kernels.Tensor // [n][KVDim]
	gate, up, hb kernels.Tensor // [n][FF]
	// qk is q and k in one piece, [QDim + KVDim], for one token (n = 1);
	// zero otherwise.
	qk kernels.Tensor
	// xbQ, attQ and hbQ are the storage of the 8-bit copies of xb, att and
	// hb (kernels.Q8), where the scratch has them for these rows; empty
	// otherwise. The ops that write xb, att and hb fill them (preNorm,
	// attention, siluMulQ) and return the copy they made, which the block
	// hands to the products on that input.
	xbQ, attQ, hbQ kernels.Q8
}

// rows views rows [first, first+n) of every scratch buffer. One row's
// query and key are views of the one-token buffer qk1, so that they are
// adjacent.
func (s *scratch) rows(first, n int, c Config) act {
	r := func(t kernels.Tensor, w int) kernels.Tensor { return t.View(first*w, n*w) }
	a := act{
		x: r(s.x, c.Embd), xb: r(s.xb, c.Embd), xb2: r(s.xb2, c.Embd),
		q: r(s.q, c.QDim()), att: r(s.att, c.QDim()),
		k: r(s.k, c.KVDim()), v: r(s.v, c.KVDim()),
		gate: r(s.gate, c.FF), up: r(s.up, c.FF), hb: r(s.hb, c.FF),
	}
	if n == 1 {
		a.qk = s.qk1
		a.q, a.k = s.qk1.View(0, c.QDim()), s.qk1.View(c.QDim(), c.KVDim())
	}
	q8 := func(q kernels.Q8) kernels.Q8 {
		if first+n > q.Rows {
			return kernels.Q8{} // rows past the copies' (or none)
		}
		return q.View(first, n)
	}
	a.xbQ, a.attQ, a.hbQ = q8(s.xbQ), q8(s.attQ), q8(s.hbQ)
	return a
}

// q8Store is q, the storage of the 8-bit copy of an activation of n rows,
// where the model makes one: on a backend that reads them (kernels.Q8Ops),
// for up to kernels.MaxBatchRows rows (decode steps, short prompts and
// prompt pieces; longer ones go through GEMMs that read floats). The zero
// Q8 otherwise.
func (m *Model) q8Store(q kernels.Q8, n int) kernels.Q8 {
	if m.q8 == nil || n > kernels.MaxBatchRows || q.Rows != n {
		return kernels.Q8{}
	}
	return q
}

// ropeQK rotates the queries and keys of n tokens with layer's RoPE: for
// one token, in one op over the adjacent pair (RoPE treats the keys' heads
// as more heads).
func (m *Model) ropeQK(a act, n, pos0, layer int) {
	c := m.Cfg
	r := m.ropes[layer]
	if n == 1 {
		m.rope(a.qk, 1, c.Heads+c.KVHeads, pos0, r)
		return
	}
	m.rope(a.q, n, c.Heads, pos0, r)
	m.rope(a.k, n, c.KVHeads, pos0, r)
}

// selfAttention is a block's attention from its projections in a (q, k,
// v): the per-head norms of the queries and keys with qw and kw where set
// (Qwen3, Gemma), RoPE, the store of the keys and values in the cache, and
// attention over it; it returns att's 8-bit copy as attention does. One
// token of the single-sequence path on a kernels.QKVPreparer takes two ops
// (prepare, attend) instead of four, with the same bits; without head
// norms, on a kernels.QKVAttender, one.
func (m *Model) selfAttention(a act, qw, kw *kernels.Weight, layer, pos0, n int) kernels.Q8 {
	c := m.Cfg
	if n == 1 && m.prep != nil && m.bat == nil && (qw == nil) == (kw == nil) {
		if m.err != nil {
			return kernels.Q8{}
		}
		at := m.attns[layer]
		if m.attend != nil && qw == nil {
			oq, ok, err := m.attend.AttendQKVQ8(a.att, a.q, a.k, a.v, m.kv, layer-m.lo, pos0, m.ropes[layer], at, m.q8Store(a.attQ, 1))
			if err != nil {
				m.err = fmt.Errorf("attention: %w", err)
				return kernels.Q8{}
			}
			if ok {
				return oq
			}
		}
		if err := m.prep.PrepareQKV(a.q, a.k, a.v, qw, kw, c.NormEps, m.kv, layer-m.lo, pos0, m.ropes[layer], at); err != nil {
			m.err = fmt.Errorf("prepare attention: %w", err)
			return kernels.Q8{}
		}
		oq, err := m.prep.AttentionStoredQ8(a.att, a.q, m.kv, layer-m.lo, pos0, at, m.q8Store(a.attQ, 1))
		if err != nil {
			m.err = fmt.Errorf("attention: %w", err)
			return kernels.Q8{}
		}
		return oq
	}
	if qw != nil {
		m.rmsnormPair(a.q, qw, n*c.Heads, a.k, kw, n*c.KVHeads)
	}
	m.ropeQK(a, n, pos0, layer)
	return m.attention(a.att, a.q, a.k, a.v, a.attQ, layer, pos0, n)
}

// preNorm is the norm that starts a sub-block (and the output head):
//
//	xb = rmsnorm(x) ⊙ w   over n rows
//
// where x first receives the previous sub-block's output (xb2) if it is
// still pending: the residual add is deferred to here so that a backend
// can fuse it with the norm (kernels.ResidualNormer); else Add, then
// RMSNorm, as without the deferral.
//
// It returns xb's 8-bit copy where the backend made one (kernels.Q8Ops),
// else the zero Q8: the block passes it to the products on xb.
func (m *Model) preNorm(a act, w *kernels.Weight, n int) kernels.Q8 {
	q := m.q8Store(a.xbQ, n)
	if !m.pending {
		return m.rmsnormQ(a.xb, a.x, w, n, q)
	}
	m.pending = false
	if m.mix.norm != nil {
		return m.mixNorm(a, w, n, q)
	}
	if m.resNorm == nil && q.Empty() {
		m.add(a.x, a.x, a.xb2, n*m.Cfg.Embd)
		m.rmsnorm(a.xb, a.x, w, n)
		return kernels.Q8{}
	}
	if m.err != nil {
		return kernels.Q8{}
	}
	var err error
	if q.Empty() {
		err = m.resNorm.AddRMSNorm(a.xb, a.x, a.xb2, w, n, m.Cfg.NormEps)
	} else {
		q, err = m.q8.AddRMSNormQ8(a.xb, a.x, a.xb2, w, n, m.Cfg.NormEps, q)
	}
	if err != nil {
		m.err = fmt.Errorf("residual add and rmsnorm %s: %w", w.Name, err)
		return kernels.Q8{}
	}
	return q
}

// deferredMix is a one-token mixture's weighted sum not yet computed:
// dst = Σ_j w[j]·src[j] over k slots (mixtureDevice leaves it to preNorm).
type deferredMix struct {
	norm        kernels.MixNormer // the backend, which is also an ExpertRouter
	dst, src, w kernels.Tensor
	k           int
}

// mixNorm is preNorm for a pending output that is a deferred mixture: the
// weighted sum into xb2, the residual add and the norm in one op.
func (m *Model) mixNorm(a act, w *kernels.Weight, n int, q kernels.Q8) kernels.Q8 {
	mix := m.mix
	m.mix = deferredMix{}
	if m.err != nil {
		return kernels.Q8{}
	}
	if n != 1 {
		m.err = fmt.Errorf("mixture of experts: a weighted sum of one token deferred to a norm of %d rows", n)
		return kernels.Q8{}
	}
	q, err := mix.norm.MixAddRMSNormQ8(a.xb, a.x, mix.dst, mix.src, mix.w, mix.k, w, m.Cfg.NormEps, q)
	if err != nil {
		m.err = fmt.Errorf("weighted sum, residual add and rmsnorm %s: %w", w.Name, err)
		return kernels.Q8{}
	}
	m.mixNormed++
	return q
}

// settleMix computes a deferred weighted sum into its destination, for a
// reader of the pending output other than preNorm (the crossing after a
// split model's span, runSpan).
func (m *Model) settleMix() error {
	mix := m.mix
	m.mix = deferredMix{}
	rt, ok := mix.norm.(kernels.ExpertRouter)
	if !ok {
		return nil
	}
	if err := rt.MixSlots(mix.dst, mix.src, mix.w, 1, mix.k, m.Cfg.Embd); err != nil {
		return fmt.Errorf("mixture of experts (routed on the device): weighted sum: %w", err)
	}
	return nil
}

// rmsnormQ is rmsnorm, filling q (when not empty) with dst's 8-bit copy
// where the backend can; it returns the copy made, or the zero Q8.
func (m *Model) rmsnormQ(dst, x kernels.Tensor, w *kernels.Weight, n int, q kernels.Q8) kernels.Q8 {
	if q.Empty() || m.err != nil {
		m.rmsnorm(dst, x, w, n)
		return kernels.Q8{}
	}
	q, err := m.q8.RMSNormQ8(dst, x, w, n, m.Cfg.NormEps, q)
	if err != nil {
		m.err = fmt.Errorf("rmsnorm %s: %w", w.Name, err)
		return kernels.Q8{}
	}
	return q
}

// The ops below call the backend and keep the first error in m.err, so a
// block reads as a list of math steps and checks once at its end. After an
// error the remaining ops of the block are skipped. The error message is
// built only on failure: a forward step allocates nothing.

func (m *Model) rmsnorm(dst, x kernels.Tensor, w *kernels.Weight, n int) {
	if m.err == nil {
		if err := m.be.RMSNorm(dst, x, w, n, m.Cfg.NormEps); err != nil {
			m.err = fmt.Errorf("rmsnorm %s: %w", w.Name, err)
		}
	}
}

// rmsnormPair normalises the n·Heads query heads qa with qw and the
// n·KVHeads key heads ka with kw in place (one op where the backend pairs
// them, every row the bits of its own rmsnorm).
func (m *Model) rmsnormPair(qa kernels.Tensor, qw *kernels.Weight, nq int, ka kernels.Tensor, kw *kernels.Weight, nk int) {
	if m.pairNorm == nil {
		m.rmsnorm(qa, qa, qw, nq)
		m.rmsnorm(ka, ka, kw, nk)
		return
	}
	if m.err == nil {
		if err := m.pairNorm.RMSNormPair(qa, qa, qw, nq, ka, ka, kw, nk, m.Cfg.NormEps); err != nil {
			m.err = fmt.Errorf("rmsnorm %s and %s: %w", qw.Name, kw.Name, err)
		}
	}
}

// matmul multiplies x by w; xq is x's 8-bit copy (a preNorm, attention or
// siluMulQ returned it) or the zero Q8.
func (m *Model) matmul(dst kernels.Tensor, w *kernels.Weight, x kernels.Tensor, xq kernels.Q8, n int) {
	if m.err != nil {
		return
	}
	var err error
	switch {
	case m.inPrompt && m.promptMM != nil && !xq.Empty() && m.promptMulti != nil:
		m.mm1Dst[0], m.mm1W[0] = dst, w // a prompt piece of a batched step, on x's copy
		err = m.promptMulti.MatMulsPrompt(m.mm1Dst[:], m.mm1W[:], x, xq, n)
	case m.inPrompt && m.promptMM != nil:
		err = m.promptMM.MatMulPrompt(dst, w, x, n) // a prompt piece of a batched step
	case !xq.Empty():
		err = m.q8.MatMulQ8(dst, w, x, xq, n)
	default:
		err = m.be.MatMul(dst, w, x, n)
	}
	if err != nil {
		m.err = fmt.Errorf("matmul %s (%v, %d×%d) by %d rows: %w", w.Name, w.Type, w.Rows, w.Cols, n, err)
	}
}

// matmul2 and matmul3 multiply one input by two or three weights: in one
// op where the backend has it (kernels.SharedInputMatMuler, Q8Ops,
// SharedInputPromptMatMuler for prompt pieces), which quantizes x at most
// once (xq: x's copy, or the zero Q8), else one MatMul each.
func (m *Model) matmul2(d0 kernels.Tensor, w0 *kernels.Weight, d1 kernels.Tensor, w1 *kernels.Weight, x kernels.Tensor, xq kernels.Q8, n int) {
	m.mmDst[0], m.mmDst[1] = d0, d1
	m.mmW[0], m.mmW[1] = w0, w1
	m.matmuls(x, xq, n, 2)
}

func (m *Model) matmul3(d0 kernels.Tensor, w0 *kernels.Weight, d1 kernels.Tensor, w1 *kernels.Weight,
	d2 kernels.Tensor, w2 *kernels.Weight, x kernels.Tensor, xq kernels.Q8, n int) {
	m.mmDst[0], m.mmDst[1], m.mmDst[2] = d0, d1, d2
	m.mmW[0], m.mmW[1], m.mmW[2] = w0, w1, w2
	m.matmuls(x, xq, n, 3)
}

// matmuls multiplies x by the k weights of mmW into mmDst.
func (m *Model) matmuls(x kernels.Tensor, xq kernels.Q8, n, k int) {
	if m.err != nil {
		return
	}
	var err error
	switch {
	case m.inPrompt && m.promptMM != nil && m.promptMulti != nil:
		err = m.promptMulti.MatMulsPrompt(m.mmDst[:k], m.mmW[:k], x, xq, n)
	case m.inPrompt && m.promptMM != nil:
		for i := range k {
			m.matmul(m.mmDst[i], m.mmW[i], x, xq, n)
		}
		return
	case m.q8 != nil:
		err = m.q8.MatMulsQ8(m.mmDst[:k], m.mmW[:k], x, xq, n)
	case m.multi != nil:
		err = m.multi.MatMuls(m.mmDst[:k], m.mmW[:k], x, n)
	default:
		for i := range k {
			m.matmul(m.mmDst[i], m.mmW[i], x, xq, n)
		}
		return
	}
	if err != nil {
		m.err = fmt.Errorf("matmuls %s… (%d weights) by %d rows: %w", m.mmW[0].Name, k, n, err)
	}
}

func (m *Model) addBias(x kernels.Tensor, b *kernels.Weight, n int) {
	if m.err == nil {
		if err := m.be.AddBias(x, b, n); err != nil {
			m.err = fmt.Errorf("bias %s: %w", b.Name, err)
		}
	}
}

// rope and attention are the two ops that know where a row sits in its
// sequence: the single-sequence path gives them pos0 and the contiguous
// cache; a batched step (m.bat set, see batch.go) gives them the step's
// layout and the paged pool instead. The block functions are the same.
func (m *Model) rope(x kernels.Tensor, n, heads, pos0 int, r kernels.Rope) {
	if m.err == nil && m.bat != nil {
		if err := m.bat.be.RoPEAt(x, n, heads, m.Cfg.HeadDim, r); err != nil {
			m.err = fmt.Errorf("rope at: %w", err)
		}
		return
	}
	if m.err == nil {
		if err := m.be.RoPE(x, n, heads, m.Cfg.HeadDim, pos0, r); err != nil {
			m.err = fmt.Errorf("rope: %w", err)
		}
	}
}

// attention returns out's 8-bit copy, made in oq (the storage for n rows
// of out, possibly empty) where the backend can (the single-sequence
// path), else the zero Q8.
func (m *Model) attention(out, q, k, v kernels.Tensor, oq kernels.Q8, layer, pos0, n int) kernels.Q8 {
	if m.err != nil {
		return kernels.Q8{}
	}
	if m.bat != nil {
		if err := m.bat.be.PagedAttention(out, q, k, v, m.bat.pool, layer, n, m.attns[layer]); err != nil {
			m.err = fmt.Errorf("paged attention: %w", err)
		}
		return kernels.Q8{}
	}
	if oq = m.q8Store(oq, n); oq.Empty() {
		if err := m.be.Attention(out, q, k, v, m.kv, layer-m.lo, pos0, n, m.attns[layer]); err != nil {
			m.err = fmt.Errorf("attention: %w", err)
		}
		return kernels.Q8{}
	}
	oq, err := m.q8.AttentionQ8(out, q, k, v, m.kv, layer-m.lo, pos0, n, m.attns[layer], oq)
	if err != nil {
		m.err = fmt.Errorf("attention: %w", err)
		return kernels.Q8{}
	}
	return oq
}

func (m *Model) siluMul(dst, gate, up kernels.Tensor, n int) {
	if m.err == nil {
		if err := m.be.SiLUMul(dst, gate, up, n); err != nil {
			m.err = fmt.Errorf("silu·mul: %w", err)
		}
	}
}

// siluMulQ is siluMul over rows·Cols values of q's shape (q: the storage
// of dst's 8-bit copy, possibly empty), returning the copy where the
// backend made one, else the zero Q8.
func (m *Model) siluMulQ(dst, gate, up kernels.Tensor, n int, q kernels.Q8) kernels.Q8 {
	if q.Empty() || m.err != nil {
		m.siluMul(dst, gate, up, n)
		return kernels.Q8{}
	}
	q, err := m.q8.SiLUMulQ8(dst, gate, up, n, q)
	if err != nil {
		m.err = fmt.Errorf("silu·mul: %w", err)
		return kernels.Q8{}
	}
	return q
}

func (m *Model) add(dst, a, b kernels.Tensor, n int) {
	if m.err == nil {
		if err := m.be.Add(dst, a, b, n); err != nil {
			m.err = fmt.Errorf("residual add: %w", err)
		}
	}
}

func (m *Model) scale(x kernels.Tensor, s float32, n int) {
	if m.err == nil {
		if err := m.be.Scale(x, x, s, n); err != nil {
			m.err = fmt.Errorf("scale: %w", err)
		}
	}
}

func (m *Model) geluMul(dst, gate, up kernels.Tensor, n int) {
	if m.err == nil {
		if err := m.be.GELUMul(dst, gate, up, n); err != nil {
			m.err = fmt.Errorf("gelu·mul: %w", err)
		}
	}
}
