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
}

// rows views rows [first, first+n) of every scratch buffer.
func (s *scratch) rows(first, n int, c Config) act {
	r := func(t kernels.Tensor, w int) kernels.Tensor { return t.View(first*w, n*w) }
	return act{
		x: r(s.x, c.Embd), xb: r(s.xb, c.Embd), xb2: r(s.xb2, c.Embd),
		q: r(s.q, c.QDim()), att: r(s.att, c.QDim()),
		k: r(s.k, c.KVDim()), v: r(s.v, c.KVDim()),
		gate: r(s.gate, c.FF), up: r(s.up, c.FF), hb: r(s.hb, c.FF),
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
		if err := m.be.MatMul(dst, w, x, n); err != nil {
			m.err = fmt.Errorf("matmul %s (%v, %d×%d) by %d rows: %w", w.Name, w.Type, w.Rows, w.Cols, n, err)
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

func (m *Model) rope(x kernels.Tensor, n, heads, pos0 int) {
	if m.err == nil {
		if err := m.be.RoPE(x, n, heads, m.Cfg.HeadDim, pos0, m.ropeParams); err != nil {
			m.err = fmt.Errorf("rope: %w", err)
		}
	}
}

func (m *Model) attention(out, q, k, v kernels.Tensor, layer, pos0, n int) {
	if m.err == nil {
		if err := m.be.Attention(out, q, k, v, m.kv, layer, pos0, n, m.attn); err != nil {
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
