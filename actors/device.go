package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"time"
	"unsafe"

	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/rocm"
)

// DeviceUploader is the GPU's Uploader. Reserve makes one device allocation
// for every weight (the arena) and one event per unit; each Upload queues an
// asynchronous host-to-device copy on a dedicated copy stream, and Flush
// records the unit's event behind its copies. The executor's compute stream
// waits on that event (Fence.Event), so a layer is usable as soon as its
// copies are queued.
//
// Pass-through tensors (the GPU reads their blocks as they are) are copied
// straight out of the mapped file, page-locked in place with a read-only
// registration as the chunks arrive (55 GB/s on an H100 host, see
// DESIGN.md). Where that is not possible (HIP, a device without read-only
// registration, Staging set, or a registration that fails) every chunk goes
// through a small ring of pinned staging buffers allocated once. Converted
// chunks (Dest) always go through the ring.
//
// Every driver call runs on the Worker's OS-locked thread.
type DeviceUploader struct {
	W   *rocm.Worker
	Mem *Memory
	// PerTensor makes one device allocation per tensor (the host-f32
	// strategy, the design this project replaces) instead of the arena.
	PerTensor bool
	// Staging forces the pinned staging ring for pass-through tensors too.
	Staging bool
	// RingBuffers and RingBytes size the staging ring (default 8 × 4 MiB).
	RingBuffers int
	RingBytes   int

	mu       sync.Mutex // guards everything below against Weight and Release
	released bool
	stream   rocm.Stream
	arena    rocm.DevPtr
	arenaN   int64
	reserved int64 // accounted in Mem for the arena
	events   map[*Unit]rocm.Event
	perT     map[*Tensor]rocm.DevPtr
	perSum   int64 // accounted in Mem for perT
	ring     []*rocm.HostBuf
	ringEv   []rocm.Event
	next     int
	useReg   bool
	regs     []*rocm.Registered // sorted by Ptr, never overlapping
	weights  map[string]*kernels.Weight
}

// do runs fn on the worker's thread. Uploads are not cancellable once
// queued on the device, so they use a background context; only fence
// waits poll with the caller's.
func (d *DeviceUploader) do(fn func(c *rocm.Ctx) error) error {
	return d.W.Do(context.Background(), fn)
}

