package gguf

import (
	"fmt"
	"math"
)

// Config is the model shape from the "<arch>.*" keys, with llama.cpp's
// defaults where a key is absent.
type Config struct {
	Arch, Name        string
	ContextLength     int // training context
	EmbeddingLength   int
	BlockCount        int
	FeedForwardLength int // largest, where the file gives one per layer
	HeadCount         int // largest, where the file gives one per layer
	HeadCountKV       int // default HeadCount (no grouped-query attention)

	RopeDim           int     // default EmbeddingLength/HeadCount
	RopeFreqBase      float32 // default 10000
	RopeScalingType   string  // default "linear" (with factor 1 a no-op), as llama.cpp
	RopeScalingFactor float32 // default 1
	RopeOrigContext   int     // default ContextLength

	NormEps float32 // attention.layer_norm_rms_epsilon (default 1e-5)

	VocabSize       int // <arch>.vocab_size, else the token list length
	ExpertCount     int
	ExpertUsedCount int
	FileType        int // general.file_type, -1 when absent
}

// Config reads the model configuration. It fails if the architecture,
// context length, embedding length or block count is missing, as llama.cpp
// does.
func (f *File) Config() (Config, error) {
	arch, ok := f.String("general.architecture")
	if !ok {
		return Config{}, fmt.Errorf("gguf: %s: general.architecture missing or not a string", f.Path)
	}
	c := Config{Arch: arch, FileType: -1}
	c.Name, _ = f.String("general.name")
	k := func(s string) string { return arch + "." + s }

	var err error
	need := func(key string, dst *int) {
		if err != nil {
			return
		}
		n, ok := f.intOrMax(key)
		if !ok {
			err = fmt.Errorf("gguf: %s: %s missing or not a non-negative integer", f.Path, key)
			return
		}
		*dst = n
	}
	opt := func(key string, dst *int, def int) {
		if n, ok := f.intOrMax(key); ok {
			*dst = n
		} else {
			*dst = def
		}
	}
	optF := func(key string, def float32) float32 {
		if v, ok := f.Float(key); ok {
			return float32(v)
		}
		return def
	}
	need(k("context_length"), &c.ContextLength)
	need(k("embedding_length"), &c.EmbeddingLength)
	need(k("block_count"), &c.BlockCount)
	if err != nil {
		return Config{}, err
	}
	opt(k("feed_forward_length"), &c.FeedForwardLength, 0)
	opt(k("attention.head_count"), &c.HeadCount, 0)
	opt(k("attention.head_count_kv"), &c.HeadCountKV, c.HeadCount)
	rotDef := 0
	if c.HeadCount > 0 {
		rotDef = c.EmbeddingLength / c.HeadCount
	}
	opt(k("rope.dimension_count"), &c.RopeDim, rotDef)
	c.RopeFreqBase = optF(k("rope.freq_base"), 10000)
	c.RopeScalingType = "linear"
	if s, ok := f.String(k("rope.scaling.type")); ok {
		c.RopeScalingType = s
	}
	// llama.cpp: rope.scaling.factor, else the older rope.scale_linear; 0 means 1.
	c.RopeScalingFactor = optF(k("rope.scaling.factor"), optF(k("rope.scale_linear"), 0))
	if c.RopeScalingFactor == 0 {
		c.RopeScalingFactor = 1
	}
	opt(k("rope.scaling.original_context_length"), &c.RopeOrigContext, c.ContextLength)
	c.NormEps = optF(k("attention.layer_norm_rms_epsilon"), optF(k("attention.layer_norm_epsilon"), 1e-5))
	opt(k("expert_count"), &c.ExpertCount, 0)
	opt(k("expert_used_count"), &c.ExpertUsedCount, 0)
	if n, ok := f.intOrMax(k("vocab_size")); ok {
		c.VocabSize = n
	} else if a, ok := f.Array("tokenizer.ggml.tokens"); ok && a.Len <= math.MaxInt32 {
		c.VocabSize = int(a.Len)
	}
	if n, ok := f.intOrMax("general.file_type"); ok {
		c.FileType = n
	}
	return c, nil
}

// intOrMax reads an integer key, or the largest element of an integer array
// (some architectures give per-layer head counts or feed-forward sizes).
func (f *File) intOrMax(key string) (int, bool) {
	v, ok := f.Lookup(key)
	if !ok {
		return 0, false
	}
	if n, ok := v.Uint(); ok {
		return int(min(n, math.MaxInt32)), true
	}
	a, ok := v.Array()
	if !ok || !a.Elem.isInt() || a.Len == 0 {
		return 0, false
	}
	vals, err := a.Values()
	if err != nil {
		return 0, false
	}
	best := uint64(0)
	for _, v := range vals {
		n, ok := v.Uint()
		if !ok {
			return 0, false
		}
		best = max(best, n)
	}
	return int(min(best, math.MaxInt32)), true
}

