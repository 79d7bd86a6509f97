package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/forge-llm/forge/gguf"
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

// DeviceStats says where a load's time went (for benchmarks and
// profiles).
type DeviceStats struct {
	Registrations   int           // ranges registered
	RegisteredBytes int64         // bytes registered
	RegisterTime    time.Duration // summed over the registration threads
	RegisterWait    time.Duration // chunks waiting for their ranges, summed
	StagedBytes     int64         // bytes copied through the ring
	PinnedBytes     int64         // bytes copied from a kept registration (Pinned)
	StageCopyTime   time.Duration // stagers' memcpy, summed
	RingWait        time.Duration // stagers waiting for a free buffer, summed
	CopyCalls       int           // asynchronous copies queued
	Batches         int           // copy-thread round trips
	ReclaimWait     time.Duration // copy thread waiting for a ring buffer's copy
	RingPinTime     time.Duration // pinning the ring
	RingReused      bool          // the ring was lent by Rings, pinned before
	ArenaAsync      bool          // the arena was allocated in stream order
	UnregisterTime  time.Duration // in Release
	// From the start of Reserve: Reserve's end (arena, events, stream),
	// the first chunk handed to Upload, the ring registered, the first and
	// the last copy queued.
	Reserved, FirstUpload, RingReady, FirstCopy, LastCopy time.Duration
}

type deviceStats struct {
	mu    sync.Mutex
	first atomic.Bool // FirstUpload is set
	DeviceStats
}

func (s *deviceStats) add(f func(*DeviceStats)) {
	s.mu.Lock()
	f(&s.DeviceStats)
	s.mu.Unlock()
}

// Stats returns the counters so far.
func (d *DeviceUploader) Stats() DeviceStats {
	d.stats.mu.Lock()
	defer d.stats.mu.Unlock()
	return d.stats.DeviceStats
}

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

// piece is one registration range of the mapped file.
type piece struct {
	lo, hi uintptr
	unit   *unitState
	done   chan struct{} // closed once registered (reg) or failed (err)
	reg    *rocm.Registered
	err    error
}

// job is one uploaded chunk.
type job struct {
	us     *unitState
	dst    rocm.DevPtr
	data   []byte
	pieces []*piece // the registered ranges under data (registered path)
}