// Reserve implements Uploader.
func (d *DeviceUploader) Reserve(p *Plan) error {
	if d.W == nil {
		return fmt.Errorf("device uploader: no GPU worker")
	}
	if d.Mem == nil {
		d.Mem = NewMemory(0)
	}
	if d.RingBuffers <= 0 {
		d.RingBuffers = 8
	}
	if d.RingBytes <= 0 {
		d.RingBytes = 4 << 20
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.events = map[*Unit]rocm.Event{}
	d.perT = map[*Tensor]rocm.DevPtr{}
	d.weights = map[string]*kernels.Weight{}
	var n int64
	for _, u := range p.Units {
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
	d.useReg = !d.Staging && d.W.Device.Backend == rocm.CUDA && d.W.Device.ReadOnlyRegister
	return d.do(func(c *rocm.Ctx) error {
		s, err := c.NewStream()
		if err != nil {
			return fmt.Errorf("device uploader: copy stream: %w", err)
		}
		d.stream = s
		if n > 0 {
			if d.arena, err = c.Malloc(n); err != nil {
				return fmt.Errorf("weight arena of %d bytes: %w", n, err)
			}
			d.arenaN = n
		}
		for _, u := range p.Units {
			e, err := c.NewEvent(false)
			if err != nil {
				return fmt.Errorf("device uploader: event for %s: %w", u.Name(), err)
			}
			d.events[u] = e
		}
		for range d.RingBuffers {
			b, err := c.HostAlloc(d.RingBytes)
			if err != nil {
				return fmt.Errorf("device uploader: staging ring: %w", err)
			}
			d.ring = append(d.ring, b)
			e, err := c.NewEvent(false)
			if err != nil {
				return fmt.Errorf("device uploader: staging ring: %w", err)
			}
			d.ringEv = append(d.ringEv, e)
		}
		return nil
	})
}

// Dest implements Uploader: converted bytes are written to host memory and
// staged through the pinned ring by Upload (a chunk may be larger than a
// ring buffer, and dequantizer workers must not hold ring slots while the
// copy stream needs them back).
func (d *DeviceUploader) Dest(t *Tensor, off, n int64) ([]byte, error) {
	if off < 0 || n < 0 || off+n > t.OutBytes {
		return nil, fmt.Errorf("range [%d, %d) outside the tensor's %d bytes", off, off+n, t.OutBytes)
	}
	return alignedBytes(n), nil
}

// dst is where t's bytes go on the device, allocating t's own buffer
// under PerTensor. Called on the worker with d.mu held.
func (d *DeviceUploader) dst(c *rocm.Ctx, t *Tensor) (rocm.DevPtr, error) {
	if !d.PerTensor {
		return d.arena + rocm.DevPtr(t.ArenaOff), nil
	}
	if p, ok := d.perT[t]; ok {
		return p, nil
	}
	if err := d.Mem.Alloc(t.OutBytes, "tensor "+t.Name()); err != nil {
		return 0, err
	}
	p, err := c.Malloc(max(t.OutBytes, 256))
	if err != nil {
		d.Mem.Free(t.OutBytes)
		return 0, fmt.Errorf("device allocation of %d bytes: %w", t.OutBytes, err)
	}
	d.perT[t] = p
	d.perSum += t.OutBytes
	return p, nil
}

// Upload implements Uploader: the copy is queued on the copy stream.
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
	return d.do(func(c *rocm.Ctx) error {
		base, err := d.dst(c, t)
		if err != nil {
			return err
		}
		dst := base + rocm.DevPtr(off)
		if d.useReg && t.PassThrough() {
			if err := d.register(c, data); err == nil {
				return d.copyRegistered(c, dst, data)
			} else {
				// Copy through the ring from now on.
				slog.Info("actors: read-only registration of the mapped file failed; copying through pinned staging", "err", err)
				d.useReg = false
			}
		}
		return d.stage(c, dst, data)
	})
}

// stage copies data through the pinned ring: each buffer is reused only
// once the copy out of it has completed (its event).
func (d *DeviceUploader) stage(c *rocm.Ctx, dst rocm.DevPtr, data []byte) error {
	for len(data) > 0 {
		i := d.next
		d.next = (d.next + 1) % len(d.ring)
		if err := c.SyncEvent(d.ringEv[i]); err != nil {
			return fmt.Errorf("staging buffer %d: %w", i, err)
		}
		n := copy(d.ring[i].Bytes(), data)
		if err := c.CopyHtoDAsync(dst, d.ring[i].Ptr, n, d.stream); err != nil {
			return fmt.Errorf("copying %d bytes from staging buffer %d (host %#x) to device %#x: %w", n, i, d.ring[i].Ptr, dst, err)
		}
		if err := c.Record(d.ringEv[i], d.stream); err != nil {
			return err
		}
		dst += rocm.DevPtr(n)
		data = data[n:]
	}
	return nil
}

// osPage is the granularity of host registration.
const osPage = 4096

// register page-locks the pages of data (a view of the mapped file) that
// no earlier registration covers. Registrations never overlap (the driver
// refuses that), so neighbouring chunks that share a page register only
// what is new.
func (d *DeviceUploader) register(c *rocm.Ctx, data []byte) error {
	p := uintptr(unsafe.Pointer(&data[0]))
	lo := p &^ (osPage - 1)
	hi := (p + uintptr(len(data)) + osPage - 1) &^ (osPage - 1)
	for _, g := range unregistered(d.regs, lo, hi) {
		r, err := c.Register(unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(nil), g[0])), int(g[1]-g[0])), true)
		if err != nil {
			return err
		}
		i := sort.Search(len(d.regs), func(i int) bool { return d.regs[i].Ptr > r.Ptr })
		d.regs = slices.Insert(d.regs, i, r)
	}
	return nil
}

// copyRegistered queues the copy of data (registered by register) to dst,
// split where it crosses from one registration into the next: the driver
// takes a copy's source from a single registration only.
func (d *DeviceUploader) copyRegistered(c *rocm.Ctx, dst rocm.DevPtr, data []byte) error {
	src := uintptr(unsafe.Pointer(&data[0]))
	end := src + uintptr(len(data))
	i := sort.Search(len(d.regs), func(i int) bool { return d.regs[i].Ptr+uintptr(d.regs[i].Size) > src })
	for ; src < end; i++ {
		if i == len(d.regs) || d.regs[i].Ptr > src {
			return fmt.Errorf("host %#x is not registered", src)
		}
		n := min(end, d.regs[i].Ptr+uintptr(d.regs[i].Size)) - src
		if err := c.CopyHtoDAsync(dst, src, int(n), d.stream); err != nil {
			return fmt.Errorf("copying %d bytes from the registered file (host %#x) to device %#x: %w", n, src, dst, err)
		}
		src += n
		dst += rocm.DevPtr(n)
	}
	return nil
}

