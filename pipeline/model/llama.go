package model

// The Llama block (Llama 2 and 3, TinyLlama, Mistral), pre-norm with a
// SwiGLU feed-forward, on n tokens at positions pos0 … pos0+n-1:
//
//	xb  = rmsnorm(x) ⊙ attn_norm
//	q   = xb·Wqᵀ   k = xb·Wkᵀ   v = xb·Wvᵀ
//	q,k = rope(q, pos), rope(k, pos)
//	att = softmax(q·Kᵀ/√d, causal)·V   (K, V: the cache, grouped-query)
//	x   = x + att·Woᵀ
//	xb  = rmsnorm(x) ⊙ ffn_norm
//	x   = x + (silu(xb·Wgateᵀ) ⊙ xb·Wupᵀ)·Wdownᵀ
//
// Shapes: x, xb [n][Embd]; q, att [n][Heads·HeadDim]; k, v [n][KVHeads·HeadDim];
// gate, up [n][FF]. Only the last nOut rows go on past attention: in the last
// block of a step the other rows only had to leave their keys and values in
// the cache. Each residual add (x = x + …) is left pending and done by the
// norm that follows it (preNorm), in this block or the next, or before
// the output head.
func llamaLayer(m *Model, lw *LayerWeights, layer, pos0, n, nOut int) error {
	a := m.s.rows(0, n, m.Cfg)

	m.preNorm(a, lw.AttnNorm, n)
	m.matmul3(a.q, lw.Q, a.k, lw.K, a.v, lw.V, a.xb, n)
	m.ropeQK(a, n, pos0)
	m.attention(a.att, a.q, a.k, a.v, layer, pos0, n)
	if nOut == 0 {
		return m.err
	}

	b := m.s.rows(n-nOut, nOut, m.Cfg) // the rows that go on
	m.matmul(b.xb2, lw.O, b.att, nOut)
	m.pending = true // x += xb2
	feedForward(m, lw, b, nOut)
	return m.err
}

// feedForward is the SwiGLU sub-block shared by Llama and Qwen2:
//
//	xb = rmsnorm(x) ⊙ ffn_norm
//	x  = x + (silu(xb·Wgateᵀ) ⊙ xb·Wupᵀ)·Wdownᵀ   (the add left pending)
func feedForward(m *Model, lw *LayerWeights, a act, n int) {
	c := m.Cfg
	m.preNorm(a, lw.FFNNorm, n)
	m.matmul2(a.gate, lw.Gate, a.up, lw.Up, a.xb, n)
	m.siluMul(a.hb, a.gate, a.up, n*c.FF)
	m.matmul(a.xb2, lw.Down, a.hb, n)
	m.pending = true // x += xb2
}
