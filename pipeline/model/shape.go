package model

import (
	"fmt"
	"math"

	"github.com/forge-llm/forge/gguf"
)

// Shape is a model's architecture and size as `forge gen` (pipeline/synth)
// writes it: the metadata a file of that shape carries is derived from it
// (Meta), and the file's tensors are the architecture's table for the
// Config that metadata gives (Tensors), so a generated file is by
// construction one that forge loads.
type Shape struct {
	Arch    string // a registered architecture
	Embd    int
	FF      int
	Layers  int
	Heads   int
	KVHeads int
	// HeadDim is the attention head size; 0: Embd/Heads. When it differs,
	// the file says so in attention.key_length and value_length.
	HeadDim  int
	Vocab    int // 0: the vocabulary's own size
	Ctx      int
	RopeBase float32
	NormEps  float32
	Tied     bool // no output.weight: the head reuses token_embd
	// RopeLinear, when > 1, stretches positions by that factor
	// (rope.scaling.type "linear").
	RopeLinear float32
	// RopeFreqs adds Llama 3.1's rope_freqs.weight: per-frequency divisors
	// for a context extended 8× beyond 8192 positions.
	RopeFreqs bool
	// RopeOrigCtx, when > 0, makes the shape LongRoPE's (Phi-3 128K): the
	// original context, the attention factor √(1 + ln(Ctx/RopeOrigCtx) /
	// ln(RopeOrigCtx)) and the long and short factor tensors.
	RopeOrigCtx int
	// SlidingWindow, when > 0, limits attention to that many most recent
	// positions (Mistral: attention.sliding_window).
	SlidingWindow int
	// AttnSoftcap and FinalSoftcap, when > 0, are Gemma 2's soft-caps of
	// the attention scores and of the logits.
	AttnSoftcap, FinalSoftcap float32
	// ChatTemplate is the model's conversation format (a Jinja template),
	// written as tokenizer.chat_template unless the vocabulary copied
	// into the file brings its own; "": none.
	ChatTemplate string
	// SpecialTokens are control tokens the model's own vocabulary has,
	// which a synthetic byte vocabulary then ends with: its chat template's
	// markers, and those llama.cpp looks up by name for some models (it
	// refuses a file named like Phi-3 whose vocabulary lacks
	// "<|endoftext|>").
	SpecialTokens []string
	// Experts, when > 0, makes the feed-forward a mixture of that many
	// experts (expert_count), ExpertsUsed of them per token
	// (expert_used_count); ExpertFF, when > 0, is an expert's width
	// (expert_feed_forward_length; Qwen3-MoE), else FF.
	Experts, ExpertsUsed, ExpertFF int
	// YaRNFactor, when > 1, extends the context by YaRN (rope.scaling.type
	// "yarn") from YaRNOrigCtx positions (gpt-oss).
	YaRNFactor  float32
	YaRNOrigCtx int
}

// HeadSize is the attention head size: HeadDim, or Embd/Heads.
func (s Shape) HeadSize() int {
	if s.HeadDim > 0 {
		return s.HeadDim
	}
	if s.Heads <= 0 {
		return 0
	}
	return s.Embd / s.Heads
}