// unregistered returns the parts of [lo, hi) that no registration in regs
// (sorted by Ptr, disjoint) covers, in order.
func unregistered(regs []*rocm.Registered, lo, hi uintptr) [][2]uintptr {
	var gaps [][2]uintptr
	// The first registration ending after lo.
	i := sort.Search(len(regs), func(i int) bool { return regs[i].Ptr+uintptr(regs[i].Size) > lo })
	for ; lo < hi; i++ {
		if i == len(regs) || regs[i].Ptr >= hi {
			gaps = append(gaps, [2]uintptr{lo, hi})
			break
		}
		if regs[i].Ptr > lo {
			gaps = append(gaps, [2]uintptr{lo, regs[i].Ptr})
		}
		lo = regs[i].Ptr + uintptr(regs[i].Size)
	}
	return gaps
}

// Flush implements Uploader: the unit's event is recorded behind its
// copies, and its Weights (device addresses) become visible.
func (d *DeviceUploader) Flush(u *Unit) (Fence, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.released {
		return nil, ErrClosed
	}
	ev, ok := d.events[u]
	if !ok {
		return nil, fmt.Errorf("%s: no event (not reserved)", u.Name())
	}
	err := d.do(func(c *rocm.Ctx) error { return c.Record(ev, d.stream) })
	if err != nil {
		return nil, fmt.Errorf("%s: recording its copy event: %w", u.Name(), err)
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
	return &deviceFence{d: d, u: u, ev: ev}, nil
}

// Weight implements Uploader.
func (d *DeviceUploader) Weight(name string) (*kernels.Weight, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	w, ok := d.weights[name]
	return w, ok
}

// Release implements Uploader: it waits for the copies in flight, then
// frees the arena (or per-tensor buffers), the staging ring, the
// registrations, the events and the copy stream. It is safe after a
// failed or partial Reserve, and more than once.
func (d *DeviceUploader) Release() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.released || d.W == nil {
		return
	}
	d.released = true
	err := d.do(func(c *rocm.Ctx) error {
		var errs []error
		keep := func(err error) {
			if err != nil {
				errs = append(errs, err)
			}
		}
		// Everything: the compute stream may still read the arena.
		keep(c.Sync())
		for _, r := range d.regs {
			keep(c.Unregister(r))
		}
		for i, b := range d.ring {
			keep(c.FreeHost(b))
			keep(c.DestroyEvent(d.ringEv[i]))
		}
		for _, e := range d.events {
			keep(c.DestroyEvent(e))
		}
		for t, p := range d.perT {
			keep(c.Free(p, max(t.OutBytes, 256)))
		}
		if d.arena != 0 {
			keep(c.Free(d.arena, d.arenaN))
		}
		if d.stream != 0 {
			keep(c.DestroyStream(d.stream))
		}
		return errors.Join(errs...)
	})
	if err != nil {
		slog.Error("actors: releasing device weights", "err", err)
	}
	if d.Mem != nil {
		d.Mem.Free(d.reserved + d.perSum)
	}
	d.reserved, d.perSum, d.arena, d.stream = 0, 0, 0, 0
	d.regs, d.ring, d.ringEv, d.events, d.perT, d.weights = nil, nil, nil, nil, nil, nil
}

// deviceFence is a unit's copy event.
type deviceFence struct {
	d  *DeviceUploader
	u  *Unit
	ev rocm.Event
}

func (f *deviceFence) query() (bool, error) {
	f.d.mu.Lock()
	defer f.d.mu.Unlock()
	if f.d.released {
		return false, ErrClosed
	}
	var done bool
	err := f.d.do(func(c *rocm.Ctx) error {
		var err error
		done, err = c.Query(f.ev)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("%s: copies failed: %w", f.u.Name(), err)
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

// Event implements Fence.
func (f *deviceFence) Event() uintptr { return uintptr(f.ev) }
