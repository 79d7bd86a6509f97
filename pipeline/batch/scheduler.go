package batch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/pipeline/generate"
	"github.com/forge-llm/forge/pipeline/model"
	"github.com/forge-llm/forge/pipeline/sample"
)

// ErrClosed is returned for requests that the scheduler's Close ended.
var ErrClosed = errors.New("batch: scheduler closed")

// ErrPoolExhausted is returned for a sequence that needed another KV block
// when every block of the pool was held by running sequences.
var ErrPoolExhausted = errors.New("batch: KV pool exhausted")

// Config sets up a Scheduler.
type Config struct {
	// Model is a batched model (model.NewBatched) and Backend the backend
	// it runs on, which makes the pool.
	Model   *model.Model
	Backend kernels.Batcher
	// ModelID names the model in prefix hashes (its path, say): blocks are
	// shared only between sequences of the same model.
	ModelID string
	// Blocks and BlockSize size the pool (BlockSize 0: 16 positions).
	Blocks, BlockSize int
	// MaxSeqs is the most sequences running at once (0: the model's
	// MaxSeqs); the others wait in the queue.
	MaxSeqs int
	// Chunk is the prompt piece evaluated in one call (0: model.DefaultBatch,
	// the single-sequence path's batch, so both cut a prompt alike).
	Chunk int
	// StepRows is the prompt-token budget of a step (0, or less than
	// Chunk: Chunk): the pieces of several sequences share a step up to
	// it, each at most Chunk tokens, so that prompts arriving together
	// (several conversations' next turns) are computed in one pass over
	// the weights where the model merges them (model.BatchOptions
	// .MergePrompts) rather than one step each. A larger budget holds the
	// running sequences' next tokens longer while it is spent.
	StepRows int
	// Ctx is the most positions one sequence holds (0: the model's context,
	// at most model.DefaultMaxCtx).
	Ctx int
	// Reserve is how many blocks beyond its prompt a request needs free to
	// be admitted (0: 1), so that admitted sequences can start decoding.
	Reserve int
	// NoPrefixCache computes every prompt in full instead of reusing the
	// cached blocks of an earlier request's prefix. Batch invariance makes
	// a row's numbers independent of the other rows of its step; but a
	// reused block holds keys and values computed the way the earlier
	// request computed them (its generated tokens by the decode kernels,
	// its prompt in pieces of another length), which on a GPU differ from
	// a fresh computation in the last bits. Without reuse, and with
	// ReplayPreempted, a request gives the same tokens alone or among
	// others on every backend (on the CPU, whose products give every row
	// the same bits for any row count and kernel, it does either way).
	NoPrefixCache bool
	// ReplayPreempted computes a preempted sequence again the way it ran
	// first: its prompt in the pieces it took then (Chunk tokens from 0,
	// none past the prompt's end), each generated token as one decode row
	// of a step, instead of prompt and generated tokens in one piece. A
	// GPU picks a prompt piece's kernels by its length (the 8-bit product
	// up to 64 rows, a GEMM beyond, the decode kernels for one row), so a
	// piece of another length, or a generated token recomputed inside a
	// piece, gets other last bits than alone: with the prefix cache off
	// this was the one way a request's tokens still depended on the
	// others (TestGPUBatchInvariant, whose 128-position pool preempts).
	// It costs a preempted sequence one step per generated token to catch
	// up, so only a deterministic server turns it on.
	ReplayPreempted bool
}

// Request is one generation.
type Request struct {
	Prompt    []int32
	MaxTokens int             // ≤ 0: until EOG or a full context
	Sampler   *sample.Sampler // nil: greedy
	IsEOG     func(id int32) bool
}

// Result is a finished generation.
type Result struct {
	Tokens       []int32
	Stop         string // generate.StopEOG, StopMaxTokens or StopContext
	PromptTokens int
	CachedTokens int // prompt tokens whose keys and values came from the prefix cache
}

