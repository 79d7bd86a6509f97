package pipeline

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/forge-llm/forge/actors"
	"github.com/forge-llm/forge/pipeline/constrain"
	"github.com/forge-llm/forge/pipeline/generate"
	"github.com/forge-llm/forge/pipeline/model"
	"github.com/forge-llm/forge/pipeline/sample"
	"github.com/forge-llm/forge/pipeline/tokenizer"
)

// GenerateOptions control one request.
type GenerateOptions struct {
	// MaxTokens is the most tokens to generate (≤ 0: until an
	// end-of-generation token or a full context).
	MaxTokens int
	// Sampling picks tokens; the zero value is greedy.
	Sampling sample.Params
	// PromptIDs, when set, is the prompt as token ids and the prompt text
	// is ignored (no BOS is added).
	PromptIDs []int32
	// IgnoreEOG keeps generating past end-of-generation tokens.
	IgnoreEOG bool
	// Grammar constrains the output to its language (a JSON Schema, a
	// GBNF grammar, any JSON object: package constrain); the request
	// ends with an end-of-generation token once the output is complete,
	// and tokens that could not be completed within MaxTokens or the
	// context are never picked. nil: unconstrained.
	Grammar *constrain.Grammar
	// Constraint restricts the output by some other rule than a grammar
	// (a ConstraintFactory's, such as ForceText); one per request, closed
	// when it ends. Not with Grammar.
	Constraint sample.Constraint
	// OnToken streams the output: it receives each token as it is sampled,
	// with the text it completes (possibly "" while a multi-byte character
	// is incomplete). It runs on the executor's goroutine and is never
	// called after Generate returns; an error from it stops the request.
	OnToken func(t Token) error
}

// MaxGenerateTokens bounds MaxTokens: no request asks for more tokens than
// any context holds.
const MaxGenerateTokens = 1 << 24

// Validate range-checks every field a caller (a CLI flag, an HTTP request)
// can set and returns a *sample.FieldError naming the first bad one.
func (o GenerateOptions) Validate() error {
	if o.MaxTokens < 0 || o.MaxTokens > MaxGenerateTokens {
		return &sample.FieldError{Field: "max_tokens", Value: o.MaxTokens, Reason: fmt.Sprintf("must be in [0, %d] (0: until the end of generation)", MaxGenerateTokens)}
	}
	return o.Sampling.Validate()
}

// Token is one generated token.
type Token struct {
	ID   int32
	Text string
}

// Result is a finished request.
type Result struct {
	ID           uint64 // request id in the events
	PromptTokens int
	// CachedTokens is how many of the prompt's tokens came from the
	// prefix cache (batching only) rather than being computed.
	CachedTokens int
	Tokens       []int32
	Text         string
	Stop         string // "eog", "max_tokens" or "context_full"
}

