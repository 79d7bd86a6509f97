package pipeline

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/forge-llm/forge/actors"
	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/pipeline/model"
	"github.com/forge-llm/forge/pipeline/tokenizer"
)

// Evaluation outside the generation loop: perplexity needs every token's
// logits over a window, an embedding needs every token's final hidden
// state. Both run on a second forward pass over the model's weights (the
// weights are shared, not copied) with its own KV cache and scratch sized
// for the window, made for the call and freed after it.

// EvalOptions size an Evaluator.
type EvalOptions struct {
	Ctx   int // positions of the longest window (required)
	Batch int // most tokens per forward step (0: model.DefaultBatch, at most Ctx)
	// KVF32 keeps the window's keys and values in float32 on a GPU too
	// (it stores f16 otherwise; the CPU always keeps float32), at twice
	// the cache's memory: Perplexity sets it so that the GPU's estimate
	// is the CPU's computation (issue 20: stories260K-Q8_0 moved 0.13 %
	// on the CPU with its keys and values rounded to f16).
	KVF32 bool
}

// f32KVCacher is a backend that makes float32 KV caches on request
// (gpu.Backend.NewKVCacheF32).
type f32KVCacher interface {
	NewKVCacheF32(layers, ctx, kvDim int) (*kernels.KVCache, error)
}

// f32KV is the backend of an evaluation with EvalOptions.KVF32: its KV
// caches are made by NewKVCacheF32, and charged as float32.
type f32KV struct {
	kernels.Backend
	mk f32KVCacher
}

func (f f32KV) NewKVCache(layers, ctx, kvDim int) (*kernels.KVCache, error) {
	return f.mk.NewKVCacheF32(layers, ctx, kvDim)
}

// KVCacheBytes is what such a cache takes (the accounting asks it).
func (f f32KV) KVCacheBytes(layers, ctx, kvDim int) int64 { return kvBytes(layers, ctx, kvDim) }

// KVPoolBytes is what the backend's pools take (f32KV does not change
// them); with KVCacheBytes it makes f32KV the kernels.KVSizer the
// accounting finds before the backend's own.
func (f f32KV) KVPoolBytes(layers, blocks, blockSize, kvDim int) int64 {
	return kvPoolBytes(f.Backend, layers, blocks, blockSize, kvDim)
}

// Unwrap lets the model find the backend's optional capabilities.
func (f f32KV) Unwrap() kernels.Backend { return f.Backend }

// evalBackend is the backend an evaluation's model runs on: be, with
// float32 KV caches where o asks for them and be makes them on request.
func evalBackend(be kernels.Backend, o EvalOptions) kernels.Backend {
	if o.KVF32 {
		if mk, ok := kernels.As[f32KVCacher](be); ok {
			return f32KV{Backend: be, mk: mk}
		}
	}
	return be
}

// Evaluator evaluates windows of tokens, each from position 0.
type Evaluator struct {
	mdl *model.Model
	cfg model.Config
}

// Ctx is the longest window the Evaluator takes.
func (ev *Evaluator) Ctx() int { return ev.mdl.Ctx() }

// Batch is the most tokens of one forward step.
func (ev *Evaluator) Batch() int { return ev.mdl.Batch() }

// Vocab is the width of a row of logits.
func (ev *Evaluator) Vocab() int { return ev.cfg.Vocab }

// Embd is the width of a hidden state.
func (ev *Evaluator) Embd() int { return ev.cfg.Embd }

// Window evaluates tokens as one sequence from position 0 (what an earlier
// window left in the cache is overwritten, never read), in steps of at
// most Batch tokens, and hands each step's rows to each: first is the
// index in tokens of the step's first row, logits its [n][Vocab] rows and,
// with hidden, states its [n][Embd] final hidden states (nil otherwise).
// Steps come in order, so a caller can score a long window without holding
// all of its logits.
func (ev *Evaluator) Window(ctx context.Context, tokens []int32, hidden bool, each func(first int, logits, states []float32) error) error {
	if len(tokens) > ev.Ctx() {
		return fmt.Errorf("pipeline: a window of %d tokens exceeds the evaluator's %d positions", len(tokens), ev.Ctx())
	}
	for i := 0; i < len(tokens); i += ev.Batch() {
		j := min(i+ev.Batch(), len(tokens))
		logits, states, err := ev.mdl.ForwardAll(ctx, tokens[i:j], i, hidden)
		if err != nil {
			return fmt.Errorf("pipeline: evaluating tokens [%d, %d): %w", i, j, err)
		}
		if err := each(i, logits, states); err != nil {
			return err
		}
	}
	return nil
}

