package pipeline

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/pipeline/batch"
	"github.com/forge-llm/forge/pipeline/model"
	"github.com/forge-llm/forge/pipeline/sample"
	"github.com/forge-llm/forge/pipeline/tokenizer"
)

// stepPieces is how many prompt chunks one batched step may hold on a GPU
// (batch.Config.StepRows): 4 × 512 tokens, as llama-server's default batch
// of 2048 tokens.
const stepPieces = 4

// Batching configures continuous batching (package batch): with On, a
// model's requests run together in one step loop over a paged KV pool
// instead of one at a time, and full prompt blocks are shared between
// requests with a common prefix. The Engine turns it on (unless
// EngineOptions.SingleSequence); Open alone (forge run) leaves it off.
type Batching struct {
	On bool
	// Seqs is the most requests running together (0: 16, at most kernels.MaxBatchRows); the others
	// wait for room.
	Seqs int
	// Blocks is the pool's size in blocks of BlockSize positions (0:
	// enough for Seqs/4 full contexts, at least two: requests rarely fill
	// theirs, and admission waits for room); BlockSize 0 is 16.
	Blocks, BlockSize int
	// Deterministic turns the prefix cache off (batch.Config's
	// NoPrefixCache) and computes a preempted request again in the pieces
	// it first ran in (ReplayPreempted): a request then gives the same
	// tokens whether it ran alone or among others on the GPU too, at the
	// cost of computing every prompt in full.
	Deterministic bool
	// GPU batches on a GPU too (see canBatch); without it a model on a GPU
	// keeps the single-sequence path.
	GPU bool
}

const (
	defaultBatchSeqs      = 16
	defaultBatchBlockSize = 16
)

// poolShape fills Batching's defaults for a model of ctx positions.
func (b Batching) poolShape(ctx int) (seqs, blocks, blockSize int) {
	seqs, blocks, blockSize = b.Seqs, b.Blocks, b.BlockSize
	if seqs <= 0 {
		seqs = defaultBatchSeqs
	}
	seqs = min(seqs, kernels.MaxBatchRows)
	if blockSize <= 0 {
		blockSize = defaultBatchBlockSize
	}
	if blocks <= 0 {
		blocks = max(2, seqs/4) * ((ctx + blockSize - 1) / blockSize)
	}
	return seqs, blocks, blockSize
}

// kvPoolBytes is what be's KV pool of this shape is charged: what the
// backend reports (kernels.KVSizer), F32 for one that reports nothing.
func kvPoolBytes(be kernels.Backend, layers, blocks, blockSize, kvDim int) int64 {
	return planOf(be).kv.KVPoolBytes(layers, blocks, blockSize, kvDim)
}

// batched is a model's continuous-batching engine, built on its first
// request (once the weights it starts on are resident).
type batched struct {
	mu      sync.Mutex
	sched   *batch.Scheduler
	mdl     *model.Model
	charged int64
	closed  bool
	// stop is cancelled by Close, so that a first request waiting for the
	// weights does not hold Close up.
	stop   context.Context
	cancel context.CancelFunc
}

