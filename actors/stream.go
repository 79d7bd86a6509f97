package actors

import (
	"context"
	"fmt"
	"sync"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
)

// StreamUploader is the GPU Uploader's shape on the host: one arena sized
// from the plan, converted chunks handed over in staging buffers, every
// copy queued on a "copy stream" (a goroutine that runs them in order) and
// one fence per unit recorded on the stream after its copies. Futures go
// Enqueued at Flush and Resident when the stream reaches the fence. It
// exists to exercise the asynchronous path (and to show what a GPU
// implementation does where) on machines without a GPU.
type StreamUploader struct {
	Mem *Memory
	// Copy, when set, runs on the stream before each copy; an error fails
	// the copy, which the unit's fence reports (an asynchronous copy
	// failure, as a GPU reports it at the event).
	Copy func(tensor string) error

	arena []byte
	total int64
	ops   chan func()
	done  chan struct{}

	mu      sync.Mutex
	failed  map[*Unit]error // copy failures, by unit
	weights map[string]*kernels.Weight
}

// Reserve implements Uploader: every tensor gets its place in one arena.
func (su *StreamUploader) Reserve(p *Plan) error {
	if su.Mem == nil {
		su.Mem = NewMemory(0)
	}
	var n int64
	for _, u := range p.Units {
		for _, t := range u.Placed() {
			n = (n + arenaAlign - 1) / arenaAlign * arenaAlign
			t.ArenaOff = n
			n += t.OutBytes
		}
	}
	if err := su.Mem.Alloc(n, "weight arena"); err != nil {
		return err
	}
	su.total = n
	su.arena = alignedBytes(n)
	su.failed = map[*Unit]error{}
	su.weights = map[string]*kernels.Weight{}
	su.ops = make(chan func(), 256)
	su.done = make(chan struct{})
	go func() { // the copy stream
		defer close(su.done)
		for op := range su.ops {
			op()
		}
	}()
	return nil
}

// Dest implements Uploader: a staging buffer (on a GPU, one of a ring of
// pinned buffers).
func (su *StreamUploader) Dest(t *Tensor, off, n int64) ([]byte, error) {
	return alignedBytes(n), nil
}

// Upload implements Uploader: the copy is queued, not done.
func (su *StreamUploader) Upload(t *Tensor, off int64, data []byte) error {
	if off < 0 || off+int64(len(data)) > t.OutBytes {
		return fmt.Errorf("range [%d, %d) outside the tensor's %d bytes", off, off+int64(len(data)), t.OutBytes)
	}
	su.ops <- func() {
		if su.Copy != nil {
			if err := su.Copy(t.Name()); err != nil {
				su.mu.Lock()
				if su.failed[t.unit] == nil {
					su.failed[t.unit] = fmt.Errorf("tensor %q: copy failed: %w", t.Name(), err)
				}
				su.mu.Unlock()
				return
			}
		}
		// data is a view of the mapping for a pass-through tensor: a file
		// truncated since fails the unit instead of the process.
		if err := gguf.CopyMapped(su.arena[t.ArenaOff+off:], data); err != nil {
			su.mu.Lock()
			if su.failed[t.unit] == nil {
				su.failed[t.unit] = fmt.Errorf("tensor %q: copy failed: %w", t.Name(), err)
			}
			su.mu.Unlock()
		}
	}
	return nil
}

// Flush implements Uploader: a fence recorded on the stream after the
// unit's copies.
func (su *StreamUploader) Flush(u *Unit) (Fence, error) {
	f := &streamFence{done: make(chan struct{})}
	su.ops <- func() {
		su.mu.Lock()
		defer su.mu.Unlock()
		if f.err = su.failed[u]; f.err == nil {
			for _, t := range u.Placed() {
				end := t.ArenaOff + t.OutBytes
				su.weights[t.Name()] = placedWeight(t, 0, su.arena[t.ArenaOff:end:end])
			}
		}
		close(f.done)
	}
	return f, nil
}

// Weight implements Uploader.
func (su *StreamUploader) Weight(name string) (*kernels.Weight, bool) {
	su.mu.Lock()
	defer su.mu.Unlock()
	w, ok := su.weights[name]
	return w, ok
}

// Release implements Uploader: the stream drains and stops, then the
// arena goes.
func (su *StreamUploader) Release() {
	if su.ops == nil {
		return
	}
	close(su.ops)
	<-su.done
	su.Mem.Free(su.total)
	su.arena, su.weights, su.ops = nil, nil, nil
}

// streamFence completes when the stream reaches it.
type streamFence struct {
	done chan struct{}
	err  error
}

func (f *streamFence) Done() bool {
	select {
	case <-f.done:
		return true
	default:
		return false
	}
}

func (f *streamFence) Wait(ctx context.Context) error {
	select {
	case <-f.done:
		return f.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (f *streamFence) Event() uintptr { return 0 }
