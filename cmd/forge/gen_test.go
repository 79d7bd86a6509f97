package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/pipeline"
	"github.com/forge-llm/forge/pipeline/synth"
)

// TestGenTiny: `forge gen --preset tiny` for every mix writes a file that
// the GGUF reader opens with the tensor types the mix assigns, and that
// the pipeline loads and generates from.
func TestGenTiny(t *testing.T) {
	dir := t.TempDir()
	shape := synth.Presets["tiny"]
	for _, mix := range []string{"q4_k_m", "q4_0", "q8_0", "f16"} {
		out := filepath.Join(dir, "tiny-"+mix+".gguf")
		var stdout, stderr bytes.Buffer
		if err := newApp(&stdout, &stderr).Run([]string{"forge", "gen", "--preset", "tiny", "--quant", mix, "-o", out, "--progress", "plain"}); err != nil {
			t.Fatalf("%s: %v", mix, err)
		}
		if !strings.HasPrefix(stdout.String(), "wrote "+out+": ") || !strings.Contains(stdout.String(), "/s)") {
			t.Errorf("%s: stdout %q", mix, stdout.String())
		}
		if !strings.Contains(stderr.String(), "writing "+out) {
			t.Errorf("%s: stderr %q", mix, stderr.String())
		}
		f, err := gguf.Open(out)
		if err != nil {
			t.Fatalf("%s: %v", mix, err)
		}
		if want := 3 + 9*shape.Layers; len(f.Tensors) != want {
			t.Errorf("%s: %d tensors, want %d", mix, len(f.Tensors), want)
		}
		m, _ := synth.ParseMix(mix)
		for _, ti := range f.Tensors {
			want := synth.TensorType(m, shape, ti.Name, int(ti.Dims[0]), int(ti.Rows()), layerOfName(ti.Name))
			if ti.Type != want {
				t.Errorf("%s: %s is %v, want %v", mix, ti.Name, ti.Type, want)
			}
		}
		if a, _ := f.String("general.architecture"); a != "llama" {
			t.Errorf("%s: architecture %q", mix, a)
		}
		f.Close()

		model, err := pipeline.Open(context.Background(), out, pipeline.Options{Threads: 2})
		if err != nil {
			t.Fatalf("%s: %v", mix, err)
		}
		res, err := model.Generate(context.Background(), "hello", pipeline.GenerateOptions{MaxTokens: 4, IgnoreEOG: true})
		model.Close()
		if err != nil {
			t.Fatalf("%s: generate: %v", mix, err)
		}
		if len(res.Tokens) != 4 || res.PromptTokens < 2 {
			t.Errorf("%s: %d tokens from a %d-token prompt", mix, len(res.Tokens), res.PromptTokens)
		}
		for _, id := range res.Tokens {
			if id < 0 || int(id) >= shape.Vocab {
				t.Errorf("%s: token %d outside the vocabulary", mix, id)
			}
		}
	}
}

// TestGenVocab: --vocab copies a file's tokenizer.
func TestGenVocab(t *testing.T) {
	out := filepath.Join(t.TempDir(), "v.gguf")
	src := testmodels.Path(t, "stories260K-F32.gguf")
	var stdout, stderr bytes.Buffer
	if err := newApp(&stdout, &stderr).Run([]string{"forge", "gen", "--preset", "tiny", "-q", "q8_0", "--vocab", src, "-o", out}); err != nil {
		t.Fatal(err)
	}
	want, err := synth.VocabFromFile(src)
	if err != nil {
		t.Fatal(err)
	}
	got, err := synth.VocabFromFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Tokens) < len(want.Tokens) {
		t.Fatalf("%d tokens, want at least %d", len(got.Tokens), len(want.Tokens))
	}
	for i, tok := range want.Tokens {
		if got.Tokens[i] != tok {
			t.Fatalf("token %d is %q, want %q", i, got.Tokens[i], tok)
		}
	}
}

