package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/forge-llm/forge/rocm"
)

// PinnedFile keeps a mapped model file registered with the driver
// (read-only host registration) for as long as a server serves it, so
// that every later load of the model copies its pass-through tensors
// straight from the file's pages at the link's rate: no staging memcpy,
// no ring. Registering is slow (9-16 GB/s on the H100 host, about 0.4 s
// for an 8B file) but happens once per file, in the background, after
// the model's first load; copies from the registered pages then ran at
// 51-54 GB/s where the staging ring gave 25-37 (DESIGN.md, "Moving bytes
// fast"; bench/results/2026-11-25-night-swap-h100.md).
//
// The file is registered in ranges of Piece bytes from its start, so a
// partly registered file already serves its first ranges; a load copies
// what is registered directly and stages the rest. Uploaders hold the
// file (Acquire, Release) while their copies may read it; Drop stops the
// registering and, once no uploader holds it, undoes every registration
// and calls OnFree (which may then unmap the file). The pages stay
// locked in host memory until then: the owner bounds how many bytes it
// keeps (pipeline.EngineOptions.PinFiles).
type PinnedFile struct {
	lo, size uintptr // the mapping, page-rounded
	piece    uintptr
	reg      func(b []byte) (func() error, error) // registers b, returns its undo
	onFree   func()

	n atomic.Int64 // ranges registered, from lo on

	mu      sync.Mutex
	cond    *sync.Cond // signalled when holds drops to 0
	undo    []func() error
	holds   int
	dropped bool
	stop    chan struct{}
	done    chan struct{}
	bytes   atomic.Int64 // bytes registered (stats)
}

// DefaultPinPiece is the bytes one registration covers: small enough
// that the driver lock a registration holds (about 1.5 ms at 11 GB/s)
// does not starve another model's copy thread, large enough that an 8B
// file is a few hundred calls.
const DefaultPinPiece = 16 << 20

// NewPinnedFile starts registering data (a file mapping: page-aligned,
// not Go memory) on w, in ranges of piece bytes (0: DefaultPinPiece).
// onFree runs once every registration is undone after Drop.
func NewPinnedFile(w *rocm.Worker, data []byte, piece int, onFree func()) (*PinnedFile, error) {
	if w == nil || w.Device.Backend != rocm.CUDA || !w.Device.ReadOnlyRegister {
		return nil, fmt.Errorf("actors: pinning a mapped file: the device has no read-only host registration")
	}
	reg := func(b []byte) (func() error, error) {
		var r *rocm.Registered
		err := w.Do(context.Background(), func(c *rocm.Ctx) error {
			var err error
			r, err = c.Register(b, true)
			return err
		})
		if err != nil {
			return nil, err
		}
		return func() error {
			return w.Do(context.Background(), func(c *rocm.Ctx) error { return c.Unregister(r) })
		}, nil
	}
	return NewPinnedFileFunc(data, piece, reg, onFree)
}

// NewPinnedFileFunc is NewPinnedFile with the registration given: reg
// registers one range and returns its undo (tests count them on the CPU).
func NewPinnedFileFunc(data []byte, piece int, reg func([]byte) (func() error, error), onFree func()) (*PinnedFile, error) {
	if len(data) == 0 {
		return nil, fmt.Errorf("actors: pinning a mapped file: no mapping")
	}
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(data)))
	if lo%osPage != 0 {
		return nil, fmt.Errorf("actors: pinning a mapped file: mapping at %#x is not page-aligned", lo)
	}
	if piece <= 0 {
		piece = DefaultPinPiece
	}
	piece = (piece + osPage - 1) &^ (osPage - 1)
	p := &PinnedFile{
		lo: lo, size: (uintptr(len(data)) + osPage - 1) &^ (osPage - 1), piece: uintptr(piece),
		reg: reg, onFree: onFree, stop: make(chan struct{}), done: make(chan struct{}),
	}
	p.cond = sync.NewCond(&p.mu)
	go p.run()
	return p, nil
}

