package pipeline

import (
	"context"
	"errors"
	"iter"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/forge-llm/forge/gguf/testmodels"
	"go.uber.org/goleak"
)

// A reader that stops reading mid-stream holds up nothing: the other
// requests on the model run to their end, cancelling the stalled one
// returns (its slot freed at the next step), a reader blocked in its loop
// body does not keep Engine.Close waiting, and no goroutine is left.
func TestStreamStalledReader(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	path := testmodels.Path(t, "stories260K-F32.gguf")
	// A long context, so that the stalled request is still generating
	// (it asks for every position) when it is cancelled.
	e := NewEngine(EngineOptions{Open: Options{Threads: 1, Ctx: 1 << 15}, Resolve: func(name string) (string, error) { return name, nil }, Logger: slog.New(slog.DiscardHandler)})
	closed := false
	defer func() {
		if !closed {
			e.Close()
		}
	}()

	// A: read the id and one piece of text, then stop reading (the
	// iterator stays suspended in its yield).
	ctxA, cancelA := context.WithCancel(t.Context())
	defer cancelA()
	next, stop := iter.Pull2(e.Stream(ctxA, EngineRequest{Model: path, Prompt: "Once upon a time", IgnoreEOG: true}))
	defer stop()
	d, err, ok := next()
	if !ok || err != nil || d.RequestID == "" || d.Text != "" || d.Result != nil {
		t.Fatalf("first delta %+v %v %v: want the request id alone", d, err, ok)
	}
	idA := d.RequestID
	for {
		d, err, ok = next()
		if !ok || err != nil {
			t.Fatalf("A ended early: %v %v", err, ok)
		}
		if d.Text != "" {
			break
		}
	}

	// B and C run to their end while A's reader sleeps.
	var wg sync.WaitGroup
	results := make([]*EngineResult, 2)
	texts := make([]string, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Go(func() {
			var b strings.Builder
			for d, err := range e.Stream(t.Context(), EngineRequest{Model: path, Prompt: "The cat", MaxTokens: 16, IgnoreEOG: true}) {
				if err != nil {
					errs[i] = err
					return
				}
				if d.RequestID == idA {
					errs[i] = errors.New("a delta with A's request id")
				}
				b.WriteString(d.Text)
				if d.Result != nil {
					results[i] = d.Result
				}
			}
			texts[i] = b.String()
		})
	}
	wg.Wait()
	for i := range 2 {
		if errs[i] != nil || results[i] == nil {
			t.Fatalf("request %d: %v, result %v", i, errs[i], results[i])
		}
		r := results[i]
		if len(r.Tokens) != 16 || r.FinishReason != FinishLength || texts[i] != r.Text || r.RequestID == "" {
			t.Errorf("request %d: %d tokens, finish %q, streamed %q, result %q, id %q", i, len(r.Tokens), r.FinishReason, texts[i], r.Text, r.RequestID)
		}
		if r.Usage.CompletionTokens != 16 || r.Usage.PromptTokens != r.PromptTokens || r.Usage.DecodeRate() <= 0 {
			t.Errorf("request %d: usage %+v", i, r.Usage)
		}
	}

	// Cancelling A ends it: the stream gives what was buffered, then the
	// cancellation.
	cancelA()
	for {
		d, err, ok = next()
		if !ok {
			t.Fatal("A's stream ended without the cancellation")
		}
		if d.Result != nil {
			t.Fatalf("A finished (%d tokens) instead of being cancelled", len(d.Result.Tokens))
		}
		if err != nil {
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("A: %v, want the cancellation", err)
			}
			break
		}
	}
	stop()

	// D's reader blocks in its loop body; Close returns all the same,
	// and the reader, once released, sees the engine closed.
	release := make(chan struct{})
	got := make(chan error, 1)
	started := make(chan struct{})
	go func() {
		var last error
		first := true
		for d, err := range e.Stream(context.Background(), EngineRequest{Model: path, Prompt: "One day", IgnoreEOG: true}) {
			if err != nil {
				last = err
				break
			}
			if d.Text != "" && first {
				first = false
				close(started)
				<-release
			}
		}
		got <- last
	}()
	<-started
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	close(release)
	if err := <-got; !errors.Is(err, ErrEngineClosed) {
		t.Fatalf("D after Close: %v, want ErrEngineClosed", err)
	}
}

// Breaking out of a stream cancels its request and returns once it ended.
func TestStreamBreak(t *testing.T) {
	base := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, base) }) // after the engine's Close
	path := testmodels.Path(t, "stories260K-F32.gguf")
	e := newTestEngine(t, EngineOptions{Open: Options{Ctx: 1 << 15}})
	n := 0
	for d, err := range e.Stream(t.Context(), EngineRequest{Model: path, Prompt: "Once upon a time", IgnoreEOG: true}) {
		if err != nil {
			t.Fatal(err)
		}
		if d.Text != "" {
			if n++; n == 3 {
				break
			}
		}
	}
	// The model is free again: a request runs to its end.
	res, err := e.Generate(t.Context(), EngineRequest{Model: path, Prompt: "Once upon a time", MaxTokens: 4, IgnoreEOG: true})
	if err != nil || len(res.Tokens) != 4 {
		t.Fatalf("after break: %d tokens, %v", len(res.Tokens), err)
	}
}
