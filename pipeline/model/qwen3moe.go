package model

import "strings"

// qwen3moeArch is Qwen3-MoE (Qwen3-30B-A3B, 235B-A22B): the Qwen3 block
// (NeoX RoPE, per-head RMS norms of queries and keys) whose feed-forward
// is a mixture of experts (moe.go): expert_count experts of
// expert_feed_forward_length each, expert_used_count of them per token,
// chosen by a softmax router and weighted renormalised. Every block is a
// mixture; there is no shared expert.
var qwen3moeArch = Arch{
	Name: "qwen3moe",
	Configure: func(c *Config, md Metadata) error {
		c.Rope.NeoX = true
		c.QKNorm = true
		// Without expert_feed_forward_length llama.cpp takes an expert
		// to be feed_forward_length / expert_used_count wide.
		defaultFF := 0
		if k, ok := metaUint(md, "qwen3moe.expert_used_count"); ok && k > 0 && k <= uint64(c.FF) {
			defaultFF = c.FF / int(k)
		}
		return configureExperts(c, md, "qwen3moe", true, defaultFF)
	},
	Block: qwen3moeBlock,
	Layer: qwen3Layer, // its feed-forward runs the experts (feedForward)
	Presets: map[string]Shape{
		// 16 experts, 4 per token: every step routes through several
		// experts and renormalises more than two weights.
		"tiny-qwen3moe": {Embd: 256, FF: 512, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 96, Vocab: 512, Ctx: 256, RopeBase: 1e6, NormEps: 1e-6,
			Experts: 16, ExpertsUsed: 4, ExpertFF: 128, ChatTemplate: chatMLTemplate},
		"qwen3-30b-a3b": {Embd: 2048, FF: 6144, Layers: 48, Heads: 32, KVHeads: 4, HeadDim: 128, Vocab: 151936, Ctx: 40960, RopeBase: 1e6, NormEps: 1e-6,
			Experts: 128, ExpertsUsed: 8, ExpertFF: 768, ChatTemplate: chatMLTemplate},
	},
}

// qwen3moeBlock is Qwen3's attention table and the mixture's feed-forward.
func qwen3moeBlock(c Config) []TensorSpec {
	var b []TensorSpec
	for _, s := range qwen3Block(c) {
		if !strings.HasPrefix(s.Name, "ffn_") {
			b = append(b, s)
		}
	}
	return append(b, moeTensors(c)...)
}
