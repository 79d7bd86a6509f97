package pipeline

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/forge-llm/forge/actors"
	"github.com/forge-llm/forge/kernels/gpu"
	"github.com/forge-llm/forge/rocm"
)

// sharedGPU is the GPU an Engine opens once for every model it loads: the
// worker that holds the context, its sibling for the uploaders' copies,
// a gpu.Backend with the kernel modules loaded and cuBLAS open, and a
// pool of pinned staging rings. Each model forks the backend (a stream,
// its own tensors, KV cache, scratch and recorded steps) and borrows a
// ring; on unload it frees only what it made. Opening a model in a warm
// server then costs what the model itself needs (its arena and copies),
// not a fresh process's driver start (measured at 380-510 ms to the first
// token of a swapped 8B model when every model opened its own context).
//
// It opens on the first model that asks for it (a server that only runs
// CPU models never starts the driver), is retried by the next model if
// opening failed, and closes once the Engine has closed every model.
type sharedGPU struct {
	o Options // Device selects the GPU

	mem *actors.Memory // what the shared pieces hold (the staging rings)
	// open opens the device (tests replace it).
	open func(o Options, sel rocm.Selection, mem *actors.Memory, d *sharedDev)

	mu     sync.Mutex
	idle   *sync.Cond // signalled when users drops to 0
	cur    *sharedDev // the device, opening or open; nil before the first GPU model
	past   []*sharedDev
	users  int // models holding cur
	opens  int // openings started (tests: one per Engine)
	closed bool
}

// sharedDev is one opening of the shared device.
type sharedDev struct {
	done   chan struct{} // closed when opened (or failed); then the fields below are set
	err    error
	cpu    bool   // "auto" found no usable GPU: each model opens the CPU backend
	reason string // why the CPU
	w, upW *rocm.Worker
	pinW   *rocm.Worker // registers served files (pinWorker); nil until asked
	base   *gpu.Backend
	rings  *actors.RingPool
	close  func() // frees what was opened (nil: nothing)

	preloads sync.WaitGroup // libraries loading next to the driver
}

func newSharedGPU(o Options) *sharedGPU {
	s := &sharedGPU{o: o, mem: actors.NewMemory(0), open: openSharedDev}
	s.idle = sync.NewCond(&s.mu)
	return s
}

// errSharedClosed: a model asked for the device after the Engine closed.
var errSharedClosed = errors.New("pipeline: the engine's GPU is closed")

// acquire holds the device for one model, opening it if no model did yet
// (or the last opening failed), and waits until it is open or abort is
// closed. On success the caller calls release once it has freed what it
// made on the device.
func (s *sharedGPU) acquire(sel rocm.Selection, abort <-chan struct{}) (*sharedDev, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, errSharedClosed
	}
	if s.cur != nil {
		select {
		case <-s.cur.done:
			if s.cur.err != nil { // failed: open again
				s.past = append(s.past, s.cur)
				s.cur = nil
			}
		default:
		}
	}
	if s.cur == nil {
		d := &sharedDev{done: make(chan struct{})}
		s.cur = d
		s.opens++
		go func() {
			defer close(d.done)
			s.open(s.o, sel, s.mem, d)
		}()
	}
	d := s.cur
	s.users++
	s.mu.Unlock()
	select {
	case <-d.done:
	case <-abort:
		s.release()
		return nil, errAborted
	}
	if d.err != nil {
		s.release()
		return nil, d.err
	}
	return d, nil
}

// release ends one model's hold.
func (s *sharedGPU) release() {
	s.mu.Lock()
	s.users--
	if s.users == 0 {
		s.idle.Broadcast()
	}
	s.mu.Unlock()
}

// inUse is what the shared pieces hold, counted once for all models.
func (s *sharedGPU) inUse() int64 { return s.mem.InUse() }

// close waits until no model holds the device, then closes it. Later
// acquires fail.
func (s *sharedGPU) close() {
	s.mu.Lock()
	s.closed = true
	for s.users > 0 {
		s.idle.Wait()
	}
	devs := append(s.past, s.cur)
	s.cur, s.past = nil, nil
	s.mu.Unlock()
	for _, d := range devs {
		if d == nil {
			continue
		}
		<-d.done
		if d.pinW != nil {
			d.pinW.Close()
		}
		if d.close != nil {
			d.close()
		}
		d.preloads.Wait()
	}
}

// openSharedDev opens the device as device.run does for one model
// (the run-time compiler and cuBLAS's library load next to the driver's
// start), and adds the staging ring pool.
func openSharedDev(o Options, sel rocm.Selection, mem *actors.Memory, d *sharedDev) {
	t0 := time.Now()
	d.preloads.Go(rocm.PreloadCompiler)
	fail := func(err error) {
		d.err = err
		d.preloads.Wait() // a failed opening leaves nothing running
	}
	ch, err := rocm.Choose(sel)
	if err != nil {
		fail(err)
		return
	}
	if ch.CPU {
		d.cpu, d.reason = true, ch.Reason
		return
	}
	d.preloads.Go(gpu.PreloadBLAS)
	w, err := ch.Runtime.NewWorker(ch.Device.Ordinal)
	if err != nil {
		fail(fmt.Errorf("%s: %w", ch.Device, err))
		return
	}
	tCtx := time.Since(t0)
	upW, err := w.Sibling()
	if err != nil {
		slog.Debug("pipeline: no thread of its own for the uploaders", "err", err)
		upW = w
	}
	closeWorkers := func() {
		if upW != w {
			upW.Close()
		}
		w.Close()
	}
	b, err := gpu.New(w, gpuOptions(o))
	if err != nil {
		closeWorkers()
		fail(fmt.Errorf("%s: %w", ch.Device, err))
		return
	}
	rings := &actors.RingPool{W: upW, Mem: mem, MaxIdle: 1}
	d.w, d.upW, d.base, d.rings = w, upW, b, rings
	d.close = func() {
		rings.Close()
		if err := b.Close(); err != nil {
			slog.Warn("pipeline: closing the engine's GPU backend", "err", err)
		}
		closeWorkers()
	}
	if sel.Kind == rocm.SelectAuto {
		slog.Info("pipeline: running on the GPU", "device", ch.Device.String())
	}
	slog.Debug("pipeline: engine GPU open", "device", ch.Device.String(), "context", tCtx, "kernels", time.Since(t0))
}
