package synth

import (
	"bytes"
	"context"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/forge-llm/forge/dequant"
	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/gguf/testmodels"
)

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

// TestDeterministic: the bytes depend on the seed, not on the worker count.
func TestDeterministic(t *testing.T) {
	o := Options{Shape: Presets["tiny"], Mix: MixQ4_KM, Seed: 3}
	var a, b, c bytes.Buffer
	o.Workers = 1
	if err := Write(context.Background(), &a, o); err != nil {
		t.Fatal(err)
	}
	o.Workers = 5
	if err := Write(context.Background(), &b, o); err != nil {
		t.Fatal(err)
	}
	o.Seed = 4
	if err := Write(context.Background(), &c, o); err != nil {
		t.Fatal(err)
	}
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
	smallVocab := byteVocab(1000) // padded to 128256 in the file
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
