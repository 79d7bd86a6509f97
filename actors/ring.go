package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/forge-llm/forge/rocm"
)

// StagingRing is a DeviceUploader's pinned staging memory: Buffers host
// buffers of BufBytes each, page-locked for the copy engines, and one
// event per buffer, recorded behind the copy that reads it. Pinning is
// cheap next to a load (a few milliseconds) but not free, and it competes
// with the first copies for the driver; a program that loads model after
// model keeps rings in a RingPool and lends them out.
type StagingRing struct {
	Buffers, BufBytes int

	bufs    [][]byte
	events  []rocm.Event
	mem     []byte           // the anonymous mapping the buffers are carved from
	reg     *rocm.Registered // its registration
	hb      []*rocm.HostBuf  // buffers pinned by cuMemHostAlloc instead
	pinned  time.Duration
	charged bool // counted in its pool's Mem
}

// Bytes is the pinned host memory the ring holds.
func (r *StagingRing) Bytes() int64 { return int64(r.Buffers) * int64(r.BufBytes) }

// pinStagingRing makes a ring on w: anonymous memory (huge pages where the
// kernel gives them), paged in by several threads and registered with the
// driver in one call, a few milliseconds for the whole ring; where that
// fails, cuMemHostAlloc one buffer at a time (~1.3 GB/s). ready, if not
// nil, is called as each buffer becomes usable (in the fallback, before
// the next is pinned). quit stops the fallback between buffers: the ring
// then holds fewer buffers (Buffers says how many).
func pinStagingRing(w *rocm.Worker, n, size int, ready func(i int, buf []byte, ev rocm.Event), quit <-chan struct{}) (*StagingRing, error) {
	t0 := time.Now()
	r := &StagingRing{Buffers: n, BufBytes: size, bufs: make([][]byte, n), hb: make([]*rocm.HostBuf, n)}
	defer func() { r.pinned = time.Since(t0) }()
	err := w.Do(bg, func(c *rocm.Ctx) error {
		for range n {
			e, err := c.NewEvent(false)
			if err != nil {
				return err
			}
			r.events = append(r.events, e)
		}
		return nil
	})
	if err != nil {
		r.release(w)
		return nil, fmt.Errorf("staging ring events: %w", err)
	}
	if mem := anonMemory(n * size); mem != nil {
		var wg sync.WaitGroup
		for g := range min(8, n) {
			wg.Go(func() {
				for i := g; i < n; i += min(8, n) {
					populateWrite(mem[i*size : (i+1)*size])
				}
			})
		}
		wg.Wait()
		err := w.Do(bg, func(c *rocm.Ctx) error {
			var err error
			r.reg, err = c.Register(mem, false)
			return err
		})
		if err == nil {
			r.mem = mem
			for i := range n {
				r.bufs[i] = mem[i*size : (i+1)*size : (i+1)*size]
				if ready != nil {
					ready(i, r.bufs[i], r.events[i])
				}
			}
			return r, nil
		}
		if uerr := freeAnonMemory(mem); uerr != nil {
			slog.Error("actors: unmapping the staging ring", "err", uerr)
		}
		slog.Debug("actors: registering the staging ring failed; pinning with the driver's allocator", "err", err)
	}
	for i := range n {
		select {
		case <-quit:
			r.Buffers = i
			return r, nil
		default:
		}
		err := w.Do(bg, func(c *rocm.Ctx) error {
			h, err := c.HostAlloc(size)
			if err != nil {
				return err
			}
			r.bufs[i], r.hb[i] = h.Bytes(), h
			return nil
		})
		if err != nil {
			if i == 0 {
				r.release(w)
				return nil, fmt.Errorf("pinning the staging ring: %w", err)
			}
			r.Buffers = i // what could be pinned
			return r, nil
		}
		if ready != nil {
			ready(i, r.bufs[i], r.events[i])
		}
	}
	return r, nil
}

// bg is the context of driver calls that must finish once queued.
var bg = context.Background()

// release frees the ring (its copies must be done).
func (r *StagingRing) release(w *rocm.Worker) error {
	err := w.Do(bg, func(c *rocm.Ctx) error {
		var errs []error
		if r.reg != nil {
			errs = append(errs, c.Unregister(r.reg))
		}
		for _, h := range r.hb {
			if h != nil {
				errs = append(errs, c.FreeHost(h))
			}
		}
		for _, e := range r.events {
			errs = append(errs, c.DestroyEvent(e))
		}
		return errors.Join(errs...)
	})
	if r.mem != nil {
		err = errors.Join(err, freeAnonMemory(r.mem))
	}
	r.reg, r.hb, r.events, r.mem, r.bufs = nil, nil, nil, nil, nil
	return err
}

