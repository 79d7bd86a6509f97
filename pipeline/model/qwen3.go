package model

// qwen3Arch is Qwen3 (dense): the Llama block with NeoX RoPE, no biases,
// and an RMS norm over each head of the queries and keys (q_norm, k_norm,
// HeadDim values each) before RoPE. Its heads are often wider than
// Embd/Heads (attention.key_length).
var qwen3Arch = Arch{
	Name: "qwen3",
	Configure: func(c *Config, _ Metadata) error {
		c.Rope.NeoX = true
		c.QKNorm = true
		return nil
	},
	Block: qwen3Block,
	Layer: qwen3Layer,
	Presets: map[string]Shape{
		"tiny-qwen3": {Embd: 256, FF: 512, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 96, Vocab: 512, Ctx: 256, RopeBase: 1e6, NormEps: 1e-6, Tied: true,
			ChatTemplate: chatMLTemplate},
		"qwen3-8b": {Embd: 4096, FF: 12288, Layers: 36, Heads: 32, KVHeads: 8, HeadDim: 128, Vocab: 151936, Ctx: 40960, RopeBase: 1e6, NormEps: 1e-6,
			ChatTemplate: chatMLTemplate},
	},
}

// chatMLTemplate is the ChatML conversation format of the Qwen family
// (<|im_start|>role … <|im_end|>), as a Jinja template.
const chatMLTemplate = `{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}`

// qwen3Block is the Llama table with the two per-head norms after the
// projections they follow.
func qwen3Block(c Config) []TensorSpec {
	return []TensorSpec{
		vec("attn_norm.weight", c.Embd, KindNorm, fAttnNorm),
		mat("attn_q.weight", c.Embd, c.QDim(), fQ),
		vec("attn_q_norm.weight", c.HeadDim, KindNorm, fQNorm),
		mat("attn_k.weight", c.Embd, c.KVDim(), fK),
		vec("attn_k_norm.weight", c.HeadDim, KindNorm, fKNorm),
		mat("attn_v.weight", c.Embd, c.KVDim(), fV),
		mat("attn_output.weight", c.QDim(), c.Embd, fO),
		vec("ffn_norm.weight", c.Embd, KindNorm, fFFNNorm),
		mat("ffn_gate.weight", c.Embd, c.FF, fGate),
		mat("ffn_up.weight", c.Embd, c.FF, fUp),
		mat("ffn_down.weight", c.FF, c.Embd, fDown),
	}
}

// qwen3Layer is the Qwen3 block on n tokens at positions pos0…:
//
//	xb  = rmsnorm(x) ⊙ attn_norm
//	q   = rmsnorm_head(xb·Wqᵀ) ⊙ q_norm   (each HeadDim-wide head alone)
//	k   = rmsnorm_head(xb·Wkᵀ) ⊙ k_norm
//	v   = xb·Wvᵀ
//	q,k = rope_neox(q, pos), rope_neox(k, pos)
//	att = softmax(q·Kᵀ/√HeadDim, causal)·V
//	x   = x + att·Woᵀ
//	x   = x + swiglu(rmsnorm(x) ⊙ ffn_norm)
//
// The head norms are the backend's RMSNorm over n·heads rows of HeadDim.
func qwen3Layer(m *Model, lw *LayerWeights, layer, pos0, n, nOut int) error {
	c := m.Cfg
	a := m.s.rows(0, n, c)

	xq := m.preNorm(a, lw.AttnNorm, n)
	m.matmul3(a.q, lw.Q, a.k, lw.K, a.v, lw.V, a.xb, xq, n)
	aq := m.selfAttention(a, lw.QNorm, lw.KNorm, layer, pos0, n)
	if nOut == 0 {
		return m.err
	}

	b := m.s.rows(n-nOut, nOut, c)
	m.matmul(b.xb2, lw.O, b.att, aq.View(n-nOut, nOut), nOut)
	m.pending = true // x += xb2
	feedForward(m, lw, b, nOut)
	return m.err
}
