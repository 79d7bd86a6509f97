package actors

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/forge-llm/forge/actors/progress"
	"github.com/forge-llm/forge/gguf"
)

// Generator is the model as the executor runs it: pipeline builds one from
// an architecture, the backend and the weights (whose layers it gets
// through System.WaitLayer) and hands it over in StartExecutor, so this
// package never imports the architectures. It owns the KV cache and
// scratch; the executor runs one request on it at a time. O is the type of
// its requests' options, which only the Generator interprets: the executor
// carries them through typed, so neither side asserts a type.
type Generator[O any] interface {
	// Generate evaluates prompt and calls emit with each generated token
	// until a stop condition (returned as stop) or an error. opts is the
	// request's Opts. ctx carries the request's identity: pass it to
	// System.WaitLayer.
	Generate(ctx context.Context, prompt []int32, opts O, emit func(id int32) error) (stop string, err error)
	// Close releases the KV cache and scratch.
	Close()
}

// Request is one generation for the executor, with the options its
// Generator reads.
type Request[O any] struct {
	Prompt []int32
	Opts   O
	// OnToken receives each token on the executor's goroutine; an error
	// stops the request. It is never called after Submit returned.
	OnToken func(id int32) error
}

// Result is a finished request.
type Result struct {
	ID     uint64
	Tokens []int32
	Stop   string
}

// executorState is what Close needs of the executor.
type executorState struct {
	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // the executor's goroutines

	mu      sync.Mutex
	closing bool // set by Close; no goroutine starts after it
}

// spawn runs fn on a goroutine Close waits for, unless Close has begun.
func (st *executorState) spawn(fn func()) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closing {
		return false
	}
	st.wg.Add(1)
	go func() {
		defer st.wg.Done()
		fn()
	}()
	return true
}

// stop cancels the executor's work and waits for its goroutines.
func (st *executorState) stop() {
	st.mu.Lock()
	st.closing = true
	st.mu.Unlock()
	st.cancel()
	st.wg.Wait()
}

// Executor is the handle requests of option type O are submitted through
// (StartExecutor).
type Executor[O any] struct{ s *System }

// StartExecutor starts s's executor actor. It waits (off its mailbox) for
// the model to be ready — for every unit under Eager and HostF32 — then
// calls build once to make the Generator, and runs requests one at a time
// in submission order. Call it once, right after Start.
func StartExecutor[O any](s *System, build func(ctx context.Context) (Generator[O], error)) *Executor[O] {
	st := &executorState{}
	st.ctx, st.cancel = context.WithCancel(context.Background())
	s.exec = st
	s.executor = s.as.Root.Spawn(s.props(func() actor.Actor { return &executor[O]{s: s, st: st, build: build} }))
	return &Executor[O]{s: s}
}

// Submit runs a request and waits for its result. It returns ctx's error
// as soon as ctx is done (the request stops at its next layer boundary, in
// the background).
func (x *Executor[O]) Submit(ctx context.Context, r Request[O]) (Result, error) {
	s := x.s
	id := s.nextReq.Add(1)
	run := &runReq[O]{ctx: ctx, id: id, req: r, res: make(chan runRes, 1), guard: &guard{fn: r.OnToken}}
	s.closeMu.Lock()
	if s.closed {
		s.closeMu.Unlock()
		return Result{ID: id}, ErrClosed
	}
	s.as.Root.Send(s.executor, run)
	s.closeMu.Unlock()
	select {
	case res := <-run.res:
		return res.Result, res.err
	case <-ctx.Done():
		run.guard.abandon()
		return Result{ID: id}, ctx.Err()
	}
}

type (
	runReq[O any] struct {
		ctx   context.Context
		id    uint64
		req   Request[O]
		res   chan runRes
		guard *guard
	}
	runRes struct {
		Result
		err error
	}
	prepared[O any] struct {
		gen Generator[O]
		err error
	}
	ran struct{}
)

// guard keeps a request's callback from running after Submit returned.
type guard struct {
	mu   sync.Mutex
	gone bool
	fn   func(int32) error
}

func (g *guard) call(id int32) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.gone {
		return context.Canceled
	}
	if g.fn == nil {
		return nil
	}
	return g.fn(id)
}

func (g *guard) abandon() {
	g.mu.Lock()
	g.gone = true
	g.mu.Unlock()
}

// reqKey carries a request's trace in its context, for WaitLayer.
type reqKey struct{}

type reqTrace struct {
	id   uint64
	seen []bool
	// experts are the (layer, expert) used so far, made on first use;
	// under mu: a split model's segments may wait for experts at once.
	mu      sync.Mutex
	experts map[[2]int]bool
}

// firstUse records that the request used expert e of layer i and reports
// whether it is the first time.
func (rt *reqTrace) firstUse(i, e int) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	k := [2]int{i, e}
	if rt.experts[k] {
		return false
	}
	if rt.experts == nil {
		rt.experts = map[[2]int]bool{}
	}
	rt.experts[k] = true
	return true
}

// executor owns the Generator (the backend, KV cache and scratch). Its
// mailbox only queues: waiting for readiness and running a request happen
// on goroutines that report back with a message, so Receive never blocks.
type executor[O any] struct {
	s     *System
	st    *executorState
	build func(ctx context.Context) (Generator[O], error)

	gen    Generator[O]
	genErr error
	busy   bool
	queue  []*runReq[O]
}