// TokenizerMeta is the tokenizer as the file describes it.
type TokenizerMeta struct {
	Model, Pre string // tokenizer.ggml.model ("llama", "gpt2", …) and .pre
	Tokens     []string
	Scores     []float32 // nil when absent
	TokenTypes []int32   // nil when absent
	Merges     []string  // BPE merges, "a b"; nil when absent

	// Special token ids, -1 when absent (after the model's defaults).
	BOS, EOS, UNK, PAD, SEP, EOT int32

	AddBOS, AddEOS, AddSpacePrefix bool
	ChatTemplate                   string
}

// Tokenizer reads the tokenizer metadata. Special ids and flags the file
// does not set get llama.cpp's defaults for the tokenizer model:
//
//	llama (SentencePiece): BOS 1, EOS 2, UNK 0; adds BOS and a space prefix
//	gpt2 (BPE):            BOS = EOS = 11; adds BOS only for the Llama 3
//	                       family of pre-tokenizers (llama3, llama-bpe, tekken, …)
//	bert (WordPiece):      BOS (CLS) 101, SEP 102, UNK 100, PAD 0; adds BOS
//	t5 (Unigram):          EOS 1, UNK 2, PAD 0; adds EOS
//
// As in llama.cpp, a special id outside the vocabulary (such as the
// 0xFFFFFFFF that converters write for "none") leaves the default in place,
// and when no EOT id is given the token whose text is an end-of-turn marker
// ("<|eot_id|>", "<|im_end|>", "<end_of_turn>", …) is used.
func (f *File) Tokenizer() (*TokenizerMeta, error) {
	model, ok := f.String("tokenizer.ggml.model")
	if !ok {
		return nil, fmt.Errorf("gguf: %s: tokenizer.ggml.model missing or not a string", f.Path)
	}
	tm := &TokenizerMeta{Model: model, Pre: "default", BOS: -1, EOS: -1, UNK: -1, PAD: -1, SEP: -1, EOT: -1}
	if p, ok := f.String("tokenizer.ggml.pre"); ok {
		tm.Pre = p
	}
	switch model {
	case "llama":
		tm.BOS, tm.EOS, tm.UNK = 1, 2, 0
		tm.AddBOS, tm.AddSpacePrefix = true, true
	case "gpt2":
		tm.BOS, tm.EOS = 11, 11
		switch tm.Pre {
		case "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "tekken", "chameleon":
			tm.AddBOS = true
		case "glm4", "chatglm-bpe":
			tm.BOS = -1
		}
	case "bert":
		tm.BOS, tm.SEP, tm.UNK, tm.PAD = 101, 102, 100, 0
		tm.AddBOS = true
	case "t5":
		tm.EOS, tm.UNK, tm.PAD = 1, 2, 0
		tm.AddEOS = true
	case "plamo2":
		tm.BOS, tm.EOS, tm.UNK, tm.PAD = 1, 2, 0, 3
	}

	if model != "none" && model != "no_vocab" {
		a, ok := f.Array("tokenizer.ggml.tokens")
		if !ok {
			return nil, fmt.Errorf("gguf: %s: tokenizer.ggml.tokens missing or not an array", f.Path)
		}
		var err error
		if tm.Tokens, err = a.Strings(); err != nil {
			return nil, fmt.Errorf("gguf: %s: tokenizer.ggml.tokens: %w", f.Path, err)
		}
	}
	n := len(tm.Tokens)
	if a, ok := f.Array("tokenizer.ggml.scores"); ok {
		s, err := a.Float32s()
		if err != nil || len(s) != n {
			return nil, fmt.Errorf("gguf: %s: tokenizer.ggml.scores: %d entries for %d tokens (%v)", f.Path, len(s), n, err)
		}
		tm.Scores = s
	}
	if a, ok := f.Array("tokenizer.ggml.token_type"); ok {
		s, err := a.Int32s()
		if err != nil || len(s) != n {
			return nil, fmt.Errorf("gguf: %s: tokenizer.ggml.token_type: %d entries for %d tokens (%v)", f.Path, len(s), n, err)
		}
		tm.TokenTypes = s
	}
	if a, ok := f.Array("tokenizer.ggml.merges"); ok {
		s, err := a.Strings()
		if err != nil {
			return nil, fmt.Errorf("gguf: %s: tokenizer.ggml.merges: %w", f.Path, err)
		}
		tm.Merges = s
	}
	ids := []struct {
		key string
		dst *int32
	}{
		{"tokenizer.ggml.bos_token_id", &tm.BOS},
		{"tokenizer.ggml.eos_token_id", &tm.EOS},
		{"tokenizer.ggml.unknown_token_id", &tm.UNK},
		{"tokenizer.ggml.padding_token_id", &tm.PAD},
		{"tokenizer.ggml.seperator_token_id", &tm.SEP}, // llama.cpp's spelling
		{"tokenizer.ggml.eot_token_id", &tm.EOT},
	}
	for _, id := range ids {
		v, ok := f.Lookup(id.key)
		if !ok {
			continue
		}
		x, ok := v.Int()
		if !ok {
			return nil, fmt.Errorf("gguf: %s: %s = %v is not an integer", f.Path, id.key, v)
		}
		if x < 0 || x >= int64(n) {
			continue // llama.cpp: "bad special token", keep the default
		}
		*id.dst = int32(x)
	}
	flags := []struct {
		key string
		dst *bool
	}{
		{"tokenizer.ggml.add_bos_token", &tm.AddBOS},
		{"tokenizer.ggml.add_eos_token", &tm.AddEOS},
		{"tokenizer.ggml.add_space_prefix", &tm.AddSpacePrefix},
	}
	for _, fl := range flags {
		if b, ok := f.Bool(fl.key); ok {
			*fl.dst = b
		}
	}
	if _, ok := f.Lookup("tokenizer.ggml.eot_token_id"); !ok {
		for i, t := range tm.Tokens {
			if eotTexts[t] {
				tm.EOT = int32(i)
				break
			}
		}
	}
	tm.ChatTemplate, _ = f.String("tokenizer.chat_template")
	return tm, nil
}

