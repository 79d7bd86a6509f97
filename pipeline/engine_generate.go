package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/forge-llm/forge/pipeline/chat"
	"github.com/forge-llm/forge/pipeline/constrain"
	"github.com/forge-llm/forge/pipeline/sample"
	"github.com/forge-llm/forge/pipeline/tokenizer"
)

// EngineRequest is one request to an Engine.
type EngineRequest struct {
	// ID names the request in logs and results; empty: one is made up
	// ("req-N") when it starts.
	ID    string
	Model string
	// Prompt is the text to complete, used when Messages is nil.
	Prompt string
	// Messages is a conversation, rendered with the model's chat template
	// (ending with the opening of an assistant turn).
	Messages []chat.Message
	// Template renders Messages in place of the model's own template
	// (nil: the model's tokenizer.chat_template), for a server that
	// overrides it or falls back to a default.
	Template  *chat.Template
	MaxTokens int // ≤ 0: until end of generation or a full context
	Sampling  sample.Params
	// Stop ends the output before the first occurrence of any of these
	// strings; the stop string itself is not returned.
	Stop []string
	// IgnoreEOG generates past end-of-generation tokens (benchmarks,
	// tests; vLLM's ignore_eos).
	IgnoreEOG bool
	// Grammar constrains the output (see GenerateOptions.Grammar).
	Grammar *constrain.Grammar
	// OnText streams the output as it is generated. Text that may be the
	// start of a stop string is held back until it is known not to be.
	// An error from it ends the request with that error.
	OnText func(delta string) error
	// Tools are the functions the model may call: the template renders
	// them, and the output is parsed back as calls in the model's format
	// (EngineResult.ToolCalls). Content streams to OnText as it comes;
	// text that opens a call in that format is held, parsed once the
	// answer is whole, and never streamed. See ToolChoice.
	Tools []chat.Tool
	// ToolChoice is OpenAI's tool_choice: "" or "auto", "none" (tools are
	// not offered), "required" (the answer must be a call) or a function's
	// name (a call of it).
	ToolChoice string
	// Constrain, when set, is asked for a token constraint before the
	// request runs (the hook constrained decoding plugs into, see
	// Constraint).
	Constrain ConstraintFactory
}

// EngineResult is a finished engine request.
type EngineResult struct {
	Result
	// RequestID is EngineRequest.ID, or the id made up for the request.
	RequestID string
	// FinishReason is "stop" (end of generation or a stop string),
	// "length" (MaxTokens or a full context) or "tool_calls", as OpenAI's
	// API says it.
	FinishReason FinishReason
	// ToolCalls are the calls parsed from the output, for a request with
	// Tools; Text is then what the model wrote besides them.
	ToolCalls []chat.ToolCall
	// Usage has the request's counts and timings.
	Usage Usage
}

// errStopString ends a request whose output reached a stop string.
var errStopString = errors.New("stop string reached")

// Generate runs one request on its model, loading the model first if it
// is not loaded. Requests on one model run one at a time in arrival order;
// cancelling ctx ends a request at once, queued or running, and the next
// one starts.
func (e *Engine) Generate(ctx context.Context, r EngineRequest) (EngineResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(e.ctx, cancel)()
	res, err := e.generate(ctx, r)
	if err != nil && e.ctx.Err() != nil {
		// Close cancelled it (queued or running): say so, rather than
		// passing the cancellation off as the client's.
		err = fmt.Errorf("%w: %w", ErrEngineClosed, err)
	}
	return res, err
}

// ErrContextLength is wrapped when a prompt has more tokens than the
// model's context holds; nothing was queued or computed for it.
var ErrContextLength = errors.New("pipeline: prompt longer than the context")