// Stats are counters of a scheduler, safe to read at any time.
type Stats struct {
	Blocks         int   // pool size
	Held           int   // blocks held by running sequences
	Cached         int   // blocks kept for their prefix, held by nobody
	Running        int   // sequences in the step loop
	Waiting        int   // requests queued for admission
	Steps          int64 // batched forward steps run
	PromptComputed int64 // prompt tokens evaluated
	PromptCached   int64 // prompt tokens found in the prefix cache
	Preempted      int64 // sequences that gave their blocks back to make room (evaluated again later)
}

// Scheduler runs the continuous-batching step loop of one model.
type Scheduler struct {
	cfg  Config
	m    *model.Model
	be   kernels.Batcher
	pool *kernels.KVPool
	bm   *blocks

	reqs   chan *seq // buffered: Submit returns while a step runs
	quit   chan struct{}
	done   chan struct{}
	subMu  sync.Mutex // orders Submit against the loop's final drain
	closed bool       // under subMu: the loop has drained reqs for good
	// stepCtx bounds the forward steps (a step may wait for a layer still
	// loading); Close cancels it so that it never waits on a load that
	// only ends after Close.
	stepCtx    context.Context
	cancelStep context.CancelFunc

	mu    sync.Mutex // guards stats
	stats Stats
	steps atomic.Int64
	// onStep, where a test sets it (before the first request), sees the
	// rows of every step before it runs, on the loop goroutine.
	onStep func(rows []model.SeqRows)
}

// New makes the pool and starts the step loop. Close stops it and frees
// the pool.
func New(cfg Config) (*Scheduler, error) {
	if cfg.Model == nil || cfg.Backend == nil {
		return nil, fmt.Errorf("batch: a batched model and its backend are required")
	}
	if cfg.BlockSize <= 0 {
		cfg.BlockSize = 16
	}
	if cfg.MaxSeqs <= 0 || cfg.MaxSeqs > cfg.Model.MaxSeqs() {
		cfg.MaxSeqs = cfg.Model.MaxSeqs()
	}
	if cfg.Chunk <= 0 {
		cfg.Chunk = model.DefaultBatch
	}
	cfg.StepRows = max(cfg.StepRows, cfg.Chunk)
	if cfg.StepRows+cfg.MaxSeqs > cfg.Model.MaxRows() {
		return nil, fmt.Errorf("batch: a step of %d prompt tokens and %d sequences exceeds the model's %d rows", cfg.StepRows, cfg.MaxSeqs, cfg.Model.MaxRows())
	}
	if cfg.Ctx <= 0 {
		cfg.Ctx = cfg.Model.Cfg.Ctx
		if cfg.Ctx <= 0 || cfg.Ctx > model.DefaultMaxCtx {
			cfg.Ctx = model.DefaultMaxCtx
		}
	}
	if cfg.Reserve <= 0 {
		cfg.Reserve = 1
	}
	if cfg.Blocks <= 0 {
		return nil, fmt.Errorf("batch: a pool of %d blocks", cfg.Blocks)
	}
	c := cfg.Model.Cfg
	pool, err := cfg.Backend.NewKVPool(c.Layers, cfg.Blocks, cfg.BlockSize, c.KVDim())
	if err != nil {
		return nil, fmt.Errorf("batch: kv pool of %d blocks of %d positions: %w", cfg.Blocks, cfg.BlockSize, err)
	}
	s := &Scheduler{cfg: cfg, m: cfg.Model, be: cfg.Backend, pool: pool, bm: newBlocks(cfg.Blocks, cfg.BlockSize),
		reqs: make(chan *seq, 64), quit: make(chan struct{}), done: make(chan struct{})}
	s.stats.Blocks = cfg.Blocks
	s.stepCtx, s.cancelStep = context.WithCancel(context.Background())
	go s.loop()
	return s, nil
}

// Close ends every request (ErrClosed), waits for the loop to exit and
// frees the pool.
func (s *Scheduler) Close() {
	select {
	case <-s.quit:
	default:
		close(s.quit)
	}
	s.cancelStep()
	<-s.done
	if s.pool != nil {
		s.be.FreeKVPool(s.pool)
		s.pool = nil
	}
}

