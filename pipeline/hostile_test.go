package pipeline

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/gguf/ggufedit"
	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/pipeline/sample"
)

// TestGenerateRejectsBadOptions: Model.Generate range-checks its options
// and returns the *sample.FieldError (min_p 2 used to panic in the
// sampler's softmax, issue 17 item 1).
func TestGenerateRejectsBadOptions(t *testing.T) {
	m, err := Open(context.Background(), testmodels.Path(t, "stories260K-Q8_0.gguf"), Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for _, c := range []struct {
		field string
		o     GenerateOptions
	}{
		{"min_p", GenerateOptions{Sampling: sample.Params{Temp: 1, MinP: 2}}},
		{"top_p", GenerateOptions{Sampling: sample.Params{Temp: 1, TopP: 7}}},
		{"temperature", GenerateOptions{Sampling: sample.Params{Temp: float32(math.NaN())}}},
		{"top_k", GenerateOptions{Sampling: sample.Params{TopK: -3}}},
		{"repeat_penalty", GenerateOptions{Sampling: sample.Params{RepeatPenalty: -1}}},
		{"max_tokens", GenerateOptions{MaxTokens: -1}},
	} {
		_, err := m.Generate(context.Background(), "hi", c.o)
		var fe *sample.FieldError
		if !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("%s: error %v, want a FieldError for it", c.field, err)
		}
	}
	// The model still serves a valid request afterwards.
	if _, err := m.Generate(context.Background(), "hi", GenerateOptions{MaxTokens: 2, Sampling: sample.Params{Temp: 1, MinP: 1}}); err != nil {
		t.Fatal(err)
	}
}

// TestNaNWeightsAreARequestError: NaN in token_embd makes every logit NaN;
// a greedy and a sampled request both fail with sample.ErrNonFinite (no
// panic, no tokens of garbage), issue 17 item 2.
func TestNaNWeightsAreARequestError(t *testing.T) {
	p := filepath.Join(t.TempDir(), "nan-embd.gguf")
	nan := math.Float32bits(float32(math.NaN()))
	err := ggufedit.Copy(testmodels.Path(t, "stories260K-F32.gguf"), p, ggufedit.Edit{Tensor: func(ti *gguf.TensorInfo, b []byte) {
		if ti.Name == "token_embd.weight" {
			for i := 0; i+4 <= len(b); i += 4 {
				binary.LittleEndian.PutUint32(b[i:], nan)
			}
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	m, err := Open(context.Background(), p, Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for _, sp := range []sample.Params{{}, sample.Defaults()} {
		res, err := m.Generate(context.Background(), "Once upon a time", GenerateOptions{MaxTokens: 8, Sampling: sp})
		if !errors.Is(err, sample.ErrNonFinite) {
			t.Errorf("%+v: error %v, want sample.ErrNonFinite", sp, err)
		}
		if len(res.Tokens) != 0 {
			t.Errorf("%+v: %d tokens generated from NaN logits", sp, len(res.Tokens))
		}
	}
}

// TestOpenHostileBlockCount: pipeline.Open of a file announcing 2³² − 1 or
// 2⁴⁰ blocks fails naming block_count and allocates little on the way
// (before the check it sized per-layer structures by the count).
func TestOpenHostileBlockCount(t *testing.T) {
	for _, v := range []gguf.Value{gguf.Uint32(0xFFFFFFFF), gguf.Uint64(1 << 40)} {
		p := filepath.Join(t.TempDir(), "blocks.gguf")
		if err := ggufedit.Copy(testmodels.Path(t, "stories260K-F32.gguf"), p, ggufedit.Edit{Set: map[string]gguf.Value{"llama.block_count": v}}); err != nil {
			t.Fatal(err)
		}
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		m, err := Open(context.Background(), p, Options{Threads: 2})
		runtime.ReadMemStats(&after)
		if err == nil {
			m.Close()
			t.Fatalf("block_count %v: opened", v)
		}
		if !strings.Contains(err.Error(), "llama.block_count") {
			t.Errorf("block_count %v: error %v does not name llama.block_count", v, err)
		}
		if got := after.TotalAlloc - before.TotalAlloc; got > 200<<20 {
			t.Errorf("block_count %v: Open allocated %d MB before failing", v, got>>20)
		}
	}
}

// TestEngineRejectsBadSampling: the server's path (Engine.Generate) gets
// the *sample.FieldError for min_p 2 (the request body of issue 17's item
// 1), and the engine serves the next request.
func TestEngineRejectsBadSampling(t *testing.T) {
	e := NewEngine(EngineOptions{Resolve: func(n string) (string, error) { return n, nil }, Open: Options{Threads: 1}})
	defer e.Close()
	m := testmodels.Path(t, "stories260K-Q8_0.gguf")
	_, err := e.Generate(context.Background(), EngineRequest{Model: m, Prompt: "hi", Sampling: sample.Params{Temp: 0.8, MinP: 2}})
	var fe *sample.FieldError
	if !errors.As(err, &fe) || fe.Field != "min_p" {
		t.Fatalf("min_p 2: %v, want a FieldError for min_p", err)
	}
	if _, err := e.Generate(context.Background(), EngineRequest{Model: m, Prompt: "hi", MaxTokens: 2, Sampling: sample.Defaults()}); err != nil {
		t.Fatal(err)
	}
}
