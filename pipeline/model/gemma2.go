package model

import (
	"fmt"
	"math"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
)

// gemma2Arch is Gemma 2: embeddings scaled by √Embd; RMS norms before and
// after both sub-blocks (llama.cpp's converter stores Gemma's norm weights
// as 1+w, so they are plain RMS norms here); a GELU-gated feed-forward
// (GeGLU, tanh form); NeoX RoPE; attention scores and output logits
// soft-capped (c·tanh(x/c)); sliding-window attention on every other layer
// (the even ones), global attention on the rest; a tied head.
var gemma2Arch = Arch{
	Name: "gemma2",
	Configure: func(c *Config, md Metadata) error {
		if err := gemmaConfigure(c, md, "gemma2", 2); err != nil {
			return err
		}
		// llama.cpp's defaults where the file does not say.
		c.AttnSoftcap, c.FinalSoftcap = 50, 30
		if v, ok := metaFloat(md, "gemma2.attn_logit_softcapping"); ok {
			c.AttnSoftcap = float32(v)
		}
		if v, ok := metaFloat(md, "gemma2.final_logit_softcapping"); ok {
			c.FinalSoftcap = float32(v)
		}
		return nil
	},
	Block: func(c Config) []TensorSpec { return gemmaBlock(c, false) },
	Layer: gemmaLayer,
	Meta: func(s Shape, add func(string, gguf.Value)) {
		gemmaMeta(s, add)
		add("gemma2.attn_logit_softcapping", gguf.Float32(s.AttnSoftcap))
		add("gemma2.final_logit_softcapping", gguf.Float32(s.FinalSoftcap))
	},
	Presets: map[string]Shape{
		"gemma2-2b": {Embd: 2304, FF: 9216, Layers: 26, Heads: 8, KVHeads: 4, HeadDim: 256, Vocab: 256000, Ctx: 8192, RopeBase: 10000, NormEps: 1e-6,
			Tied: true, SlidingWindow: 4096, AttnSoftcap: 50, FinalSoftcap: 30, ChatTemplate: gemmaTemplate},
		// Small: a window of 8 positions (the tests' 21 positions cross it)
		// and a score cap low enough to bend the scores.
		"tiny-gemma2": {Embd: 256, FF: 512, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 128, Vocab: 512, Ctx: 256, RopeBase: 10000, NormEps: 1e-6, Tied: true, SlidingWindow: 8, AttnSoftcap: 4, FinalSoftcap: 30, ChatTemplate: gemmaTemplate},
	},
}

// gemmaTemplate is Gemma's conversation format (<start_of_turn>user …
// <end_of_turn>; the assistant is "model"), as a Jinja template.
const gemmaTemplate = `{{- bos_token }}{%- for message in messages %}{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}{{- '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<start_of_turn>model\n' }}{%- endif %}`

// gemmaConfigure is what Gemma 2 and 3 share: NeoX RoPE, the embedding
// scale, the score scale, and the sliding window on the local layers of
// the given pattern.
func gemmaConfigure(c *Config, md Metadata, arch string, pattern int) error {
	c.Rope.NeoX = true
	c.EmbedScale = float32(math.Sqrt(float64(c.Embd)))
	// 1/√query_pre_attn_scalar: the head size, except for the 27B models
	// (46 and 62 layers), whose scalar is Embd/Heads (llama.cpp's rule).
	c.AttnScale = float32(1 / math.Sqrt(float64(c.HeadDim)))
	if (arch == "gemma2" && c.Layers == 46) || (arch == "gemma3" && c.Layers == 62) {
		c.AttnScale = float32(1 / math.Sqrt(float64(c.Embd/c.Heads)))
	}
	if w, ok := metaUint(md, arch+".attention.sliding_window"); ok && w > 0 {
		if w > 1<<30 {
			return fmt.Errorf("%s.attention.sliding_window = %d is too large", arch, w)
		}
		c.Window = int(w)
		c.SWAPattern = pattern
	}
	return nil
}

// gemmaMeta writes the sliding window.
func gemmaMeta(s Shape, add func(string, gguf.Value)) {
	if s.SlidingWindow > 0 {
		add(s.Arch+".attention.sliding_window", gguf.Uint32(uint32(s.SlidingWindow)))
	}
}

