package rocm

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Worker owns one OS thread bound to one device: on CUDA the thread holds the
// worker's context, on HIP it has set the current device. Every GPU call is
// made through Do, so an actor that owns a Worker can never call the driver
// from the wrong thread.
type Worker struct {
	rt     *Runtime
	Device DeviceInfo

	reqs    chan *request
	quit    chan struct{} // closed by Close
	closed  chan struct{} // closed when the thread has torn down
	once    sync.Once
	spin    atomic.Int64 // polling window in ns, see DefaultSpin
	polling atomic.Bool  // the worker is polling for a request
	parks   atomic.Int64 // Do calls that parked for their result (tests, benchmarks)
	ctx     Ctx
}

// request is one Do call. state tells the worker whether the caller is
// still polling (then setting state is enough) or has parked (then it must be
// woken through wake).
type request struct {
	fn    func(*Ctx) error
	err   error
	state atomic.Int32 // reqPending → reqDone, or reqPending → reqParked → reqDone
	wake  chan struct{}
}

const (
	reqPending int32 = iota
	reqDone
	reqParked
)

// Ctx is the handle to the GPU inside Worker.Do. Its methods must only be
// called from the function passed to Do (they run on the worker's thread).
type Ctx struct {
	*Runtime
	w     *Worker
	cuCtx uintptr // CUcontext (CUDA only)
	dev   int
	args  uintptr // C-allocated kernel argument block, argBlockSize bytes
}

// NewWorker starts a worker for device ordinal and sets up its context.
func (rt *Runtime) NewWorker(ordinal int) (*Worker, error) {
	info, err := rt.Device(ordinal)
	if err != nil {
		return nil, err
	}
	w := newWorker(rt, info)
	if err := w.start(func(c *Ctx) error { return c.setup(ordinal) }, (*Ctx).teardown); err != nil {
		return nil, err
	}
	return w, nil
}

func newWorker(rt *Runtime, info DeviceInfo) *Worker {
	w := &Worker{rt: rt, Device: info, reqs: make(chan *request, 1), quit: make(chan struct{}), closed: make(chan struct{})}
	w.ctx = Ctx{Runtime: rt, w: w}
	w.spin.Store(int64(DefaultSpin))
	return w
}

// start runs the worker's thread; setup and teardown bind and release the
// device (tests of the request protocol pass no-ops).
func (w *Worker) start(setup func(*Ctx) error, teardown func(*Ctx)) error {
	started := make(chan error, 1)
	go w.loop(setup, teardown, started)
	return <-started
}

func (w *Worker) loop(setup func(*Ctx) error, teardown func(*Ctx), started chan<- error) {
	// Never unlocked: when this goroutine returns, Go retires the thread with
	// it, so no other goroutine ever runs on a thread with our context current.
	runtime.LockOSThread()
	c := &w.ctx
	if err := setup(c); err != nil {
		started <- err
		close(w.closed)
		return
	}
	started <- nil
	woke := false // the last request's caller had parked and was woken
	for {
		var r *request
		ok := false
		if !woke {
			w.polling.Store(true)
			r, ok = spinRecv(w.reqs, w.spin.Load())
			w.polling.Store(false)
		}
		if !ok {
			select {
			case r = <-w.reqs:
			case <-w.quit:
				teardown(c)
				close(w.closed)
				return
			}
		}
		r.err = c.run(r.fn)
		woke = !r.state.CompareAndSwap(reqPending, reqDone)
		if woke {
			// The caller parked: wake it. Waking made it runnable on this
			// thread's P, which polling would hold for the whole window
			// (another thread takes a woken goroutine from a busy P only
			// after a while): park at once instead, so that the P goes
			// to the caller.
			r.state.Store(reqDone)
			r.wake <- struct{}{}
		}
	}
}

func (c *Ctx) setup(ordinal int) error {
	dev, err := c.device(ordinal)
	if err != nil {
		return err
	}
	c.dev = dev
	switch c.backend {
	case CUDA:
		var ctx uintptr
		if err := c.call("cuCtxCreate_v2", c.ctxCreate, uintptr(unsafe.Pointer(&ctx)), 0, uintptr(dev)); err != nil {
			return fmt.Errorf("rocm: device %d: %w", ordinal, err)
		}
		c.cuCtx = ctx
		live.contexts.Add(1)
	case HIP:
		if err := c.call("hipSetDevice", c.setDevice, uintptr(ordinal)); err != nil {
			return fmt.Errorf("rocm: device %d: %w", ordinal, err)
		}
	}
	var p uintptr
	if err := c.call(c.name("cuMemHostAlloc", "hipHostMalloc"), c.hostAlloc, uintptr(unsafe.Pointer(&p)), argBlockSize, 0); err != nil {
		c.teardown()
		return fmt.Errorf("rocm: kernel argument block: %w", err)
	}
	c.args = p
	return nil
}

func (c *Ctx) teardown() {
	if c.args != 0 {
		_ = c.call(c.name("cuMemFreeHost", "hipHostFree"), c.hostFree, c.args)
		c.args = 0
	}
	if c.cuCtx != 0 {
		_ = c.call("cuCtxDestroy_v2", c.ctxDestroy, c.cuCtx)
		c.cuCtx = 0
		live.contexts.Add(-1)
	}
}

