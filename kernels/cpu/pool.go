package cpu

import (
	"sync/atomic"
)

// task is one parallel loop body. run handles items [lo, hi) on worker w
// (0 ≤ w < threads; worker 0 is the goroutine that called the op). Ops keep
// their task structs inside the Backend and pass a pointer, so starting a
// loop allocates nothing.
type task interface {
	run(w, lo, hi int)
}

// pool is a fixed set of worker goroutines that split one loop at a time.
// Items are handed out in chunks from an atomic counter, so a worker that is
// descheduled for a while does not hold the others up. The calling goroutine
// works too: with threads = 1 there are no helper goroutines at all.
type pool struct {
	threads int
	wake    []chan struct{} // one per helper goroutine (workers 1…threads-1)
	done    chan struct{}   // each helper sends once per loop it joined

	// The current loop; written by parallel before it wakes the helpers (the
	// channel send orders those writes before the helpers' reads).
	t     task
	total int
	chunk int
	next  atomic.Int64
}

func newPool(threads int) *pool {
	p := &pool{threads: threads, done: make(chan struct{}, threads)}
	p.wake = make([]chan struct{}, threads-1)
	for i := range p.wake {
		p.wake[i] = make(chan struct{}, 1)
		go p.helper(i+1, p.wake[i])
	}
	return p
}

// helper is the body of worker w: wait for a loop, join it, report back.
// A closed wake channel ends it.
func (p *pool) helper(w int, wake chan struct{}) {
	for range wake {
		p.work(w)
		p.done <- struct{}{}
	}
}

// work takes chunks until the loop is exhausted.
func (p *pool) work(w int) {
	for {
		lo := int(p.next.Add(int64(p.chunk))) - p.chunk
		if lo >= p.total {
			return
		}
		p.t.run(w, lo, min(lo+p.chunk, p.total))
	}
}

// parallel runs t over items [0, total) in chunks of chunk items and returns
// when every item is done. Loops too small to split run on the caller alone.
func (p *pool) parallel(t task, total, chunk int) {
	if total <= 0 {
		return
	}
	chunk = max(chunk, 1)
	chunks := (total + chunk - 1) / chunk
	helpers := min(p.threads-1, chunks-1)
	if helpers <= 0 || p.wake == nil { // nothing to split, or closed
		t.run(0, 0, total)
		return
	}
	p.t, p.total, p.chunk = t, total, chunk
	p.next.Store(0)
	for i := 0; i < helpers; i++ {
		p.wake[i] <- struct{}{}
	}
	p.work(0)
	for i := 0; i < helpers; i++ {
		<-p.done
	}
	p.t = nil
}

// close stops the helper goroutines.
func (p *pool) close() {
	for _, c := range p.wake {
		close(c)
	}
	p.wake = nil
}