// scheduler returns the model's scheduler, building it on first use.
func (m *Model) scheduler(ctx context.Context) (*batch.Scheduler, error) {
	b := &m.batch
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, fmt.Errorf("pipeline: model closed")
	}
	if b.sched != nil {
		defer b.mu.Unlock()
		return b.sched, nil
	}
	if b.stop == nil {
		b.stop, b.cancel = context.WithCancel(context.Background())
	}
	stop := b.stop
	b.mu.Unlock()

	// Wait (without the lock) for the weights the strategy starts on.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(stop, cancel)()
	f := m.sys.Ready()
	if s := m.opts.Strategy; s == Eager || s == HostF32 {
		f = m.sys.Resident()
	}
	t0 := time.Now()
	if err := f.Wait(wctx); err != nil {
		return nil, err
	}
	be, err := m.backend(wctx)
	if err != nil {
		return nil, err
	}

	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.closed:
		return nil, fmt.Errorf("pipeline: model closed")
	case b.sched != nil: // built by a request that waited alongside
		return b.sched, nil
	}
	bt, ok := kernels.As[kernels.Batcher](be)
	if !ok {
		return nil, fmt.Errorf("pipeline: backend %s cannot batch requests", be.Name())
	}
	tw := time.Now()
	w, err := newWeights(m.sys, be, m.cfg, m.opts.ExpertProfiles != "")
	if err != nil {
		return nil, err
	}
	ctxLen := m.opts.Ctx
	if ctxLen <= 0 {
		ctxLen = m.cfg.Ctx
		if ctxLen <= 0 || ctxLen > model.DefaultMaxCtx {
			ctxLen = model.DefaultMaxCtx
		}
	}
	chunk := m.opts.Batch
	if chunk <= 0 {
		chunk = model.DefaultBatch
	}
	chunk = min(chunk, ctxLen)
	seqs, blocks, bs := m.opts.Batching.poolShape(ctxLen)
	// On a GPU the pieces of prompts that arrive together share a step up
	// to stepPieces chunks (merged: one pass over the weights); a CPU,
	// whose step of a chunk already takes a fraction of a second, and a
	// deterministic server (whose pieces never merge) keep one chunk.
	stepRows := chunk
	if _, onCPU := kernels.As[*cpu.Backend](be); !m.opts.Batching.Deterministic && !onCPU {
		stepRows = stepPieces * chunk
	}
	mdl, err := model.NewBatched(accounted{Backend: be, mem: m.mem.acct}, m.cfg, w, model.BatchOptions{MaxRows: stepRows + seqs, MaxSeqs: seqs, MergePrompts: !m.opts.Batching.Deterministic, NoGraph: m.opts.NoGraph})
	if err != nil {
		return nil, err
	}
	tp := time.Now()
	if m.kvFrom != nil {
		defer m.kvFrom.close() // a pool not taken now is not taken later
	}
	n := kvPoolBytes(be, m.cfg.Layers, blocks, bs, m.cfg.KVDim())
	if err := m.mem.acct.Alloc(n, "KV pool"); err != nil {
		mdl.Close()
		return nil, err
	}
	s, err := batch.New(batch.Config{Model: mdl, Backend: handoffBatcher{Backend: be, Batcher: bt, m: m}, ModelID: m.path, Blocks: blocks, BlockSize: bs, MaxSeqs: seqs, Chunk: chunk, StepRows: stepRows, Ctx: ctxLen, NoPrefixCache: m.opts.Batching.Deterministic, ReplayPreempted: m.opts.Batching.Deterministic})
	if err != nil {
		m.mem.acct.Free(n)
		mdl.Close()
		return nil, err
	}
	b.sched, b.mdl, b.charged = s, mdl, n
	// A swap's first request pays this (FORGE_SWAP_DEBUG).
	slog.Debug("pipeline: batching scheduler built", "path", m.path, "since open", time.Since(m.start), "weights wait", tw.Sub(t0),
		"model", tp.Sub(tw), "pool and scheduler", time.Since(tp), "pool MB", n>>20)
	return s, nil
}

// closeBatched stops the scheduler (ending its requests) and frees its
// pool and buffers; Close calls it before the weights go.
func (m *Model) closeBatched() {
	if m.kvFrom != nil {
		m.kvFrom.close()
	}
	b := &m.batch
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	if b.cancel != nil {
		b.cancel()
	}
	if b.sched != nil {
		b.sched.Close()
		b.mdl.Close()
		m.mem.acct.Free(b.charged)
		b.sched, b.mdl = nil, nil
	}
}

// BatchStats reports the model's continuous-batching counters (zero when
// batching is off or no request ran yet).
func (m *Model) BatchStats() batch.Stats {
	b := &m.batch
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.sched == nil {
		return batch.Stats{}
	}
	return b.sched.Stats()
}

