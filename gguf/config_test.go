package gguf

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"
)

// memFile writes kvs (no tensors) and opens the result.
func memFile(t *testing.T, kvs ...KV) *File {
	t.Helper()
	var buf bytes.Buffer
	w := NewWriter(&buf)
	for _, kv := range kvs {
		if err := w.AddKV(kv.Key, kv.Value); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := OpenReaderAt(bytes.NewReader(buf.Bytes()), int64(buf.Len()), "mem")
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestConfigDefaults(t *testing.T) {
	f := memFile(t,
		KV{"general.architecture", Str("qwen2")},
		KV{"qwen2.context_length", Uint64(32768)}, // any integer type
		KV{"qwen2.embedding_length", Int32(896)},
		KV{"qwen2.block_count", Uint16(24)},
		KV{"qwen2.attention.head_count", Uint32(14)},
		KV{"qwen2.feed_forward_length", ArrayOf([]uint32{4864, 9728, 4864})}, // per layer: the largest
		KV{"tokenizer.ggml.tokens", ArrayOf([]string{"a", "b", "c"})},
	)
	c, err := f.Config()
	if err != nil {
		t.Fatal(err)
	}
	want := Config{Arch: "qwen2", ContextLength: 32768, EmbeddingLength: 896, BlockCount: 24, FeedForwardLength: 9728,
		HeadCount: 14, HeadCountKV: 14, RopeDim: 64, RopeFreqBase: 10000, RopeScalingType: "linear", RopeScalingFactor: 1,
		RopeOrigContext: 32768, NormEps: 1e-5, VocabSize: 3, FileType: -1}
	if c != want {
		t.Errorf("config\n got %+v\nwant %+v", c, want)
	}

	f = memFile(t,
		KV{"general.architecture", Str("llama")},
		KV{"llama.context_length", Uint32(131072)}, KV{"llama.embedding_length", Uint32(4096)}, KV{"llama.block_count", Uint32(32)},
		KV{"llama.attention.head_count", Uint32(32)}, KV{"llama.attention.head_count_kv", Uint32(8)},
		KV{"llama.rope.dimension_count", Uint32(128)}, KV{"llama.rope.freq_base", Float32(500000)},
		KV{"llama.rope.scaling.type", Str("yarn")}, KV{"llama.rope.scaling.factor", Float32(8)},
		KV{"llama.rope.scaling.original_context_length", Uint32(8192)},
		KV{"llama.attention.layer_norm_rms_epsilon", Float32(1e-6)},
		KV{"llama.expert_count", Uint32(8)}, KV{"llama.expert_used_count", Uint32(2)},
		KV{"llama.vocab_size", Uint32(128256)}, KV{"general.file_type", Uint32(15)},
	)
	c, err = f.Config()
	if err != nil {
		t.Fatal(err)
	}
	if c.RopeScalingType != "yarn" || c.RopeScalingFactor != 8 || c.RopeOrigContext != 8192 || c.RopeFreqBase != 500000 ||
		c.NormEps != 1e-6 || c.ExpertCount != 8 || c.ExpertUsedCount != 2 || c.VocabSize != 128256 || c.FileType != 15 || c.HeadCountKV != 8 || c.RopeDim != 128 {
		t.Errorf("config %+v", c)
	}

	for _, c := range []struct {
		kvs  []KV
		want string
	}{
		{nil, "general.architecture missing"},
		{[]KV{{"general.architecture", Uint32(1)}}, "general.architecture missing or not a string"},
		{[]KV{{"general.architecture", Str("llama")}, {"llama.context_length", Uint32(1)}}, "llama.embedding_length missing"},
		{[]KV{{"general.architecture", Str("llama")}, {"llama.context_length", Int32(-1)}}, "llama.context_length missing or not a non-negative integer"},
	} {
		if _, err := memFile(t, c.kvs...).Config(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want %q", c.kvs, err, c.want)
		}
	}
}

func TestTokenizerDefaults(t *testing.T) {
	toks := ArrayOf([]string{"<unk>", "<s>", "</s>", "x", "<|im_end|>", "y", "z", "w", "v", "u", "t", "<|endoftext|>"})
	cases := []struct {
		name string
		kvs  []KV
		want TokenizerMeta
	}{
		{"llama", []KV{{"tokenizer.ggml.model", Str("llama")}},
			TokenizerMeta{Model: "llama", Pre: "default", BOS: 1, EOS: 2, UNK: 0, PAD: -1, SEP: -1, EOT: 4, AddBOS: true, AddSpacePrefix: true}},
		{"gpt2 plain", []KV{{"tokenizer.ggml.model", Str("gpt2")}, {"tokenizer.ggml.pre", Str("qwen2")}},
			TokenizerMeta{Model: "gpt2", Pre: "qwen2", BOS: 11, EOS: 11, UNK: -1, PAD: -1, SEP: -1, EOT: 4}},
		{"gpt2 llama3", []KV{{"tokenizer.ggml.model", Str("gpt2")}, {"tokenizer.ggml.pre", Str("llama-bpe")}},
			TokenizerMeta{Model: "gpt2", Pre: "llama-bpe", BOS: 11, EOS: 11, UNK: -1, PAD: -1, SEP: -1, EOT: 4, AddBOS: true}},
		{"bert", []KV{{"tokenizer.ggml.model", Str("bert")}},
			TokenizerMeta{Model: "bert", Pre: "default", BOS: 101, EOS: -1, UNK: 100, PAD: 0, SEP: 102, EOT: 4, AddBOS: true}},
		{"t5", []KV{{"tokenizer.ggml.model", Str("t5")}},
			TokenizerMeta{Model: "t5", Pre: "default", BOS: -1, EOS: 1, UNK: 2, PAD: 0, SEP: -1, EOT: 4, AddEOS: true}},
		{"ids and flags set", []KV{{"tokenizer.ggml.model", Str("llama")},
			{"tokenizer.ggml.bos_token_id", Uint32(3)}, {"tokenizer.ggml.eos_token_id", Int32(5)},
			{"tokenizer.ggml.padding_token_id", Uint32(0xFFFFFFFF)}, // "none": keeps the default
			{"tokenizer.ggml.unknown_token_id", Uint32(1000)},       // out of range: keeps the default
			{"tokenizer.ggml.seperator_token_id", Uint32(6)}, {"tokenizer.ggml.eot_token_id", Uint32(11)},
			{"tokenizer.ggml.add_bos_token", Bool(false)}, {"tokenizer.ggml.add_eos_token", Bool(true)},
			{"tokenizer.ggml.add_space_prefix", Bool(false)}, {"tokenizer.chat_template", Str("{{ x }}")}},
			TokenizerMeta{Model: "llama", Pre: "default", BOS: 3, EOS: 5, UNK: 0, PAD: -1, SEP: 6, EOT: 11, AddEOS: true, ChatTemplate: "{{ x }}"}},
	}
	for _, c := range cases {
		kvs := append([]KV{{"tokenizer.ggml.tokens", toks}}, c.kvs...)
		tm, err := memFile(t, kvs...).Tokenizer()
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if len(tm.Tokens) != 12 {
			t.Fatalf("%s: %d tokens", c.name, len(tm.Tokens))
		}
		tm.Tokens = nil
		if !tokEqual(*tm, c.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", c.name, *tm, c.want)
		}
	}
	for _, c := range []struct {
		kvs  []KV
		want string
	}{
		{[]KV{{"tokenizer.ggml.tokens", toks}}, "tokenizer.ggml.model missing"},
		{[]KV{{"tokenizer.ggml.model", Str("llama")}}, "tokenizer.ggml.tokens missing"},
		{[]KV{{"tokenizer.ggml.model", Str("llama")}, {"tokenizer.ggml.tokens", toks}, {"tokenizer.ggml.scores", ArrayOf([]float32{1})}}, "scores: 1 entries for 12 tokens"},
		{[]KV{{"tokenizer.ggml.model", Str("llama")}, {"tokenizer.ggml.tokens", toks}, {"tokenizer.ggml.bos_token_id", Str("1")}}, "bos_token_id = \"1\" is not an integer"},
	} {
		if _, err := memFile(t, c.kvs...).Tokenizer(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("error %v, want %q", err, c.want)
		}
	}
}

func tokEqual(a, b TokenizerMeta) bool {
	return a.Model == b.Model && a.Pre == b.Pre && a.BOS == b.BOS && a.EOS == b.EOS && a.UNK == b.UNK && a.PAD == b.PAD &&
		a.SEP == b.SEP && a.EOT == b.EOT && a.AddBOS == b.AddBOS && a.AddEOS == b.AddEOS && a.AddSpacePrefix == b.AddSpacePrefix &&
		a.ChatTemplate == b.ChatTemplate
}

// TestConfigValidate: Validate names the key of each value no model can
// run with; a bundled model's configuration passes.
func TestConfigValidate(t *testing.T) {
	good := Config{Arch: "llama", ContextLength: 128, EmbeddingLength: 64, BlockCount: 5, FeedForwardLength: 172, HeadCount: 8,
		HeadCountKV: 4, RopeDim: 8, RopeFreqBase: 10000, RopeScalingFactor: 1, RopeOrigContext: 128, NormEps: 1e-5, VocabSize: 512}
	if err := good.Validate("m"); err != nil {
		t.Fatal(err)
	}
	nan := float32(math.NaN())
	for _, c := range []struct {
		mod  func(*Config)
		want string
	}{
		{func(c *Config) { c.NormEps = nan }, "llama.attention.layer_norm_rms_epsilon = NaN"},
		{func(c *Config) { c.NormEps = -1 }, "llama.attention.layer_norm_rms_epsilon = -1"},
		{func(c *Config) { c.RopeFreqBase = 0 }, "llama.rope.freq_base = 0"},
		{func(c *Config) { c.RopeFreqBase = float32(math.Inf(1)) }, "llama.rope.freq_base = +Inf"},
		{func(c *Config) { c.RopeScalingFactor = nan }, "llama.rope.scaling.factor = NaN"},
		{func(c *Config) { c.BlockCount = math.MaxInt32 }, "llama.block_count = 2147483647"},
		{func(c *Config) { c.BlockCount = 0 }, "llama.block_count = 0"},
		{func(c *Config) { c.ContextLength = 0 }, "llama.context_length = 0"},
		{func(c *Config) { c.HeadCount = MaxHeads + 1 }, "llama.attention.head_count"},
		{func(c *Config) { c.VocabSize = MaxVocab + 1 }, "llama.vocab_size"},
	} {
		bad := good
		c.mod(&bad)
		err := bad.Validate("m")
		var ce *ConfigError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("error %v, want a *ConfigError containing %q", err, c.want)
		}
	}
}