// eotTexts are the token texts llama.cpp takes as end of turn when the file
// gives no eot_token_id.
var eotTexts = map[string]bool{
	"<|eot_id|>": true, "<|im_end|>": true, "<|end|>": true, "<end_of_turn>": true,
	"<|endoftext|>": true, "<|end_of_text|>": true, "<EOT>": true, "_<EOT>": true,
	"<｜end▁of▁sentence｜>": true, "<end_of_utterance>": true,
}

// Bounds on hyper-parameters that Validate enforces: far above any
// published model, yet small enough that a structure sized by one of them
// cannot exhaust memory before the tensors are checked against it.
const (
	MaxBlockCount  = 4096
	MaxEmbedding   = 1 << 17
	MaxFeedForward = 1 << 20
	MaxHeads       = 1 << 12
	MaxContext     = 1 << 24
	MaxVocab       = 1 << 23
)

// ConfigError is a hyper-parameter that no model can run with. Key is the
// metadata key it came from (or would have, for a default).
type ConfigError struct {
	Path   string
	Key    string
	Value  any
	Reason string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("gguf: %s: %s = %v: %s", e.Path, e.Key, e.Value, e.Reason)
}

// Validate checks what Config read for values that would crash or poison a
// forward pass (NaN or non-positive epsilon and RoPE base, which make every
// logit NaN) or size memory without bound (a block count of 2³² − 1). It
// is separate from Config so that tools that only describe a file (forge
// inspect) still show a broken one.
func (c Config) Validate(path string) error {
	k := func(s string) string { return c.Arch + "." + s }
	ints := []struct {
		key       string
		v, lo, hi int
	}{
		{k("context_length"), c.ContextLength, 1, MaxContext},
		{k("embedding_length"), c.EmbeddingLength, 1, MaxEmbedding},
		{k("block_count"), c.BlockCount, 1, MaxBlockCount},
		{k("feed_forward_length"), c.FeedForwardLength, 0, MaxFeedForward},
		{k("attention.head_count"), c.HeadCount, 0, MaxHeads},
		{k("attention.head_count_kv"), c.HeadCountKV, 0, MaxHeads},
		{k("rope.dimension_count"), c.RopeDim, 0, MaxEmbedding},
		{k("rope.scaling.original_context_length"), c.RopeOrigContext, 0, MaxContext},
		{k("vocab_size"), c.VocabSize, 0, MaxVocab},
	}
	for _, x := range ints {
		if x.v < x.lo || x.v > x.hi {
			return &ConfigError{path, x.key, x.v, fmt.Sprintf("must be in [%d, %d]", x.lo, x.hi)}
		}
	}
	floats := []struct {
		key    string
		v, max float64
	}{
		{k("attention.layer_norm_rms_epsilon"), float64(c.NormEps), 1},
		{k("rope.freq_base"), float64(c.RopeFreqBase), math.MaxFloat32},
		{k("rope.scaling.factor"), float64(c.RopeScalingFactor), math.MaxFloat32},
	}
	for _, x := range floats {
		if math.IsNaN(x.v) || x.v <= 0 || x.v > x.max {
			return &ConfigError{path, x.key, x.v, fmt.Sprintf("must be a finite number in (0, %g]", x.max)}
		}
	}
	return nil
}
