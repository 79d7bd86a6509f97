package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/forge-llm/forge/pipeline/tokenizer"
)

// perplexityExpected is gguf/testdata/story-perplexity.json: llama-perplexity's
// final estimates on story.txt, committed so CI checks forge without
// llama.cpp.
type perplexityExpected struct {
	Ctx    int `json:"ctx"`
	Tokens int `json:"tokens"`
	Chunks int `json:"chunks"`
	Models map[string]struct {
		Exact   float64 `json:"exact"`
		Default float64 `json:"default"`
	} `json:"models"`
	ExactCommand string `json:"exact_command"`
}

func loadPerplexityExpected(t *testing.T) (perplexityExpected, string) {
	t.Helper()
	b, err := os.ReadFile("../gguf/testdata/story-perplexity.json")
	if err != nil {
		t.Fatal(err)
	}
	var e perplexityExpected
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatal(err)
	}
	text, err := os.ReadFile("../gguf/testdata/story.txt")
	if err != nil {
		t.Fatal(err)
	}
	return e, string(text)
}

// TestPerplexityMatchesLlamaCpp: forge's estimate on the CPU is within
// 0.1 % of llama-perplexity's with the same context size and the same
// arithmetic (F32 KV cache), for F32, Q8_0, Q4_0 and Q4_K_M; the chunking
// (tokens, chunks, scored tokens) is llama-perplexity's.
func TestPerplexityMatchesLlamaCpp(t *testing.T) {
	want, text := loadPerplexityExpected(t)
	if len(want.Models) != 4 {
		t.Fatalf("%d models in the expected file, want 4", len(want.Models))
	}
	for name, w := range want.Models {
		t.Run(name, func(t *testing.T) {
			m, err := Open(context.Background(), filepath.Join("../gguf/testdata", name), Options{Device: "cpu", Threads: 2, Ctx: want.Ctx})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			var running []float64
			res, err := m.Perplexity(context.Background(), text, PerplexityOptions{Ctx: want.Ctx, OnChunk: func(c, n int, ppl float64) {
				if c != len(running)+1 || n != want.Chunks {
					t.Errorf("OnChunk(%d, %d) after %d chunks, want (%d, %d)", c, n, len(running), len(running)+1, want.Chunks)
				}
				running = append(running, ppl)
			}})
			if err != nil {
				t.Fatal(err)
			}
			if res.Tokens != want.Tokens || res.Chunks != want.Chunks || res.Ctx != want.Ctx {
				t.Errorf("tokens %d, chunks %d, ctx %d; llama-perplexity: %d, %d, %d", res.Tokens, res.Chunks, res.Ctx, want.Tokens, want.Chunks, want.Ctx)
			}
			if wantScored := want.Chunks * (want.Ctx - want.Ctx/2 - 1); res.Scored != wantScored {
				t.Errorf("%d tokens scored, want %d (the second half of each window)", res.Scored, wantScored)
			}
			if len(running) != want.Chunks || running[len(running)-1] != res.PPL {
				t.Errorf("running estimates %d, last %v; want %d ending at the final %v", len(running), running[len(running)-1], want.Chunks, res.PPL)
			}
			if rel := math.Abs(res.PPL-w.Exact) / w.Exact; rel > 0.001 {
				t.Errorf("PPL %.4f, llama-perplexity %.4f: %.3f %% apart, want ≤ 0.1 %%", res.PPL, w.Exact, 100*rel)
			}
			if res.StdErr <= 0 || res.StdErr > res.PPL {
				t.Errorf("standard error %v of PPL %v", res.StdErr, res.PPL)
			}
			t.Logf("forge %.4f, llama.cpp %.4f (exact) %.4f (default F16 KV cache)", res.PPL, w.Exact, w.Default)
		})
	}
}

