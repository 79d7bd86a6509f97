package gguf

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf/testmodels"
)

// Every bundled model opens, its tensors tile the data section exactly as
// llama.cpp lays them out (each padded to the alignment), and the padded
// sizes add up to the file size.
func TestOpenBundled(t *testing.T) {
	for _, path := range testmodels.Glob(t, "*.gguf") {
		t.Run(filepath.Base(path), func(t *testing.T) {
			f, err := Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			want := 48
			if strings.HasPrefix(filepath.Base(path), "synth-kq") {
				want = 12
			}
			if len(f.Tensors) != want || f.Version != 3 || f.Alignment != 32 {
				t.Fatalf("%d tensors (want %d), version %d, alignment %d", len(f.Tensors), want, f.Version, f.Alignment)
			}
			end := uint64(0)
			for _, ti := range f.Tensors {
				if ti.Offset != end {
					t.Errorf("%s at %d, want %d", ti.Name, ti.Offset, end)
				}
				end = alignUp(ti.Offset+ti.Size, f.Alignment)
			}
			if f.DataOffset+int64(end) != f.Size {
				t.Errorf("data offset %d + padded tensors %d = %d, file is %d", f.DataOffset, end, f.DataOffset+int64(end), f.Size)
			}
		})
	}
}

func TestConfigStories(t *testing.T) {
	f, err := Open(testmodels.Path(t, "stories260K-Q4_0.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c, err := f.Config()
	if err != nil {
		t.Fatal(err)
	}
	want := Config{Arch: "llama", ContextLength: 128, EmbeddingLength: 64, BlockCount: 5, FeedForwardLength: 172,
		HeadCount: 8, HeadCountKV: 4, RopeDim: 8, RopeFreqBase: 10000, RopeScalingType: "linear", RopeScalingFactor: 1,
		RopeOrigContext: 128, NormEps: 1e-5, VocabSize: 512, FileType: c.FileType, Name: c.Name}
	if c != want {
		t.Errorf("config\n got %+v\nwant %+v", c, want)
	}
	if c.FileType != 2 { // LLAMA_FTYPE_MOSTLY_Q4_0
		t.Errorf("file type %d, want 2", c.FileType)
	}
	tk, err := f.Tokenizer()
	if err != nil {
		t.Fatal(err)
	}
	if tk.Model != "llama" || len(tk.Tokens) != 512 || len(tk.Scores) != 512 || len(tk.TokenTypes) != 512 {
		t.Fatalf("tokenizer %q with %d tokens, %d scores, %d types", tk.Model, len(tk.Tokens), len(tk.Scores), len(tk.TokenTypes))
	}
	if tk.Tokens[0] != "<unk>" || tk.Tokens[1] != "<s>" || tk.Tokens[2] != "</s>" || tk.Tokens[3] != "<0x00>" {
		t.Errorf("first tokens %q", tk.Tokens[:4])
	}
	if tk.BOS != 1 || tk.EOS != 2 || tk.UNK != 0 || tk.PAD != -1 || !tk.AddBOS || tk.AddEOS {
		t.Errorf("specials bos %d eos %d unk %d pad %d add_bos %v add_eos %v", tk.BOS, tk.EOS, tk.UNK, tk.PAD, tk.AddBOS, tk.AddEOS)
	}
	// Byte tokens are type 6 (BYTE) in llama.cpp's enum, normal tokens 1.
	if tk.TokenTypes[3] != 6 || tk.TokenTypes[300] != 1 {
		t.Errorf("token types %d %d", tk.TokenTypes[3], tk.TokenTypes[300])
	}
	g, err := Open(testmodels.Path(t, "stories260K-ggml-org.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if n, ok := g.Uint("llama.context_length"); !ok || n != 2048 {
		t.Errorf("ggml-org context %d %v", n, ok)
	}
}

func TestTokenizerGPT2(t *testing.T) {
	f, err := Open(testmodels.Path(t, "tokenizer/ggml-vocab-gpt-2.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tk, err := f.Tokenizer()
	if err != nil {
		t.Fatal(err)
	}
	if tk.Model != "gpt2" || len(tk.Tokens) != 50257 || len(tk.Merges) != 50000 {
		t.Fatalf("%q: %d tokens, %d merges", tk.Model, len(tk.Tokens), len(tk.Merges))
	}
	if tk.Tokens[50256] != "<|endoftext|>" || tk.EOS != 50256 || tk.Merges[0] != "Ġ t" {
		t.Errorf("last token %q eos %d merge0 %q", tk.Tokens[50256], tk.EOS, tk.Merges[0])
	}
}

// The mapped view, ReadTensor and a ReaderAt-opened file all see the same
// bytes, and those bytes are the F32 values the header promises.
func TestTensorDataPaths(t *testing.T) {
	path := testmodels.Path(t, "stories260K-F32.gguf")
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	r, err := OpenReaderAt(bytes.NewReader(raw), int64(len(raw)), "mem")
	if err != nil {
		t.Fatal(err)
	}
	for i := range f.Tensors {
		ti := &f.Tensors[i]
		view, err := f.TensorData(ti)
		if err != nil {
			t.Fatal(err)
		}
		if uint64(len(view)) != ti.Size || ti.Size != 4*ti.Elements() {
			t.Fatalf("%s: view %d bytes, size %d, %d elements", ti.Name, len(view), ti.Size, ti.Elements())
		}
		buf := make([]byte, ti.Size/2)
		if err := f.ReadTensor(ti, ti.Size/4, buf); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf, view[ti.Size/4:ti.Size/4+ti.Size/2]) {
			t.Fatalf("%s: ReadTensor differs from view", ti.Name)
		}
		if m := f.Mapped(); !bytes.Equal(m[f.FileOffset(ti):f.FileOffset(ti)+int64(ti.Size)], view) || !bytes.Equal(raw[f.FileOffset(ti):f.FileOffset(ti)+int64(ti.Size)], view) {
			t.Fatalf("%s: FileOffset/Mapped disagree with the view", ti.Name)
		}
		rt, ok := r.Tensor(ti.Name)
		if !ok {
			t.Fatalf("%s missing via ReaderAt", ti.Name)
		}
		buf2 := make([]byte, ti.Size)
		if err := r.ReadTensor(rt, 0, buf2); err != nil || !bytes.Equal(buf2, view) {
			t.Fatalf("%s: ReaderAt read differs (%v)", ti.Name, err)
		}
		for j := 0; j+4 <= len(view); j += 4 {
			v := math.Float32frombits(uint32(view[j]) | uint32(view[j+1])<<8 | uint32(view[j+2])<<16 | uint32(view[j+3])<<24)
			if math.IsNaN(float64(v)) || math.Abs(float64(v)) > 100 {
				t.Fatalf("%s[%d] = %v: not a plausible weight", ti.Name, j/4, v)
			}
		}
	}
	if r.Mapped() != nil {
		t.Error("ReaderAt file has a mapping")
	}
	if _, err := r.TensorData(&r.Tensors[0]); err == nil || !strings.Contains(err.Error(), "without mmap") {
		t.Errorf("TensorData without mmap: %v", err)
	}
	if err := f.ReadTensor(&f.Tensors[0], f.Tensors[0].Size-3, make([]byte, 4)); err == nil || !strings.Contains(err.Error(), "outside") {
		t.Errorf("read past tensor end: %v", err)
	}
	emb, ok := f.Tensor("token_embd.weight")
	if !ok || emb.Dims[0] != 64 || emb.Dims[1] != 512 || emb.Rows() != 512 || emb.RowBytes() != 256 {
		t.Errorf("token_embd: %+v", emb)
	}
}