// RingPool lends staging rings to the DeviceUploaders of one device, one
// after another (a server swapping models): a ring given back is lent
// again instead of pinned anew. Uploaders loading at the same time get a
// ring each. Rings are made and freed on W, which must share the
// uploaders' context (their copy worker or a sibling of it).
type RingPool struct {
	W *rocm.Worker
	// Mem, if not nil, is charged with the pinned bytes of every ring the
	// pool holds, lent or idle: the one accountant of memory shared by
	// the models that borrow it.
	Mem *Memory
	// MaxIdle is how many rings are kept while nobody borrows them
	// (0: 1). The rest are freed when given back.
	MaxIdle int

	// pin and unpin make and free a ring (tests replace them).
	pin   func(n, size int, ready func(int, []byte, rocm.Event), quit <-chan struct{}) (*StagingRing, error)
	unpin func(*StagingRing) error

	mu     sync.Mutex
	idle   []*StagingRing
	lent   int
	closed bool
}

// errPoolClosed: a ring asked of a closed pool.
var errPoolClosed = errors.New("staging ring pool closed")

func (p *RingPool) pinFn() func(n, size int, ready func(int, []byte, rocm.Event), quit <-chan struct{}) (*StagingRing, error) {
	if p.pin != nil {
		return p.pin
	}
	return func(n, size int, ready func(int, []byte, rocm.Event), quit <-chan struct{}) (*StagingRing, error) {
		return pinStagingRing(p.W, n, size, ready, quit)
	}
}

func (p *RingPool) unpinFn(r *StagingRing) error {
	if p.unpin != nil {
		return p.unpin(r)
	}
	return r.release(p.W)
}

// get lends an idle ring of n buffers of size bytes, or pins a new one.
// reused says which.
func (p *RingPool) get(n, size int, ready func(int, []byte, rocm.Event), quit <-chan struct{}) (r *StagingRing, reused bool, err error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, false, errPoolClosed
	}
	for i, r := range p.idle {
		if r.Buffers == n && r.BufBytes == size {
			p.idle = append(p.idle[:i], p.idle[i+1:]...)
			p.lent++
			p.mu.Unlock()
			if ready != nil {
				for j := range n {
					ready(j, r.bufs[j], r.events[j])
				}
			}
			return r, true, nil
		}
	}
	p.lent++ // counted while pinning, so that Close waits for nothing it frees
	p.mu.Unlock()
	r, err = p.pinFn()(n, size, ready, quit)
	if err == nil && p.Mem != nil {
		r.charged = p.Mem.Alloc(r.Bytes(), "staging ring") == nil
	}
	if err != nil {
		p.mu.Lock()
		p.lent--
		p.mu.Unlock()
	}
	return r, false, err
}

// put gives a ring back: its copies must be done. Past MaxIdle, or after
// Close, it is freed.
func (p *RingPool) put(r *StagingRing) {
	p.mu.Lock()
	p.lent--
	keep := !p.closed && r.Buffers > 0 && r.Buffers == len(r.bufs) && len(p.idle) < max(p.MaxIdle, 1) // whole rings only
	if keep {
		p.idle = append(p.idle, r)
	}
	p.mu.Unlock()
	if !keep {
		p.free(r)
	}
}

// drop frees a lent ring instead of keeping it.
func (p *RingPool) drop(r *StagingRing) {
	p.mu.Lock()
	p.lent--
	p.mu.Unlock()
	p.free(r)
}

func (p *RingPool) free(r *StagingRing) {
	n, charged := r.Bytes(), r.charged
	if err := p.unpinFn(r); err != nil {
		slog.Error("actors: freeing a staging ring", "err", err)
	}
	if charged {
		p.Mem.Free(n)
	}
}

// Idle is the number of rings waiting to be lent.
func (p *RingPool) Idle() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle)
}

// Lent is the number of rings borrowed now.
func (p *RingPool) Lent() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lent
}

// Close frees the idle rings; rings still lent are freed when given back.
// The pool lends no more.
func (p *RingPool) Close() {
	p.mu.Lock()
	p.closed = true
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, r := range idle {
		p.free(r)
	}
}
