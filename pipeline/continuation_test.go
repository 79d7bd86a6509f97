package pipeline

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/forge-llm/forge/pipeline/synth"
	"github.com/forge-llm/forge/pipeline/tokenizer"
)

// paddedVocabModel writes the tiny random-weight model with its byte-level
// vocabulary padded past its tokens, as forge gen's presets are: a
// generated padding token's text is several byte tokens when tokenized
// again.
func paddedVocabModel(t *testing.T) string {
	t.Helper()
	shape := synth.Presets["tiny"]
	shape.Ctx, shape.Vocab = 1024, 4096
	path := filepath.Join(t.TempDir(), "tiny.gguf")
	if err := synth.WriteFile(context.Background(), path, synth.Options{Shape: shape, Seed: 5, Name: "tiny", ValidUTF8: true}); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestBatchingContinuation: a conversation's next turn, sent as text
// (the first prompt, the reply as streamed, new words), keeps the ids of
// the first prompt and of the reply as generated, so the prefix cache
// holds every full block of them. The model is a random-weight one with
// the padded byte-level vocabulary forge gen writes, whose reply,
// tokenized again, gives other ids (checked: else the test would show
// nothing). A deterministic server tokenizes the whole text instead.
func TestBatchingContinuation(t *testing.T) {
	path := paddedVocabModel(t)
	ctx := context.Background()
	const bs = 8
	first := "once upon a time there was a little dog who liked to run in the park every day with its friends"
	for _, det := range []bool{false, true} {
		m, err := Open(ctx, path, Options{Threads: 2, Batching: Batching{On: true, Seqs: 4, BlockSize: bs, Deterministic: det}})
		if err != nil {
			t.Fatal(err)
		}
		tok, err := m.Tokenizer(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var streamed strings.Builder
		res1, err := m.Generate(ctx, first, GenerateOptions{MaxTokens: 24, IgnoreEOG: true, OnToken: func(tk Token) error {
			streamed.WriteString(tk.Text)
			return nil
		}})
		if err != nil {
			t.Fatal(err)
		}
		rest := " and then it slept"
		second := first + streamed.String() + rest
		res2, err := m.Generate(ctx, second, GenerateOptions{MaxTokens: 2, IgnoreEOG: true})
		if err != nil {
			t.Fatal(err)
		}
		ids1, err := tok.Encode(first, tokenizer.EncodeOptions{AddBOS: tok.ShouldAddBOS()})
		if err != nil {
			t.Fatal(err)
		}
		kept := append(slices.Clone(ids1), res1.Tokens...)
		more, _ := tok.Encode(rest, tokenizer.EncodeOptions{Continue: true})
		fresh, _ := tok.Encode(second, tokenizer.EncodeOptions{AddBOS: tok.ShouldAddBOS()})
		if slices.Equal(fresh, append(slices.Clone(kept), more...)) {
			t.Fatalf("the reply tokenized again gives its own ids: this model shows nothing")
		}
		if det {
			if res2.PromptTokens != len(fresh) {
				t.Errorf("deterministic: the turn has %d prompt tokens, the whole text tokenized %d", res2.PromptTokens, len(fresh))
			}
		} else {
			if want := len(kept) + len(more); res2.PromptTokens != want {
				t.Errorf("the turn has %d prompt tokens, want %d (%d kept + %d new; tokenized afresh %d)", res2.PromptTokens, want, len(kept), len(more), len(fresh))
			}
			// every full block of what request 1 computed (its prompt and
			// all but its last generated token) comes from the cache
			if want := (len(kept) - 1) / bs * bs; res2.CachedTokens != want {
				t.Errorf("%d of the turn's tokens came from the cache, want %d", res2.CachedTokens, want)
			}
		}
		t.Logf("deterministic %v: first prompt %d tokens + reply %d; the turn %d tokens, %d cached (the whole text tokenized: %d)",
			det, res1.PromptTokens, len(res1.Tokens), res2.PromptTokens, res2.CachedTokens, len(fresh))
		m.Close()
	}
}

// TestEngineContinuation: the same through the Engine (forge serve's
// path, which tokenizes a completion's prompt itself): the second
// request, the first's prompt and streamed reply and new words, keeps the
// first's ids.
func TestEngineContinuation(t *testing.T) {
	path := paddedVocabModel(t)
	ctx := context.Background()
	e := NewEngine(EngineOptions{Resolve: func(n string) (string, error) { return n, nil },
		Open: Options{Threads: 2, Batching: Batching{Seqs: 4, BlockSize: 8}}})
	defer e.Close()
	first := "once upon a time there was a little dog who liked to run in the park every day with its friends"
	gen := func(prompt string) (EngineResult, string) {
		var sb strings.Builder
		res, err := e.Generate(ctx, EngineRequest{Model: path, Prompt: prompt, MaxTokens: 24, IgnoreEOG: true,
			OnText: func(d string) error { sb.WriteString(d); return nil }})
		if err != nil {
			t.Fatal(err)
		}
		return res, sb.String()
	}
	res1, text1 := gen(first)
	res2, _ := gen(first + text1 + " and then it slept")
	if want := res1.PromptTokens + len(res1.Tokens); res2.PromptTokens < want || res2.CachedTokens < (want-1)/8*8 {
		t.Errorf("the turn: %d prompt tokens, %d cached; want the first request's %d kept and their full blocks cached", res2.PromptTokens, res2.CachedTokens, want)
	}
	t.Logf("first %d + %d tokens; the turn %d tokens, %d cached", res1.PromptTokens, len(res1.Tokens), res2.PromptTokens, res2.CachedTokens)
}

// TestContinuationsKeepTheLatest: the longest remembered text that begins
// a prompt wins, short requests are not kept, and only the latest
// maxContinuations are.
func TestContinuationsKeepTheLatest(t *testing.T) {
	var c continuations
	ids := func(n int) []int32 { return make([]int32, n) }
	c.add("abc", ids(minContinuation-1))
	if _, ok := c.longest("abcdef"); ok {
		t.Fatal("a request shorter than minContinuation was kept")
	}
	c.add("ab", ids(minContinuation))
	c.add("abcd", ids(minContinuation+1))
	c.add("x", ids(minContinuation))
	if e, ok := c.longest("abcdef"); !ok || e.text != "abcd" {
		t.Fatalf("longest of abcdef: %q %v, want abcd", e.text, ok)
	}
	if e, ok := c.longest("abz"); !ok || e.text != "ab" {
		t.Fatalf("longest of abz: %q %v, want ab", e.text, ok)
	}
	for i := range maxContinuations {
		c.add(strings.Repeat("y", i+1), ids(minContinuation))
	}
	if len(c.entries) != maxContinuations {
		t.Fatalf("%d remembered, want %d", len(c.entries), maxContinuations)
	}
	if _, ok := c.longest("abcdef"); ok {
		t.Fatal("the oldest requests were not forgotten")
	}
}
