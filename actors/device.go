// This file holds the DeviceUploader: its type and the Uploader API
// (Reserve, Dest, Upload, Flush, Weight, Release) over one device arena or
// per-tensor buffers. How bytes reach the device is split by concern: the
// staging ring in staging.go, read-only registration in register.go, the
// per-unit events in fence.go and the counters in device_stats.go, so each
// path can be read, and changed, without the others in view.

package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/rocm"
)

// DeviceUploader is the GPU's Uploader. Reserve makes one device allocation
// for every weight (the arena) and one event per unit. Upload only queues
// a chunk and returns; helper goroutines move it, and the unit's event is
// recorded on the copy stream behind the unit's copies once Flush was
// called and the last of them is queued. The executor's compute stream
// waits on that event (Fence.Event), so a layer is usable as soon as its
// copies are queued.
//
// Staging is how bytes move (DESIGN.md, "Moving bytes fast"): Stagers
// goroutines copy chunks into a ring of RingBuffers pinned buffers of
// RingBytes, and the copy thread only queues the asynchronous copies out
// of the ring (eight stagers move the page-cached 8B file at 37-40 GB/s
// on the H100 host). The ring is anonymous memory paged in by several
// threads and registered with the driver in one call, a few milliseconds
// (cuMemHostAlloc pins at ~1.3 GB/s, which held the first copies back by
// tens of milliseconds).
//
// Register (CUDA with read-only host registration, Prefetch and Eager)
// copies pass-through tensors straight from the mapped file instead,
// registered read-only in ranges of RegBytes by RegThreads threads running
// ahead of the chunks in load order. It is there for comparison: on the
// H100 host the driver registers at 9-16 GB/s whatever the number of
// threads (copies from the registered range then run at 51-54 GB/s),
// while several stagers fill a pinned ring at 33-53 GB/s, and a
// registration in progress holds up the copy thread's own driver calls
// (BenchmarkDeviceRates, bench/results/2026-11-25-gpu-h100.md).
//
// Registration wins where it is paid once: Pinned is a file a server keeps
// registered between a model's loads (PinnedFile), and a load copies its
// registered ranges directly, 4.7 GB in ~112 ms against ~153 ms through
// the ring (bench/results/2026-11-25-night-swap-h100.md).
//
// Every driver call of the copies runs on W's OS-locked thread (best a
// rocm.Worker.Sibling of the backend's worker, so copies never queue
// behind kernel launches or module loads); registrations run on siblings
// of W.
type DeviceUploader struct {
	W   *rocm.Worker
	Mem *Memory
	// PerTensor makes one device allocation per tensor (the host-f32
	// strategy, the design this project replaces) instead of the arena.
	PerTensor bool
	// Register copies pass-through tensors from the registered mapping
	// (see above) where the device allows, with Ahead.
	Register bool
	// Ahead says every unit will be loaded, in order (Prefetch, Eager):
	// only then are ranges registered ahead of the chunks.
	Ahead bool
	// Unpaced reports every chunk as out of the queue as soon as it is
	// queued (UploadThen), so the loader hands over the whole file at
	// once and a demanded unit waits behind it: the behaviour before
	// pacing, kept for comparisons.
	Unpaced bool
	// RingBuffers and RingBytes size the staging ring (default 16 × 4 MiB);
	// Stagers is the number of goroutines filling it (default 8).
	RingBuffers int
	RingBytes   int
	Stagers     int
	// RegThreads is the number of registration threads (default 1; more
	// do not register faster) and RegBytes the most bytes one
	// registration covers (default 64 MiB), under Register.
	RegThreads int
	RegBytes   int64
	// Rings, if not nil, lends the staging ring (given back by Release,
	// its copies done) instead of one pinned for this uploader alone.
	Rings *RingPool
	// Compute is set where other models share the context (a server's
	// one GPU context): it returns the stream the model's kernels run on
	// (0: none yet). Release then waits for that stream and its own
	// copies, not for the whole device (other models' copies and kernels
	// must not hold an eviction back), and the arena is allocated and
	// freed in stream order (cuMemAllocAsync, cuMemFreeAsync, on CUDA
	// where the library has them): the free is queued behind the model's
	// own work and no other stream waits for it. nil: Release
	// synchronises the context.
	Compute func() rocm.Stream
	// Pinned, if not nil, is this model's file kept registered by its
	// server (PinnedFile): pass-through chunks whose pages are registered
	// are copied from them directly, the rest staged. Reserve takes a
	// hold on it and Release gives it back once the copies are done.
	Pinned *PinnedFile

	mu         sync.Mutex // guards the fields below against Flush, Weight, Release and fence queries
	released   bool
	stream     rocm.Stream
	arena      rocm.DevPtr
	arenaN     int64
	arenaAsync bool  // allocated in the copy stream's order: freed the same way
	reserved   int64 // accounted in Mem for the arena
	units      map[*Unit]*unitState
	perT       map[*Tensor]rocm.DevPtr
	perSum     int64 // accounted in Mem for perT
	weights    map[string]*kernels.Weight
	useReg     bool
	pinHeld    bool     // Reserve holds Pinned
	planned    bool     // pieces planned (at the first pass-through upload)
	pieces     []*piece // registration ranges in load order
	byAddr     []*piece // the same, by address
	regW       []*rocm.Worker

	stageMu sync.Mutex // guards the two below; never held while waiting
	staging bool       // the ring and stagers are started
	stopped bool       // Release has begun: start nothing more

	// Set up by Reserve, read-only afterwards.
	quit    chan struct{}
	wg      sync.WaitGroup
	jobs    chan *job // to the stagers
	urgent  chan *job // to the stagers, before jobs: demanded units' chunks
	regJobs chan *job // to the registered-copy queue
	ops     chan op   // to the copy thread
	free    chan int  // staging buffers ready for a stager
	ring    [][]byte  // staging buffers, by slot
	ringEv  []rocm.Event
	rng     *StagingRing   // set by pinRing: the ring, own or borrowed from Rings
	regNext atomic.Int64   // registrars: the next range to claim, counting down
	regWG   sync.WaitGroup // the registrars

	stats     deviceStats
	reserveAt time.Time
}

