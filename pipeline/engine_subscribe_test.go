package pipeline

import (
	"context"
	"testing"

	"github.com/forge-llm/forge/gguf/testmodels"
	"go.uber.org/goleak"
)

// A subscription taken from the Engine and never read neither blocks
// requests nor outlives Close; one whose context ends is closed.
func TestEngineSubscribeClosedWithEngine(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	path := testmodels.Path(t, "stories260K-F32.gguf")
	e := NewEngine(EngineOptions{Open: Options{Threads: 1}, Resolve: func(n string) (string, error) { return n, nil }})
	idle, err := e.Subscribe(t.Context(), path) // never read
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	short, err := e.Subscribe(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := e.Generate(t.Context(), EngineRequest{Model: path, Prompt: "Once upon a time", MaxTokens: 16}); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	for range short.C { // closed once its context ended (queued events dropped)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if _, open := <-idle.C; open {
		// Close dropped what was queued: the channel is closed.
		t.Fatal("the idle subscription is still open after Close")
	}
	if _, err := e.Subscribe(t.Context(), path); err == nil {
		t.Fatal("Subscribe after Close: no error")
	}
}
