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
	"github.com/forge-llm/forge/pipeline/model"
)

// Shape is a model's architecture and size: model.Shape, which derives a
// file's metadata and tensor table from the architecture registry
// (pipeline/model/arch.go).
type Shape = model.Shape

// Presets are the shapes of well-known models, plus small ones for tests
// and the 86M-parameter model of the CPU benchmark: every architecture's
// presets (declared in its file in pipeline/model).
var Presets = model.Presets()

// PresetNames lists the presets in alphabetical order.
func PresetNames() []string {
	var names []string
	for n := range Presets {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
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
	// EmbedStd, when > 0, is token_embd's standard deviation instead of
	// Std: a model that scales its embeddings up (Gemma, by √Embd) and
	// ties its head to them needs them smaller than its other weights, or
	// each token's own embedding outweighs everything the blocks add.
	EmbedStd float64
	// NormMean, when > 0, is the mean of the norm weights instead of 1
	// (their spread stays 20 %): with EmbedStd, what lets the blocks of a
	// tied, embedding-scaling model (Gemma) outweigh each token's own
	// embedding and gives its logits a clear spread.
	NormMean float64
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
	// ValidUTF8 gives the byte tokens 0x80–0xFF (pieces of a multi-byte
	// character, not text by themselves) zero rows in the output head, so
	// that greedy output of random weights is always valid UTF-8: a zero
	// row's logit is 0, and among a large vocabulary's random logits the
	// largest is always above it. Servers that parse what they generate
	// (llama-server's chat parser refuses malformed UTF-8 mid-stream) then
	// accept a synthetic model's output, which bench serve's peer needs.
	// The head is token_embd where the shape ties it.
	ValidUTF8 bool

	headRows map[int]bool // rows of the head that ValidUTF8 zeroes (set by Write)
	head     string       // the head's tensor name
}

// tensor is one tensor to write.
type tensor struct {
	name       string
	cols, rows int
	dims       []uint64 // as the file stores them (3-D for experts' tensors)
	layer      int      // -1 outside blocks
	typ        gguf.Type
	kind       model.TensorKind // what the values look like: weight, norm or bias
}

const (
	kindWeight    = model.KindWeight
	kindNorm      = model.KindNorm
	kindBias      = model.KindBias
	kindRopeFreqs = model.KindRopeFreqs
)

// tensors lists a shape's tensors, as the architecture's table gives
// them, in the order llama.cpp's converter writes them.
func (o *Options) tensors() ([]tensor, error) {
	specs, err := o.Shape.Tensors()
	if err != nil {
		return nil, fmt.Errorf("synth: %w", err)
	}
	ts := make([]tensor, 0, len(specs))
	for _, sp := range specs {
		ts = append(ts, tensor{name: sp.Name, cols: sp.Cols, rows: sp.Rows, dims: sp.Dims(), layer: sp.Layer, kind: sp.Kind,
			typ: TensorType(o.Mix, o.Shape, sp.Name, sp.Cols, sp.Rows, sp.Layer)})
	}
	return ts, nil
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
	if _, err := model.Lookup(s.Arch); err != nil {
		return fmt.Errorf("synth: %w", err)
	}
	if s.Embd <= 0 || s.Heads <= 0 || s.KVHeads <= 0 || (s.HeadDim == 0 && s.Embd%s.Heads != 0) || s.HeadDim < 0 ||
		s.Heads%s.KVHeads != 0 || s.Layers <= 0 || s.FF <= 0 {
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
		voc = byteVocab(max(s.Vocab, 259), s.SpecialTokens)
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
	ts, err := o.tensors()
	if err != nil {
		return err
	}
	if o.ValidUTF8 {
		o.headRows, o.head = partialCharTokens(voc), headTensor(ts)
	}
	for _, t := range ts {
		if err := w.AddTensor(t.name, t.typ, t.dims...); err != nil {
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

// partialCharTokens are the ids of a vocabulary's byte tokens 0x80–0xFF:
// each is part of a multi-byte UTF-8 character, invalid text alone.
func partialCharTokens(voc *gguf.TokenizerMeta) map[int]bool {
	ids := map[int]bool{}
	for i, t := range voc.Tokens {
		var b int
		if i < len(voc.TokenTypes) && voc.TokenTypes[i] == 6 { // byte
			if _, err := fmt.Sscanf(t, "<0x%02X>", &b); err == nil && b >= 0x80 {
				ids[i] = true
			}
		}
	}
	return ids
}

// headTensor is the name of the tensor the logits come from: output.weight,
// else the tied token_embd.weight.
func headTensor(ts []tensor) string {
	for _, t := range ts {
		if t.name == "output.weight" {
			return t.name
		}
	}
	return "token_embd.weight"
}

// zeroHeadRows clears the rows [r0, r1) of buf (rowBytes each, starting at
// row r0) that ValidUTF8 zeroes when buf is the head's: zero bytes are a
// zero row in every type the writer stores (float or quantized blocks).
func zeroHeadRows(o *Options, name string, r0, r1, rowBytes int, buf []byte) {
	if len(o.headRows) == 0 || name != o.head {
		return
	}
	for r := r0; r < r1; r++ {
		if o.headRows[r] {
			clear(buf[(r-r0)*rowBytes : (r-r0+1)*rowBytes])
		}
	}
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
	kvs, merr := s.Meta()
	if merr != nil {
		return fmt.Errorf("synth: %w", merr)
	}
	for _, kv := range kvs {
		add(kv.Key, kv.Value)
	}
	if err != nil {
		return fmt.Errorf("synth: %w", err)
	}
	return writeVocab(w, voc, s.Vocab, s.ChatTemplate)
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

// writeVocab writes the tokenizer, padded to n tokens, with the
// vocabulary's chat template, else the shape's (template).
func writeVocab(w *gguf.Writer, voc *gguf.TokenizerMeta, n int, template string) error {
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
		template = voc.ChatTemplate
	}
	if template != "" {
		add("tokenizer.chat_template", gguf.Str(template))
	}
	if err != nil {
		return fmt.Errorf("synth: vocabulary: %w", err)
	}
	return nil
}

// byteVocab is a SentencePiece-style vocabulary with nothing learnt: the
// control tokens, the 256 byte tokens (so any text encodes by byte
// fallback), then filler pieces up to n tokens, the last of them replaced
// by the model's special tokens (control tokens) where it names some.
func byteVocab(n int, specials []string) *gguf.TokenizerMeta {
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
	for k, sp := range specials {
		if i := n - len(specials) + k; i >= 3+256 {
			v.Tokens[i], v.TokenTypes[i] = sp, 3 // control
		}
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
