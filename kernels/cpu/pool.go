package cpu

import (
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/forge-llm/forge/gguf"
)

// task is one parallel loop body. run handles items [lo, hi) on worker w
// (0 ≤ w < threads; worker 0 is the goroutine that called the op). Ops keep
// their task structs inside the Backend and pass a pointer, so starting a
// loop allocates nothing.
type task interface {
	run(w, lo, hi int)
}

// spinFor is how long an idle helper keeps polling for the next loop before
// it parks. A decode step is ~100 short loops (one per op, ~100 µs each)
// separated by a few µs of serial work; waking a parked goroutine costs tens
// of µs (futex wake of an idle OS thread), by which time the caller has done
// most of the loop alone. Measured on bench86m Q8_0 decode: with park-only
// helpers the helper did ~20 % of the matmul work. Spinning is bounded so an
// idle backend costs nothing and a loaded machine loses at most this much
// per op.
const spinFor = 50 * time.Microsecond

// pool is a fixed set of worker goroutines that split one loop at a time.
// Items are handed out in chunks from an atomic counter, so a worker that is
// descheduled for a while does not hold the others up. The calling goroutine
// works too: with threads = 1 there are no helper goroutines at all.
//
// Hand-off: parallel publishes the loop, bumps gen, then drops a token into
// every helper's wake channel unless one is already waiting there. A helper
// that is spinning sees gen change and joins at once; one that has parked
// wakes on the token and re-checks gen (a token left over from a loop it
// joined by spinning just costs it one extra look). Since every bump of gen
// is followed by a token, a parked helper cannot miss a loop.
type pool struct {
	threads int
	helpers []*helperState // workers 1…threads-1
	wg      sync.WaitGroup // helper goroutines still running

	// The current loop; written by parallel before gen is bumped (the
	// atomic store orders those writes before the helpers' reads).
	t       task
	total   int
	chunk   int
	guided  bool // chunks shrink as the loop runs out (parallelGuided)
	next    atomic.Int64
	gen     atomic.Uint64 // loop number; the helpers join when it changes
	pending atomic.Int32  // helpers still inside the current loop
	closed  atomic.Bool
	// fault is the first memory fault a helper hit in the current loop
	// (a weight read from a mapped file that was truncated under it),
	// handed back to the caller by parallel.
	fault atomic.Pointer[gguf.FaultError]
}

type helperState struct {
	wake chan struct{} // buffered 1: at most one token waits
}

func newPool(threads int) *pool {
	p := &pool{threads: threads}
	for i := 1; i < threads; i++ {
		h := &helperState{wake: make(chan struct{}, 1)}
		p.helpers = append(p.helpers, h)
		p.wg.Add(1)
		go p.helper(i, h)
	}
	return p
}

// helper is the body of worker w: wait for the next loop (spinning for up
// to spinFor, then parked), join it, report back; exit when closed.
func (p *pool) helper(w int, h *helperState) {
	defer p.wg.Done()
	// Loops read weights straight from the model file's mapping; if the
	// file is truncated under it the read raises SIGBUS, which kills the
	// process unless the goroutine asked for a panic instead. This
	// goroutine only ever runs loops, so the setting stays on for its life.
	debug.SetPanicOnFault(true)
	// gen is 0 when the pool is made; reading it here instead would miss a
	// loop that parallel published before this goroutine first ran.
	var seen uint64
	for {
		if !p.spinWait(seen) {
			for p.gen.Load() == seen {
				<-h.wake
			}
		}
		seen = p.gen.Load()
		if p.closed.Load() {
			return
		}
		p.helperWork(w)
		p.pending.Add(-1)
	}
}

// helperWork is work on a helper, with a memory fault recorded for
// parallel to return instead of taking the process down; the chunks left
// are dropped, since the loop has failed. Other panics are bugs and go on.
func (p *pool) helperWork(w int) {
	defer func() {
		if r := recover(); r != nil {
			fe, ok := gguf.AsFault(r)
			if !ok {
				panic(r)
			}
			p.fault.CompareAndSwap(nil, fe)
			p.next.Store(int64(p.total))
		}
	}()
	p.work(w)
}