func TestGenErrors(t *testing.T) {
	out := filepath.Join(t.TempDir(), "x.gguf")
	for _, args := range [][]string{
		{"--preset", "gpt5", "-o", out},
		{"--preset", "tiny", "--quant", "q3_k_xs", "-o", out},
		{"--preset", "tiny", "--progress", "fancy", "-o", out},
		{"--preset", "tiny", "--fill", "zeros", "-o", out},
	} {
		var stdout, stderr bytes.Buffer
		if err := newApp(&stdout, &stderr).Run(append([]string{"forge", "gen"}, args...)); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

// TestGenFill: --fill blocks is the default and --fill quantize selects
// the quantizer: same layout and size, different weights, each equal to
// what synth.Write makes with that fill.
func TestGenFill(t *testing.T) {
	dir := t.TempDir()
	files := map[string][]byte{}
	for _, args := range [][]string{{}, {"--fill", "blocks"}, {"--fill", "quantize"}} {
		out := filepath.Join(dir, strings.Join(append([]string{"default"}, args...), "-")+".gguf")
		var stdout, stderr bytes.Buffer
		cmd := append([]string{"forge", "gen", "--preset", "tiny", "-q", "q4_k_m", "--seed", "3", "-o", out, "--progress", "plain"}, args...)
		if err := newApp(&stdout, &stderr).Run(cmd); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		files[strings.Join(args, " ")] = b
	}
	for _, fill := range synth.Fills() {
		var want bytes.Buffer
		o := synth.Options{Shape: synth.Presets["tiny"], Mix: synth.MixQ4_KM, Seed: 3, Fill: fill, Name: "synthetic tiny q4_k_m"}
		if err := synth.Write(context.Background(), &want, o); err != nil {
			t.Fatal(err)
		}
		if got := files["--fill "+fill.String()]; !bytes.Equal(got, want.Bytes()) {
			t.Errorf("--fill %s: %d bytes differ from synth.Write's %d", fill, len(got), want.Len())
		}
	}
	if !bytes.Equal(files[""], files["--fill blocks"]) {
		t.Error("the default fill is not blocks")
	}
	if bytes.Equal(files["--fill blocks"], files["--fill quantize"]) || len(files["--fill blocks"]) != len(files["--fill quantize"]) {
		t.Error("blocks and quantize fills: want the same size and different bytes")
	}
}

// TestGenCancelRemovesFile: a gen interrupted mid-file (the context is
// cancelled once the file passes 1 MiB; the quantize fill of bench86m
// takes seconds) fails with the context's error and leaves no file.
func TestGenCancelRemovesFile(t *testing.T) {
	out := filepath.Join(t.TempDir(), "c.gguf")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res := make(chan error, 1)
	go func() {
		var stdout, stderr bytes.Buffer
		res <- newApp(&stdout, &stderr).RunContext(ctx, []string{"forge", "gen", "--preset", "bench86m", "-q", "q4_k_m",
			"--fill", "quantize", "-o", out, "--progress", "plain"})
	}()
	var err error
	for done := false; !done; {
		select {
		case err = <-res:
			t.Fatalf("gen finished before it was cancelled: %v", err)
		case <-time.After(2 * time.Millisecond):
			// The file is written under a temporary name beside out.
			tmps, _ := filepath.Glob(filepath.Join(filepath.Dir(out), ".c.gguf.tmp-*"))
			if len(tmps) == 1 {
				if st, serr := os.Stat(tmps[0]); serr == nil && st.Size() > 1<<20 {
					cancel()
					err, done = <-res, true
				}
			}
		}
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled gen returned %v", err)
	}
	if _, serr := os.Stat(out); !os.IsNotExist(serr) {
		t.Errorf("partial file left behind: %v", serr)
	}
	if left, _ := os.ReadDir(filepath.Dir(out)); len(left) != 0 {
		t.Errorf("files left behind: %v", left)
	}
}

// TestPlannedSize: the dry run's size is the written file's.
func TestPlannedSize(t *testing.T) {
	for _, mix := range []synth.Mix{synth.MixQ4_KM, synth.MixF16} {
		o := synth.Options{Shape: synth.Presets["tiny"], Mix: mix, Seed: 3, Fill: synth.FillBlocks}
		n, err := plannedSize(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if err := synth.Write(context.Background(), &b, o); err != nil {
			t.Fatal(err)
		}
		if n != int64(b.Len()) {
			t.Errorf("%s: planned %d bytes, wrote %d", mix, n, b.Len())
		}
	}
}

// layerOfName is the block index of a tensor name, -1 outside blocks.
func layerOfName(name string) int {
	rest, ok := strings.CutPrefix(name, "blk.")
	if !ok {
		return -1
	}
	n := 0
	for _, c := range rest {
		if c < '0' || c > '9' {
			break
		}
		n = n*10 + int(c-'0')
	}
	return n
}
