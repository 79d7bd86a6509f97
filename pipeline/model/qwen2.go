package model

// The Qwen2 / Qwen2.5 block: the Llama block with biases on the Q, K and V
// projections and NeoX-style RoPE (pairs (i, i+d/2) instead of (2i, 2i+1),
// set in Config.Rope), on n tokens at positions pos0 … pos0+n-1:
//
//	xb  = rmsnorm(x) ⊙ attn_norm
//	q   = xb·Wqᵀ + bq   k = xb·Wkᵀ + bk   v = xb·Wvᵀ + bv
//	q,k = rope_neox(q, pos), rope_neox(k, pos)
//	att = softmax(q·Kᵀ/√d, causal)·V
//	x   = x + att·Woᵀ
//	x   = x + swiglu(rmsnorm(x) ⊙ ffn_norm)
//
// Shapes as in llamaLayer.
func qwen2Layer(m *Model, lw *LayerWeights, layer, pos0, n, nOut int) error {
	a := m.s.rows(0, n, m.Cfg)

	m.preNorm(a, lw.AttnNorm, n) // adds the previous block's pending output
	m.matmul3(a.q, lw.Q, a.k, lw.K, a.v, lw.V, a.xb, n)
	m.addBias(a.q, lw.QBias, n)
	m.addBias(a.k, lw.KBias, n)
	m.addBias(a.v, lw.VBias, n)
	m.ropeQK(a, n, pos0)
	m.attention(a.att, a.q, a.k, a.v, layer, pos0, n)
	if nOut == 0 {
		return m.err
	}

	b := m.s.rows(n-nOut, nOut, m.Cfg)
	m.matmul(b.xb2, lw.O, b.att, nOut)
	m.pending = true // x += xb2
	feedForward(m, lw, b, nOut)
	return m.err
}