// Ctx is the most positions one sequence holds.
func (s *Scheduler) Ctx() int { return s.cfg.Ctx }

// Stats returns the current counters.
func (s *Scheduler) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Steps = s.steps.Load()
	return st
}

// Stream is the output of one submitted request. The loop queues tokens
// on it without ever waiting for the reader.
type Stream struct {
	mu     sync.Mutex
	toks   []int32
	read   int
	done   bool
	res    Result
	err    error
	notify chan struct{} // one token: something changed
}

func newStream() *Stream { return &Stream{notify: make(chan struct{}, 1)} }

func (st *Stream) signal() {
	select {
	case st.notify <- struct{}{}:
	default:
	}
}

func (st *Stream) push(id int32) {
	st.mu.Lock()
	st.toks = append(st.toks, id)
	st.mu.Unlock()
	st.signal()
}

func (st *Stream) finish(res Result, err error) {
	st.mu.Lock()
	st.done, st.res, st.err = true, res, err
	st.mu.Unlock()
	st.signal()
}

// Next waits for the next token. ok is false once the request ended (see
// Result) or ctx is done.
func (st *Stream) Next(ctx context.Context) (id int32, ok bool) {
	for {
		st.mu.Lock()
		if st.read < len(st.toks) {
			id = st.toks[st.read]
			st.read++
			st.mu.Unlock()
			return id, true
		}
		done := st.done
		st.mu.Unlock()
		if done {
			return 0, false
		}
		select {
		case <-st.notify:
		case <-ctx.Done():
			return 0, false
		}
	}
}

// Result is the request's outcome once Next reported the end.
func (st *Stream) Result() (Result, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if !st.done {
		return Result{}, fmt.Errorf("batch: result read before the request ended")
	}
	return st.res, st.err
}

// seq is one request inside the loop (owned by the loop goroutine).
type seq struct {
	ctx    context.Context
	req    Request
	out    *Stream
	smp    *sample.Sampler
	tokens []int32 // prompt then generated tokens
	prompt int
	done   int // positions whose keys and values are in the pool
	table  []int32
	hashed int    // leading full blocks registered in the prefix cache
	last   uint64 // hash of block hashed-1
	cached int
	gen    []int32
	// admitted: in the running set (counted in Stats.Running).
	admitted  bool
	preempted int // times it gave its blocks back to make room
}

// Submit queues a request; its tokens and result come through the
// returned Stream. Cancelling ctx ends the request at the next step
// boundary (its result's error is ctx's).
func (s *Scheduler) Submit(ctx context.Context, r Request) (*Stream, error) {
	if len(r.Prompt) == 0 {
		return nil, fmt.Errorf("batch: empty prompt")
	}
	if len(r.Prompt) > s.cfg.Ctx {
		return nil, fmt.Errorf("batch: prompt of %d tokens does not fit the %d-position context", len(r.Prompt), s.cfg.Ctx)
	}
	for i, t := range r.Prompt {
		if t < 0 || int(t) >= s.m.Cfg.Vocab {
			return nil, fmt.Errorf("batch: prompt token %d at %d outside the vocabulary of %d", t, i, s.m.Cfg.Vocab)
		}
	}
	smp := r.Sampler
	if smp == nil {
		smp = sample.New(sample.Params{}, s.m.Cfg.Vocab)
	}
	for _, id := range r.Prompt {
		smp.Accept(id)
	}
	q := &seq{ctx: ctx, req: r, out: newStream(), smp: smp, tokens: append([]int32(nil), r.Prompt...), prompt: len(r.Prompt)}
	// Under subMu so that a request is either queued before the loop's
	// final drain or refused: none is left in the queue unanswered.
	s.subMu.Lock()
	defer s.subMu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	select {
	case s.reqs <- q:
		return q.out, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("batch: %w", ctx.Err())
	case <-s.quit:
		return nil, ErrClosed
	}
}

