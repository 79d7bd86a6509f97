package actors

import (
	"context"
	"fmt"
	"sync"

	"github.com/forge-llm/forge/kernels"
)

// Fence completes when a unit's copies have landed on the device.
type Fence interface {
	// Done reports, without blocking, whether the copies have landed.
	Done() bool
	// Wait blocks until they have, or ctx is done.
	Wait(ctx context.Context) error
	// Event is the device event recorded after the unit's copies on the
	// copy stream (a CUevent or hipEvent_t), which a GPU executor's stream
	// waits on; 0 on the CPU.
	Event() uintptr
}

// doneFence is the fence of copies that were never asynchronous.
type doneFence struct{}

func (doneFence) Done() bool                     { return true }
func (doneFence) Wait(ctx context.Context) error { return nil }
func (doneFence) Event() uintptr                 { return 0 }

// Uploader places converted weights where the backend reads them. The
// uploader actor owns it and calls it from its mailbox only, except Dest,
// which dequantizer workers call concurrently for different chunks, and
// Weight, which the executor calls once a unit is resident.
//
// The CPU implementation is HostUploader. A GPU implementation makes one
// device arena in Reserve, hands out pinned staging buffers in Dest, queues
// each Upload as an asynchronous copy on its copy stream (from staging, or
// straight from the read-only registered mapping for pass-through tensors)
// and records one event per unit in Flush.
type Uploader interface {
	// Reserve lays out the single weight allocation for every tensor of p
	// (setting Tensor.ArenaOff) and makes it. An error fails the whole load.
	Reserve(p *Plan) error
	// Dest returns where converted bytes [off, off+n) of t are to be
	// written by the dequantizer. Not called for pass-through tensors.
	Dest(t *Tensor, off, n int64) ([]byte, error)
	// Upload moves bytes [off, off+len(data)) of t (in its target type) to
	// the device: data is a view of the mapped file for a pass-through
	// tensor, else the slice Dest returned.
	Upload(t *Tensor, off int64, data []byte) error
	// Flush is called once every tensor of u is uploaded; the fence
	// completes when they are resident.
	Flush(u *Unit) (Fence, error)
	// Weight returns the backend's view of a tensor of a flushed unit.
	Weight(name string) (*kernels.Weight, bool)
	// Release frees everything Reserve and Dest took. It is called once,
	// after the pipeline's actors have stopped.
	Release()
}

// PacedUploader is an Uploader whose Upload only queues a chunk (a GPU's,
// behind its staging ring): UploadThen calls done once the chunk has left
// that queue, exactly once where it returns nil and never where it
// returns an error. The loader counts a chunk in flight until then
// (Config.MaxInflight), so what waits in the uploader stays short and the
// chunks of a unit a request demands (WaitExpert, DemandExperts) overtake
// the rest instead of queueing behind the whole file.
type PacedUploader interface {
	Uploader
	UploadThen(t *Tensor, off int64, data []byte, done func()) error
}

// arenaAlign aligns every converted tensor in the arena (cache line, and
// what SIMD loads like).
const arenaAlign = 64

// HostUploader is the CPU's Uploader. Pass-through tensors stay where they
// are: the mapped file is the weight allocation and each Weight is a
// zero-copy view of it. Converted tensors go to one host arena sized from
// the plan, or with PerTensor (the host-f32 strategy) to one allocation each.
// Memory accounts all of it (the mapped bytes too: they become resident
// memory once read).
type HostUploader struct {
	Mem       *Memory
	PerTensor bool

	plan     *Plan
	reserved int64  // accounted by Reserve
	arena    []byte // converted tensors, when !PerTensor

	mu      sync.Mutex
	bufs    map[*Tensor][]byte // PerTensor allocations
	bufSum  int64              // bytes of bufs accounted
	weights map[string]*kernels.Weight
}

