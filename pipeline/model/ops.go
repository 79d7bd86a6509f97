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
	return a
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

// preNorm is the norm that starts a sub-block (and the output head):
//
//	xb = rmsnorm(x) ⊙ w   over n rows
//
// where x first receives the previous sub-block's output (xb2) if it is
// still pending: the residual add is deferred to here so that a backend
// can fuse it with the norm (kernels.ResidualNormer); else Add, then
// RMSNorm, as without the deferral.
func (m *Model) preNorm(a act, w *kernels.Weight, n int) {
	if !m.pending {
		m.rmsnorm(a.xb, a.x, w, n)
		return
	}
	m.pending = false
	if m.resNorm == nil {
		m.add(a.x, a.x, a.xb2, n*m.Cfg.Embd)
		m.rmsnorm(a.xb, a.x, w, n)
		return
	}
	if m.err == nil {
		if err := m.resNorm.AddRMSNorm(a.xb, a.x, a.xb2, w, n, m.Cfg.NormEps); err != nil {
			m.err = fmt.Errorf("residual add and rmsnorm %s: %w", w.Name, err)
		}
	}
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

func (m *Model) matmul(dst kernels.Tensor, w *kernels.Weight, x kernels.Tensor, n int) {
	if m.err == nil {
		mm := m.be.MatMul
		if m.inPrompt && m.promptMM != nil {
			mm = m.promptMM.MatMulPrompt // a prompt piece of a batched step
		}
		if err := mm(dst, w, x, n); err != nil {
			m.err = fmt.Errorf("matmul %s (%v, %d×%d) by %d rows: %w", w.Name, w.Type, w.Rows, w.Cols, n, err)
		}
	}
}

// matmul2 and matmul3 multiply one input by two or three weights: in one
// op where the backend has it (kernels.SharedInputMatMuler), else one
// MatMul each.
func (m *Model) matmul2(d0 kernels.Tensor, w0 *kernels.Weight, d1 kernels.Tensor, w1 *kernels.Weight, x kernels.Tensor, n int) {
	if m.multi == nil || (m.inPrompt && m.promptMM != nil) {
		m.matmul(d0, w0, x, n)
		m.matmul(d1, w1, x, n)
		return
	}
	m.mmDst[0], m.mmDst[1] = d0, d1
	m.mmW[0], m.mmW[1] = w0, w1
	m.matmuls(x, n, 2)
}

func (m *Model) matmul3(d0 kernels.Tensor, w0 *kernels.Weight, d1 kernels.Tensor, w1 *kernels.Weight,
	d2 kernels.Tensor, w2 *kernels.Weight, x kernels.Tensor, n int) {
	if m.multi == nil || (m.inPrompt && m.promptMM != nil) {
		m.matmul(d0, w0, x, n)
		m.matmul(d1, w1, x, n)
		m.matmul(d2, w2, x, n)
		return
	}
	m.mmDst[0], m.mmDst[1], m.mmDst[2] = d0, d1, d2
	m.mmW[0], m.mmW[1], m.mmW[2] = w0, w1, w2
	m.matmuls(x, n, 3)
}

func (m *Model) matmuls(x kernels.Tensor, n, k int) {
	if m.err == nil {
		if err := m.multi.MatMuls(m.mmDst[:k], m.mmW[:k], x, n); err != nil {
			m.err = fmt.Errorf("matmuls %s… (%d weights) by %d rows: %w", m.mmW[0].Name, k, n, err)
		}
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

func (m *Model) attention(out, q, k, v kernels.Tensor, layer, pos0, n int) {
	if m.err == nil && m.bat != nil {
		if err := m.bat.be.PagedAttention(out, q, k, v, m.bat.pool, layer, n, m.attns[layer]); err != nil {
			m.err = fmt.Errorf("paged attention: %w", err)
		}
		return
	}
	if m.err == nil {
		if err := m.be.Attention(out, q, k, v, m.kv, layer-m.lo, pos0, n, m.attns[layer]); err != nil {
			m.err = fmt.Errorf("attention: %w", err)
		}
	}
}

func (m *Model) siluMul(dst, gate, up kernels.Tensor, n int) {
	if m.err == nil {
		if err := m.be.SiLUMul(dst, gate, up, n); err != nil {
			m.err = fmt.Errorf("silu·mul: %w", err)
		}
	}
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
