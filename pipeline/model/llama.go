package model

import (
	"fmt"

	"github.com/forge-llm/forge/gguf"
)

// llamaArch is the Llama family: Llama 2 and 3, TinyLlama, Mistral (files
// with general.architecture "llama"), ggml's normal RoPE (adjacent pairs).
var llamaArch = Arch{
	Name: "llama",
	// Mistral's sliding window, where the file says so. llama.cpp (build
	// 11669) ignores this key for "llama" files; forge applies it, as the
	// model was trained (the two agree within the window: 4096 positions
	// for Mistral 7B v0.1).
	// Mixtral: a mixture of experts where the file says so
	// (expert_count, ffn_gate_inp and ffn_*_exps; moe.go).
	Configure: func(c *Config, md Metadata) error {
		if err := configureExperts(c, md, "llama", false, c.FF); err != nil {
			return err
		}
		if w, ok := metaUint(md, "llama.attention.sliding_window"); ok && w > 0 {
			if w > 1<<30 {
				return fmt.Errorf("llama.attention.sliding_window = %d is too large", w)
			}
			c.Window = int(w)
		}
		return nil
	},
	Block: llamaBlock,
	Layer: llamaLayer,
	Meta: func(s Shape, add func(string, gguf.Value)) {
		if s.SlidingWindow > 0 {
			add("llama.attention.sliding_window", gguf.Uint32(uint32(s.SlidingWindow)))
		}
	},
	Presets: map[string]Shape{
		"tiny":        {Embd: 256, FF: 512, Layers: 2, Heads: 4, KVHeads: 2, Vocab: 512, Ctx: 256, RopeBase: 10000, NormEps: 1e-5},
		"bench86m":    {Embd: 768, FF: 2048, Layers: 12, Heads: 12, KVHeads: 12, Vocab: 512, Ctx: 2048, RopeBase: 10000, NormEps: 1e-5},
		"llama2-7b":   {Embd: 4096, FF: 11008, Layers: 32, Heads: 32, KVHeads: 32, Vocab: 32000, Ctx: 4096, RopeBase: 10000, NormEps: 1e-5},
		"llama3-8b":   {Embd: 4096, FF: 14336, Layers: 32, Heads: 32, KVHeads: 8, Vocab: 128256, Ctx: 8192, RopeBase: 500000, NormEps: 1e-5},
		"llama3-70b":  {Embd: 8192, FF: 28672, Layers: 80, Heads: 64, KVHeads: 8, Vocab: 128256, Ctx: 8192, RopeBase: 500000, NormEps: 1e-5},
		"llama3.1-8b": {Embd: 4096, FF: 14336, Layers: 32, Heads: 32, KVHeads: 8, Vocab: 128256, Ctx: 131072, RopeBase: 500000, NormEps: 1e-5, RopeFreqs: true},
		// Llama 3.1's RoPE scaling (rope_freqs.weight), small.
		"tiny-llama3.1": {Embd: 256, FF: 512, Layers: 2, Heads: 4, KVHeads: 2, Vocab: 512, Ctx: 256, RopeBase: 500000, NormEps: 1e-5, RopeFreqs: true,
			ChatTemplate: llama3Template},
		// Mistral 7B v0.1: sliding-window attention over 4096 positions.
		"mistral-7b": {Embd: 4096, FF: 14336, Layers: 32, Heads: 32, KVHeads: 8, Vocab: 32000, Ctx: 32768, RopeBase: 10000, NormEps: 1e-5,
			SlidingWindow: 4096, ChatTemplate: mistralTemplate},
		"tiny-mistral": {Embd: 256, FF: 512, Layers: 2, Heads: 4, KVHeads: 1, Vocab: 512, Ctx: 256, RopeBase: 10000, NormEps: 1e-5,
			SlidingWindow: 32, ChatTemplate: mistralTemplate},
		// Mixtral 8x7B: 8 experts, 2 per token.
		"mixtral-8x7b": {Embd: 4096, FF: 14336, Layers: 32, Heads: 32, KVHeads: 8, Vocab: 32000, Ctx: 32768, RopeBase: 1e6, NormEps: 1e-5,
			Experts: 8, ExpertsUsed: 2, ChatTemplate: mistralTemplate},
		"tiny-mixtral": {Embd: 256, FF: 256, Layers: 2, Heads: 4, KVHeads: 2, Vocab: 512, Ctx: 256, RopeBase: 1e6, NormEps: 1e-5,
			Experts: 8, ExpertsUsed: 2, ChatTemplate: mistralTemplate},
	},
}