// Reserve implements Uploader.
func (h *HostUploader) Reserve(p *Plan) error {
	if h.Mem == nil {
		h.Mem = NewMemory(0)
	}
	h.plan = p
	h.bufs = map[*Tensor][]byte{}
	h.weights = map[string]*kernels.Weight{}
	var mapped, arena int64
	for _, u := range p.Units {
		for _, t := range u.Placed() {
			switch {
			case t.PassThrough():
				mapped += t.OutBytes
				t.ArenaOff = -1
			case h.PerTensor:
				t.ArenaOff = -1
			default:
				arena = (arena + arenaAlign - 1) / arenaAlign * arenaAlign
				t.ArenaOff = arena
				arena += t.OutBytes
			}
		}
	}
	if err := h.Mem.Alloc(mapped+arena, "weight arena"); err != nil {
		return err
	}
	h.reserved = mapped + arena
	if arena > 0 {
		h.arena = alignedBytes(arena)
	}
	return nil
}

// alignedBytes returns n zero bytes starting on an arenaAlign boundary.
func alignedBytes(n int64) []byte {
	// Over-allocate and start at the first aligned byte.
	b := make([]byte, n+arenaAlign)
	off := 0
	for (uintptrOf(b)+uintptr(off))%arenaAlign != 0 {
		off++
	}
	return b[off : int64(off)+n : int64(off)+n]
}

// Dest implements Uploader.
func (h *HostUploader) Dest(t *Tensor, off, n int64) ([]byte, error) {
	if off < 0 || n < 0 || off+n > t.OutBytes {
		return nil, fmt.Errorf("range [%d, %d) outside the tensor's %d bytes", off, off+n, t.OutBytes)
	}
	if !h.PerTensor {
		base := t.ArenaOff
		return h.arena[base+off : base+off+n : base+off+n], nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	root, base := t.Placement()
	b, err := h.buf(root)
	if err != nil {
		return nil, err
	}
	return b[base+off : base+off+n : base+off+n], nil
}

// buf is t's own allocation under PerTensor, made on first use (by the
// first chunk converted, or by Flush for a stacked tensor whose pieces
// are still to come). Called with h.mu held.
func (h *HostUploader) buf(t *Tensor) ([]byte, error) {
	if b, ok := h.bufs[t]; ok {
		return b, nil
	}
	if err := h.Mem.Alloc(t.OutBytes, "tensor "+t.Name()); err != nil {
		return nil, err
	}
	h.bufSum += t.OutBytes
	b := alignedBytes(t.OutBytes)
	h.bufs[t] = b
	return b, nil
}

// Upload implements Uploader: on the host the bytes are already in place.
func (h *HostUploader) Upload(t *Tensor, off int64, data []byte) error {
	if off < 0 || off+int64(len(data)) > t.OutBytes {
		return fmt.Errorf("range [%d, %d) outside the tensor's %d bytes", off, off+int64(len(data)), t.OutBytes)
	}
	return nil
}

// Flush implements Uploader: the unit's Weights become visible (an
// expert unit's pieces are rows of a Weight its block made visible).
func (h *HostUploader) Flush(u *Unit) (Fence, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, t := range u.Placed() {
		var data []byte
		switch {
		case t.PassThrough():
			data = t.src
		case h.PerTensor:
			b, err := h.buf(t)
			if err != nil {
				return nil, err
			}
			data = b
		default:
			data = h.arena[t.ArenaOff : t.ArenaOff+t.OutBytes : t.ArenaOff+t.OutBytes]
		}
		if int64(len(data)) != t.OutBytes {
			return nil, fmt.Errorf("tensor %q: %d bytes in place, want %d", t.Name(), len(data), t.OutBytes)
		}
		h.weights[t.Name()] = placedWeight(t, 0, data)
	}
	return doneFence{}, nil
}

// Weight implements Uploader.
func (h *HostUploader) Weight(name string) (*kernels.Weight, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	w, ok := h.weights[name]
	return w, ok
}

// Release implements Uploader.
func (h *HostUploader) Release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.Mem == nil { // never reserved
		return
	}
	h.Mem.Free(h.reserved + h.bufSum)
	h.reserved, h.bufSum = 0, 0
	h.arena, h.bufs, h.weights = nil, nil, nil
}
