package model

import "slices"

// qwen2Arch is Qwen2 and Qwen2.5: the Llama block with Q, K and V biases
// and NeoX RoPE.
var qwen2Arch = Arch{
	Name: "qwen2",
	Configure: func(c *Config, _ Metadata) error {
		c.Rope.NeoX = true // pairs (i, i+Dim/2)
		c.Bias = true
		return nil
	},
	Block: qwen2Block,
	Layer: qwen2Layer,
	Presets: map[string]Shape{
		"tiny-qwen2": {Embd: 256, FF: 512, Layers: 2, Heads: 4, KVHeads: 2, Vocab: 512, Ctx: 256, RopeBase: 1e6, NormEps: 1e-6, Tied: true},
		"qwen2.5-7b": {Embd: 3584, FF: 18944, Layers: 28, Heads: 28, KVHeads: 4, Vocab: 152064, Ctx: 32768, RopeBase: 1e6, NormEps: 1e-6},
	},
}

// qwen2Block is the Llama table with the three biases after the V
// projection (the order of llama.cpp's converter).
func qwen2Block(c Config) []TensorSpec {
	t := llamaBlock(c)
	return slices.Insert(t, 4,
		vec("attn_q.bias", c.QDim(), KindBias, fQBias),
		vec("attn_k.bias", c.KVDim(), KindBias, fKBias),
		vec("attn_v.bias", c.KVDim(), KindBias, fVBias))
}

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

	xq := m.preNorm(a, lw.AttnNorm, n) // adds the previous block's pending output
	m.matmul3(a.q, lw.Q, a.k, lw.K, a.v, lw.V, a.xb, xq, n)
	m.addBias(a.q, lw.QBias, n)
	m.addBias(a.k, lw.KBias, n)
	m.addBias(a.v, lw.VBias, n)
	aq := m.selfAttention(a, nil, nil, layer, pos0, n)
	if nOut == 0 {
		return m.err
	}

	b := m.s.rows(n-nOut, nOut, m.Cfg)
	m.matmul(b.xb2, lw.O, b.att, aq.View(n-nOut, nOut), nOut)
	m.pending = true // x += xb2
	feedForward(m, lw, b, nOut)
	return m.err
}