// shutdown ends every request the loop holds or that is still queued.
func (s *Scheduler) shutdown(qs []*seq) {
	for _, q := range qs {
		s.retire(q, "", ErrClosed)
	}
	s.subMu.Lock()
	s.closed = true
	for {
		select {
		case q := <-s.reqs:
			s.retire(q, "", ErrClosed)
			continue
		default:
		}
		break
	}
	s.subMu.Unlock()
	s.publish(nil, nil)
}

// Generate submits r and calls onToken (on the caller's goroutine) with
// each token as it comes; an error from onToken ends the request and is
// returned. The Result holds what was generated even on error.
func (s *Scheduler) Generate(ctx context.Context, r Request, onToken func(id int32) error) (Result, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := s.Submit(ctx, r)
	if err != nil {
		return Result{PromptTokens: len(r.Prompt)}, err
	}
	var got []int32
	for {
		id, ok := st.Next(ctx)
		if !ok {
			break
		}
		got = append(got, id)
		if onToken != nil {
			if err := onToken(id); err != nil {
				cancel()
				st.wait()
				return Result{Tokens: got, PromptTokens: len(r.Prompt)}, err
			}
		}
	}
	st.wait() // ctx done: the loop retires the sequence at its next step
	res, err := st.Result()
	res.Tokens = got
	return res, err
}

// wait blocks until the loop finished the request.
func (st *Stream) wait() {
	for {
		st.mu.Lock()
		done := st.done
		st.mu.Unlock()
		if done {
			return
		}
		<-st.notify
	}
}

// loop is the scheduler goroutine: it owns the pool's blocks and the
// sequences.
func (s *Scheduler) loop() {
	defer close(s.done)
	var waiting, running []*seq
	for {
		// Take new requests; wait for one when there is nothing to do.
		if len(running) == 0 && len(waiting) == 0 {
			select {
			case q := <-s.reqs:
				waiting = append(waiting, q)
			case <-s.quit:
				s.shutdown(nil)
				return
			}
		}
	intake:
		for {
			select {
			case q := <-s.reqs:
				waiting = append(waiting, q)
			case <-s.quit:
				s.shutdown(append(running, waiting...))
				return
			default:
				break intake
			}
		}
		// Retire cancelled sequences (running or waiting).
		running = s.dropCancelled(running)
		waiting = s.dropCancelled(waiting)
		// Admit in arrival order while the pool can hold the head's prompt.
		for len(waiting) > 0 && len(running) < s.cfg.MaxSeqs {
			q := waiting[0]
			ok, err := s.admit(q)
			if err != nil {
				s.retire(q, "", err)
				waiting = waiting[1:]
				continue
			}
			if !ok {
				break
			}
			waiting = waiting[1:]
			running = append(running, q)
		}
		s.publish(running, waiting)
		if len(running) == 0 {
			continue
		}
		var preempted []*seq
		running, preempted = s.step(running)
		// Preempted sequences wait first in line: they are older.
		waiting = append(preempted, waiting...)
		s.publish(running, waiting)
	}
}

func (s *Scheduler) dropCancelled(qs []*seq) []*seq {
	out := qs[:0]
	for _, q := range qs {
		if err := q.ctx.Err(); err != nil {
			s.retire(q, "", fmt.Errorf("batch: %w", err))
			continue
		}
		out = append(out, q)
	}
	return out
}

func (s *Scheduler) publish(running, waiting []*seq) {
	s.mu.Lock()
	s.stats.Held = s.bm.held
	s.stats.Cached = s.bm.nLRU
	s.stats.Running, s.stats.Waiting = len(running), len(waiting)
	s.mu.Unlock()
}