func (e *Engine) generate(ctx context.Context, r EngineRequest) (EngineResult, error) {
	arrived := time.Now()
	if r.ID == "" {
		r.ID = newRequestID()
	}
	lease, err := e.Acquire(ctx, r.Model)
	if err != nil {
		return EngineResult{}, err
	}
	defer lease.Release()
	m := lease.Model()

	o := GenerateOptions{MaxTokens: r.MaxTokens, Sampling: r.Sampling, IgnoreEOG: r.IgnoreEOG, Grammar: r.Grammar}
	// The prompt is tokenized here, under the request's context, and its
	// length checked before it is queued: a long prompt neither waits in
	// the queue nor touches the KV cache only to be refused.
	var ids []int32
	var tmpl *chat.Template
	tools, err := offeredTools(&r)
	if err != nil {
		return EngineResult{}, err
	}
	if r.Messages != nil {
		ids, tmpl, err = chatPromptTools(ctx, m, r.Messages, r.Template, tools)
	} else {
		ids, err = textPrompt(ctx, m, r.Prompt)
	}
	if err != nil {
		return EngineResult{}, err
	}
	if n := ctxPositions(m.Config(), e.o.Open); len(ids) > n {
		return EngineResult{}, &ContextLengthError{Prompt: len(ids), Context: n}
	}
	o.PromptIDs = ids
	if tools != nil && tmpl == nil {
		return EngineResult{}, fmt.Errorf("%w: tools need a chat request (messages)", ErrToolChoice)
	}
	if r.Constrain == nil && tools != nil {
		// Where constrained decoding holds a call to its format and
		// arguments to the function's schema.
		r.Constrain = e.o.ToolConstraint
	}
	if r.Constrain != nil {
		// The factory sees the template the prompt was rendered with:
		// its Family says how the model writes a call (chat.ToolCallText).
		r.Template = tmpl
		tok, err := m.Tokenizer(ctx)
		if err != nil {
			return EngineResult{}, err
		}
		c, err := r.Constrain(tok, &r)
		if err != nil {
			return EngineResult{}, err
		}
		o.Constraint = c
	}
	admitted := time.Now()
	var first, last time.Time
	st := &stopper{stops: r.Stop}
	// With tools the answer may be a call: the streamer holds what may be
	// one until the answer is whole and parsed; content streams.
	var ts *toolStreamer
	sent := 0 // bytes handed to OnText
	if tools != nil {
		ts = newToolStreamer(tmpl.Family)
	}
	o.OnToken = func(t Token) error {
		last = time.Now()
		if first.IsZero() {
			first = last
		}
		delta, hit := st.add(t.Text)
		if ts != nil {
			delta = ts.add(delta)
		}
		if delta != "" && r.OnText != nil {
			if err := r.OnText(delta); err != nil {
				return err
			}
			sent += len(delta)
		}
		if hit {
			return errStopString
		}
		return nil
	}
	res, err := m.Generate(ctx, r.Prompt, o)
	out := EngineResult{Result: res, RequestID: r.ID}
	out.Usage = Usage{PromptTokens: res.PromptTokens, CompletionTokens: len(res.Tokens), Queued: admitted.Sub(arrived)}
	if !first.IsZero() {
		// OnToken's writes are ordered before Generate's return.
		out.Usage.FirstToken, out.Usage.Decode = first.Sub(admitted), last.Sub(first)
	}
	switch {
	case errors.Is(err, errStopString) && tools == nil:
		out.Text, out.Stop, out.FinishReason = st.text(), "stop_string", FinishStop
		return out, nil
	case errors.Is(err, errStopString):
		// A stop string with tools: the text up to it is parsed below.
		out.Stop = "stop_string"
	case err != nil:
		return out, e.fail(lease.ent, lease.inst, err)
	}
	rest := st.flush()
	out.Text = st.text()
	out.FinishReason = FinishStop
	if res.Stop == "max_tokens" || res.Stop == "context_full" {
		out.FinishReason = FinishLength
	}
	if ts != nil {
		out.Text, out.ToolCalls = ts.finish(tmpl.Family, out.Text, sent)
		if out.ToolCalls != nil {
			toolCallIDs(r.ID, out.ToolCalls)
			out.FinishReason = FinishToolCalls
		}
		rest = out.Text[sent:]
	}
	if rest != "" && r.OnText != nil {
		if err := r.OnText(rest); err != nil {
			return out, err
		}
	}
	if r.Messages == nil && ts == nil {
		// a completion's next turn may continue this text (continuation.go)
		if tok, err := m.Tokenizer(ctx); err == nil {
			m.remember(tok, r.Prompt, ids, res.Tokens, out.Text)
		}
	}
	return out, nil
}

