// Package synth writes synthetic GGUF models: the tensor names, shapes,
// metadata and quantization mixes of real models (llama.cpp's rules), with
// random weights, through the gguf writer. They exercise the loader, the
// kernels and the benchmarks at real sizes without downloading anything;
// their text is meaningless. `forge gen` is built on it.
package synth

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"

	"github.com/forge-llm/forge/dequant"
	"github.com/forge-llm/forge/gguf"
)

// Shape is a model's architecture and size.
type Shape struct {
	Arch     string // "llama" or "qwen2" (Q, K, V biases, NeoX RoPE)
	Embd     int
	FF       int
	Layers   int
	Heads    int
	KVHeads  int
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
}

// Presets are the shapes of well-known models, plus small ones for tests
// and the 86M-parameter model of the CPU benchmark.
var Presets = map[string]Shape{
	"tiny":        {Arch: "llama", Embd: 256, FF: 512, Layers: 2, Heads: 4, KVHeads: 2, Vocab: 512, Ctx: 256, RopeBase: 10000, NormEps: 1e-5},
	"tiny-qwen2":  {Arch: "qwen2", Embd: 256, FF: 512, Layers: 2, Heads: 4, KVHeads: 2, Vocab: 512, Ctx: 256, RopeBase: 1e6, NormEps: 1e-6, Tied: true},
	"bench86m":    {Arch: "llama", Embd: 768, FF: 2048, Layers: 12, Heads: 12, KVHeads: 12, Vocab: 512, Ctx: 2048, RopeBase: 10000, NormEps: 1e-5},
	"llama2-7b":   {Arch: "llama", Embd: 4096, FF: 11008, Layers: 32, Heads: 32, KVHeads: 32, Vocab: 32000, Ctx: 4096, RopeBase: 10000, NormEps: 1e-5},
	"llama3-8b":   {Arch: "llama", Embd: 4096, FF: 14336, Layers: 32, Heads: 32, KVHeads: 8, Vocab: 128256, Ctx: 8192, RopeBase: 500000, NormEps: 1e-5},
	"llama3-70b":  {Arch: "llama", Embd: 8192, FF: 28672, Layers: 80, Heads: 64, KVHeads: 8, Vocab: 128256, Ctx: 8192, RopeBase: 500000, NormEps: 1e-5},
	"llama3.1-8b": {Arch: "llama", Embd: 4096, FF: 14336, Layers: 32, Heads: 32, KVHeads: 8, Vocab: 128256, Ctx: 131072, RopeBase: 500000, NormEps: 1e-5, RopeFreqs: true},
	"qwen2.5-7b":  {Arch: "qwen2", Embd: 3584, FF: 18944, Layers: 28, Heads: 28, KVHeads: 4, Vocab: 152064, Ctx: 32768, RopeBase: 1e6, NormEps: 1e-6},
}

