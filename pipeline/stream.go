package pipeline

import (
	"context"
	"fmt"
	"iter"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/forge-llm/forge/pipeline/chat"
)

// Delta is one step of a streamed request (Engine.Stream, Session.Stream).
// The first Delta of a stream carries only the request's id, as soon as the
// request is accepted; then come pieces of text; the last Delta carries the
// Result. Every Delta carries RequestID.
type Delta struct {
	// RequestID names the request from its start (logs, cancellation
	// reports); the Result repeats it.
	RequestID string
	// Text is the output generated since the previous Delta. A consumer
	// slower than the model gets the text of several tokens at once: the
	// stream never waits for its reader.
	Text string
	// ToolCalls are the calls the model made, parsed from its output in
	// the model's format; set on the last Delta only, when the request had
	// tools (Result.ToolCalls holds them too).
	ToolCalls []chat.ToolCall
	// Result is set on the last Delta: the finished request.
	Result *EngineResult
}

// requestSeq numbers stream requests across Engines of one process.
var requestSeq atomic.Uint64

// newRequestID is a request id: unique in the process, readable in logs.
func newRequestID() string {
	return fmt.Sprintf("req-%d", requestSeq.Add(1))
}

// streamBuf passes text from the executor to a stream's reader. push
// never blocks: it appends to what the reader has not taken yet and wakes
// it, so a slow reader, or one that stopped reading, cannot hold up a
// decode step. What it holds is the output not yet read, bounded by the
// request's output (MaxTokens, the context).
type streamBuf struct {
	mu      sync.Mutex
	pending strings.Builder
	done    bool
	res     EngineResult
	err     error
	wake    chan struct{} // capacity 1: a wake-up is never lost, never blocks
}

func newStreamBuf() *streamBuf { return &streamBuf{wake: make(chan struct{}, 1)} }

func (b *streamBuf) signal() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// push hands out text; it runs on the executor's goroutine.
func (b *streamBuf) push(s string) {
	b.mu.Lock()
	b.pending.WriteString(s)
	b.mu.Unlock()
	b.signal()
}

func (b *streamBuf) finish(res EngineResult, err error) {
	b.mu.Lock()
	b.done, b.res, b.err = true, res, err
	b.mu.Unlock()
	b.signal()
}

// take returns the text not yet read and, once the request ended, its
// outcome.
func (b *streamBuf) take() (text string, done bool, res EngineResult, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	text = b.pending.String()
	b.pending.Reset()
	return text, b.done, b.res, b.err
}

// Stream runs a request as Generate does and streams its output. The
// request runs on its own goroutine, decoupled from the reader: the
// executor only appends text to a buffer, so a reader that is slow, or
// that stops reading (never calls next, blocks in the loop body), never
// stalls a step of this or any other request, and Engine.Close does not
// wait for it. Breaking out of the loop, or cancelling ctx, cancels the
// request: its slot is freed at the next step, and the loop returns once
// the request has ended (no goroutine outlives it).
//
// The first Delta carries the request id; the last the Result. An error
// (the request's, wrapped as Generate wraps it) ends the sequence.
// EngineRequest.OnText, if set, is called too, on the executor.
func (e *Engine) Stream(ctx context.Context, r EngineRequest) iter.Seq2[Delta, error] {
	return func(yield func(Delta, error) bool) {
		id := r.ID
		if id == "" {
			id = newRequestID()
			r.ID = id
		}
		ctx, cancel := context.WithCancel(ctx)
		b := newStreamBuf()
		user := r.OnText
		r.OnText = func(s string) error {
			if user != nil {
				if err := user(s); err != nil {
					return err
				}
			}
			b.push(s)
			return nil
		}
		var wg sync.WaitGroup
		wg.Go(func() {
			res, err := e.Generate(ctx, r)
			b.finish(res, err)
		})
		defer func() {
			cancel()
			wg.Wait()
		}()
		if !yield(Delta{RequestID: id}, nil) {
			return
		}
		for {
			select {
			case <-b.wake:
			case <-ctx.Done():
				// The request ends within a step; its outcome follows.
				<-b.wake
			}
			text, done, res, err := b.take()
			if text != "" && !yield(Delta{RequestID: id, Text: text}, nil) {
				return
			}
			if !done {
				continue
			}
			if err != nil {
				yield(Delta{RequestID: id}, err)
				return
			}
			yield(Delta{RequestID: id, ToolCalls: res.ToolCalls, Result: &res}, nil)
			return
		}
	}
}

// Usage is a finished request's counts and timings.
type Usage struct {
	PromptTokens     int
	CompletionTokens int
	// Queued is the time from the request's arrival to its admission
	// (its model loaded and its prompt tokenized).
	Queued time.Duration
	// FirstToken is the time from admission to the first generated token:
	// the prompt's processing (less what the prefix cache saved) and one
	// decode step.
	FirstToken time.Duration
	// Decode is the time from the first token to the last.
	Decode time.Duration
}

// DecodeRate is the generation speed after the first token, in tokens per
// second (0 with fewer than two tokens).
func (u Usage) DecodeRate() float64 {
	if u.CompletionTokens < 2 || u.Decode <= 0 {
		return 0
	}
	return float64(u.CompletionTokens-1) / u.Decode.Seconds()
}

// PromptRate is the prompt's processing speed, in tokens per second,
// counting the first token's time as prompt time.
func (u Usage) PromptRate() float64 {
	if u.FirstToken <= 0 {
		return 0
	}
	return float64(u.PromptTokens) / u.FirstToken.Seconds()
}

// FinishReason says why a request ended, in OpenAI's words (it marshals
// as the string).
type FinishReason string

// The finish reasons.
const (
	// FinishStop: an end-of-generation token or a stop string.
	FinishStop FinishReason = "stop"
	// FinishLength: MaxTokens, or the context is full.
	FinishLength FinishReason = "length"
	// FinishToolCalls: the model called tools (the output parsed as calls
	// in its family's format).
	FinishToolCalls FinishReason = "tool_calls"
)