// textPrompt tokenizes a completion prompt as Model.Generate does (BOS and
// EOS as the vocabulary asks, special-token text as text), cancellably.
func textPrompt(ctx context.Context, m *Model, prompt string) ([]int32, error) {
	tok, err := m.Tokenizer(ctx)
	if err != nil {
		return nil, err
	}
	if ids := m.continued(ctx, tok, prompt); ids != nil {
		slog.Debug("pipeline: prompt continues a request", "tokens", len(ids))
		return ids, nil
	}
	ids, err := tok.EncodeContext(ctx, prompt, tokenizer.EncodeOptions{AddBOS: tok.ShouldAddBOS(), AddEOS: tok.ShouldAddEOS()})
	if err != nil {
		return nil, fmt.Errorf("pipeline: tokenizing the prompt: %w", err)
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("pipeline: empty prompt")
	}
	return ids, nil
}

// chatPrompt renders a conversation with the model's template and
// tokenizes it: special tokens are parsed in the template's text only,
// never in the messages' content. BOS comes from the template when it
// writes one, else as the vocabulary asks.
func chatPrompt(ctx context.Context, m *Model, msgs []chat.Message, tmpl *chat.Template) ([]int32, error) {
	ids, _, err := chatPromptTools(ctx, m, msgs, tmpl, nil)
	return ids, err
}

// chatPromptTools is chatPrompt with the tools the template renders; it
// returns the template used (its Family says how calls are written).
func chatPromptTools(ctx context.Context, m *Model, msgs []chat.Message, tmpl *chat.Template, tools []chat.Tool) ([]int32, *chat.Template, error) {
	if tmpl == nil {
		var err error
		if tmpl, err = chat.Parse(m.ChatTemplate()); err != nil {
			return nil, nil, err
		}
	}
	tok, err := m.Tokenizer(ctx)
	if err != nil {
		return nil, nil, err
	}
	var bos, eos string
	if tok.BOS() >= 0 {
		bos = tok.Token(tok.BOS())
	}
	if tok.EOS() >= 0 {
		eos = tok.Token(tok.EOS())
	}
	segs, err := tmpl.RenderSegments(msgs, chat.Options{BOS: bos, EOS: eos, AddGenerationPrompt: true, Tools: tools})
	if err != nil {
		return nil, nil, err
	}
	tsegs := make([]tokenizer.Segment, len(segs))
	for i, sg := range segs {
		tsegs[i] = tokenizer.Segment{Text: sg.Text, ParseSpecial: !sg.Content}
	}
	startsBOS := len(segs) > 0 && !segs[0].Content && strings.HasPrefix(segs[0].Text, bos)
	addBOS := tok.ShouldAddBOS() && (bos == "" || !startsBOS)
	ids, err := tok.EncodeSegments(ctx, tsegs, tokenizer.EncodeOptions{AddBOS: addBOS})
	if err != nil {
		return nil, nil, fmt.Errorf("pipeline: tokenizing the chat prompt: %w", err)
	}
	return ids, tmpl, nil
}

// stopper cuts the output at the first stop string, holding back any
// tail that could still grow into one.
type stopper struct {
	stops   []string
	all     strings.Builder
	emitted int // bytes of all handed out
	end     int // where the output ends once a stop string was found (-1: not yet)
	hit     bool
}

// add appends text and returns what can be handed out now, and whether a
// stop string was reached.
func (s *stopper) add(text string) (string, bool) {
	if s.hit {
		return "", true
	}
	s.all.WriteString(text)
	all := s.all.String()
	cut := -1
	for _, stop := range s.stops {
		if stop == "" {
			continue
		}
		from := max(0, s.emitted-len(stop)+1)
		if i := strings.Index(all[from:], stop); i >= 0 && (cut < 0 || from+i < cut) {
			cut = from + i
		}
	}
	if cut >= 0 {
		s.hit = true
		s.end = cut
		delta := all[min(s.emitted, cut):cut]
		s.emitted = cut
		return delta, true
	}
	safe := len(all)
	for _, stop := range s.stops {
		// The longest tail of all that begins stop stays held back.
		for n := min(len(stop)-1, len(all)-s.emitted); n > 0; n-- {
			if strings.HasSuffix(all, stop[:n]) {
				safe = min(safe, len(all)-n)
				break
			}
		}
	}
	delta := all[s.emitted:safe]
	s.emitted = safe
	return delta, false
}

// flush hands out what was held back once the output ended.
func (s *stopper) flush() string {
	if s.hit {
		return ""
	}
	all := s.all.String()
	delta := all[s.emitted:]
	s.emitted = len(all)
	return delta
}

// text is the whole output, up to the stop string.
func (s *stopper) text() string {
	all := s.all.String()
	if s.hit {
		return all[:s.end]
	}
	return all
}