// Generate runs one request: it validates o (a *sample.FieldError, wrapped,
// for a value out of range), tokenizes the prompt (BOS as the model
// asks), waits for the model to be ready (every weight under eager and
// host-f32), then generates, each layer of the first forward pass waiting
// for its own weights. It returns when the request ends or ctx is done
// (within one layer's work).
func (m *Model) Generate(ctx context.Context, prompt string, o GenerateOptions) (Result, error) {
	// Out-of-range options are the caller's mistake, reported as a
	// *sample.FieldError before anything runs.
	if err := o.Validate(); err != nil {
		return Result{}, fmt.Errorf("pipeline: %w", err)
	}
	// A prompt given as ids needs no tokenizer: a file without a usable
	// vocabulary still generates (ids only, no text, no end-of-generation
	// tokens).
	tok, err := m.Tokenizer(ctx)
	if err != nil && (o.PromptIDs == nil || ctx.Err() != nil) {
		return Result{}, err
	}
	ids := o.PromptIDs
	if ids == nil {
		t0 := time.Now()
		// a batching model keeps the ids of a request the prompt
		// continues (continuation.go)
		ids = m.continued(ctx, tok, prompt)
		kept := len(ids)
		if ids == nil {
			ids, err = tok.Encode(prompt, tokenizer.EncodeOptions{AddBOS: tok.ShouldAddBOS(), AddEOS: tok.ShouldAddEOS()})
			if err != nil {
				return Result{}, fmt.Errorf("pipeline: tokenizing the prompt: %w", err)
			}
		}
		slog.Debug("pipeline: prompt tokenized", "bytes", len(prompt), "tokens", len(ids), "continued", kept > 0, "took", time.Since(t0))
	}
	if len(ids) == 0 {
		return Result{}, fmt.Errorf("pipeline: empty prompt")
	}
	if m.opts.Batching.On {
		// A backend without a kernels.Batcher (a GPU build that lacks it)
		// keeps the single-sequence path.
		be, err := m.backend(ctx)
		if err != nil {
			return Result{}, err
		}
		if canBatch(be, m.opts.Batching, m.cfg) {
			res, err := m.generateBatched(ctx, ids, o, tok)
			if err == nil && o.PromptIDs == nil {
				// (the reply as OnToken streamed it: its text after the prompt's)
				if reply, ok := replyText(tok, ids, res.Tokens); ok {
					m.remember(tok, prompt, ids, res.Tokens, reply)
				}
			}
			return res, err
		}
	}
	var stream *tokenizer.Stream
	if tok != nil {
		stream = tok.NewStream()
	}
	// got collects the tokens as they stream, so that a request cut short
	// by ctx still returns what it produced. The executor never calls back
	// after Submit returned, which orders these writes before our read.
	var got []int32
	onToken := func(id int32) error {
		got = append(got, id)
		if o.OnToken == nil {
			return nil
		}
		t := Token{ID: id}
		if stream != nil {
			t.Text = stream.Add(id)
		}
		return o.OnToken(t)
	}
	req := &request{o: o, tok: tok}
	res, err := m.exec.Submit(ctx, actors.Request[job]{Prompt: ids, Opts: req, OnToken: onToken})
	out := Result{ID: res.ID, PromptTokens: len(ids), Tokens: got, Stop: res.Stop}
	if tok != nil {
		out.Text = tok.Decode(got)
	}
	if err != nil {
		return out, fmt.Errorf("pipeline: request %d: %w", res.ID, err)
	}
	return out, nil
}

// job is one piece of work the executor runs on a model's generator, in
// submission order: a generation (*request) or an evaluation between
// generations (*evalJob, eval.go). It is the executor's request option
// type (actors.Generator[job]): each job runs itself, so nothing asserts
// a type.
type job interface {
	runOn(ctx context.Context, g *generator, prompt []int32, emit func(id int32) error) (stop string, err error)
}

// request is a generation's job: its options and tokenizer.
type request struct {
	o   GenerateOptions
	tok *tokenizer.Tokenizer
}

// generator is the actors.Generator of a model: the architecture's
// forward pass on the backend, with its KV cache and scratch, run by the
// generation loop.
type generator struct {
	m   *Model
	mdl *model.Model
}

// Generate implements actors.Generator: it runs the job.
func (g *generator) Generate(ctx context.Context, prompt []int32, j job, emit func(id int32) error) (string, error) {
	return j.runOn(ctx, g, prompt, emit)
}

func (r *request) runOn(ctx context.Context, g *generator, prompt []int32, emit func(id int32) error) (string, error) {
	smp := sample.New(r.o.Sampling, g.mdl.Cfg.Vocab)
	defer smp.Close()
	if err := g.m.constrainSampler(smp, r.o, r.tok, g.mdl.Ctx()-len(prompt)+1); err != nil {
		return "", err
	}
	o := generate.Options{
		MaxTokens: r.o.MaxTokens,
		Sampler:   smp,
		OnToken:   emit,
	}
	if !r.o.IgnoreEOG && r.tok != nil {
		o.IsEOG = r.tok.IsEOG
	}
	_, st, err := generate.Run(ctx, g.mdl, prompt, o)
	return st.Stop, err
}

func (g *generator) Close() { g.mdl.Close() }