// op is one copy for the copy thread.
type op struct {
	us   *unitState
	dst  rocm.DevPtr
	src  uintptr
	n    int
	slot int  // staging buffer, or -1 for a registered source
	last bool // the chunk's last copy
	err  error
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
	d.regJobs = make(chan *job, 1<<12)
	d.ops = make(chan op, 2*d.RingBuffers+256)
	d.free = make(chan int, d.RingBuffers)
	d.ring = make([][]byte, d.RingBuffers)
	d.ringEv = make([]rocm.Event, d.RingBuffers)
	var n int64
	for _, u := range p.Units {
		d.units[u] = &unitState{u: u, recorded: make(chan struct{})}
		for _, t := range u.Tensors {
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
	if off < 0 || off+int64(len(data)) > t.OutBytes {
		return fmt.Errorf("range [%d, %d) outside the tensor's %d bytes", off, off+int64(len(data)), t.OutBytes)
	}
	if len(data) == 0 {
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
	base, err := d.dst(t)
	if err != nil {
		return err
	}
	j := &job{us: us, dst: base + rocm.DevPtr(off), data: data}
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

// stage queues j for the staging ring, starting the ring and its stagers
// on first use. It reports false once Release has begun.
func (d *DeviceUploader) stage(j *job) bool {
	d.stageMu.Lock()
	if d.stopped {
		d.stageMu.Unlock()
		return false
	}
	if !d.staging {
		d.staging = true
		d.wg.Add(1 + d.Stagers)
		go d.pinRing()
		for range d.Stagers {
			go d.stager()
		}
	}
	d.stageMu.Unlock()
	select {
	case d.jobs <- j:
		return true
	case <-d.quit:
		return false
	}
}

// pinRing makes the staging ring (see pinStagingRing), or borrows one
// from Rings, and hands its buffers to the stagers as they become usable.
// Without a ring nothing can be staged: the stagers fail what comes.
func (d *DeviceUploader) pinRing() {
	defer d.wg.Done()
	t0 := time.Now()
	ready := func(i int, buf []byte, ev rocm.Event) {
		d.ring[i], d.ringEv[i] = buf, ev
		d.free <- i
	}
	var r *StagingRing
	var reused bool
	var err error
	if d.Rings != nil {
		r, reused, err = d.Rings.get(d.RingBuffers, d.RingBytes, ready, d.quit)
	} else {
		r, err = pinStagingRing(d.W, d.RingBuffers, d.RingBytes, ready, d.quit)
	}
	d.stats.add(func(s *DeviceStats) {
		s.RingPinTime, s.RingReady, s.RingReused = time.Since(t0), time.Since(d.reserveAt), reused
	})
	if err != nil {
		slog.Error("actors: staging ring", "err", err)
		d.free <- -1
		return
	}
	d.rng = r
}

// stager copies queued chunks into free ring buffers and hands them to the
// copy thread.
func (d *DeviceUploader) stager() {
	defer d.wg.Done()
	for {
		var j *job
		select {
		case j = <-d.jobs:
		case <-d.quit:
			return
		}
		data, dst := j.data, j.dst
		for len(data) > 0 {
			t0 := time.Now()
			var slot int
			select {
			case slot = <-d.free:
			case <-d.quit:
				return
			}
			if slot < 0 {
				d.free <- slot // for the other stagers
				d.send(op{us: j.us, slot: -1, last: true, err: fmt.Errorf("no pinned staging buffer")})
				break
			}
			t1 := time.Now()
			buf := d.ring[slot]
			n := min(len(buf), len(data))
			err := gguf.CopyMapped(buf[:n], data[:n])
			d.stats.add(func(s *DeviceStats) {
				s.RingWait += t1.Sub(t0)
				s.StageCopyTime += time.Since(t1)
				s.StagedBytes += int64(n)
			})
			src := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
			if !d.send(op{us: j.us, dst: dst, src: src, n: n, slot: slot, last: n == len(data), err: err}) {
				return
			}
			if err != nil {
				break
			}
			data, dst = data[n:], dst+rocm.DevPtr(n)
		}
	}
}

// send hands o to the copy thread unless the uploader is released.
func (d *DeviceUploader) send(o op) bool {
	select {
	case d.ops <- o:
		return true
	case <-d.quit:
		return false
	}
}

// copier is the copy thread's feeder: it queues the copies it is handed
// (several per round trip to the worker), records the ring buffers' and
// the units' events, and gives ring buffers back once their copies are
// done.
func (d *DeviceUploader) copier() {
	defer d.wg.Done()
	var inflight []int // ring buffers with a copy queued, oldest first
	batch := make([]op, 0, 64)
	for {
		batch = batch[:0]
		select {
		case o := <-d.ops:
			batch = append(batch, o)
		case <-d.quit:
			return
		default:
			// Nothing to queue. While copies are in flight, wait for the
			// oldest (a 4 MiB copy takes ~80 µs) and give back every
			// buffer whose copy is done: given back only when the next
			// chunk came, they kept the stagers waiting for buffers
			// already free (a quarter of their time on the H100 host).
			if len(inflight) > 0 {
				t0 := time.Now()
				var done []int
				err := d.do(func(c *rocm.Ctx) error {
					err := c.SyncEvent(d.ringEv[inflight[0]])
					done, inflight = append(done, inflight[0]), inflight[1:]
					if err == nil {
						done, inflight = d.copied(c, done, inflight)
					}
					return err
				})
				d.stats.add(func(s *DeviceStats) { s.ReclaimWait += time.Since(t0) })
				if err != nil {
					slog.Error("actors: staging copy failed", "err", err)
					if len(done) == 0 { // the worker is gone: never wait on it again
						done, inflight = append(done, inflight[0]), inflight[1:]
					}
				}
				for _, i := range done {
					d.free <- i
				}
				continue
			}
			select {
			case o := <-d.ops:
				batch = append(batch, o)
			case <-d.quit:
				return
			}
		}
	more:
		for len(batch) < cap(batch) {
			select {
			case o := <-d.ops:
				batch = append(batch, o)
			default:
				break more
			}
		}
		var done []int
		var record []*unitState
		var failed []struct {
			us  *unitState
			err error
		}
		err := d.do(func(c *rocm.Ctx) error {
			for _, o := range batch {
				if o.err == nil {
					if err := c.CopyHtoDAsync(o.dst, o.src, o.n, d.stream); err != nil {
						o.err = fmt.Errorf("copying %d bytes (host %#x) to device %#x: %w", o.n, o.src, o.dst, err)
					} else if o.slot >= 0 {
						if err := c.Record(d.ringEv[o.slot], d.stream); err != nil {
							o.err = err
						} else {
							inflight = append(inflight, o.slot)
							o.slot = -1
						}
					}
				}
				if o.slot >= 0 { // failed: the buffer is free again
					done = append(done, o.slot)
				}
				if o.err != nil {
					failed = append(failed, struct {
						us  *unitState
						err error
					}{o.us, o.err})
				}
				if o.last && o.us.finish(true, false) {
					record = append(record, o.us)
				}
			}
			for _, us := range record {
				err := c.Record(us.ev, d.stream)
				if err != nil {
					err = fmt.Errorf("%s: recording its copy event: %w", us.u.Name(), err)
				}
				us.close(err)
			}
			done, inflight = d.copied(c, done, inflight)
			return nil
		})
		now := time.Since(d.reserveAt)
		d.stats.add(func(s *DeviceStats) {
			s.Batches++
			s.CopyCalls += len(batch)
			if s.FirstCopy == 0 {
				s.FirstCopy = now
			}
			s.LastCopy = now
		})
		for _, f := range failed {
			f.us.close(f.err)
		}
		if err != nil { // the worker is gone
			for _, o := range batch {
				o.us.close(err)
			}
		}
		for _, i := range done {
			d.free <- i
		}
	}
}

// copied moves the ring buffers at the front of inflight (oldest first)
// whose copies are done to done, stopping at the first still in flight.
func (d *DeviceUploader) copied(c *rocm.Ctx, done, inflight []int) ([]int, []int) {
	for len(inflight) > 0 {
		if ok, err := c.Query(d.ringEv[inflight[0]]); err != nil || !ok {
			break
		}
		done, inflight = append(done, inflight[0]), inflight[1:]
	}
	return done, inflight
}

// osPage is the granularity of host registration.
const osPage = 4096

// span is a page range [lo, hi) of the mapped file.
type span struct{ lo, hi uintptr }

// plan lays out the registration ranges of every pass-through tensor in
// load order, given one chunk (data at offset off of tensor t) to find
// where the file is mapped: every tensor view is a slice of one mapping.
// Neighbouring tensors that share a page register it once (the driver
// refuses overlapping registrations); a range never spans two units.
// Called with d.mu held.
func (d *DeviceUploader) plan(t *Tensor, off int64, data []byte) {
	d.planned = true
	base := uintptr(unsafe.Pointer(unsafe.SliceData(data))) - uintptr(off) - uintptr(t.Info.Offset)
	var covered []span // sorted, disjoint
	var units []*unitState
	for _, us := range d.units {
		units = append(units, us)
	}
	sort.Slice(units, func(a, b int) bool { return units[a].u.idx < units[b].u.idx })
	for _, us := range units {
		var last *piece
		for _, tn := range us.u.Tensors {
			if !tn.PassThrough() || tn.OutBytes == 0 {
				continue
			}
			lo := (base + uintptr(tn.Info.Offset)) &^ (osPage - 1)
			hi := (base + uintptr(tn.Info.Offset) + uintptr(tn.OutBytes) + osPage - 1) &^ (osPage - 1)
			for _, g := range gaps(covered, lo, hi) {
				for g.lo < g.hi {
					if last != nil && last.hi == g.lo && last.hi-last.lo < uintptr(d.RegBytes) {
						n := min(g.hi-g.lo, uintptr(d.RegBytes)-(last.hi-last.lo))
						last.hi += n
						g.lo += n
						continue
					}
					n := min(g.hi-g.lo, uintptr(d.RegBytes))
					last = &piece{lo: g.lo, hi: g.lo + n, unit: us, done: make(chan struct{})}
					d.pieces = append(d.pieces, last)
					g.lo += n
				}
			}
			covered = insertSpan(covered, span{lo, hi})
		}
	}
	d.byAddr = append([]*piece(nil), d.pieces...)
	sort.Slice(d.byAddr, func(a, b int) bool { return d.byAddr[a].lo < d.byAddr[b].lo })
}

// startRegistrars starts the registration threads. Called with d.mu held.
func (d *DeviceUploader) startRegistrars() {
	for _, w := range d.regW {
		d.wg.Add(1)
		go d.registrar(w)
	}
}

// gaps returns the parts of [lo, hi) that no span of covered (sorted,
// disjoint) covers, in order.
func gaps(covered []span, lo, hi uintptr) []span {
	var out []span
	// The first span ending after lo.
	i := sort.Search(len(covered), func(i int) bool { return covered[i].hi > lo })
	for ; lo < hi; i++ {
		if i == len(covered) || covered[i].lo >= hi {
			out = append(out, span{lo, hi})
			break
		}
		if covered[i].lo > lo {
			out = append(out, span{lo, covered[i].lo})
		}
		lo = covered[i].hi
	}
	return out
}

// insertSpan adds s to covered (sorted, disjoint), merging what it touches.
func insertSpan(covered []span, s span) []span {
	i := sort.Search(len(covered), func(i int) bool { return covered[i].hi >= s.lo })
	j := i
	for j < len(covered) && covered[j].lo <= s.hi {
		s.lo, s.hi = min(s.lo, covered[j].lo), max(s.hi, covered[j].hi)
		j++
	}
	out := append(covered[:i:i], s)
	return append(out, covered[j:]...)
}

// covering returns the registration ranges under data, in order, or nil
// where some byte of data is in none.
func (d *DeviceUploader) covering(data []byte) []*piece {
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(data)))
	hi := lo + uintptr(len(data))
	i := sort.Search(len(d.byAddr), func(i int) bool { return d.byAddr[i].hi > lo })
	var out []*piece
	for at := lo; at < hi; i++ {
		if i == len(d.byAddr) || d.byAddr[i].lo > at {
			return nil
		}
		out = append(out, d.byAddr[i])
		at = d.byAddr[i].hi
	}
	return out
}

// registrar registers ranges read-only on its thread, in load order.
func (d *DeviceUploader) registrar(w *rocm.Worker) {
	defer d.wg.Done()
	for {
		select {
		case <-d.quit:
			return
		default:
		}
		i := d.regNext.Add(1) - 1
		if i >= int64(len(d.pieces)) {
			return
		}
		p := d.pieces[i]
		t0 := time.Now()
		p.err = w.Do(context.Background(), func(c *rocm.Ctx) error {
			var err error
			p.reg, err = c.Register(unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(nil), p.lo)), int(p.hi-p.lo)), true)
			return err
		})
		d.stats.add(func(s *DeviceStats) {
			s.RegisterTime += time.Since(t0)
			if p.err == nil {
				s.Registrations++
				s.RegisteredBytes += int64(p.hi - p.lo)
			}
		})
		if p.err != nil {
			slog.Info("actors: read-only registration of the mapped file failed; copying through pinned staging", "err", p.err)
		}
		close(p.done)
	}
}

