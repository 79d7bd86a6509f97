package pipeline

import (
	"log/slog"
	"sync"

	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/gpu"
)

// kvHandoff passes the KV pool of a model evicted for a load to the model
// loaded in its place, when the new model's scheduler asks for a pool of
// the same shape (two models of one architecture and size, the common
// swap): the evicted model's pool free (a synchronous cuMemFree of 8.6 GB
// for an 8B model at --batch-seqs 64, on the path to the new model's
// weight reservation) and the new model's allocation and clearing of
// as much are both skipped. Reuse is as safe as the scheduler's own reuse
// of a freed block by another request: every position a sequence reads
// was written by that sequence first.
//
// The pool waits here, charged to no model, from the victim's close to the
// new model's first request (a swap's request arrives with the load); the
// Engine closes the handoff, freeing an untaken pool, once the new model
// is all resident, and the new model's Close does too.
type kvHandoff struct {
	// free releases a pool nobody took (the engine's shared backend:
	// the evicted model's backend is gone by then).
	free func(*kernels.KVPool)

	mu     sync.Mutex
	pool   *kernels.KVPool
	closed bool
	taken  bool // a pool was handed over (tests)
}

// offer hands p over; false if the handoff is closed or holds one already
// (the caller frees p then).
func (h *kvHandoff) offer(p *kernels.KVPool) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed || h.pool != nil || p == nil {
		return false
	}
	h.pool = p
	return true
}

// take returns the offered pool if it has the shape asked for; a pool of
// another shape is freed (the caller allocates its own).
func (h *kvHandoff) take(layers, blocks, blockSize, kvDim int) *kernels.KVPool {
	h.mu.Lock()
	p := h.pool
	h.pool = nil
	if p != nil && p.Layers == layers && p.Blocks == blocks && p.BlockSize == blockSize && p.KVDim == kvDim {
		h.taken = true
		h.mu.Unlock()
		return p
	}
	h.mu.Unlock()
	if p != nil {
		h.free(p)
	}
	return nil
}

// close frees an untaken pool and refuses later offers. Safe more than
// once.
func (h *kvHandoff) close() {
	h.mu.Lock()
	h.closed = true
	p := h.pool
	h.pool = nil
	h.mu.Unlock()
	if p != nil {
		h.free(p)
	}
}

// handoffBatcher is a model's Batcher as its scheduler sees it: its pool
// comes from the model it replaced where that model left one of the right
// shape (from), and goes to the model that replaces it (to, set by the
// Engine at eviction) instead of being freed.
//
// It is the whole backend too (Unwrap), so that whatever asks the
// scheduler's backend for another capability finds the real one.
type handoffBatcher struct {
	kernels.Backend
	kernels.Batcher
	m *Model
}

// Unwrap implements kernels.Unwrapper.
func (b handoffBatcher) Unwrap() kernels.Backend { return b.Backend }

func (b handoffBatcher) NewKVPool(layers, blocks, blockSize, kvDim int) (*kernels.KVPool, error) {
	if h := b.m.kvFrom; h != nil {
		if p := h.take(layers, blocks, blockSize, kvDim); p != nil {
			slog.Debug("pipeline: KV pool taken over from the evicted model", "path", b.m.path)
			return p, nil
		}
	}
	return b.Batcher.NewKVPool(layers, blocks, blockSize, kvDim)
}

func (b handoffBatcher) FreeKVPool(p *kernels.KVPool) {
	if h := b.m.kvTo.Load(); h != nil {
		// The pool's last kernels are this model's: wait for them, as
		// FreeKVPool would before freeing.
		if g, ok := kernels.As[*gpu.Backend](b.Backend); ok {
			if err := g.Sync(); err != nil {
				b.Batcher.FreeKVPool(p)
				return
			}
		}
		if h.offer(p) {
			return
		}
	}
	b.Batcher.FreeKVPool(p)
}

// freeKVPool frees a pool on the engine's GPU (a pool nobody took); a
// CPU pool needs nothing.
func (s *sharedGPU) freeKVPool(p *kernels.KVPool) {
	s.mu.Lock()
	d := s.cur
	s.mu.Unlock()
	if d == nil {
		return
	}
	select {
	case <-d.done:
	default:
		return // not open: the pool is not one of its
	}
	if d.base != nil {
		d.base.FreeKVPool(p)
	}
}