// evalJob is a request the executor runs in place of a generation: an
// Evaluate on a backend whose ops must come from one goroutine at a time.
type evalJob struct {
	run func(ctx context.Context) error
}

func (j *evalJob) runOn(ctx context.Context, _ *generator, _ []int32, _ func(int32) error) (string, error) {
	return "", j.run(ctx)
}

// evalOnExecutor sends every evaluation through the executor, as on a
// GPU; tests set it to run that path on the CPU.
var evalOnExecutor = false

// errBatchedEval is Evaluate's refusal on a GPU that batches requests: its
// scheduler owns the stream and offers no slot for another pass.
var errBatchedEval = errors.New("pipeline: evaluation (embeddings, perplexity) on a GPU that batches requests is not supported; run it with single-sequence serving")

// Evaluate makes an Evaluator sized by o, calls fn with it, and frees it.
// It waits for the weights the strategy starts on (each layer then waits
// for its own, as a generation does).
//
// Where it runs: the CPU backend takes ops from any goroutine (one at a
// time, under its lock), so fn runs on the caller's goroutine beside any
// generation. On another backend (a GPU stream) fn runs on the executor,
// between generation requests, in their order; a GPU model that batches
// its requests through the scheduler refuses.
func (m *Model) Evaluate(ctx context.Context, o EvalOptions, fn func(ev *Evaluator) error) error {
	if o.Ctx <= 0 {
		return fmt.Errorf("pipeline: evaluation context of %d positions", o.Ctx)
	}
	f := m.sys.Ready()
	if s := m.opts.Strategy; s == Eager || s == HostF32 {
		f = m.sys.Resident()
	}
	if err := f.Wait(ctx); err != nil {
		return fmt.Errorf("pipeline: waiting for the weights: %w", err)
	}
	be, err := m.backend(ctx)
	if err != nil {
		return err
	}
	run := func(ctx context.Context) error {
		w, err := newWeights(m.sys, be, m.cfg, m.opts.ExpertProfiles != "")
		if err != nil {
			return err
		}
		mdl, err := model.New(accounted{Backend: evalBackend(be, o), mem: m.mem.acct}, m.cfg, w, model.Options{Ctx: o.Ctx, Batch: o.Batch, AllLogits: true, NoGraph: m.opts.NoGraph})
		if err != nil {
			return fmt.Errorf("pipeline: evaluator: %w", err)
		}
		defer mdl.Close()
		return fn(&Evaluator{mdl: mdl, cfg: m.cfg})
	}
	if _, ok := kernels.As[*cpu.Backend](be); ok && !evalOnExecutor {
		return run(ctx)
	}
	if m.opts.Batching.On && canBatch(be, m.opts.Batching, m.cfg) {
		return errBatchedEval
	}
	_, err = m.exec.Submit(ctx, actors.Request[job]{Opts: &evalJob{run: run}})
	return err
}

// Pooling is how an embedding is made of a text's token states: GGUF's
// {arch}.pooling_type, as llama.cpp numbers it.
type Pooling int

// The poolings. A generative model's file names none; it is pooled by the
// mean, as a sentence embedding is most often made.
const (
	PoolNone Pooling = 0
	PoolMean Pooling = 1
	PoolCLS  Pooling = 2 // the first token's state
	PoolLast Pooling = 3 // the last token's state
)

// poolingOf reads {arch}.pooling_type; none, absent or a kind an embedding
// cannot use (rank) is the mean.
func poolingOf(f *gguf.File, arch string) Pooling {
	if v, ok := f.Uint(arch + ".pooling_type"); ok {
		switch p := Pooling(v); p {
		case PoolMean, PoolCLS, PoolLast:
			return p
		}
	}
	return PoolMean
}