// registeredCopies hands chunks to the copy thread, in order, as soon as
// the ranges under them are registered (split where a chunk crosses from
// one range into the next: a copy's source must lie in one registration).
// A chunk on a range that failed to register goes through the ring.
func (d *DeviceUploader) registeredCopies() {
	defer d.wg.Done()
	for {
		var j *job
		select {
		case j = <-d.regJobs:
		case <-d.quit:
			return
		}
		t0 := time.Now()
		ok := true
		for _, p := range j.pieces {
			select {
			case <-p.done:
			case <-d.quit:
				return
			}
			ok = ok && p.err == nil
		}
		d.stats.add(func(s *DeviceStats) { s.RegisterWait += time.Since(t0) })
		if !ok {
			j.pieces = nil // staged for good
			if !d.stage(j) {
				return
			}
			continue
		}
		src := uintptr(unsafe.Pointer(unsafe.SliceData(j.data)))
		end := src + uintptr(len(j.data))
		dst := j.dst
		for i, p := range j.pieces {
			n := min(end, p.hi) - src
			if !d.send(op{us: j.us, dst: dst, src: src, n: int(n), slot: -1, last: i == len(j.pieces)-1}) {
				return
			}
			src += n
			dst += rocm.DevPtr(n)
		}
	}
}

// Registrations is the number of registered ranges (for tests).
func (d *DeviceUploader) Registrations() int { return d.Stats().Registrations }

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
	for _, t := range u.Tensors {
		var p rocm.DevPtr
		if d.PerTensor {
			if p = d.perT[t]; p == 0 {
				return nil, fmt.Errorf("tensor %q: never uploaded", t.Name())
			}
		} else {
			p = d.arena + rocm.DevPtr(t.ArenaOff)
		}
		w := &kernels.Weight{Name: t.Name(), Type: t.To, Cols: int(t.Info.Dims[0]), Rows: int(t.Info.Rows()), Dev: uintptr(p)}
		if t.PassThrough() {
			w.Host = t.src // the mapped file: free, and handy for host-side checks
		}
		d.weights[t.Name()] = w
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
