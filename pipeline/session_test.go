package pipeline

import (
	"errors"
	"iter"
	"strings"
	"testing"

	"github.com/forge-llm/forge/pipeline/sample"
)

// batchStats is a loaded model's batching counters.
func batchStats(t *testing.T, e *Engine, model string) (computed, cached int64) {
	t.Helper()
	l, err := e.Acquire(t.Context(), model)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	st := l.Model().BatchStats()
	return st.PromptComputed, st.PromptCached
}

// A Session keeps the conversation; its second turn finds the first
// turn's prompt in the prefix cache instead of computing it again; one
// turn at a time; a cancelled turn leaves the conversation as it was.
func TestSession(t *testing.T) {
	path := chatModel(t)
	e := newTestEngine(t, EngineOptions{Open: Options{Ctx: 2048}})
	system := strings.Repeat("You are a patient storyteller who speaks of cats and dogs. ", 4)
	s := e.NewSession(path, SessionOptions{System: system, MaxTokens: 6, Sampling: sample.Params{}})
	r1, err := s.Send(t.Context(), "Tell me a story")
	if err != nil {
		t.Fatal(err)
	}
	comp1, cached1 := batchStats(t, e, path)
	r2, err := s.Send(t.Context(), "Another one")
	if err != nil {
		t.Fatal(err)
	}
	comp2, cached2 := batchStats(t, e, path)
	if cached2-cached1 <= 0 || comp2-comp1 >= int64(r2.PromptTokens) {
		t.Errorf("second turn: %d prompt tokens, %d computed, %d from the prefix cache; want the history cached", r2.PromptTokens, comp2-comp1, cached2-cached1)
	}
	t.Logf("second turn: %d prompt tokens, %d computed, %d from the prefix cache", r2.PromptTokens, comp2-comp1, cached2-cached1)
	msgs := s.Messages()
	roles := []string{}
	for _, m := range msgs {
		roles = append(roles, m.Role)
	}
	if strings.Join(roles, ",") != "system,user,assistant,user,assistant" || msgs[2].Content != r1.Text || msgs[4].Content != r2.Text {
		t.Fatalf("conversation %+v", msgs)
	}

	// A turn in progress makes the session busy; cancelling it leaves the
	// conversation as it was.
	next, stop := iter.Pull2(s.Stream(t.Context(), "And a third"))
	if _, err, ok := next(); !ok || err != nil {
		t.Fatalf("third turn: %v", err)
	}
	if _, err := s.Send(t.Context(), "Meanwhile"); !errors.Is(err, ErrSessionBusy) {
		t.Fatalf("concurrent turn: %v", err)
	}
	stop()
	if got := s.Messages(); len(got) != len(msgs) {
		t.Fatalf("after a cancelled turn: %d messages, want %d", len(got), len(msgs))
	}
	if _, err := collectStream(s.Continue(t.Context())); !errors.Is(err, ErrNoTurn) {
		t.Fatalf("continue after the assistant: %v", err)
	}
}

// A prompt over the context is a *ContextLengthError with the counts
// CountTokens gives.
func TestContextLengthError(t *testing.T) {
	path := chatModel(t)
	e := newTestEngine(t, EngineOptions{})
	r := EngineRequest{Model: path, Prompt: strings.Repeat("Once upon a time there was a cat. ", 60)}
	n, ctxLen, err := e.CountTokens(t.Context(), r)
	if err != nil || n <= ctxLen {
		t.Fatalf("CountTokens: %d of %d, %v", n, ctxLen, err)
	}
	_, err = e.Generate(t.Context(), r)
	var cl *ContextLengthError
	if !errors.Is(err, ErrContextLength) || !errors.As(err, &cl) || cl.Prompt != n || cl.Context != ctxLen {
		t.Fatalf("error %v (%+v), want prompt %d context %d", err, cl, n, ctxLen)
	}
}