// TestPerplexityBatchInvariant: -b changes the steps, not the estimate.
func TestPerplexityBatchInvariant(t *testing.T) {
	_, text := loadPerplexityExpected(t)
	m, err := Open(context.Background(), "../gguf/testdata/stories260K-Q4_0.gguf", Options{Device: "cpu", Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var got []float64
	for _, b := range []int{128, 48, 1} {
		res, err := m.Perplexity(context.Background(), text[:3000], PerplexityOptions{Ctx: 64, Batch: b})
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, res.PPL)
	}
	for _, p := range got[1:] {
		if rel := math.Abs(p-got[0]) / got[0]; rel > 1e-6 {
			t.Errorf("estimates by batch size %v differ", got)
		}
	}
}

// TestPerplexityRefusals: too short a text, too short a context.
func TestPerplexityRefusals(t *testing.T) {
	m, err := Open(context.Background(), "../gguf/testdata/stories260K-F32.gguf", Options{Device: "cpu", Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.Perplexity(context.Background(), "Once upon a time", PerplexityOptions{Ctx: 64}); err == nil || !strings.Contains(err.Error(), "needs at least 128") {
		t.Errorf("short text: %v", err)
	}
	if _, err := m.Perplexity(context.Background(), strings.Repeat("a b ", 100), PerplexityOptions{Ctx: 2}); err == nil || !strings.Contains(err.Error(), "too short") {
		t.Errorf("ctx 2: %v", err)
	}
}

// TestPerplexityAgainstLiveLlamaCpp re-runs llama-perplexity where
// bench/llamacpp.sh installed it, so the committed numbers can be checked
// anew; CI without it relies on the committed file.
func TestPerplexityAgainstLiveLlamaCpp(t *testing.T) {
	llama, err := filepath.Abs("../bench/llamacpp/llama")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(llama); err != nil {
		t.Skip("llama.cpp is not installed (bench/llamacpp.sh fetches it): the committed estimates are checked by TestPerplexityMatchesLlamaCpp")
	}
	want, _ := loadPerplexityExpected(t)
	final := regexp.MustCompile(`Final estimate: PPL = ([0-9.]+)`)
	for name, w := range want.Models {
		// llama.cpp logs from a thread of its own and, now and then,
		// exits before the last lines are written: up to three tries.
		var m [][]byte
		var out []byte
		for try := 0; try < 3 && m == nil; try++ {
			out, err = exec.Command(llama, "llama-perplexity", "-m", filepath.Join("../gguf/testdata", name), "-f", "../gguf/testdata/story.txt",
				"-c", strconv.Itoa(want.Ctx), "-t", "2", "-ctk", "f32", "-ctv", "f32", "-fa", "off").CombinedOutput()
			if err != nil {
				t.Fatalf("%s: llama-perplexity: %v\n%s", name, err, out)
			}
			m = final.FindSubmatch(out)
		}
		if m == nil {
			t.Fatalf("%s: no final estimate in three runs; the last:\n%s", name, out)
		}
		got, _ := strconv.ParseFloat(string(m[1]), 64)
		if got != w.Exact {
			t.Errorf("%s: llama-perplexity now says %.4f, the committed file %.4f", name, got, w.Exact)
		}
	}
}

// TestEmbed: unit vectors of the model's width, the same text gives the
// same vector whatever it is batched with, different texts differ, and
// a text past the context is refused with ErrContextLength.
func TestEmbed(t *testing.T) {
	m, err := Open(context.Background(), "../gguf/testdata/stories260K-Q8_0.gguf", Options{Device: "cpu", Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.Pooling() != PoolMean {
		t.Errorf("pooling %v of a file that names none, want mean", m.Pooling())
	}
	embs, err := m.Embed(context.Background(), []string{"Lily saw a big red ball.", "The cat sat on the mat and went to sleep.", "Lily saw a big red ball."}, EmbedOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(embs) != 3 {
		t.Fatalf("%d embeddings for 3 texts", len(embs))
	}
	for i, e := range embs {
		if len(e.Vector) != m.Config().Embd {
			t.Fatalf("embedding %d has %d values, want %d", i, len(e.Vector), m.Config().Embd)
		}
		var n float64
		for _, x := range e.Vector {
			n += float64(x) * float64(x)
		}
		if math.Abs(math.Sqrt(n)-1) > 1e-5 {
			t.Errorf("embedding %d has norm %v, want 1", i, math.Sqrt(n))
		}
		if e.Tokens < 2 {
			t.Errorf("embedding %d counts %d tokens", i, e.Tokens)
		}
	}
	dot := func(a, b []float32) (s float64) {
		for i := range a {
			s += float64(a[i]) * float64(b[i])
		}
		return s
	}
	if d := dot(embs[0].Vector, embs[2].Vector); math.Abs(d-1) > 1e-5 {
		t.Errorf("the same text twice: cosine %v, want 1", d)
	}
	if d := dot(embs[0].Vector, embs[1].Vector); d > 0.9999 {
		t.Errorf("different texts: cosine %v", d)
	}
	alone, err := m.Embed(context.Background(), []string{"Lily saw a big red ball."}, EmbedOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if d := dot(alone[0].Vector, embs[0].Vector); math.Abs(d-1) > 1e-5 {
		t.Errorf("a text alone and among others: cosine %v, want 1", d)
	}
	long := strings.Repeat("Once upon a time there was a dog. ", 40)
	if _, err := m.Embed(context.Background(), []string{long}, EmbedOptions{}); !errors.Is(err, ErrContextLength) {
		t.Errorf("a text past the context: %v, want ErrContextLength", err)
	}
	cut, err := m.Embed(context.Background(), []string{long}, EmbedOptions{Truncate: true})
	if err != nil || cut[0].Tokens != m.Config().Ctx {
		t.Errorf("a text past the context, truncated: %v tokens, %v; want the %d of the context", cut, err, m.Config().Ctx)
	}
	if _, err := m.Embed(context.Background(), nil, EmbedOptions{}); err == nil {
		t.Error("no texts: no error")
	}
}

// TestEmbedPoolings: mean, first-token and last-token pooling are those of
// the hidden states Window hands out, normalized.
func TestEmbedPoolings(t *testing.T) {
	m, err := Open(context.Background(), "../gguf/testdata/stories260K-F32.gguf", Options{Device: "cpu", Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	tok, err := m.Tokenizer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ids, err := tok.Encode("Lily saw a big red ball.", tokenizer.EncodeOptions{AddBOS: tok.ShouldAddBOS()})
	if err != nil {
		t.Fatal(err)
	}
	var states []float32
	err = m.Evaluate(context.Background(), EvalOptions{Ctx: len(ids), Batch: 3}, func(ev *Evaluator) error {
		return ev.Window(context.Background(), ids, true, func(first int, logits, s []float32) error {
			if len(logits) != len(s)/ev.Embd()*ev.Vocab() {
				t.Errorf("step at %d: %d logits for %d states", first, len(logits), len(s)/ev.Embd())
			}
			states = append(states, s...)
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	d := m.Config().Embd
	unit := func(v []float64) []float64 {
		var n float64
		for _, x := range v {
			n += x * x
		}
		for i := range v {
			v[i] /= math.Sqrt(n)
		}
		return v
	}
	wantOf := map[Pooling][]float64{PoolMean: make([]float64, d), PoolCLS: make([]float64, d), PoolLast: make([]float64, d)}
	for r := range len(ids) {
		for k := range d {
			x := float64(states[r*d+k])
			wantOf[PoolMean][k] += x
			if r == 0 {
				wantOf[PoolCLS][k] = x
			}
			if r == len(ids)-1 {
				wantOf[PoolLast][k] = x
			}
		}
	}
	for p, want := range wantOf {
		m.pooling = p
		got, err := m.Embed(context.Background(), []string{"Lily saw a big red ball."}, EmbedOptions{})
		if err != nil {
			t.Fatal(err)
		}
		want = unit(want)
		for k := range d {
			if math.Abs(float64(got[0].Vector[k])-want[k]) > 1e-5 {
				t.Fatalf("pooling %d: value %d is %v, want %v", p, k, got[0].Vector[k], want[k])
			}
		}
	}
}

// TestEvalPaths: an evaluation gives the same numbers on the caller's
// goroutine beside a batching engine's generations (the CPU path) and on
// the executor between generation requests (the GPU path, forced here).
func TestEvalPaths(t *testing.T) {
	path := "../gguf/testdata/stories260K-Q8_0.gguf"
	texts := []string{"Lily saw a big red ball.", "The cat sat on the mat."}
	m, err := Open(context.Background(), path, Options{Device: "cpu", Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	want, err := m.Embed(context.Background(), texts, EmbedOptions{})
	m.Close()
	if err != nil {
		t.Fatal(err)
	}
	same := func(got []Embedding) {
		t.Helper()
		for i := range want {
			for k := range want[i].Vector {
				if got[i].Vector[k] != want[i].Vector[k] {
					t.Fatalf("text %d value %d: %v, alone %v", i, k, got[i].Vector[k], want[i].Vector[k])
				}
			}
		}
	}

	// Beside generations of a batching engine.
	eng := NewEngine(EngineOptions{Open: Options{Device: "cpu", Threads: 1}})
	defer eng.Close()
	if err := eng.Add("m", path); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 4)
	for range 4 {
		go func() {
			_, err := eng.Generate(context.Background(), EngineRequest{Model: "m", Prompt: "Once upon a time", MaxTokens: 24, IgnoreEOG: true})
			done <- err
		}()
	}
	for range 3 {
		got, err := eng.Embed(context.Background(), "m", texts, EmbedOptions{})
		if err != nil {
			t.Fatal(err)
		}
		same(got)
	}
	for range 4 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}

	// On the executor, between requests of a single-sequence model.
	evalOnExecutor = true
	defer func() { evalOnExecutor = false }()
	m, err = Open(context.Background(), path, Options{Device: "cpu", Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	go func() {
		_, err := m.Generate(context.Background(), "Once upon a time", GenerateOptions{MaxTokens: 24, IgnoreEOG: true})
		done <- err
	}()
	got, err := m.Embed(context.Background(), texts, EmbedOptions{})
	if err != nil {
		t.Fatal(err)
	}
	same(got)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	res, err := m.Perplexity(context.Background(), strings.Repeat("Once upon a time there was a little dog. ", 40), PerplexityOptions{Ctx: 64})
	if err != nil || res.PPL <= 1 {
		t.Fatalf("perplexity on the executor: %+v %v", res, err)
	}
}