// generateBatched runs one tokenized request through the scheduler.
func (m *Model) generateBatched(ctx context.Context, ids []int32, o GenerateOptions, tok *tokenizer.Tokenizer) (Result, error) {
	s, err := m.scheduler(ctx)
	if err != nil {
		return Result{PromptTokens: len(ids)}, fmt.Errorf("pipeline: batching: %w", err)
	}
	id := m.batchReqs.Add(1)
	smp := sample.New(o.Sampling, m.cfg.Vocab)
	defer smp.Close() // the scheduler closes it too when it retires the request
	if err := m.constrainSampler(smp, o, tok, s.Ctx()-len(ids)+1); err != nil {
		return Result{PromptTokens: len(ids)}, err
	}
	r := batch.Request{Prompt: ids, MaxTokens: o.MaxTokens, Sampler: smp}
	if !o.IgnoreEOG && tok != nil {
		r.IsEOG = tok.IsEOG
	}
	var stream *tokenizer.Stream
	if tok != nil {
		stream = tok.NewStream()
	}
	n := 0
	res, err := s.Generate(ctx, r, func(t int32) error {
		if o.OnToken == nil {
			return nil
		}
		tk := Token{ID: t}
		if stream != nil {
			tk.Text = stream.Add(t)
		}
		if n++; n <= 2 { // when the first tokens reach the caller, and whether they had text yet
			slog.Debug("pipeline: token out", "request", id, "n", n, "text bytes", len(tk.Text))
		}
		return o.OnToken(tk)
	})
	out := Result{ID: id, PromptTokens: len(ids), CachedTokens: res.CachedTokens, Tokens: res.Tokens, Stop: res.Stop}
	if tok != nil {
		out.Text = tok.Decode(res.Tokens)
	}
	if err != nil {
		return out, fmt.Errorf("pipeline: request %d: %w", id, err)
	}
	return out, nil
}

// openOptions are the Options the engine opens its models with: batching
// on unless SingleSequence.
func (e *Engine) openOptions() Options {
	o := e.o.Open
	o.Batching.On = !e.o.SingleSequence
	return o
}

// batchedOnly is the executor's Generator when batching is on: Generate
// sends every request to the scheduler, so the executor holds no model.
type batchedOnly struct{}

func (batchedOnly) Generate(context.Context, []int32, job, func(int32) error) (string, error) {
	return "", fmt.Errorf("pipeline: this model runs its requests through the batching scheduler")
}

func (batchedOnly) Close() {}

// canBatch reports whether be runs batched steps; a model on a backend
// that cannot keeps the single-sequence path even with Batching.On.
//
// On a GPU it batches only where Batching.GPU asks (forge serve
// --batch-seqs). The batched decode step is now recorded as a graph per row
// count, like the single-sequence one (model/batchgraph.go), so a request
// alone decodes at about the single-sequence rate and 16 together far
// faster (8B Q4_K_M on an H100 over HTTP, one client: 282 tokens/s batched
// vs 281-291 single-sequence; 16 clients: 1404-1443 vs 1076-1190 before
// the graphs; bench/results/2026-11-25-serve-graph-h100.md). It is not
// yet the GPU default: the engine's swap test (TestEngineGPUSwap) sizes
// its budget for the single-sequence path and fails with batching on.
//
// A model with a sliding window or soft-capped attention scores (Mistral,
// Gemma 2 and 3) keeps the single-sequence path on a GPU: the GPU's paged
// attention has neither yet, and refusing every request of such a model
// would be worse than serving them one at a time.
//
// The Engine's estimate follows the same rule before the model opens
// (backendPlan.batches, device_plan.go).
func canBatch(be kernels.Backend, b Batching, cfg model.Config) bool {
	return planOf(be).batches(b, cfg)
}