// Reserve implements Uploader.
func (d *DeviceUploader) Reserve(p *Plan) error {
	if d.W == nil {
		return fmt.Errorf("device uploader: no GPU worker")
	}
	d.reserveAt = time.Now()
	defer func() { d.stats.add(func(s *DeviceStats) { s.Reserved = time.Since(d.reserveAt) }) }()
	if d.Mem == nil {
		d.Mem = NewMemory(0)
	}
	if d.RingBuffers <= 0 {
		d.RingBuffers = 16
	}
	if d.RingBytes <= 0 {
		d.RingBytes = 4 << 20
	}
	if d.Stagers <= 0 {
		d.Stagers = 8
	}
	if d.RegThreads <= 0 {
		d.RegThreads = 1
	}
	if d.RegBytes <= 0 {
		d.RegBytes = 64 << 20
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.units = map[*Unit]*unitState{}
	d.perT = map[*Tensor]rocm.DevPtr{}
	d.weights = map[string]*kernels.Weight{}
	d.quit = make(chan struct{})
	d.jobs = make(chan *job, 1<<12)
	d.urgent = make(chan *job, 1<<12)
	d.regJobs = make(chan *job, 1<<12)
	d.ops = make(chan op, 2*d.RingBuffers+256)
	d.free = make(chan int, d.RingBuffers)
	d.ring = make([][]byte, d.RingBuffers)
	d.ringEv = make([]rocm.Event, d.RingBuffers)
	var n int64
	for _, u := range p.Units {
		d.units[u] = &unitState{u: u, recorded: make(chan struct{})}
		for _, t := range u.Placed() {
			if d.PerTensor {
				t.ArenaOff = -1
				continue
			}
			// 256 bytes: what cuMemAlloc guarantees, and enough for every
			// vector load the kernels make.
			n = (n + 255) &^ 255
			t.ArenaOff = n
			n += t.OutBytes
		}
	}
	if n > 0 {
		if err := d.Mem.Alloc(n, "weight arena"); err != nil {
			return err
		}
		d.reserved = n
	}
	d.useReg = d.Register && d.Ahead && d.W.Device.Backend == rocm.CUDA && d.W.Device.ReadOnlyRegister
	err := d.do(func(c *rocm.Ctx) error {
		s, err := c.NewStream()
		if err != nil {
			return fmt.Errorf("device uploader: copy stream: %w", err)
		}
		d.stream = s
		// CUDA only for now: hipMallocAsync has not been tried on a device.
		if n > 0 && d.Compute != nil && d.W.Device.Backend == rocm.CUDA && c.HasAsyncAlloc() {
			if d.arena, err = c.MallocAsync(n, s); err == nil {
				d.arenaN, d.arenaAsync = n, true
				d.stats.add(func(s *DeviceStats) { s.ArenaAsync = true })
			} else {
				slog.Debug("actors: stream-ordered arena refused; allocating it plainly", "err", err)
			}
		}
		if n > 0 && d.arena == 0 {
			if d.arena, err = c.Malloc(n); err != nil {
				return fmt.Errorf("weight arena of %d bytes: %w", n, err)
			}
			d.arenaN = n
		}
		for _, us := range d.units {
			if us.ev, err = c.NewEvent(false); err != nil {
				return fmt.Errorf("device uploader: event for %s: %w", us.u.Name(), err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	d.wg.Add(1)
	go d.copier()
	if d.useReg {
		for range d.RegThreads {
			sw, err := d.W.Sibling()
			if err != nil {
				slog.Debug("actors: no registration thread; registering on the copy thread", "err", err)
				break
			}
			d.regW = append(d.regW, sw)
		}
		if len(d.regW) == 0 {
			d.regW = []*rocm.Worker{d.W}
		}
		d.wg.Add(1)
		go d.registeredCopies()
	}
	if d.Pinned != nil && d.Pinned.Acquire() {
		d.pinHeld = true
		if !d.useReg {
			d.wg.Add(1)
			go d.registeredCopies()
		}
	}
	return nil
}

// do runs fn on the copy thread. Uploads are not cancellable once queued
// on the device, so this uses a background context; only fence waits poll
// with the caller's.
func (d *DeviceUploader) do(fn func(c *rocm.Ctx) error) error {
	return d.W.Do(context.Background(), fn)
}

// Dest implements Uploader: converted bytes are written to host memory and
// staged through the pinned ring by Upload (a chunk may be larger than a
// ring buffer, and dequantizer workers must not hold ring buffers while the
// copy stream needs them back).
func (d *DeviceUploader) Dest(t *Tensor, off, n int64) ([]byte, error) {
	if off < 0 || n < 0 || off+n > t.OutBytes {
		return nil, fmt.Errorf("range [%d, %d) outside the tensor's %d bytes", off, off+n, t.OutBytes)
	}
	return alignedBytes(n), nil
}

// dst is where t's bytes go on the device, allocating t's own buffer
// under PerTensor. Called with d.mu held.
func (d *DeviceUploader) dst(t *Tensor) (rocm.DevPtr, error) {
	if !d.PerTensor {
		return d.arena + rocm.DevPtr(t.ArenaOff), nil
	}
	if p, ok := d.perT[t]; ok {
		return p, nil
	}
	if err := d.Mem.Alloc(t.OutBytes, "tensor "+t.Name()); err != nil {
		return 0, err
	}
	var p rocm.DevPtr
	err := d.do(func(c *rocm.Ctx) error {
		var err error
		p, err = c.Malloc(max(t.OutBytes, 256))
		return err
	})
	if err != nil {
		d.Mem.Free(t.OutBytes)
		return 0, fmt.Errorf("device allocation of %d bytes: %w", t.OutBytes, err)
	}
	d.perT[t] = p
	d.perSum += t.OutBytes
	return p, nil
}

// Upload implements Uploader: the chunk is queued for copying and Upload
// returns; a failed copy fails the unit's fence.
func (d *DeviceUploader) Upload(t *Tensor, off int64, data []byte) error {
	return d.UploadThen(t, off, data, nil)
}

// UploadThen implements PacedUploader: done is called once the chunk is
// staged into the ring (or its copy from registered memory queued). A
// chunk of a demanded unit (an expert a request waits for) is staged
// before the others queued.
func (d *DeviceUploader) UploadThen(t *Tensor, off int64, data []byte, done func()) error {
	if off < 0 || off+int64(len(data)) > t.OutBytes {
		return fmt.Errorf("range [%d, %d) outside the tensor's %d bytes", off, off+int64(len(data)), t.OutBytes)
	}
	if d.Unpaced && done != nil {
		done()
		done = nil
	}
	if len(data) == 0 {
		if done != nil {
			done()
		}
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.released {
		return ErrClosed
	}
	us := d.units[t.unit]
	if us == nil {
		return fmt.Errorf("%s: not reserved", t.unit.Name())
	}
	root, rootOff := t.Placement() // a piece lands inside its stacked tensor
	base, err := d.dst(root)
	if err != nil {
		return err
	}
	j := &job{us: us, dst: base + rocm.DevPtr(rootOff+off), data: data, urgent: t.unit.demanded.Load(), done: done}
	if d.stats.first.CompareAndSwap(false, true) {
		now := time.Since(d.reserveAt)
		d.stats.add(func(s *DeviceStats) { s.FirstUpload = now })
	}
	us.mu.Lock()
	us.pending++
	us.mu.Unlock()
	if d.pinHeld && t.PassThrough() {
		if j.pieces = d.Pinned.covering(data); j.pieces != nil {
			d.stats.add(func(s *DeviceStats) { s.PinnedBytes += int64(len(data)) })
			d.regJobs <- j
			return nil
		}
	}
	if d.useReg && t.PassThrough() {
		if !d.planned {
			d.plan(t, off, data)
			d.startRegistrars()
		}
		if j.pieces = d.covering(data); j.pieces != nil {
			d.regJobs <- j
			return nil
		}
	}
	if !d.stage(j) {
		return ErrClosed
	}
	return nil
}

// Flush implements Uploader: the unit's event is recorded behind its
// copies once they are all queued (at once if they are), and its Weights
// (device addresses) become visible. The fence's Event waits for the
// recording.
func (d *DeviceUploader) Flush(u *Unit) (Fence, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.released {
		return nil, ErrClosed
	}
	us, ok := d.units[u]
	if !ok {
		return nil, fmt.Errorf("%s: no event (not reserved)", u.Name())
	}
	for i, t := range u.Placed() {
		var p rocm.DevPtr
		switch {
		case d.PerTensor && i >= len(u.Tensors):
			// A stacked tensor: its buffer is made now if no piece came
			// yet, so the block's view exists before its experts land.
			var err error
			if p, err = d.dst(t); err != nil {
				return nil, fmt.Errorf("tensor %q: %w", t.Name(), err)
			}
		case d.PerTensor:
			if p = d.perT[t]; p == 0 {
				return nil, fmt.Errorf("tensor %q: never uploaded", t.Name())
			}
		default:
			p = d.arena + rocm.DevPtr(t.ArenaOff)
		}
		var host []byte
		if t.PassThrough() {
			host = t.src // the mapped file: free, and handy for host-side checks
		}
		d.weights[t.Name()] = placedWeight(t, uintptr(p), host)
	}
	if us.finish(false, true) {
		err := d.do(func(c *rocm.Ctx) error { return c.Record(us.ev, d.stream) })
		if err != nil {
			err = fmt.Errorf("%s: recording its copy event: %w", u.Name(), err)
			us.close(err)
			return nil, err
		}
		us.close(nil)
	}
	return &deviceFence{d: d, us: us}, nil
}

// Weight implements Uploader.
func (d *DeviceUploader) Weight(name string) (*kernels.Weight, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	w, ok := d.weights[name]
	return w, ok
}

// Release implements Uploader: it stops the helpers, waits for the copies
// in flight, then frees the arena (or per-tensor buffers), the staging
// ring (or gives it back to Rings), the registrations, the events and the
// copy stream. With Compute it waits for its own copies only, and the
// arena's free waits, on the device, for the model's kernels (see
// Compute). It is safe after a failed or partial Reserve, and more than
// once.
func (d *DeviceUploader) Release() {
	d.mu.Lock()
	if d.released || d.W == nil {
		d.mu.Unlock()
		return
	}
	d.released = true
	d.mu.Unlock()
	// The helpers stop; none may start after this (stage, plan check).
	d.stageMu.Lock()
	d.stopped = true
	d.stageMu.Unlock()
	if d.quit != nil {
		close(d.quit)
	}
	d.wg.Wait()
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, us := range d.units {
		us.close(ErrClosed) // fences whose copies were never all queued
	}
	t0 := time.Now()
	err := d.do(func(c *rocm.Ctx) error {
		var errs []error
		keep := func(err error) {
			if err != nil {
				errs = append(errs, err)
			}
		}
		if d.Compute == nil {
			// Everything: the compute stream may still read the arena.
			keep(c.Sync())
		} else if d.stream != 0 {
			// The copies out of the ring and the registrations: the
			// ring goes back to the pool, the ranges are unregistered.
			keep(c.SyncStream(d.stream))
			// The arena's free comes after the model's last kernel.
			if s := d.Compute(); s != 0 {
				ev, err := c.NewEvent(false)
				keep(err)
				if err == nil {
					keep(c.Record(ev, s))
					keep(c.WaitEvent(d.stream, ev))
					keep(c.DestroyEvent(ev)) // released once it completes
				}
			}
		}
		for _, p := range d.pieces {
			if p.reg != nil {
				keep(c.Unregister(p.reg))
			}
		}
		for _, us := range d.units {
			keep(c.DestroyEvent(us.ev))
		}
		for t, p := range d.perT {
			keep(c.Free(p, max(t.OutBytes, 256)))
		}
		if d.arena != 0 && d.arenaAsync {
			keep(c.FreeAsync(d.arena, d.arenaN, d.stream))
			// The pool gives freed memory back to the driver at the next
			// synchronisation: here, on this model's own stream (idle
			// but for the free), not at the next model's first copy.
			keep(c.SyncStream(d.stream))
		} else if d.arena != 0 {
			keep(c.Free(d.arena, d.arenaN))
		}
		if d.stream != 0 {
			keep(c.DestroyStream(d.stream))
		}
		return errors.Join(errs...)
	})
	d.stats.add(func(s *DeviceStats) { s.UnregisterTime = time.Since(t0) })
	if err != nil {
		slog.Error("actors: releasing device weights", "err", err)
	}
	if d.pinHeld {
		// The copy stream was synchronised above (or the whole context
		// without Compute): nothing reads the file's pages any more.
		d.Pinned.Release()
		d.pinHeld = false
	}
	if r := d.rng; r != nil {
		switch {
		case d.Rings != nil && err == nil:
			d.Rings.put(r)
		case d.Rings != nil:
			d.Rings.drop(r) // not lent again after a failed release
		default:
			if err := r.release(d.W); err != nil {
				slog.Error("actors: freeing the staging ring", "err", err)
			}
		}
		d.rng = nil
	}
	st := d.Stats()
	slog.Debug("actors: device uploads", "reserved", st.Reserved, "first upload", st.FirstUpload, "ring ready", st.RingReady,
		"first copy", st.FirstCopy, "last copy", st.LastCopy,
		"staged MB", st.StagedBytes>>20, "pinned MB", st.PinnedBytes>>20, "registered MB", st.RegisteredBytes>>20, "copies", st.CopyCalls, "batches", st.Batches,
		"ring pinned", st.RingPinTime, "ring reused", st.RingReused, "ring wait", st.RingWait, "memcpy", st.StageCopyTime,
		"reclaim wait", st.ReclaimWait, "arena in stream order", st.ArenaAsync, "release", st.UnregisterTime)
	for _, w := range d.regW {
		if w != d.W {
			w.Close()
		}
	}
	if d.Mem != nil {
		d.Mem.Free(d.reserved + d.perSum)
	}
	d.reserved, d.perSum, d.arena, d.stream = 0, 0, 0, 0
	d.pieces, d.byAddr, d.regW, d.ring, d.ringEv, d.perT, d.weights = nil, nil, nil, nil, nil, nil, nil
}