// Pooling is how Embed pools the model's token states.
func (m *Model) Pooling() Pooling { return m.pooling }

// Embedding is one text's embedding.
type Embedding struct {
	Vector []float32 // L2-normalized, [Embd]
	Tokens int       // the text's tokens, BOS included
}

// EmbedOptions control Embed.
type EmbedOptions struct {
	// Truncate cuts a text longer than the context to its first tokens
	// (Ollama's truncate) instead of refusing it.
	Truncate bool
}

// Embed returns the embedding of each text: its tokens (with BOS and EOS
// as the vocabulary asks) evaluated as one sequence, their final hidden
// states (after the output norm) pooled as Pooling says, normalized to
// unit length. A text longer than the model's context is an error wrapping
// ErrContextLength unless o.Truncate; an empty one is an error.
func (m *Model) Embed(ctx context.Context, texts []string, o EmbedOptions) ([]Embedding, error) {
	if len(texts) == 0 {
		return nil, fmt.Errorf("pipeline: no text to embed")
	}
	tok, err := m.Tokenizer(ctx)
	if err != nil {
		return nil, err
	}
	ids := make([][]int32, len(texts))
	longest := 0
	limit := ctxPositions(m.cfg, m.opts)
	for i, t := range texts {
		ids[i], err = tok.EncodeContext(ctx, t, tokenizer.EncodeOptions{AddBOS: tok.ShouldAddBOS(), AddEOS: tok.ShouldAddEOS()})
		if err != nil {
			return nil, fmt.Errorf("pipeline: tokenizing input %d: %w", i, err)
		}
		if len(ids[i]) == 0 {
			return nil, fmt.Errorf("pipeline: input %d is empty", i)
		}
		if len(ids[i]) > limit && o.Truncate {
			ids[i] = ids[i][:limit]
		}
		if len(ids[i]) > limit {
			return nil, fmt.Errorf("%w: input %d has %d tokens, the context holds %d", ErrContextLength, i, len(ids[i]), limit)
		}
		longest = max(longest, len(ids[i]))
	}
	out := make([]Embedding, len(texts))
	err = m.Evaluate(ctx, EvalOptions{Ctx: longest, Batch: min(longest, model.DefaultBatch)}, func(ev *Evaluator) error {
		for i, seq := range ids {
			v, err := pool(ctx, ev, seq, m.pooling)
			if err != nil {
				return fmt.Errorf("pipeline: input %d: %w", i, err)
			}
			out[i] = Embedding{Vector: v, Tokens: len(seq)}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// pool evaluates one sequence and pools its states into a unit vector.
func pool(ctx context.Context, ev *Evaluator, seq []int32, p Pooling) ([]float32, error) {
	d := ev.Embd()
	sum := make([]float64, d)
	err := ev.Window(ctx, seq, true, func(first int, _, states []float32) error {
		n := len(states) / d
		for r := range n {
			pos := first + r
			use := p == PoolMean || p == PoolCLS && pos == 0 || p == PoolLast && pos == len(seq)-1
			if !use {
				continue
			}
			for k, x := range states[r*d : (r+1)*d] {
				sum[k] += float64(x)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	var norm float64
	for _, x := range sum {
		norm += x * x
	}
	norm = math.Sqrt(norm)
	v := make([]float32, d)
	if norm == 0 || math.IsNaN(norm) || math.IsInf(norm, 0) {
		return nil, fmt.Errorf("pooled hidden state has norm %v", norm)
	}
	// The mean's 1/n cancels in the normalization.
	for k, x := range sum {
		v[k] = float32(x / norm)
	}
	return v, nil
}

// Embed embeds texts on the model id, loading it first if it is not
// loaded (see Model.Embed).
func (e *Engine) Embed(ctx context.Context, id string, texts []string, o EmbedOptions) ([]Embedding, error) {
	lease, err := e.Acquire(ctx, id)
	if err != nil {
		return nil, err
	}
	defer lease.Release()
	return lease.Model().Embed(ctx, texts, o)
}
