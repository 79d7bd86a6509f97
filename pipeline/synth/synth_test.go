package synth

import (
	"bytes"
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/forge-llm/forge/dequant"
	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/pipeline/model"
)

// TestMain fails the package if a test leaves a goroutine behind (the
// fill pipeline's dispatcher and workers must all stop before Write
// returns, on success, error or cancellation).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// layerOf returns the block index in a tensor name, -1 outside blocks.
func layerOf(name string) int {
	if !strings.HasPrefix(name, "blk.") {
		return -1
	}
	rest := name[4:]
	n, _ := strconv.Atoi(rest[:strings.IndexByte(rest, '.')])
	return n
}

// TestMixMatchesLlamaQuantize checks TensorType against the types
// llama-quantize actually chose in the bundled files.
func TestMixMatchesLlamaQuantize(t *testing.T) {
	stories := Shape{Arch: "llama", Embd: 64, FF: 172, Layers: 5, Heads: 8, KVHeads: 4, Vocab: 512}
	synthKQ := Shape{Arch: "llama", Embd: 256, FF: 512, Layers: 1, Heads: 4, KVHeads: 2, Vocab: 512}
	cases := []struct {
		file  string
		shape Shape
		mix   Mix
	}{
		{"stories260K-Q4_K_M.gguf", stories, MixQ4_KM},
		{"stories260K-Q8_0.gguf", stories, MixQ8_0},
		{"stories260K-F16.gguf", stories, MixF16},
		{"stories260K-F32.gguf", stories, MixF32},
		{"synth-kq-Q4_K_M.gguf", synthKQ, MixQ4_KM},
		{"synth-kq-F32.gguf", synthKQ, MixF32},
	}
	for _, c := range cases {
		f, err := gguf.Open(testmodels.Path(t, c.file))
		if err != nil {
			t.Fatal(err)
		}
		for _, ti := range f.Tensors {
			got := TensorType(c.mix, c.shape, ti.Name, int(ti.Dims[0]), int(ti.Rows()), layerOf(ti.Name))
			if got != ti.Type {
				t.Errorf("%s: %s: mix %s gives %v, llama-quantize chose %v", c.file, ti.Name, c.mix, got, ti.Type)
			}
		}
		f.Close()
	}
	// stories260K-Q4_0 was made with ffn_down forced to F16 (172 is not a
	// multiple of 32), which is also what the fallback picks.
	f, err := gguf.Open(testmodels.Path(t, "stories260K-Q4_0.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, ti := range f.Tensors {
		if got := TensorType(MixQ4_0, stories, ti.Name, int(ti.Dims[0]), int(ti.Rows()), layerOf(ti.Name)); got != ti.Type {
			t.Errorf("stories260K-Q4_0: %s: got %v, file has %v", ti.Name, got, ti.Type)
		}
	}
}

// TestQ4KMLayerRule checks the layers that get Q6_K in a 32-layer model:
// the first and last four, and every third from layer 6 (llama.cpp's
// use_more_bits), and that the head of a real-size model is Q6_K.
func TestQ4KMLayerRule(t *testing.T) {
	s := Presets["llama3-8b"]
	var more []int
	for l := range s.Layers {
		if TensorType(MixQ4_KM, s, "blk.0.ffn_down.weight", s.FF, s.Embd, l) == gguf.TypeQ6_K {
			more = append(more, l)
		}
	}
	want := []int{0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31}
	if len(more) != len(want) {
		t.Fatalf("Q6_K ffn_down layers %v, want %v", more, want)
	}
	for i := range want {
		if more[i] != want[i] {
			t.Fatalf("Q6_K ffn_down layers %v, want %v", more, want)
		}
	}
	if got := TensorType(MixQ4_KM, s, "output.weight", s.Embd, s.Vocab, -1); got != gguf.TypeQ6_K {
		t.Errorf("output: %v, want Q6_K", got)
	}
	if got := TensorType(MixQ4_0, s, "output.weight", s.Embd, s.Vocab, -1); got != gguf.TypeQ6_K {
		t.Errorf("q4_0 output: %v, want Q6_K", got)
	}
	if got := TensorType(MixQ4_KM, s, "token_embd.weight", s.Embd, s.Vocab, -1); got != gguf.TypeQ4_K {
		t.Errorf("token_embd: %v, want Q4_K", got)
	}
	s70 := Presets["llama3-70b"]
	if got := TensorType(MixQ4_KM, s70, "blk.20.attn_v.weight", s70.Embd, 1024, 20); got != gguf.TypeQ5_K {
		t.Errorf("70B attn_v on a plain layer: %v, want Q5_K", got)
	}
}

func storiesVocab(t *testing.T) *gguf.TokenizerMeta {
	v, err := VocabFromFile(testmodels.Path(t, "stories260K-F32.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestWriteReadBack writes small models in every mix and reads them back:
// metadata, tensor types, vocabulary and the weights' statistics.
func TestWriteReadBack(t *testing.T) {
	voc := storiesVocab(t)
	dir := t.TempDir()
	for _, preset := range []string{"tiny", "tiny-qwen2"} {
		for _, mix := range Mixes() {
			s := Presets[preset]
			path := filepath.Join(dir, preset+"-"+string(mix)+".gguf")
			if err := WriteFile(context.Background(), path, Options{Shape: s, Mix: mix, Vocab: voc, Seed: 7}); err != nil {
				t.Fatal(err)
			}
			f, err := gguf.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			c, err := f.Config()
			if err != nil {
				t.Fatal(err)
			}
			if c.Arch != s.Arch || c.EmbeddingLength != s.Embd || c.BlockCount != s.Layers || c.HeadCountKV != s.KVHeads || c.FeedForwardLength != s.FF || c.VocabSize != 512 {
				t.Errorf("%s: config %+v does not match shape %+v", path, c, s)
			}
			tm, err := f.Tokenizer()
			if err != nil {
				t.Fatal(err)
			}
			if len(tm.Tokens) != len(voc.Tokens) || tm.Tokens[300] != voc.Tokens[300] || tm.BOS != voc.BOS || tm.Scores[400] != voc.Scores[400] {
				t.Errorf("%s: vocabulary not copied", path)
			}
			_, hasOut := f.Tensor("output.weight")
			if hasOut == s.Tied {
				t.Errorf("%s: output.weight present = %v with tied = %v", path, hasOut, s.Tied)
			}
			if _, ok := f.Tensor("blk.1.attn_q.bias"); ok != (s.Arch == "qwen2") {
				t.Errorf("%s: attn_q.bias present = %v", path, ok)
			}
			for _, ti := range f.Tensors {
				want := TensorType(mix, s, ti.Name, int(ti.Dims[0]), int(ti.Rows()), layerOf(ti.Name))
				if ti.Type != want {
					t.Errorf("%s: %s is %v, want %v", path, ti.Name, ti.Type, want)
				}
			}
			// A weight matrix: mean ≈ 0, std ≈ 1/√cols (quantization adds
			// a few percent of noise at 4 bits).
			ti, _ := f.Tensor("blk.0.ffn_gate.weight")
			data, err := f.TensorData(ti)
			if err != nil {
				t.Fatal(err)
			}
			v := make([]float32, ti.Elements())
			if err := dequant.ToFloat32(ti.Type, data, v); err != nil {
				t.Fatal(err)
			}
			mean, sq := 0.0, 0.0
			for _, x := range v {
				mean += float64(x)
				sq += float64(x) * float64(x)
			}
			mean /= float64(len(v))
			std := math.Sqrt(sq/float64(len(v)) - mean*mean)
			want := 1 / math.Sqrt(float64(s.Embd))
			if math.Abs(mean) > 0.05*want || math.Abs(std-want) > 0.1*want {
				t.Errorf("%s: ffn_gate mean %.4g std %.4g, want 0 and %.4g", path, mean, std, want)
			}
			f.Close()
		}
	}
}

// writeThree writes o three times: with one worker, with workers, and
// with workers and the next seed.
func writeThree(t *testing.T, o Options, workers int) (a, b, c *bytes.Buffer) {
	t.Helper()
	a, b, c = new(bytes.Buffer), new(bytes.Buffer), new(bytes.Buffer)
	o.Workers = 1
	if err := Write(context.Background(), a, o); err != nil {
		t.Fatal(err)
	}
	o.Workers = workers
	if err := Write(context.Background(), b, o); err != nil {
		t.Fatal(err)
	}
	o.Seed++
	if err := Write(context.Background(), c, o); err != nil {
		t.Fatal(err)
	}
	return a, b, c
}

// TestDeterministic: the bytes depend on the seed, not on the worker count.
func TestDeterministic(t *testing.T) {
	a, b, c := writeThree(t, Options{Shape: Presets["tiny"], Mix: MixQ4_KM, Seed: 3}, 5)
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Error("1 and 5 workers wrote different bytes")
	}
	if bytes.Equal(a.Bytes(), c.Bytes()) {
		t.Error("seeds 3 and 4 wrote the same bytes")
	}
	// The built-in byte vocabulary makes a usable SentencePiece tokenizer.
	f, err := gguf.OpenReaderAt(bytes.NewReader(a.Bytes()), int64(a.Len()), "tiny")
	if err != nil {
		t.Fatal(err)
	}
	tm, err := f.Tokenizer()
	if err != nil {
		t.Fatal(err)
	}
	if tm.Model != "llama" || len(tm.Tokens) != 512 || tm.Tokens[3+'A'] != "<0x41>" {
		t.Errorf("byte vocabulary: model %q, %d tokens, token %d = %q", tm.Model, len(tm.Tokens), 3+'A', tm.Tokens[3+'A'])
	}
}

// TestZeroLargePreset writes llama3-70b's header and holes (no values) and
// checks the sizes add up to a Q4_K_M 70B file (~40 GiB).
func TestZeroLargePreset(t *testing.T) {
	s := Presets["llama3-70b"]
	smallVocab := byteVocab(1000, nil) // padded to 128256 in the file
	path := filepath.Join(t.TempDir(), "70b.gguf")
	if err := WriteFile(context.Background(), path, Options{Shape: s, Mix: MixQ4_KM, Zero: true, Vocab: smallVocab}); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if got := len(f.Tensors); got != 2+80*9+1 {
		t.Errorf("%d tensors, want %d", got, 2+80*9+1)
	}
	gib := float64(f.Size) / (1 << 30)
	if gib < 38 || gib > 44 {
		t.Errorf("70B Q4_K_M file is %.1f GiB, want about 40", gib)
	}
	if p := s.Params(); p < 69e9 || p > 72e9 {
		t.Errorf("llama3-70b has %d parameters, want about 70.6e9", p)
	}
	if p := Presets["bench86m"].Params(); p < 84e6 || p > 87e6 {
		t.Errorf("bench86m has %d parameters, want about 86e6", p)
	}
}

// stats are a dequantized tensor's moments.
type stats struct {
	mean, std float64
	// groupDev is the mean absolute deviation of the means of groups of 32
	// consecutive values from the overall mean: about 0.14·std for
	// well-centred groups, several std when groups carry offsets.
	groupDev float64
	finite   bool
}

func statsOf(v []float32) stats {
	s := stats{finite: true}
	sum, sq := 0.0, 0.0
	for _, x := range v {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			s.finite = false
		}
		sum += float64(x)
		sq += float64(x) * float64(x)
	}
	n := float64(len(v))
	s.mean = sum / n
	s.std = math.Sqrt(max(sq/n-s.mean*s.mean, 0))
	groups := 0
	for g := 0; g+32 <= len(v); g += 32 {
		gs := 0.0
		for _, x := range v[g : g+32] {
			gs += float64(x)
		}
		s.groupDev += math.Abs(gs/32 - s.mean)
		groups++
	}
	s.groupDev /= float64(max(groups, 1))
	return s
}

// checkStats asserts the statistics FillBlocks promises: finite values,
// the target std within 10 % (the recipes are exact in expectation and
// land within 1 %; the slack covers f16 rounding of the scales and
// sampling noise), a mean under 5 % of the std, and centred groups
// (0.14·std is pure sampling noise; a wrong K-quant min packing gives
// 0.36).
func checkStats(t *testing.T, what string, v []float32, want float64) {
	t.Helper()
	s := statsOf(v)
	if !s.finite {
		t.Errorf("%s: non-finite values", what)
	}
	if math.Abs(s.std/want-1) > 0.10 {
		t.Errorf("%s: std %.4g, want %.4g (ratio %.3f)", what, s.std, want, s.std/want)
	}
	if math.Abs(s.mean) > 0.05*s.std {
		t.Errorf("%s: mean %.3g is %.3f of the std", what, s.mean, math.Abs(s.mean)/s.std)
	}
	if s.groupDev > 0.25*s.std {
		t.Errorf("%s: groups of 32 are off-centre by %.3f std on average", what, s.groupDev/s.std)
	}
}

// TestFillBlocksEveryType fills 64×512 weights of every type with a block
// recipe and checks the dequantized statistics, for two target stds.
func TestFillBlocksEveryType(t *testing.T) {
	const rows, cols = 64, 512
	for _, typ := range []gguf.Type{gguf.TypeF32, gguf.TypeF16, gguf.TypeQ4_0, gguf.TypeQ4_1, gguf.TypeQ5_0,
		gguf.TypeQ5_1, gguf.TypeQ8_0, gguf.TypeQ4_K, gguf.TypeQ5_K, gguf.TypeQ6_K} {
		if !blockFillable(typ) {
			t.Errorf("%v has no block recipe", typ)
			continue
		}
		for _, std := range []float64{1 / math.Sqrt(cols), 1 / math.Sqrt(28672)} {
			rb, _ := typ.RowBytes(cols)
			buf := make([]byte, rows*int(rb))
			r := chunkRNG(1, 2, 3)
			fillBlocks(typ, buf, newBlockScales(typ, std), &r)
			v := make([]float32, rows*cols)
			if err := dequant.ToFloat32(typ, buf, v); err != nil {
				t.Fatal(err)
			}
			checkStats(t, typ.String(), v, std)
		}
	}
}

// TestPresetsUseBlockRecipes: every weight matrix of every preset and mix
// has a block recipe, so `forge gen --fill blocks` never falls back to the
// quantizer on a real shape (70B's Q5_K attn_v included).
func TestPresetsUseBlockRecipes(t *testing.T) {
	for _, name := range PresetNames() {
		for _, mix := range Mixes() {
			o := Options{Shape: Presets[name], Mix: mix}
			all, err := o.tensors()
			if err != nil {
				t.Fatal(err)
			}
			for _, ts := range all {
				if ts.kind == kindWeight && !blockFillable(ts.typ) {
					t.Errorf("%s %s: %s is %v, which has no block recipe", name, mix, ts.name, ts.typ)
				}
			}
		}
	}
}

// TestWriteBlocks writes the small presets in every mix with FillBlocks:
// every weight matrix dequantizes to finite values with std ≈ 1/√cols and
// mean ≈ 0, differs from the quantize fill's, and the norms and biases are
// the quantize fill's bytes exactly (they share that path).
func TestWriteBlocks(t *testing.T) {
	dir := t.TempDir()
	for _, preset := range []string{"tiny", "tiny-qwen2"} {
		for _, mix := range Mixes() {
			s := Presets[preset]
			var files [2]*gguf.File
			for i, fill := range []Fill{FillBlocks, FillQuantize} {
				path := filepath.Join(dir, preset+"-"+string(mix)+"-"+fill.String()+".gguf")
				if err := WriteFile(context.Background(), path, Options{Shape: s, Mix: mix, Seed: 9, Fill: fill}); err != nil {
					t.Fatal(err)
				}
				f, err := gguf.Open(path)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				files[i] = f
			}
			blocks, quant := files[0], files[1]
			for i := range blocks.Tensors {
				ti := &blocks.Tensors[i]
				what := preset + " " + string(mix) + " " + ti.Name
				data, err := blocks.TensorData(ti)
				if err != nil {
					t.Fatal(err)
				}
				qi, _ := quant.Tensor(ti.Name)
				qdata, err := quant.TensorData(qi)
				if err != nil {
					t.Fatal(err)
				}
				if ti.Rows() == 1 { // norms and biases
					if !bytes.Equal(data, qdata) {
						t.Errorf("%s: vector differs between the fills", what)
					}
					continue
				}
				if bytes.Equal(data, qdata) {
					t.Errorf("%s: the block fill wrote the quantize fill's bytes", what)
				}
				v := make([]float32, ti.Elements())
				if err := dequant.ToFloat32(ti.Type, data, v); err != nil {
					t.Fatal(err)
				}
				checkStats(t, what+" ("+ti.Type.String()+")", v, 1/math.Sqrt(float64(ti.Dims[0])))
			}
		}
	}
}

// TestDeterministicBlocks: with FillBlocks the bytes depend on the seed,
// not on the worker count, also for tensors cut into several chunks (the
// 8192×512 F16 embedding is 8 MiB, two chunks).
func TestDeterministicBlocks(t *testing.T) {
	cases := []struct {
		s   Shape
		mix Mix
	}{
		{Presets["tiny"], MixQ4_KM},
		{Shape{Arch: "llama", Embd: 512, FF: 256, Layers: 1, Heads: 4, KVHeads: 2, Vocab: 8192, Tied: true}, MixF16},
	}
	for _, c := range cases {
		mix := c.mix
		a, b, c := writeThree(t, Options{Shape: c.s, Mix: mix, Seed: 3, Fill: FillBlocks}, 4)
		if !bytes.Equal(a.Bytes(), b.Bytes()) {
			t.Errorf("%s: 1 and 4 workers wrote different bytes", mix)
		}
		f, err := gguf.OpenReaderAt(bytes.NewReader(a.Bytes()), int64(a.Len()), "a")
		if err != nil {
			t.Fatal(err)
		}
		ti, _ := f.Tensor("token_embd.weight")
		off := f.DataOffset + int64(ti.Offset)
		first, second := a.Bytes()[off:off+4096], a.Bytes()[off+int64(ti.Size)/2:][:4096]
		if ti.Size > chunkBytes && bytes.Equal(first, second) {
			t.Errorf("%s: the embedding's two chunks repeat one random stream", mix)
		}
		if bytes.Equal(a.Bytes()[off:off+int64(ti.Size)], c.Bytes()[off:off+int64(ti.Size)]) {
			t.Errorf("%s: seeds 3 and 4 wrote the same embedding", mix)
		}
		f.Close()
	}
}

// cancelAfter is a writer that cancels a context once n bytes went
// through it.
type cancelAfter struct {
	n      int
	cancel context.CancelFunc
}

func (w *cancelAfter) Write(p []byte) (int, error) {
	w.n -= len(p)
	if w.n <= 0 {
		w.cancel()
	}
	return len(p), nil
}

// TestCancel: cancelling the context stops the writer mid-file with the
// context's error (TestMain checks no goroutine is left), and WriteFile
// removes the partial file.
func TestCancel(t *testing.T) {
	s := Shape{Arch: "llama", Embd: 512, FF: 1024, Layers: 8, Heads: 4, KVHeads: 2, Vocab: 8192}
	for _, fill := range Fills() {
		ctx, cancel := context.WithCancel(context.Background())
		w := &cancelAfter{n: 6 << 20, cancel: cancel}
		err := Write(ctx, w, Options{Shape: s, Mix: MixQ8_0, Fill: fill})
		cancel()
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%s: cancelled write returned %v", fill, err)
		}
		if w.n < -(64 << 20) {
			t.Errorf("%s: %d bytes written after the cancel", fill, -w.n)
		}
	}
	path := filepath.Join(t.TempDir(), "x.gguf")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := WriteFile(ctx, path, Options{Shape: s, Mix: MixQ4_KM, Fill: FillBlocks}); !errors.Is(err, context.Canceled) {
		t.Errorf("WriteFile with a cancelled context returned %v", err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("partial file left behind: %v", err)
	}
}

// TestBlocksForward runs a block-filled tiny Q4_K_M model on the CPU
// backend: eight greedy steps give finite logits whose spread matches
// the quantize-filled model's (same weight statistics, so activations of
// the same size) within a factor of 2.
func TestBlocksForward(t *testing.T) {
	dir := t.TempDir()
	spread := map[Fill]float64{}
	for _, fill := range Fills() {
		path := filepath.Join(dir, fill.String()+".gguf")
		if err := WriteFile(context.Background(), path, Options{Shape: Presets["tiny"], Mix: MixQ4_KM, Seed: 5, Fill: fill}); err != nil {
			t.Fatal(err)
		}
		f, err := gguf.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		m, closeModel := cpuModel(t, f, 32)
		next, sum := int32(1), 0.0
		for pos := range 8 {
			logits, err := m.Forward(context.Background(), []int32{next}, pos)
			if err != nil {
				t.Fatal(err)
			}
			s := statsOf(logits)
			if !s.finite || s.std == 0 {
				t.Fatalf("%s: position %d: logits finite %v, std %g", fill, pos, s.finite, s.std)
			}
			sum += s.std
			next = int32(argmax(logits))
		}
		spread[fill] = sum / 8
		closeModel()
		f.Close()
	}
	t.Logf("mean logit std: %.3g with block fill, %.3g with quantize fill", spread[FillBlocks], spread[FillQuantize])
	if r := spread[FillBlocks] / spread[FillQuantize]; r < 0.5 || r > 2 {
		t.Errorf("logit std %.3g with block fill, %.3g with quantize fill", spread[FillBlocks], spread[FillQuantize])
	}
}

// TestByteVocabSpecials: a preset's special tokens end the byte vocabulary
// as control tokens (llama.cpp refuses a file named like Phi-3 whose
// vocabulary lacks "<|endoftext|>"), the size unchanged.
func TestByteVocabSpecials(t *testing.T) {
	sp := Presets["phi3-mini"].SpecialTokens
	if len(sp) == 0 || sp[0] != "<|endoftext|>" {
		t.Fatalf("phi3-mini's special tokens: %q", sp)
	}
	v := byteVocab(32064, sp)
	if len(v.Tokens) != 32064 {
		t.Fatalf("%d tokens, want 32064", len(v.Tokens))
	}
	for k, s := range sp {
		i := 32064 - len(sp) + k
		if v.Tokens[i] != s || v.TokenTypes[i] != 3 {
			t.Errorf("token %d = %q (type %d), want %q (control)", i, v.Tokens[i], v.TokenTypes[i], s)
		}
	}
}

// TestValidUTF8: ValidUTF8 zeroes exactly the head rows of the byte tokens
// 0x80–0xFF, under both fills, and greedy decoding from every byte token
// then never picks one of them (so the text decodes as valid UTF-8).
func TestValidUTF8(t *testing.T) {
	dir := t.TempDir()
	for _, fill := range Fills() {
		path := filepath.Join(dir, fill.String()+".gguf")
		if err := WriteFile(context.Background(), path, Options{Shape: Presets["tiny"], Mix: MixQ4_KM, Seed: 3, Fill: fill, ValidUTF8: true}); err != nil {
			t.Fatal(err)
		}
		f, err := gguf.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		tm, err := f.Tokenizer()
		if err != nil {
			t.Fatal(err)
		}
		partial := partialCharTokens(tm)
		if len(partial) != 128 {
			t.Fatalf("%s: %d byte tokens 0x80–0xFF, want 128", fill, len(partial))
		}
		name := "output.weight"
		ti, ok := f.Tensor(name)
		if !ok {
			name = "token_embd.weight"
			ti, _ = f.Tensor(name)
		}
		data, err := f.TensorData(ti)
		if err != nil {
			t.Fatal(err)
		}
		v := make([]float32, ti.Elements())
		if err := dequant.ToFloat32(ti.Type, data, v); err != nil {
			t.Fatal(err)
		}
		cols := int(ti.Dims[0])
		for r := range int(ti.Rows()) {
			zero := true
			for _, x := range v[r*cols : (r+1)*cols] {
				zero = zero && x == 0
			}
			if zero != partial[r] {
				t.Errorf("%s: %s row %d (%q) zero = %v", fill, name, r, tm.Tokens[r], zero)
			}
		}
		m, closeModel := cpuModel(t, f, 64)
		for start := range partial {
			next := int32(start)
			for pos := range 16 {
				logits, err := m.Forward(context.Background(), []int32{next}, pos)
				if err != nil {
					t.Fatal(err)
				}
				best := argmax(logits)
				if partial[best] {
					t.Fatalf("%s: greedy picked byte token %q after %d steps from %q", fill, tm.Tokens[best], pos, tm.Tokens[start])
				}
				next = int32(best)
			}
		}
		closeModel()
		f.Close()
	}
}

// cpuModel makes a model of f's weights on a two-thread CPU backend with
// ctx positions; close frees both.
func cpuModel(t *testing.T, f *gguf.File, ctx int) (m *model.Model, close func()) {
	t.Helper()
	cfg, err := model.ConfigFromFile(f)
	if err != nil {
		t.Fatal(err)
	}
	w, err := model.NewFileWeights(f, cfg)
	if err != nil {
		t.Fatal(err)
	}
	be := cpu.New(2)
	m, err = model.New(be, cfg, w, model.Options{Ctx: ctx})
	if err != nil {
		be.Close()
		t.Fatal(err)
	}
	return m, func() { m.Close(); be.Close() }
}

// argmax is the index of the largest logit (the first of equals).
func argmax(logits []float32) int {
	best := 0
	for i, x := range logits {
		if x > logits[best] {
			best = i
		}
	}
	return best
}
