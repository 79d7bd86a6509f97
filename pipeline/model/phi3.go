package model

import (
	"fmt"

	"github.com/forge-llm/forge/kernels"
)

// phi3Arch is Phi-3 and Phi-3.5 (mini and medium; Phi-4-mini is the same
// block): the Llama block with NeoX RoPE, one fused Q·K·V projection and
// one fused gate·up projection, which the forward pass reads as row views
// of the fused tensors (FinishLayer), never copies. The 128K-context
// models rotate with LongRoPE's per-frequency factors (long beyond the
// original context, short within it) and scale the rotated queries and
// keys by its attention factor. The files' sliding_window key is ignored,
// as llama.cpp (build 11669) ignores it for Phi-3.
var phi3Arch = Arch{
	Name:      "phi3",
	Configure: phi3Configure,
	Globals: func(c Config) []TensorSpec {
		return []TensorSpec{
			globalT("rope_factors_long.weight", c.Rope.Dim/2, 1, KindRopeFactors, true, func(g *GlobalWeights) **kernels.Weight { return &g.RopeLong }),
			globalT("rope_factors_short.weight", c.Rope.Dim/2, 1, KindRopeFactors, true, func(g *GlobalWeights) **kernels.Weight { return &g.RopeShort }),
		}
	},
	Block: phi3Block,
	Layer: phi3Layer,
	Presets: map[string]Shape{
		// Phi-3-mini-128k-instruct: LongRoPE from a 4096-position original.
		"phi3-mini": {Embd: 3072, FF: 8192, Layers: 32, Heads: 32, KVHeads: 32, Vocab: 32064, Ctx: 131072, RopeBase: 10000, NormEps: 1e-5,
			RopeOrigCtx: 4096, ChatTemplate: phi3Template,
			SpecialTokens: []string{"<|endoftext|>", "<|assistant|>", "<|system|>", "<|end|>", "<|user|>"}},
		// Small, with an original context of 32 so that the tests' contexts
		// (64 here, 256 for llama.cpp) both take the long factors.
		"tiny-phi3": {Embd: 256, FF: 512, Layers: 2, Heads: 4, KVHeads: 4, Vocab: 512, Ctx: 256, RopeBase: 10000, NormEps: 1e-5,
			RopeOrigCtx: 32, ChatTemplate: phi3Template},
	},
}

// phi3Template is Phi-3's conversation format, as a Jinja template.
const phi3Template = `{%- for message in messages %}{{- '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|assistant|>\n' }}{%- else %}{{- eos_token }}{%- endif %}`

func phi3Configure(c *Config, md Metadata) error {
	c.Rope.NeoX = true
	if v, ok := metaUint(md, "phi3.rope.scaling.original_context_length"); ok && v > 0 {
		if v > 1<<30 {
			return fmt.Errorf("phi3.rope.scaling.original_context_length = %d is too large", v)
		}
		c.RopeOrigCtx = int(v)
	}
	if v, ok := metaFloat(md, "phi3.rope.scaling.attn_factor"); ok && v != 1 {
		c.RopeAttnFactor = float32(v)
	}
	if c.RopeAttnFactor > 0 && c.Rope.Dim != c.HeadDim {
		// The factor scales the rotated pairs only; forge applies it to
		// whole heads.
		return fmt.Errorf("a rope attention factor with rope dimension %d < head size %d is not supported", c.Rope.Dim, c.HeadDim)
	}
	return nil
}

// phi3Block is Phi-3's tensor table: the fused projections.
func phi3Block(c Config) []TensorSpec {
	return []TensorSpec{
		vec("attn_norm.weight", c.Embd, KindNorm, fAttnNorm),
		mat("attn_qkv.weight", c.Embd, c.QDim()+2*c.KVDim(), fQKV),
		mat("attn_output.weight", c.QDim(), c.Embd, fO),
		vec("ffn_norm.weight", c.Embd, KindNorm, fFFNNorm),
		mat("ffn_up.weight", c.Embd, 2*c.FF, fGateUp),
		mat("ffn_down.weight", c.FF, c.Embd, fDown),
	}
}

// phi3Layer is the Phi-3 block on n tokens at positions pos0…:
//
//	xb    = rmsnorm(x) ⊙ attn_norm
//	q,k,v = xb·Wqkvᵀ's three row ranges (Q, K, V: views of the fused weight)
//	q,k   = f·rope_neox(q, pos), f·rope_neox(k, pos)   (f: LongRoPE's attention factor, 1 without)
//	att   = softmax(q·Kᵀ/√d, causal)·V
//	x     = x + att·Woᵀ
//	x     = x + (silu(xb·Wgateᵀ) ⊙ xb·Wupᵀ)·Wdownᵀ   (gate, up: the first and second half of ffn_up)
func phi3Layer(m *Model, lw *LayerWeights, layer, pos0, n, nOut int) error {
	c := m.Cfg
	a := m.s.rows(0, n, c)

	xq := m.preNorm(a, lw.AttnNorm, n)
	m.matmul3(a.q, lw.Q, a.k, lw.K, a.v, lw.V, a.xb, xq, n)
	m.ropeQK(a, n, pos0, layer)
	if f := c.RopeAttnFactor; f > 0 {
		if n == 1 {
			m.scale(a.qk, f, c.QDim()+c.KVDim())
		} else {
			m.scale(a.q, f, n*c.QDim())
			m.scale(a.k, f, n*c.KVDim())
		}
	}
	aq := m.attention(a.att, a.q, a.k, a.v, a.attQ, layer, pos0, n)
	if nOut == 0 {
		return m.err
	}

	b := m.s.rows(n-nOut, nOut, c)
	m.matmul(b.xb2, lw.O, b.att, aq.View(n-nOut, nOut), nOut)
	m.pending = true // x += xb2
	feedForward(m, lw, b, nOut)
	return m.err
}
