// This file holds the DeviceUploader's fences: unitState counts a unit's
// chunks still to be queued and records its event once they are all queued
// and Flush was called, and deviceFence is the Fence the executor gets. A
// unit is usable as soon as its copies are queued (the compute stream waits
// on the event), not once the host has seen them finish.

package actors

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/forge-llm/forge/rocm"
)

// unitState is one unit's copies: how many of its chunks are still to be
// queued, and its event once recorded behind them.
type unitState struct {
	u        *Unit
	ev       rocm.Event
	recorded chan struct{} // closed once ev is recorded, or the unit failed

	mu        sync.Mutex
	pending   int  // chunks accepted by Upload whose copies are not yet queued
	flushed   bool // Flush was called: no more chunks
	recording bool // someone is recording ev (or gave up on it)
	closed    bool // recorded is closed
	err       error
}

// finish notes that one chunk is queued (done) and/or the unit flushed,
// and reports whether the caller must now record the event.
func (us *unitState) finish(done, flush bool) bool {
	us.mu.Lock()
	defer us.mu.Unlock()
	if done {
		us.pending--
	}
	if flush {
		us.flushed = true
	}
	if us.flushed && us.pending == 0 && !us.recording {
		us.recording = true
		return true
	}
	return false
}

// close marks the event recorded (err nil) or the unit failed.
func (us *unitState) close(err error) {
	us.mu.Lock()
	defer us.mu.Unlock()
	if err != nil && us.err == nil {
		us.err = err
	}
	if !us.closed {
		us.closed = true
		us.recording = true
		close(us.recorded)
	}
}

func (us *unitState) failure() error {
	us.mu.Lock()
	defer us.mu.Unlock()
	return us.err
}

// deviceFence is a unit's copy event.
type deviceFence struct {
	d  *DeviceUploader
	us *unitState
}

func (f *deviceFence) query() (bool, error) {
	select {
	case <-f.us.recorded:
	default:
		return false, nil // copies still being queued
	}
	if err := f.us.failure(); err != nil {
		return false, fmt.Errorf("%s: copies failed: %w", f.us.u.Name(), err)
	}
	f.d.mu.Lock()
	defer f.d.mu.Unlock()
	if f.d.released {
		return false, ErrClosed
	}
	var done bool
	err := f.d.do(func(c *rocm.Ctx) error {
		var err error
		done, err = c.Query(f.us.ev)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("%s: copies failed: %w", f.us.u.Name(), err)
	}
	return done, nil
}

// Done implements Fence.
func (f *deviceFence) Done() bool {
	done, err := f.query()
	return done && err == nil
}

// Wait implements Fence: it polls the event (a blocking cuEventSynchronize
// could not be abandoned when ctx ends), backing off from 50 µs to 1 ms.
func (f *deviceFence) Wait(ctx context.Context) error {
	select {
	case <-f.us.recorded:
	case <-ctx.Done():
		return ctx.Err()
	}
	wait := 50 * time.Microsecond
	for {
		done, err := f.query()
		if err != nil || done {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, time.Millisecond)
	}
}

// Event implements Fence: the event, once recorded behind the unit's
// copies (it waits for the copy thread to queue the last of them); 0 if
// the copies failed.
func (f *deviceFence) Event() uintptr {
	<-f.us.recorded
	if f.us.failure() != nil {
		return 0
	}
	return uintptr(f.us.ev)
}