// admit takes the longest chain of cached blocks of q's tokens (never
// the block holding its last token, which is always evaluated for its
// logits) and, when the pool can hold the rest plus the reservation,
// allocates the blocks of every token, so that an admitted sequence always
// evaluates its prompt. A prompt that could never fit fails. A preempted
// sequence comes back here with its generated tokens, which it evaluates
// again like a prompt (mostly from the cache, where its full blocks went).
func (s *Scheduler) admit(q *seq) (bool, error) {
	bs := s.cfg.BlockSize
	n := len(q.tokens)
	blocksFor := (n + bs - 1) / bs
	need := blocksFor + s.cfg.Reserve
	if need > s.cfg.Blocks {
		return false, fmt.Errorf("%w: %d tokens need %d blocks of %d positions, the pool has %d", ErrPoolExhausted, n, need, bs, s.cfg.Blocks)
	}
	// Look the chain up first without taking references.
	var hits []int32
	var prev uint64
	for i := 0; !s.cfg.NoPrefixCache && i < (n-1)/bs; i++ {
		toks := q.tokens[i*bs : (i+1)*bs]
		h := chainHash(s.cfg.ModelID, prev, toks)
		id, ok := s.bm.byHash[h]
		if !ok || !equal(s.bm.toks[id], toks) {
			break
		}
		hits = append(hits, id)
		prev = h
	}
	// Cached (unheld) hits leave the evictable set once taken.
	unheldHits := 0
	for _, id := range hits {
		if s.bm.ref[id] == 0 {
			unheldHits++
		}
	}
	if s.bm.available()-unheldHits < need-len(hits) {
		return false, nil
	}
	prev = 0
	for i := range hits {
		toks := q.tokens[i*bs : (i+1)*bs]
		h := chainHash(s.cfg.ModelID, prev, toks)
		id, _ := s.bm.lookup(h, toks)
		q.table = append(q.table, id)
		prev = h
	}
	for len(q.table) < blocksFor {
		id, _ := s.bm.alloc() // available() was checked above
		q.table = append(q.table, id)
	}
	q.hashed, q.last = len(hits), prev
	q.admitted = true
	q.done = len(hits) * bs
	slog.Debug("batch: admitted", "prompt", q.prompt, "cached", q.done, "blocks", len(q.table))
	if q.preempted == 0 {
		q.cached = q.done
		s.mu.Lock()
		s.stats.PromptCached += int64(q.cached)
		s.mu.Unlock()
	}
	return true, nil
}

// preempt takes q out of the running set to make room: its blocks go back
// (its full blocks stay in the prefix cache) and it waits to be admitted
// again with every token so far.
func (s *Scheduler) preempt(q *seq) {
	for _, id := range q.table {
		s.bm.release(id)
	}
	q.table, q.done, q.hashed, q.last = nil, 0, 0, 0
	q.admitted = false
	q.preempted++
	s.mu.Lock()
	s.stats.Preempted++
	s.stats.Running--
	s.stats.Held, s.stats.Cached = s.bm.held, s.bm.nLRU
	s.mu.Unlock()
}

