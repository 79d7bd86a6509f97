package actors

import (
	"context"
	"fmt"
	"sync"
)

// State is where a unit of weights (one layer, or the globals) stands.
// It only moves forward: Pending → Enqueued → Resident, or to Failed from
// either of the first two.
type State int32

const (
	// Pending: nothing of the unit is on its way to the device yet.
	Pending State = iota
	// Enqueued: every copy of the unit is queued. On a GPU the executor may
	// go on from here: its stream waits on the unit's Fence, so the wait
	// happens on the device. On the CPU Enqueued is immediately followed by
	// Resident.
	Enqueued
	// Resident: the unit's weights are usable by the backend.
	Resident
	// Failed: the unit will never arrive; Err says why.
	Failed
)

func (s State) String() string {
	switch s {
	case Pending:
		return "pending"
	case Enqueued:
		return "enqueued"
	case Resident:
		return "resident"
	case Failed:
		return "failed"
	}
	return fmt.Sprintf("State(%d)", int32(s))
}

// Future is the readiness of one unit of weights. The pipeline resolves it;
// the executor (and API users) wait on it. Every path that gives up on a
// unit fails its future, so waiting never hangs: Wait returns when the unit
// is resident, when it failed, or when ctx is done.
type Future struct {
	name string

	mu    sync.Mutex
	state State
	err   error
	fence Fence
	enq   chan struct{} // closed on Enqueued, Resident or Failed
	done  chan struct{} // closed on Resident or Failed
}

func newFuture(name string) *Future {
	return &Future{name: name, enq: make(chan struct{}), done: make(chan struct{})}
}

// Name says what the future stands for ("ready", "layer 3", "all").
func (f *Future) Name() string { return f.name }

// State returns the current state and, when Failed, the cause.
func (f *Future) State() (State, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state, f.err
}

// Done is closed once the future is Resident or Failed.
func (f *Future) Done() <-chan struct{} { return f.done }

// Err is the cause of failure, nil unless Failed.
func (f *Future) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// Wait blocks until the unit is resident (nil), failed (its cause) or ctx
// is done (ctx's error).
func (f *Future) Wait(ctx context.Context) error {
	select {
	case <-f.done:
		return f.Err()
	default:
	}
	select {
	case <-f.done:
		return f.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// WaitEnqueued blocks until the unit's copies are queued and returns the
// fence that completes when they land (a GPU executor makes its stream wait
// on it). A resident unit returns a completed fence.
func (f *Future) WaitEnqueued(ctx context.Context) (Fence, error) {
	select {
	case <-f.enq:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.state == Failed {
		return nil, f.err
	}
	return f.fence, nil
}

// enqueue moves Pending → Enqueued with the fence of the unit's copies.
func (f *Future) enqueue(fence Fence) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.state != Pending {
		return false
	}
	f.state, f.fence = Enqueued, fence
	close(f.enq)
	return true
}

// resolve moves Pending or Enqueued → Resident. The unit's copies have
// landed, so its fence becomes doneFence: a GPU step that asks for the
// layer from now on (WaitEnqueued) gets no event to make its stream wait
// on: every step of a served model that is not a recorded graph asks for
// every layer, and each stream wait is a call into the driver.
func (f *Future) resolve() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch f.state {
	case Pending:
		f.fence = doneFence{}
		close(f.enq)
	case Enqueued:
		f.fence = doneFence{}
	default:
		return false
	}
	f.state = Resident
	close(f.done)
	return true
}

// fail moves a future that is not yet Resident to Failed. It reports
// whether this call failed it (false: already resolved either way).
func (f *Future) fail(err error) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch f.state {
	case Pending:
		close(f.enq)
	case Enqueued:
	default:
		return false
	}
	f.state, f.err = Failed, err
	close(f.done)
	return true
}