// gemmaBlock is a Gemma block's table: the Llama tensors, Gemma 3's
// per-head Q/K norms (qkNorm), and the two post-norms.
func gemmaBlock(c Config, qkNorm bool) []TensorSpec {
	t := []TensorSpec{
		vec("attn_norm.weight", c.Embd, KindNorm, fAttnNorm),
		mat("attn_q.weight", c.Embd, c.QDim(), fQ),
	}
	if qkNorm {
		t = append(t, vec("attn_q_norm.weight", c.HeadDim, KindNorm, fQNorm))
	}
	t = append(t, mat("attn_k.weight", c.Embd, c.KVDim(), fK))
	if qkNorm {
		t = append(t, vec("attn_k_norm.weight", c.HeadDim, KindNorm, fKNorm))
	}
	return append(t,
		mat("attn_v.weight", c.Embd, c.KVDim(), fV),
		mat("attn_output.weight", c.QDim(), c.Embd, fO),
		vec("post_attention_norm.weight", c.Embd, KindNorm, fAttnPost),
		vec("ffn_norm.weight", c.Embd, KindNorm, fFFNNorm),
		mat("ffn_gate.weight", c.Embd, c.FF, fGate),
		mat("ffn_up.weight", c.Embd, c.FF, fUp),
		mat("ffn_down.weight", c.FF, c.Embd, fDown),
		vec("post_ffw_norm.weight", c.Embd, KindNorm, fFFNPost),
	)
}

// gemmaLayer is the Gemma 2 / Gemma 3 block on n tokens at positions
// pos0… (the embedding scale and the logit soft-cap are the model's, see
// embed and head):
//
//	xb  = rmsnorm(x) ⊙ attn_norm
//	q   = xb·Wqᵀ   k = xb·Wkᵀ   v = xb·Wvᵀ
//	q,k = rmsnorm_head(q) ⊙ q_norm, rmsnorm_head(k) ⊙ k_norm   (Gemma 3)
//	q,k = rope_neox(q, pos), rope_neox(k, pos)   (layer's base: local or global)
//	att = softmax(cap(q·Kᵀ·scale), causal, window on local layers)·V
//	x   = x + rmsnorm(att·Woᵀ) ⊙ post_attention_norm
//	xb  = rmsnorm(x) ⊙ ffn_norm
//	x   = x + rmsnorm((gelu(xb·Wgateᵀ) ⊙ xb·Wupᵀ)·Wdownᵀ) ⊙ post_ffw_norm
func gemmaLayer(m *Model, lw *LayerWeights, layer, pos0, n, nOut int) error {
	c := m.Cfg
	a := m.s.rows(0, n, c)

	xq := m.preNorm(a, lw.AttnNorm, n)
	m.matmul3(a.q, lw.Q, a.k, lw.K, a.v, lw.V, a.xb, xq, n)
	qw, kw := lw.QNorm, lw.KNorm // Gemma 3's; Gemma 2 has none
	if !c.QKNorm {
		qw, kw = nil, nil
	}
	aq := m.selfAttention(a, qw, kw, layer, pos0, n)
	if nOut == 0 {
		return m.err
	}

	b := m.s.rows(n-nOut, nOut, c)
	m.matmul(b.xb2, lw.O, b.att, aq.View(n-nOut, nOut), nOut)
	m.rmsnorm(b.xb2, b.xb2, lw.AttnPostNorm, nOut)
	m.pending = true // x += xb2

	xq = m.preNorm(b, lw.FFNNorm, nOut)
	m.matmul2(b.gate, lw.Gate, b.up, lw.Up, b.xb, xq, nOut)
	m.geluMul(b.hb, b.gate, b.up, nOut*c.FF)
	m.matmul(b.xb2, lw.Down, b.hb, kernels.Q8{}, nOut) // GELU·mul makes no 8-bit copy
	m.rmsnorm(b.xb2, b.xb2, lw.FFNPostNorm, nOut)
	m.pending = true // x += xb2
	return m.err
}