// pieces is the number of ranges the whole file takes.
func (p *PinnedFile) pieces() int64 { return int64((p.size + p.piece - 1) / p.piece) }

// run registers the ranges in order until all are or Drop, then waits for
// Drop and the last hold, and undoes them.
func (p *PinnedFile) run() {
	defer close(p.done)
	t0 := time.Now()
	for i := range p.pieces() {
		select {
		case <-p.stop:
			goto dropped
		default:
		}
		at := p.lo + uintptr(i)*p.piece
		n := min(p.piece, p.lo+p.size-at)
		undo, err := p.reg(unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(nil), at)), int(n)))
		if err != nil {
			slog.Info("actors: registering a served file's pages failed; its loads stage the rest", "registered MB", p.bytes.Load()>>20, "err", err)
			break
		}
		p.mu.Lock()
		p.undo = append(p.undo, undo)
		p.mu.Unlock()
		p.bytes.Add(int64(n))
		p.n.Store(i + 1) // after the range is registered: covering may hand it out
	}
	slog.Debug("actors: served file pinned", "MB", p.bytes.Load()>>20, "took", time.Since(t0))
	<-p.stop
dropped:
	p.mu.Lock()
	for p.holds > 0 {
		p.cond.Wait()
	}
	undo := p.undo
	p.undo = nil
	p.mu.Unlock()
	p.n.Store(0)
	var errs []error
	for _, u := range undo {
		if err := u(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		slog.Error("actors: unregistering a served file's pages", "err", err)
	}
	if p.onFree != nil {
		p.onFree()
	}
}

// Acquire holds the file's registrations for an uploader's copies; false
// once Drop was called (the uploader stages then).
func (p *PinnedFile) Acquire() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dropped {
		return false
	}
	p.holds++
	return true
}

// Release ends a hold taken by Acquire, once the holder's copies are done.
func (p *PinnedFile) Release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holds--
	if p.holds < 0 {
		panic("actors: PinnedFile released more often than acquired")
	}
	if p.holds == 0 {
		p.cond.Broadcast()
	}
}

// Drop stops registering and undoes the registrations once no uploader
// holds the file; it does not wait (Done says when it is over). Safe more
// than once.
func (p *PinnedFile) Drop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.dropped {
		p.dropped = true
		close(p.stop)
	}
}

// Done is closed once the registrations are undone after Drop (and OnFree
// returned).
func (p *PinnedFile) Done() <-chan struct{} { return p.done }

// Bytes is how many bytes are registered now.
func (p *PinnedFile) Bytes() int64 {
	if p.n.Load() == 0 {
		return 0
	}
	return p.bytes.Load()
}

// Size is the bytes the file takes registered in full (page-rounded).
func (p *PinnedFile) Size() int64 { return int64(p.size) }

// Complete reports whether the whole file is registered.
func (p *PinnedFile) Complete() bool { return p.n.Load() == p.pieces() }

// closedDone is the done channel of ranges registered before the load.
var closedDone = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// covering returns the registered ranges under data, in order, as pieces
// ready to copy from, or nil where some byte of data is not registered
// (yet) or lies outside the file. Only for a holder (Acquire).
func (p *PinnedFile) covering(data []byte) []*piece {
	if len(data) == 0 {
		return nil
	}
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(data)))
	hi := lo + uintptr(len(data))
	if lo < p.lo || hi > p.lo+p.size {
		return nil
	}
	first, last := (lo-p.lo)/p.piece, (hi-1-p.lo)/p.piece
	if int64(last) >= p.n.Load() {
		return nil
	}
	out := make([]*piece, 0, last-first+1)
	for i := first; i <= last; i++ {
		at := p.lo + i*p.piece
		out = append(out, &piece{lo: at, hi: min(at+p.piece, p.lo+p.size), done: closedDone})
	}
	return out
}