// PresetNames lists the presets in alphabetical order.
func PresetNames() []string {
	var names []string
	for n := range Presets {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Params is the number of weights of a model of shape s.
func (s Shape) Params() int64 {
	e, f, kv := int64(s.Embd), int64(s.FF), int64(s.KVHeads*(s.Embd/s.Heads))
	layer := e*e*2 + e*kv*2 + 3*e*f + 2*e
	if s.Arch == "qwen2" {
		layer += e + 2*kv
	}
	n := int64(s.Layers)*layer + int64(s.Vocab)*e + e
	if !s.Tied {
		n += int64(s.Vocab) * e
	}
	return n
}

// Options describe the file to write.
type Options struct {
	Shape Shape
	Mix   Mix
	// Vocab is the tokenizer to copy (e.g. from stories260K's GGUF); nil
	// makes a byte-level SentencePiece vocabulary. A vocabulary smaller than
	// Shape.Vocab is padded with unused tokens.
	Vocab *gguf.TokenizerMeta
	Name  string // general.name; default "synthetic"
	// ChatTemplate, when set, is written as tokenizer.chat_template (in
	// place of Vocab's own), so a synthetic model can be chatted with.
	ChatTemplate string
	Seed         uint64
	// Std is the standard deviation of the weight matrices; 0 gives
	// 1/√cols, which keeps activations near unit size at any width.
	Std float64
	// Zero leaves every tensor's bytes zero (holes in a seekable file), for
	// load tests of large shapes where the values do not matter.
	Zero bool
	// Workers fill chunks of rows in parallel while the previous chunks
	// are written; 0: GOMAXPROCS.
	Workers int
	// Fill chooses how weight matrices get their values: FillQuantize (the
	// zero value) quantizes Gaussian draws, FillBlocks writes random valid
	// blocks at disk speed. Norms, biases and rope frequencies are drawn
	// the same way under both.
	Fill Fill
}

// tensor is one tensor to write.
type tensor struct {
	name       string
	cols, rows int
	layer      int // -1 outside blocks
	typ        gguf.Type
	kind       int // what the values look like: weight, norm or bias
}

const (
	kindWeight = iota
	kindNorm
	kindBias
	kindRopeFreqs
)

// tensors lists a shape's tensors in the order llama.cpp's converter
// writes them.
func (o *Options) tensors() []tensor {
	s := o.Shape
	hd := s.Embd / s.Heads
	q, kv := s.Heads*hd, s.KVHeads*hd
	var ts []tensor
	add := func(name string, cols, rows, layer, kind int) {
		ts = append(ts, tensor{name: name, cols: cols, rows: rows, layer: layer, kind: kind,
			typ: TensorType(o.Mix, s, name, cols, rows, layer)})
	}
	add("token_embd.weight", s.Embd, s.Vocab, -1, kindWeight)
	if s.RopeFreqs {
		add("rope_freqs.weight", hd/2, 1, -1, kindRopeFreqs)
	}
	for l := range s.Layers {
		p := fmt.Sprintf("blk.%d.", l)
		add(p+"attn_norm.weight", s.Embd, 1, l, kindNorm)
		add(p+"attn_q.weight", s.Embd, q, l, kindWeight)
		add(p+"attn_k.weight", s.Embd, kv, l, kindWeight)
		add(p+"attn_v.weight", s.Embd, kv, l, kindWeight)
		if s.Arch == "qwen2" {
			add(p+"attn_q.bias", q, 1, l, kindBias)
			add(p+"attn_k.bias", kv, 1, l, kindBias)
			add(p+"attn_v.bias", kv, 1, l, kindBias)
		}
		add(p+"attn_output.weight", q, s.Embd, l, kindWeight)
		add(p+"ffn_norm.weight", s.Embd, 1, l, kindNorm)
		add(p+"ffn_gate.weight", s.Embd, s.FF, l, kindWeight)
		add(p+"ffn_up.weight", s.Embd, s.FF, l, kindWeight)
		add(p+"ffn_down.weight", s.FF, s.Embd, l, kindWeight)
	}
	add("output_norm.weight", s.Embd, 1, -1, kindNorm)
	if !s.Tied {
		add("output.weight", s.Embd, s.Vocab, -1, kindWeight)
	}
	return ts
}

// WriteFile writes a synthetic model to path.
func WriteFile(ctx context.Context, path string, o Options) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("synth: %w", err)
	}
	if err := Write(ctx, f, o); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("synth: %s: %w", path, err)
	}
	return nil
}

// Write writes a synthetic model to out. The bytes depend only on the
// options (not on Workers). Tensors are filled in chunks by Workers
// goroutines while earlier chunks are written (see stream.go), so memory
// stays bounded at any model size; a cancelled ctx stops it within a
// chunk's work.
func Write(ctx context.Context, out io.Writer, o Options) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("synth: %w", err)
	}
	s := &o.Shape
	if s.Arch != "llama" && s.Arch != "qwen2" {
		return fmt.Errorf("synth: architecture %q is not supported (llama, qwen2)", s.Arch)
	}
	if s.Embd <= 0 || s.Heads <= 0 || s.KVHeads <= 0 || s.Embd%s.Heads != 0 || s.Heads%s.KVHeads != 0 || s.Layers <= 0 || s.FF <= 0 {
		return fmt.Errorf("synth: inconsistent shape %+v", *s)
	}
	if o.Mix == "" {
		o.Mix = MixF32
	}
	if _, err := ParseMix(string(o.Mix)); err != nil {
		return err
	}
	voc := o.Vocab
	if voc == nil {
		voc = byteVocab(max(s.Vocab, 259))
	}
	if o.ChatTemplate != "" {
		v := *voc
		v.ChatTemplate = o.ChatTemplate
		voc = &v
	}
	if s.Vocab == 0 {
		s.Vocab = len(voc.Tokens)
	}
	if len(voc.Tokens) > s.Vocab {
		return fmt.Errorf("synth: vocabulary of %d tokens does not fit the shape's %d", len(voc.Tokens), s.Vocab)
	}
	if s.Ctx <= 0 {
		s.Ctx = 2048
	}
	if s.RopeBase == 0 {
		s.RopeBase = 10000
	}
	if s.NormEps == 0 {
		s.NormEps = 1e-5
	}
	if o.Name == "" {
		o.Name = "synthetic"
	}

	w := gguf.NewWriter(out)
	if err := writeMeta(w, &o, voc); err != nil {
		return err
	}
	ts := o.tensors()
	for _, t := range ts {
		if err := w.AddTensor(t.name, t.typ, uint64(t.cols), uint64(t.rows)); err != nil {
			return fmt.Errorf("synth: %w", err)
		}
	}
	if err := w.WriteHeader(); err != nil {
		return fmt.Errorf("synth: %w", err)
	}
	workers := o.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	if err := writeData(ctx, w, ts, &o, workers); err != nil {
		return err
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("synth: %w", err)
	}
	return nil
}