func (e *executor[O]) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *actor.Started:
		e.busy = true
		self := c.Self()
		e.st.spawn(func() {
			gen, err := e.prepare()
			e.s.as.Root.Send(self, &prepared[O]{gen: gen, err: err})
		})
	case *prepared[O]:
		e.gen, e.genErr, e.busy = m.gen, m.err, false
		e.kick(c)
	case *runReq[O]:
		e.queue = append(e.queue, m)
		e.kick(c)
	case *ran:
		e.busy = false
		e.kick(c)
	case *actor.Stopping:
		for _, r := range e.queue {
			r.res <- runRes{Result: Result{ID: r.id}, err: ErrClosed}
		}
		e.queue = nil
		if e.gen != nil {
			e.gen.Close()
			e.gen = nil
		}
	}
}

// prepare waits for the weights the strategy starts on, then builds the
// Generator.
func (e *executor[O]) prepare() (Generator[O], error) {
	f := e.s.Ready()
	if e.s.cfg.Strategy.waitsForAll() {
		f = e.s.all
	}
	if err := f.Wait(e.st.ctx); err != nil {
		return nil, err
	}
	gen, err := e.build(e.st.ctx)
	if err != nil {
		return nil, fmt.Errorf("executor: %w", err)
	}
	return gen, nil
}

// kick starts the next queued request when idle.
func (e *executor[O]) kick(c actor.Context) {
	for !e.busy && len(e.queue) > 0 {
		r := e.queue[0]
		e.queue = e.queue[1:]
		if err := r.ctx.Err(); err != nil {
			r.res <- runRes{Result: Result{ID: r.id}, err: err}
			continue
		}
		if e.genErr != nil {
			r.res <- runRes{Result: Result{ID: r.id}, err: e.genErr}
			continue
		}
		self, gen := c.Self(), e.gen
		if !e.st.spawn(func() {
			r.res <- e.run(gen, r)
			e.s.as.Root.Send(self, &ran{})
		}) {
			r.res <- runRes{Result: Result{ID: r.id}, err: ErrClosed} // Close has begun
			continue
		}
		e.busy = true
	}
}

// run executes one request on the executor's goroutine.
func (e *executor[O]) run(gen Generator[O], r *runReq[O]) runRes {
	s := e.s
	ctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	defer context.AfterFunc(e.st.ctx, cancel)()
	ctx = context.WithValue(ctx, reqKey{}, &reqTrace{id: r.id, seen: make([]bool, s.plan.Layers())})

	start := time.Now()
	s.publish(progress.RequestStarted{At: s.bus.Since(), Req: r.id, PromptTokens: len(r.req.Prompt)})
	var toks []int32
	emit := func(id int32) error {
		at := s.bus.Since()
		if len(toks) == 0 {
			s.publish(progress.FirstToken{At: at, Req: r.id, Token: id, Latency: time.Since(start)})
		}
		s.publish(progress.Token{At: at, Req: r.id, Index: len(toks), Token: id})
		toks = append(toks, id)
		return r.guard.call(id)
	}
	stop, err := "", s.usable()
	if err == nil {
		stop, err = gen.Generate(ctx, r.req.Prompt, r.req.Opts, emit)
		if gguf.MappingBroken(err) {
			// A kernel's fault knows the address, not the file: name
			// them (the messages inside were formatted already).
			var fe *gguf.FaultError
			if errors.As(err, &fe) && fe.File == "" && s.cfg.File.Locate(err) {
				err = fmt.Errorf("%s: offset %d: %w", fe.File, fe.Offset, err)
			}
			s.setBroken(err)
		}
	}
	res := Result{ID: r.id, Tokens: toks, Stop: stop}
	if err != nil {
		ev := progress.Error{At: s.bus.Since(), Req: r.id, Layer: progress.NoLayer, Err: err}
		var le *LoadError
		if errors.As(err, &le) {
			ev.Layer, ev.Tensor = le.Layer, le.Tensor
		}
		s.publish(ev)
		return runRes{Result: res, err: err}
	}
	s.publish(progress.Done{At: s.bus.Since(), Req: r.id, Tokens: len(toks), Stop: stop})
	return runRes{Result: res}
}

// usable is checked at the start of every request: a model whose file
// changed under its mapping (truncated by a download or `forge gen -o`
// over it, rewritten in place) must not run, since reading the weights
// faults or reads another model's bytes. Once that was seen, by this check
// or by a fault during a request, the model stays broken.
func (s *System) usable() error {
	if err := s.Broken(); err != nil {
		return err
	}
	if err := s.cfg.File.Check(); err != nil {
		s.setBroken(err)
		return err
	}
	return nil
}

// Broken returns why the model's file can no longer be used (a
// *gguf.ChangedError or *gguf.FaultError inside), or nil. Every request
// after that fails with it at once, and so does every unit not yet
// resident (a lazy model's layers never demanded included); the owner
// should close the model.
func (s *System) Broken() error {
	if p := s.broken.Load(); p != nil {
		return *p
	}
	return nil
}

func (s *System) setBroken(err error) {
	if s.broken.CompareAndSwap(nil, &err) {
		s.failAll(fmt.Errorf("model file unusable: %w", err))
	}
}