// spinWait polls gen for up to spinFor and reports whether it changed.
func (p *pool) spinWait(seen uint64) bool {
	var start time.Time
	for i := 0; ; i++ {
		if p.gen.Load() != seen {
			return true
		}
		if i&255 == 255 {
			if start.IsZero() {
				start = time.Now()
			} else if time.Since(start) > spinFor {
				return false
			}
			runtime.Gosched() // let other goroutines on this P run
		}
	}
}

// work takes chunks until the loop is exhausted.
func (p *pool) work(w int) {
	if p.guided {
		p.workGuided(w)
		return
	}
	for {
		lo := int(p.next.Add(int64(p.chunk))) - p.chunk
		if lo >= p.total {
			return
		}
		p.t.run(w, lo, min(lo+p.chunk, p.total))
	}
}

// workGuided takes a share of what is left (half of it over the workers,
// in whole multiples of chunk) until the loop is exhausted: long first
// chunks, so each core streams a long run of rows, and short last ones, so
// the workers finish together instead of one waiting out another's last
// long chunk.
func (p *pool) workGuided(w int) {
	step := int64(p.chunk)
	share := int64(2 * p.threads)
	total := int64(p.total)
	for {
		lo := p.next.Load()
		if lo >= total {
			return
		}
		n := max(step, (total-lo)/share/step*step)
		if !p.next.CompareAndSwap(lo, lo+n) {
			continue
		}
		p.t.run(w, int(lo), int(min(lo+n, total)))
	}
}

// parallel runs t over items [0, total) in chunks of chunk items and returns
// when every item is done. Loops too small to split run on the caller alone.
// Every helper joins every split loop (helpers that arrive late find no
// chunks left and leave at once); parallel waits for all of them before it
// returns, so the loop fields are never rewritten under a helper.
//
// A memory fault on a helper comes back as parallel's *gguf.FaultError. A
// fault on the caller (worker 0) panics out of parallel, once the helpers
// are done with the loop, to the op's recoverFault: the pool stays usable
// either way.
func (p *pool) parallel(t task, total, chunk int) (err error) {
	return p.run(t, total, chunk, false)
}

// parallelGuided is parallel with chunks that shrink as the loop runs out
// (workGuided), each a multiple of chunk items.
func (p *pool) parallelGuided(t task, total, chunk int) error {
	return p.run(t, total, chunk, true)
}

func (p *pool) run(t task, total, chunk int, guided bool) (err error) {
	if total <= 0 {
		return nil
	}
	chunk = max(chunk, 1)
	chunks := (total + chunk - 1) / chunk
	if chunks < 2 || len(p.helpers) == 0 || p.closed.Load() {
		t.run(0, 0, total)
		return nil
	}
	p.t, p.total, p.chunk, p.guided = t, total, chunk, guided
	p.next.Store(0)
	p.fault.Store(nil)
	p.pending.Store(int32(len(p.helpers)))
	p.gen.Add(1)
	p.wakeHelpers()
	defer func() {
		// Also on a panic of worker 0: the helpers must be out of the
		// loop before it unwinds.
		p.next.Store(int64(p.total)) // no-op unless worker 0 stopped early
		for i := 0; p.pending.Load() != 0; i++ {
			if i&63 == 63 {
				runtime.Gosched() // a helper may share this P or be descheduled
			}
		}
		p.t = nil
		if fe := p.fault.Load(); fe != nil {
			err = fe
		}
	}()
	p.work(0)
	return nil
}

// close stops the helper goroutines and waits for them to exit.
func (p *pool) close() {
	if p.closed.Swap(true) {
		return
	}
	p.gen.Add(1)
	p.wakeHelpers()
	p.wg.Wait()
}

// wakeHelpers leaves a token for every helper that has none waiting.
func (p *pool) wakeHelpers() {
	for _, h := range p.helpers {
		select {
		case h.wake <- struct{}{}:
		default:
		}
	}
}