// encode stores float32 values as type t.
func encode(t gguf.Type, v []float32, dst []byte) error {
	switch t {
	case gguf.TypeF32:
		for i, x := range v {
			u := math.Float32bits(x)
			dst[4*i], dst[4*i+1], dst[4*i+2], dst[4*i+3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
		}
		return nil
	case gguf.TypeF16:
		for i, x := range v {
			h := dequant.F32ToF16(x)
			dst[2*i], dst[2*i+1] = byte(h), byte(h>>8)
		}
		return nil
	}
	return dequant.Quantize(t, v, dst)
}

// writeMeta declares the model's metadata: architecture, shape, file type
// and tokenizer.
func writeMeta(w *gguf.Writer, o *Options, voc *gguf.TokenizerMeta) error {
	s := o.Shape
	a := s.Arch + "."
	var err error
	add := func(key string, v gguf.Value) {
		if err == nil {
			err = w.AddKV(key, v)
		}
	}
	add("general.architecture", gguf.Str(s.Arch))
	add("general.name", gguf.Str(o.Name))
	add("general.file_type", gguf.Uint32(o.Mix.fileType()))
	if o.Mix != MixF32 && o.Mix != MixF16 {
		add("general.quantization_version", gguf.Uint32(2))
	}
	add(a+"context_length", gguf.Uint32(uint32(s.Ctx)))
	add(a+"embedding_length", gguf.Uint32(uint32(s.Embd)))
	add(a+"block_count", gguf.Uint32(uint32(s.Layers)))
	add(a+"feed_forward_length", gguf.Uint32(uint32(s.FF)))
	add(a+"attention.head_count", gguf.Uint32(uint32(s.Heads)))
	add(a+"attention.head_count_kv", gguf.Uint32(uint32(s.KVHeads)))
	add(a+"rope.dimension_count", gguf.Uint32(uint32(s.Embd/s.Heads)))
	add(a+"rope.freq_base", gguf.Float32(s.RopeBase))
	add(a+"attention.layer_norm_rms_epsilon", gguf.Float32(s.NormEps))
	if s.RopeLinear > 1 {
		add(a+"rope.scaling.type", gguf.Str("linear"))
		add(a+"rope.scaling.factor", gguf.Float32(s.RopeLinear))
	}
	if err != nil {
		return fmt.Errorf("synth: %w", err)
	}
	return writeVocab(w, voc, s.Vocab)
}

// llama31Freqs fills Llama 3.1's rope frequency divisors, as its converter
// computes them: factor 8 for wavelengths beyond the original 8192-position
// context, 1 for those under a quarter of it, a smooth blend between.
func llama31Freqs(v []float32, base float32) {
	const factor, lowFreq, highFreq, origCtx = 8.0, 1.0, 4.0, 8192.0
	d := 2 * len(v)
	for i := range v {
		freq := math.Pow(float64(base), -2*float64(i)/float64(d))
		wavelen := 2 * math.Pi / freq
		switch {
		case wavelen < origCtx/highFreq:
			v[i] = 1
		case wavelen > origCtx/lowFreq:
			v[i] = factor
		default:
			smooth := (origCtx/wavelen - lowFreq) / (highFreq - lowFreq)
			v[i] = float32(1 / ((1-smooth)/factor + smooth))
		}
	}
}

// writeVocab writes the tokenizer, padded to n tokens.
func writeVocab(w *gguf.Writer, voc *gguf.TokenizerMeta, n int) error {
	tokens := slices.Clone(voc.Tokens)
	scores := slices.Clone(voc.Scores)
	types := slices.Clone(voc.TokenTypes)
	if scores == nil {
		scores = make([]float32, len(tokens))
	}
	if types == nil {
		types = make([]int32, len(tokens))
		for i := range types {
			types[i] = 1 // normal
		}
	}
	for i := len(tokens); i < n; i++ {
		tokens = append(tokens, fmt.Sprintf("<unused%d>", i))
		scores = append(scores, 0)
		types = append(types, 5) // unused
	}
	var err error
	add := func(key string, v gguf.Value) {
		if err == nil {
			err = w.AddKV(key, v)
		}
	}
	add("tokenizer.ggml.model", gguf.Str(voc.Model))
	if voc.Pre != "" && voc.Pre != "default" {
		add("tokenizer.ggml.pre", gguf.Str(voc.Pre))
	}
	add("tokenizer.ggml.tokens", gguf.ArrayOf(tokens))
	add("tokenizer.ggml.scores", gguf.ArrayOf(scores))
	add("tokenizer.ggml.token_type", gguf.ArrayOf(types))
	if len(voc.Merges) > 0 {
		add("tokenizer.ggml.merges", gguf.ArrayOf(voc.Merges))
	}
	ids := []struct {
		key string
		id  int32
	}{
		{"tokenizer.ggml.bos_token_id", voc.BOS},
		{"tokenizer.ggml.eos_token_id", voc.EOS},
		{"tokenizer.ggml.unknown_token_id", voc.UNK},
		{"tokenizer.ggml.padding_token_id", voc.PAD},
		{"tokenizer.ggml.seperator_token_id", voc.SEP},
		{"tokenizer.ggml.eot_token_id", voc.EOT},
	}
	for _, id := range ids {
		if id.id >= 0 {
			add(id.key, gguf.Uint32(uint32(id.id)))
		}
	}
	add("tokenizer.ggml.add_bos_token", gguf.Bool(voc.AddBOS))
	add("tokenizer.ggml.add_eos_token", gguf.Bool(voc.AddEOS))
	add("tokenizer.ggml.add_space_prefix", gguf.Bool(voc.AddSpacePrefix))
	if voc.ChatTemplate != "" {
		add("tokenizer.chat_template", gguf.Str(voc.ChatTemplate))
	}
	if err != nil {
		return fmt.Errorf("synth: vocabulary: %w", err)
	}
	return nil
}

// byteVocab is a SentencePiece-style vocabulary with nothing learnt: the
// control tokens, the 256 byte tokens (so any text encodes by byte
// fallback), then filler pieces up to n tokens.
func byteVocab(n int) *gguf.TokenizerMeta {
	v := &gguf.TokenizerMeta{Model: "llama", Pre: "default", BOS: 1, EOS: 2, UNK: 0, PAD: -1, SEP: -1, EOT: -1, AddBOS: true, AddSpacePrefix: true}
	v.Tokens = append(v.Tokens, "<unk>", "<s>", "</s>")
	v.TokenTypes = append(v.TokenTypes, 2, 3, 3) // unknown, control, control
	for b := range 256 {
		v.Tokens = append(v.Tokens, fmt.Sprintf("<0x%02X>", b))
		v.TokenTypes = append(v.TokenTypes, 6) // byte
	}
	for i := len(v.Tokens); i < n; i++ {
		v.Tokens = append(v.Tokens, fmt.Sprintf("▁w%d", i))
		v.TokenTypes = append(v.TokenTypes, 1)
	}
	v.Scores = make([]float32, len(v.Tokens))
	for i := range v.Scores {
		v.Scores[i] = -float32(i)
	}
	return v
}

// VocabFromFile reads the tokenizer of a GGUF file, to copy into a
// synthetic model (`forge gen --vocab stories260K-F32.gguf`).
func VocabFromFile(path string) (*gguf.TokenizerMeta, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	v, err := f.Tokenizer()
	if err != nil {
		return nil, fmt.Errorf("synth: vocabulary from %s: %w", path, err)
	}
	return v, nil
}