// llama3Template is Llama 3's conversation format, as a Jinja template.
const llama3Template = `{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}`

// mistralTemplate is Mistral's [INST] conversation format, as a Jinja
// template.
const mistralTemplate = `{{- bos_token }}{%- for message in messages %}{%- if message['role'] == 'user' %}{{- '[INST] ' + message['content'] + ' [/INST]' }}{%- elif message['role'] == 'assistant' %}{{- ' ' + message['content'] + eos_token }}{%- endif %}{%- endfor %}`

// llamaBlock is a Llama block's tensor table: attention, then the SwiGLU
// feed-forward (Mixtral's: the mixture of experts).
func llamaBlock(c Config) []TensorSpec {
	if c.Experts > 0 {
		return append(attentionTensors(c), moeTensors(c)...)
	}
	return append(attentionTensors(c), ffnTensors(c)...)
}

// attentionTensors are the pre-norm, Q, K, V and output projections of a
// Llama-style block.
func attentionTensors(c Config) []TensorSpec {
	return []TensorSpec{
		vec("attn_norm.weight", c.Embd, KindNorm, fAttnNorm),
		mat("attn_q.weight", c.Embd, c.QDim(), fQ),
		mat("attn_k.weight", c.Embd, c.KVDim(), fK),
		mat("attn_v.weight", c.Embd, c.KVDim(), fV),
		mat("attn_output.weight", c.QDim(), c.Embd, fO),
	}
}

// ffnTensors are the pre-norm and the gate, up and down projections of a
// SwiGLU feed-forward.
func ffnTensors(c Config) []TensorSpec {
	return []TensorSpec{
		vec("ffn_norm.weight", c.Embd, KindNorm, fFFNNorm),
		mat("ffn_gate.weight", c.Embd, c.FF, fGate),
		mat("ffn_up.weight", c.Embd, c.FF, fUp),
		mat("ffn_down.weight", c.FF, c.Embd, fDown),
	}
}

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

	xq := m.preNorm(a, lw.AttnNorm, n)
	m.matmul3(a.q, lw.Q, a.k, lw.K, a.v, lw.V, a.xb, xq, n)
	aq := m.selfAttention(a, nil, nil, layer, pos0, n)
	if nOut == 0 {
		return m.err
	}

	b := m.s.rows(n-nOut, nOut, m.Cfg) // the rows that go on
	m.matmul(b.xb2, lw.O, b.att, aq.View(n-nOut, nOut), nOut)
	m.pending = true // x += xb2
	feedForward(m, lw, b, nOut)
	return m.err
}

// feedForward is the SwiGLU sub-block shared by Llama, Qwen2 and Qwen3:
//
//	xb = rmsnorm(x) ⊙ ffn_norm
//	x  = x + (silu(xb·Wgateᵀ) ⊙ xb·Wupᵀ)·Wdownᵀ   (the add left pending)
//
// or, in a mixture of experts (Mixtral, Qwen3-MoE), moeFeedForward.
func feedForward(m *Model, lw *LayerWeights, a act, n int) {
	c := m.Cfg
	if c.Experts > 0 {
		moeFeedForward(m, lw, a, n)
		return
	}
	xq := m.preNorm(a, lw.FFNNorm, n)
	m.matmul2(a.gate, lw.Gate, a.up, lw.Up, a.xb, xq, n)
	hq := m.siluMulQ(a.hb, a.gate, a.up, n*c.FF, m.q8Store(a.hbQ, n))
	m.matmul(a.xb2, lw.Down, a.hb, hq, n)
	m.pending = true // x += xb2
}
