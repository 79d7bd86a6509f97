package pipeline

import (
	"context"
	"errors"
	"iter"
	"slices"
	"sync"

	"github.com/forge-llm/forge/pipeline/chat"
	"github.com/forge-llm/forge/pipeline/sample"
)

// ErrSessionBusy is returned by a Session asked for a turn while another
// is in progress: a conversation has one turn at a time.
var ErrSessionBusy = errors.New("pipeline: the session has a turn in progress")

// ErrNoTurn is returned by Session.Continue when the conversation does not
// end with a user message or a tool's result: there is nothing to answer.
var ErrNoTurn = errors.New("pipeline: nothing to answer (the conversation ends with the assistant)")

// SessionOptions configure a Session: what every turn's request carries.
type SessionOptions struct {
	// System is the conversation's system message ("": none).
	System string
	// Tools and ToolChoice are offered on every turn (see EngineRequest).
	Tools      []chat.Tool
	ToolChoice string
	// MaxTokens, Sampling and Stop are each turn's (see EngineRequest).
	MaxTokens int
	Sampling  sample.Params
	Stop      []string
	// Template overrides the model's chat template (nil: the model's).
	Template *chat.Template
}

// Session is a conversation bound to a model: it holds the messages, and
// each turn sends the whole history rendered by the model's template. On a
// batching engine (the default) the KV cache of the history is reused
// through the serving engine's prefix cache: a turn computes only what the
// previous turns did not (see Model.BatchStats' PromptCached), so a long
// conversation does not pay for its history again every turn.
//
// A Session is safe for concurrent use, with one turn at a time
// (ErrSessionBusy otherwise). A turn that fails or is cancelled leaves the
// conversation as it was.
type Session struct {
	e     *Engine
	model string
	o     SessionOptions

	mu   sync.Mutex
	msgs []chat.Message
	busy bool
}

// NewSession starts a conversation with model (loaded at the first turn).
func (e *Engine) NewSession(model string, o SessionOptions) *Session {
	s := &Session{e: e, model: model, o: o}
	if o.System != "" {
		s.msgs = append(s.msgs, chat.Message{Role: "system", Content: o.System})
	}
	return s
}

// Messages returns a copy of the conversation so far.
func (s *Session) Messages() []chat.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.msgs)
}

// AddToolResult appends a tool's result, answering the assistant's call
// callID; Continue then has the model answer it.
func (s *Session) AddToolResult(callID, name, content string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.msgs = append(s.msgs, chat.Message{Role: "tool", ToolCallID: callID, Name: name, Content: content})
}

// Send has the model answer user's message and returns the answer (its
// calls in ToolCalls, for a session with tools). The message and the
// answer join the conversation.
func (s *Session) Send(ctx context.Context, user string) (EngineResult, error) {
	return collectStream(s.Stream(ctx, user))
}

// Stream is Send, streamed as Engine.Stream streams.
func (s *Session) Stream(ctx context.Context, user string) iter.Seq2[Delta, error] {
	return s.turn(ctx, []chat.Message{{Role: "user", Content: user}})
}

// Continue has the model answer the conversation as it stands: after tool
// results (AddToolResult), or after a user message added by a turn that
// failed and is retried.
func (s *Session) Continue(ctx context.Context) iter.Seq2[Delta, error] {
	return s.turn(ctx, nil)
}

// turn runs one request with the history and add; on success add and the
// answer join the history.
func (s *Session) turn(ctx context.Context, add []chat.Message) iter.Seq2[Delta, error] {
	return func(yield func(Delta, error) bool) {
		s.mu.Lock()
		if s.busy {
			s.mu.Unlock()
			yield(Delta{}, ErrSessionBusy)
			return
		}
		msgs := append(slices.Clone(s.msgs), add...)
		if len(msgs) == 0 || msgs[len(msgs)-1].Role == "assistant" || msgs[len(msgs)-1].Role == "system" {
			s.mu.Unlock()
			yield(Delta{}, ErrNoTurn)
			return
		}
		s.busy = true
		s.mu.Unlock()
		defer func() {
			s.mu.Lock()
			s.busy = false
			s.mu.Unlock()
		}()
		r := EngineRequest{
			Model: s.model, Messages: msgs, Template: s.o.Template,
			MaxTokens: s.o.MaxTokens, Sampling: s.o.Sampling, Stop: s.o.Stop,
			Tools: s.o.Tools, ToolChoice: s.o.ToolChoice,
		}
		for d, err := range s.e.Stream(ctx, r) {
			if err == nil && d.Result != nil {
				s.mu.Lock()
				s.msgs = append(msgs, chat.Message{Role: "assistant", Content: d.Result.Text, ToolCalls: d.Result.ToolCalls})
				s.mu.Unlock()
			}
			if !yield(d, err) {
				return
			}
		}
	}
}

// collectStream runs a stream to its end and returns its result.
func collectStream(seq iter.Seq2[Delta, error]) (EngineResult, error) {
	for d, err := range seq {
		if err != nil {
			return EngineResult{}, err
		}
		if d.Result != nil {
			return *d.Result, nil
		}
	}
	return EngineResult{}, errors.New("pipeline: stream ended without a result")
}