func equal(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// retire ends q: its blocks go back (full prefix blocks to the cache) and
// its stream gets the result.
func (s *Scheduler) retire(q *seq, stop string, err error) {
	for _, id := range q.table {
		s.bm.release(id)
	}
	q.table = nil
	// The counters are current before the request's end is seen.
	s.mu.Lock()
	s.stats.Held, s.stats.Cached = s.bm.held, s.bm.nLRU
	if q.admitted {
		s.stats.Running--
	}
	s.mu.Unlock()
	q.admitted = false
	q.smp.Close() // a constraint's background work ends with the sequence
	q.out.finish(Result{Tokens: q.gen, Stop: stop, PromptTokens: q.prompt, CachedTokens: q.cached}, err)
}

// step runs one batched forward over the running sequences and returns
// the ones still running and the ones it preempted for room.
func (s *Scheduler) step(running []*seq) (still, preempted []*seq) {
	bs := s.cfg.BlockSize
	var rows []model.SeqRows
	var who []*seq
	budget := s.cfg.StepRows
	// plan is the running set in admission order; when a sequence needs a
	// block and none is left, the latest admitted give theirs back
	// (preempted, from the end of plan) until it gets one.
	plan := slices.Clone(running)
	var alive []*seq
	for i := 0; i < len(plan); i++ {
		q := plan[i]
		n := len(q.tokens) - q.done // 1 for a decode step
		if n > 1 && s.cfg.ReplayPreempted && q.done >= q.prompt {
			n = 1 // a generated token computed again after preemption: the decode row it was
		}
		if n > 1 {
			// A prompt piece is Chunk tokens from where the sequence
			// stands: from 0 that cuts a prompt at multiples of Chunk, as
			// the single path does; after a prefix-cache hit (done at a
			// block boundary) the rest of a conversation's next turn runs
			// in one piece, not one piece to the next multiple of Chunk
			// and another. Either way a function of the sequence and its
			// cached prefix alone.
			end := min(len(q.tokens), q.done+s.cfg.Chunk)
			if s.cfg.ReplayPreempted && q.done < q.prompt {
				end = min(end, q.prompt) // the prompt's last piece, as before preemption
			}
			n = end - q.done
			if n > budget { // (never the step's first piece: n ≤ Chunk ≤ StepRows)
				alive = append(alive, q) // next step
				continue
			}
			budget -= n
		}
		// Blocks for the new positions (a prompt's were taken at admission).
		for len(q.table)*bs < q.done+n {
			if id, ok := s.bm.alloc(); ok {
				q.table = append(q.table, id)
				continue
			}
			victim := plan[len(plan)-1]
			if victim == q && i == 0 {
				break // q holds every block there is
			}
			plan = plan[:len(plan)-1]
			s.preempt(victim)
			preempted = append(preempted, victim)
			if victim == q {
				break
			}
		}
		if !q.admitted {
			continue // preempted itself
		}
		if len(q.table)*bs < q.done+n {
			s.retire(q, "", fmt.Errorf("%w: a sequence of %d positions needs more than the pool's %d blocks of %d", ErrPoolExhausted, q.done+n, s.cfg.Blocks, bs))
			continue
		}
		rows = append(rows, model.SeqRows{Tokens: q.tokens[q.done : q.done+n], Pos0: q.done, Table: q.table, Logits: q.done+n == len(q.tokens), Greedy: q.argmaxOnly()})
		who = append(who, q)
		alive = append(alive, q)
	}
	slices.Reverse(preempted) // earliest admitted first
	if len(rows) == 0 {
		return alive, preempted
	}
	if s.onStep != nil {
		s.onStep(rows)
	}
	t0 := time.Now()
	logits, err := s.m.StepBatch(s.stepCtx, s.pool, rows)
	s.steps.Add(1)
	if slog.Default().Enabled(s.stepCtx, slog.LevelDebug) {
		logStep(rows, time.Since(t0), s.m.StepQueued())
	}
	picks := s.m.Picks()
	if err != nil && len(rows) > 1 && s.stepCtx.Err() == nil && errors.Is(err, model.ErrExpertUnavailable) {
		rows, who, alive, logits, picks, err = s.stepEach(rows, who, alive)
	}
	if err != nil {
		if s.stepCtx.Err() != nil {
			err = ErrClosed
		} else {
			err = fmt.Errorf("batch: step: %w", err)
		}
		for _, q := range alive {
			s.retire(q, "", err)
		}
		return nil, preempted
	}
	prompt := 0
	k := 0
	finished := map[*seq]bool{}
	for i, r := range rows {
		q := who[i]
		if r.Pos0 < q.prompt {
			prompt += min(len(r.Tokens), q.prompt-r.Pos0)
		}
		q.done += len(r.Tokens)
		s.register(q)
		if !r.Logits {
			continue
		}
		l := logits[k]
		k++
		var id int32
		var err error
		if l == nil { // greedy, reduced on the device
			id = picks[i]
		} else {
			id, err = q.smp.Sample(l)
		}
		if err != nil {
			// Non-finite logits end this request, not the step: the
			// others in the batch go on.
			s.retire(q, "", fmt.Errorf("batch: sampling position %d: %w", len(q.tokens), err))
			finished[q] = true
			continue
		}
		if q.req.IsEOG != nil && q.req.IsEOG(id) {
			s.retire(q, generate.StopEOG, nil)
			finished[q] = true
			continue
		}
		q.smp.Accept(id)
		q.gen = append(q.gen, id)
		q.tokens = append(q.tokens, id)
		q.out.push(id)
		switch {
		case q.req.MaxTokens > 0 && len(q.gen) >= q.req.MaxTokens:
			s.retire(q, generate.StopMaxTokens, nil)
			finished[q] = true
		case len(q.tokens)-1 >= s.cfg.Ctx:
			s.retire(q, generate.StopContext, nil)
			finished[q] = true
		}
	}
	s.mu.Lock()
	s.stats.PromptComputed += int64(prompt)
	s.mu.Unlock()
	out := alive[:0]
	for _, q := range alive {
		if !finished[q] {
			out = append(out, q)
		}
	}
	return out, preempted
}

// stepEach runs a step again one sequence at a time after it failed on
// an expert that cannot arrive (model.ErrExpertUnavailable): the
// sequences routed to that expert end with the error, the others go on
// with their rows, logits and picks as the whole step would have given
// them (a row's numbers do not depend on the rows beside it). Their keys
// and values at the step's positions are written again, to the same
// values. err is non-nil only when the scheduler is closing.
func (s *Scheduler) stepEach(rows []model.SeqRows, who, alive []*seq) (keptRows []model.SeqRows, keptWho, stillAlive []*seq, logits [][]float32, picks []int32, err error) {
	failed := map[*seq]bool{}
	notFailed := func() []*seq {
		var out []*seq
		for _, q := range alive {
			if !failed[q] {
				out = append(out, q)
			}
		}
		return out
	}
	for i, r := range rows {
		l, err := s.m.StepBatch(s.stepCtx, s.pool, rows[i:i+1])
		s.steps.Add(1)
		if err != nil {
			if s.stepCtx.Err() != nil {
				return nil, nil, notFailed(), nil, nil, ErrClosed
			}
			s.retire(who[i], "", fmt.Errorf("batch: step: %w", err))
			failed[who[i]] = true
			continue
		}
		keptRows = append(keptRows, r)
		keptWho = append(keptWho, who[i])
		var pick int32
		if p := s.m.Picks(); len(p) > 0 {
			pick = p[0]
		}
		picks = append(picks, pick)
		if r.Logits { // copied: the next step reuses the model's buffers
			var row []float32
			if l[0] != nil {
				row = slices.Clone(l[0])
			}
			logits = append(logits, row)
		}
	}
	return keptRows, keptWho, notFailed(), logits, picks, nil
}

// argmaxOnly says that q's next token is the most likely one whatever
// the logits (greedy, no penalty, no log-probabilities asked): the step may reduce its
// row on the device. (Its logits are then not checked for NaN, as the
// single-sequence path's greedy decode does not check them either.)
func (q *seq) argmaxOnly() bool {
	return q.smp.Params().Temp <= 0 && !q.smp.NeedsFullRow()
}

// register puts q's newly completed full blocks in the prefix cache.
func (s *Scheduler) register(q *seq) {
	bs := s.cfg.BlockSize
	for ; q.hashed < q.done/bs; q.hashed++ {
		toks := q.tokens[q.hashed*bs : (q.hashed+1)*bs]
		h := chainHash(s.cfg.ModelID, q.last, toks)
		s.bm.register(q.table[q.hashed], h, toks)
		q.last = h
	}
}

// logStep writes one debug line for a step: its rows (the longest piece
// and where it starts: a turn after a cached history is one piece far
// from 0), its wall time, logits read back included, and how much of it
// queueing the ops took.
func logStep(rows []model.SeqRows, took, queued time.Duration) {
	n, decode := 0, 0
	var pieces []string // each prompt piece as tokens@position
	for _, r := range rows {
		n += len(r.Tokens)
		if len(r.Tokens) == 1 {
			decode++
			continue
		}
		pieces = append(pieces, fmt.Sprintf("%d@%d", len(r.Tokens), r.Pos0))
	}
	slog.Debug("batch: step", "seqs", len(rows), "rows", n, "decode rows", decode, "pieces", strings.Join(pieces, " "), "took", took, "queued", queued)
}