// run calls fn, turning a panic into an error so the worker thread survives.
func (c *Ctx) run(fn func(*Ctx) error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("rocm: panic in worker: %v", r)
		}
	}()
	return fn(c)
}

// ErrClosed is returned by Do after Close.
var ErrClosed = errors.New("rocm: worker closed")

// Do runs fn on the worker's thread and returns its error. It blocks until fn
// has returned or ctx is done. When ctx ends first, fn may still run (or be
// running) on the worker afterwards (the driver cannot be interrupted), so fn
// must not use anything the caller frees on cancellation.
func (w *Worker) Do(ctx context.Context, fn func(*Ctx) error) error {
	r := &request{fn: fn, wake: make(chan struct{}, 1)}
	select {
	case <-w.closed:
		return ErrClosed
	default:
	}
	// Read before the send: a polling worker takes the request at once and
	// stops polling.
	polling := w.polling.Load()
	select {
	case w.reqs <- r:
	case <-w.closed:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	if d := w.spin.Load(); d > 0 {
		if !polling {
			// A parked worker has been made runnable on this goroutine's
			// P by the send, where polling would keep it from starting:
			// yield the P to it first (its thread takes it over, and this
			// goroutine goes on on another), then poll. (A busy worker
			// costs the yield only.)
			runtime.Gosched()
		}
		start := time.Now()
		for i := 0; ; i++ {
			if r.state.Load() == reqDone {
				return r.err
			}
			if i%32 == 31 && time.Since(start) > time.Duration(d) {
				break
			}
		}
	}
	if !r.state.CompareAndSwap(reqPending, reqParked) {
		return r.err // finished meanwhile
	}
	w.parks.Add(1)
	select {
	case <-r.wake:
		return r.err
	case <-w.closed: // closed with r still queued
		if r.state.Load() == reqDone {
			return r.err
		}
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

// DefaultSpin is how long the worker polls for the next request, and Do for
// its result, before parking. Waking a goroutine locked to its own OS thread
// costs a futex round trip through the kernel each way (~10 µs in a VM);
// polling briefly keeps back-to-back Do calls (an uploader queuing chunk
// after chunk, a prompt step's 600 launches) off that path at the price of
// a few µs of CPU after each call. The request queue is buffered so that a
// caller does not park while the worker polls, and the result is handed
// back through an atomic the caller polls.
//
// A goroutine woken by the other side is made runnable on the waker's P,
// and a waker that then polls holds that P: other threads take the woken
// goroutine from it only after a while. So a caller that sent to a parked
// worker yields its P before polling, and a worker that woke a parked
// caller parks rather than polls. Without that, a caller that parked once
// (behind a long request: a step's final synchronisation) resumed only
// when the worker's window ran out, found the worker parked in turn, and
// parked again: every call then cost the window, ~50 µs, and a prompt
// step of 600 launches took 25-37 ms where it takes 5
// (bench/results/2026-11-26-short-prompt-h100.md).
//
// Measured on the H100 host (16 cores, BenchmarkWorkerDo): a Do round trip
// costs ~24 µs parking at once, ~5 µs with 10 µs of polling and ~1.6 µs with
// 50 µs. On a machine with fewer cores than busy threads polling only adds
// contention: SetSpin(0) there.
const DefaultSpin = 50 * time.Microsecond

// SetSpin changes the polling window (0 parks at once).
func (w *Worker) SetSpin(d time.Duration) { w.spin.Store(int64(d)) }

// spinRecv polls ch for up to d nanoseconds.
func spinRecv[T any](ch <-chan T, d int64) (v T, ok bool) {
	if d <= 0 {
		return v, false
	}
	start := time.Now()
	for i := 0; ; i++ {
		select {
		case v = <-ch:
			return v, true
		default:
		}
		if i%32 == 31 && time.Since(start) > time.Duration(d) {
			return v, false
		}
	}
}

// Close waits for queued work, destroys the context and ends the thread. The
// caller frees its own allocations first (see Live).
func (w *Worker) Close() error {
	w.once.Do(func() { close(w.quit) })
	<-w.closed
	return nil
}

// Sync waits until all work queued on the device by this worker is done.
func (c *Ctx) Sync() error {
	return c.call(c.name("cuCtxSynchronize", "hipDeviceSynchronize"), c.ctxSync)
}

// Worker returns the worker this Ctx belongs to (for its DeviceInfo).
func (c *Ctx) Worker() *Worker { return c.w }

// Runtime returns the driver the worker runs on.
func (w *Worker) Runtime() *Runtime { return w.rt }

// MemInfo returns free and total device memory.
func (c *Ctx) MemInfo() (free, total uint64, err error) {
	err = c.call(c.name("cuMemGetInfo_v2", "hipMemGetInfo"), c.memGetInfo, uintptr(unsafe.Pointer(&free)), uintptr(unsafe.Pointer(&total)))
	return
}