// Meta lists the metadata keys of the model (without the tokenizer's), in
// the order they are written: those every architecture shares, then the
// architecture's own.
func (s Shape) Meta() ([]gguf.KV, error) {
	a, err := Lookup(s.Arch)
	if err != nil {
		return nil, fmt.Errorf("model: shape: %w", err)
	}
	var kvs []gguf.KV
	add := func(key string, v gguf.Value) { kvs = append(kvs, gguf.KV{Key: key, Value: v}) }
	p := s.Arch + "."
	hd := s.HeadSize()
	add(p+"context_length", gguf.Uint32(uint32(s.Ctx)))
	add(p+"embedding_length", gguf.Uint32(uint32(s.Embd)))
	add(p+"block_count", gguf.Uint32(uint32(s.Layers)))
	add(p+"feed_forward_length", gguf.Uint32(uint32(s.FF)))
	add(p+"attention.head_count", gguf.Uint32(uint32(s.Heads)))
	add(p+"attention.head_count_kv", gguf.Uint32(uint32(s.KVHeads)))
	if s.Heads > 0 && hd != s.Embd/s.Heads {
		add(p+"attention.key_length", gguf.Uint32(uint32(hd)))
		add(p+"attention.value_length", gguf.Uint32(uint32(hd)))
	}
	add(p+"rope.dimension_count", gguf.Uint32(uint32(hd)))
	add(p+"rope.freq_base", gguf.Float32(s.RopeBase))
	add(p+"attention.layer_norm_rms_epsilon", gguf.Float32(s.NormEps))
	if s.RopeLinear > 1 {
		add(p+"rope.scaling.type", gguf.Str("linear"))
		add(p+"rope.scaling.factor", gguf.Float32(s.RopeLinear))
	}
	if s.YaRNFactor > 1 {
		add(p+"rope.scaling.type", gguf.Str("yarn"))
		add(p+"rope.scaling.factor", gguf.Float32(s.YaRNFactor))
		add(p+"rope.scaling.original_context_length", gguf.Uint32(uint32(s.YaRNOrigCtx)))
	}
	if s.RopeOrigCtx > 0 {
		add(p+"rope.scaling.original_context_length", gguf.Uint32(uint32(s.RopeOrigCtx)))
		scale := float64(s.Ctx) / float64(s.RopeOrigCtx)
		add(p+"rope.scaling.attn_factor", gguf.Float32(float32(math.Sqrt(1+math.Log(scale)/math.Log(float64(s.RopeOrigCtx))))))
	}
	if s.Experts > 0 {
		add(p+"expert_count", gguf.Uint32(uint32(s.Experts)))
		add(p+"expert_used_count", gguf.Uint32(uint32(s.ExpertsUsed)))
	}
	if s.ExpertFF > 0 {
		add(p+"expert_feed_forward_length", gguf.Uint32(uint32(s.ExpertFF)))
	}
	if a.Meta != nil {
		a.Meta(s, add)
	}
	return kvs, nil
}

// Config is the configuration a file of shape s gives (what
// ConfigFromFile reads back from it).
func (s Shape) Config() (Config, error) {
	kvs, err := s.Meta()
	if err != nil {
		return Config{}, err
	}
	md := metaMap{}
	for _, kv := range kvs {
		md[kv.Key] = kv.Value
	}
	gc := gguf.Config{Arch: s.Arch, EmbeddingLength: s.Embd, FeedForwardLength: s.FF, BlockCount: s.Layers,
		HeadCount: s.Heads, HeadCountKV: s.KVHeads, RopeDim: s.HeadSize(), RopeFreqBase: s.RopeBase,
		VocabSize: s.Vocab, ContextLength: s.Ctx, NormEps: s.NormEps}
	if s.RopeLinear > 1 {
		gc.RopeScalingType, gc.RopeScalingFactor = "linear", s.RopeLinear
	}
	if s.YaRNFactor > 1 {
		gc.RopeScalingType, gc.RopeScalingFactor = "yarn", s.YaRNFactor
	}
	c, err := configFromMeta(gc, md)
	if err != nil {
		return Config{}, fmt.Errorf("model: shape: %w", err)
	}
	c.HeadDim = s.HeadSize()
	return c, nil
}

// Tensors lists the tensors a file of shape s holds: the architecture's
// table, less the optional tensors the shape leaves out (output.weight
// when Tied, rope_freqs.weight unless RopeFreqs).
func (s Shape) Tensors() ([]TensorSpec, error) {
	c, err := s.Config()
	if err != nil {
		return nil, err
	}
	var out []TensorSpec
	for _, t := range Tensors(c) {
		switch {
		case t.Name == "output.weight" && s.Tied:
		case t.Name == "rope_freqs.weight" && !s.RopeFreqs:
		case (t.Name == "rope_factors_long.weight" || t.Name == "rope_factors_short.weight") && s.RopeOrigCtx <= 0:
		default:
			out = append(out, t)
		}
	}
	return out, nil
}

// Params is the number of weights of a model of shape s (0 for a shape
// whose architecture is not registered).
func (s Shape) Params() int64 {
	ts, err := s.Tensors()
	if err != nil {
		return 0
	}
	var n int64
	for _, t := range ts {
		n += int64(t.Cols) * int64(t.Rows)
	}
	return n
}
