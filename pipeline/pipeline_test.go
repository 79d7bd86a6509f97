package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/forge-llm/forge/actors"
	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/pipeline/synth"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// expected is a model's greedy reference from the bundled JSON files.
type expected struct {
	Prompt    []int32 `json:"prompt_ids"`
	Generated []int32 `json:"generated_ids"`
}

// references reads llama.cpp's greedy ids for the bundled files: stories260K
// directly, synth-kq under its exact-f32 reference.
func references(t *testing.T) map[string]expected {
	t.Helper()
	out := map[string]expected{}
	var stories struct {
		Models map[string]expected `json:"models"`
	}
	readJSON(t, "stories260K-expected.json", &stories)
	for k, v := range stories.Models {
		out[k] = v
	}
	var synth struct {
		Models map[string]map[string]expected `json:"models"`
	}
	readJSON(t, "synth-kq-expected.json", &synth)
	for k, v := range synth.Models {
		out[k] = v["exact_f32_math"]
	}
	return out
}

func readJSON(t *testing.T, name string, v any) {
	t.Helper()
	b, err := os.ReadFile(testmodels.Path(t, name))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

// trace collects every event of a subscription until it closes.
type trace struct {
	mu     sync.Mutex
	events []Event
	done   chan struct{}
}

func collect(s *Subscription) *trace {
	tr := &trace{done: make(chan struct{})}
	go func() {
		defer close(tr.done)
		for e := range s.C {
			tr.mu.Lock()
			tr.events = append(tr.events, e)
			tr.mu.Unlock()
		}
	}()
	return tr
}

// all waits for the subscription to close (the model closed) and returns
// the events.
func (tr *trace) all() []Event {
	<-tr.done
	return tr.events
}

// generateIDs runs one greedy request on a fresh model and checks that
// memory is back to zero after Close.
func generateIDs(t *testing.T, file string, s Strategy, ref expected) []int32 {
	t.Helper()
	return generateWith(t, testmodels.Path(t, file), Options{Strategy: s}, ref)
}

func generateWith(t *testing.T, path string, o Options, ref expected) []int32 {
	t.Helper()
	file, s := filepath.Base(path), o.Strategy
	mem := NewMemory(0)
	o.Threads, o.Memory = 2, mem
	m, err := Open(context.Background(), path, o)
	if err != nil {
		t.Fatal(err)
	}
	res, err := m.Generate(context.Background(), "", GenerateOptions{PromptIDs: ref.Prompt, MaxTokens: len(ref.Generated)})
	if err != nil {
		m.Close()
		t.Fatalf("%s %s: %v", file, s, err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if n := mem.InUse(); n != 0 {
		t.Errorf("%s %s: %d bytes still accounted after Close", file, s, n)
	}
	return res.Tokens
}

func TestStrategiesGiveSameTokens(t *testing.T) {
	refs := references(t)
	files := []string{
		"stories260K-F32.gguf", "stories260K-Q8_0.gguf", "stories260K-Q4_0.gguf", "stories260K-Q4_K_M.gguf",
		"synth-kq-F32.gguf", "synth-kq-Q4_K_M.gguf", "synth-kq-Q6_K.gguf",
	}
	for _, file := range files {
		ref, ok := refs[file]
		if !ok {
			t.Fatalf("no reference for %s", file)
		}
		t.Run(file, func(t *testing.T) {
			base := generateIDs(t, file, Prefetch, ref)
			if !slices.Equal(base, ref.Generated) {
				t.Errorf("prefetch: got %v\nwant (llama.cpp) %v", base, ref.Generated)
			}
			for _, s := range []Strategy{Eager, Lazy, HostF32} {
				if got := generateIDs(t, file, s, ref); !slices.Equal(got, base) {
					t.Errorf("%s: got %v\nprefetch gave %v", s, got, base)
				}
			}
		})
	}
}

// TestStrategiesSmallChunks: with chunks of a few rows, tensors travel in
// many pieces (several readers, conversion per chunk, the in-flight bound)
// and the tokens are still the same.
func TestStrategiesSmallChunks(t *testing.T) {
	refs := references(t)
	for _, file := range []string{"stories260K-Q4_0.gguf", "synth-kq-Q6_K.gguf"} {
		ref := refs[file]
		path := testmodels.Path(t, file)
		for _, s := range []Strategy{Prefetch, Eager, Lazy, HostF32} {
			got := generateWith(t, path, Options{Strategy: s, ChunkBytes: 1000, Readers: 3}, ref)
			if !slices.Equal(got, ref.Generated) {
				t.Errorf("%s %s with small chunks: got %v\nwant %v", file, s, got, ref.Generated)
			}
		}
	}
}

// TestTiedHeadQwen2: a Qwen2 model with a tied head (no output.weight, so
// the embedding serves as the LM head) and Q/K/V biases loads and gives the
// same tokens under every strategy.
func TestTiedHeadQwen2(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tiny-qwen2.gguf")
	src, err := gguf.Open(testmodels.Path(t, "stories260K-F32.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	vocab, err := src.Tokenizer()
	src.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := synth.WriteFile(context.Background(), path, synth.Options{Shape: synth.Presets["tiny-qwen2"], Mix: synth.MixF32, Vocab: vocab, Seed: 7}); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	_, hasOutput := f.Tensor("output.weight")
	f.Close()
	if hasOutput {
		t.Fatal("tiny-qwen2 is supposed to have a tied head")
	}
	ref := expected{Prompt: []int32{1, 403, 407, 261, 378}, Generated: make([]int32, 12)}
	base := generateWith(t, path, Options{Strategy: Prefetch}, ref)
	if len(base) == 0 {
		t.Fatal("no tokens")
	}
	for _, s := range []Strategy{Eager, Lazy, HostF32} {
		if got := generateWith(t, path, Options{Strategy: s}, ref); !slices.Equal(got, base) {
			t.Errorf("%s: got %v, prefetch gave %v", s, got, base)
		}
	}
}

// TestStreamUploader: with the GPU-shaped uploader (staging buffers, copies
// queued on a stream goroutine, a fence per unit) every strategy gives the
// reference tokens, and its arena is released on Close.
func TestStreamUploader(t *testing.T) {
	refs := references(t)
	for _, file := range []string{"stories260K-Q4_0.gguf", "synth-kq-Q4_K_M.gguf"} {
		ref := refs[file]
		for _, s := range []Strategy{Prefetch, Eager, Lazy, HostF32} {
			mem := NewMemory(0)
			up := &actors.StreamUploader{Mem: mem.acct}
			got := generateWith(t, testmodels.Path(t, file), Options{Strategy: s, uploader: up, ChunkBytes: 4096}, ref)
			if !slices.Equal(got, ref.Generated) {
				t.Errorf("%s %s: got %v\nwant %v", file, s, got, ref.Generated)
			}
			if n := mem.InUse(); n != 0 {
				t.Errorf("%s %s: arena of %d bytes not released", file, s, n)
			}
		}
	}
}

// TestStreamUploaderCopyFault: a copy that fails on the stream is reported
// at the unit's fence and fails the request naming the tensor.
func TestStreamUploaderCopyFault(t *testing.T) {
	path := testmodels.Path(t, "stories260K-Q4_0.gguf")
	mem := NewMemory(0)
	up := &actors.StreamUploader{Mem: mem.acct, Copy: func(tensor string) error {
		if tensor == "blk.2.ffn_gate.weight" {
			return errors.New("injected device fault")
		}
		return nil
	}}
	faultCase(t, path, Options{uploader: up, Memory: mem}, "layer 2", "blk.2.ffn_gate.weight", "injected device fault")
}

// TestEventJSON: every event of a run (and an error) encodes as one JSON
// object naming its kind, with its time in milliseconds.
func TestEventJSON(t *testing.T) {
	m, err := Open(context.Background(), testmodels.Path(t, "stories260K-Q8_0.gguf"), Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	tr := collect(m.Subscribe())
	if _, err := m.Generate(context.Background(), "Once upon a time", GenerateOptions{MaxTokens: 3}); err != nil {
		t.Fatal(err)
	}
	m.Close()
	evs := append(tr.all(), ErrorEvent{Layer: 2, Tensor: "blk.2.attn_q.weight", Err: errors.New("boom")})
	kinds := map[string]bool{}
	for _, e := range evs {
		b, err := EventJSON(e)
		if err != nil {
			t.Fatalf("%T: %v", e, err)
		}
		var v map[string]any
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		if v["event"] != e.Kind() {
			t.Errorf("%s: event %v, want %s", b, v["event"], e.Kind())
		}
		if at, ok := v["at_ms"].(float64); !ok || at < 0 {
			t.Errorf("%s: bad at_ms", b)
		}
		kinds[e.Kind()] = true
	}
	for _, k := range []string{"tensor_read", "tensor_converted", "tensor_uploaded", "layer_ready", "model_ready",
		"all_resident", "request_started", "layer_run", "first_token", "token", "done", "error"} {
		if !kinds[k] {
			t.Errorf("no %s event", k)
		}
	}
}
