package gpu

import (
	"fmt"
	"log/slog"
	"unsafe"

	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/rocm"
)

// Alloc returns a zeroed device buffer of n float32.
func (b *Backend) Alloc(n int) (kernels.Tensor, error) {
	if n < 0 {
		return kernels.Tensor{}, fmt.Errorf("gpu: alloc %d values", n)
	}
	size := int64(max(n, 1)) * 4
	size = (size + 255) &^ 255
	b.mu.Lock()
	defer b.mu.Unlock()
	var p rocm.DevPtr
	err := b.do(func(c *rocm.Ctx) error {
		var err error
		if p, err = c.Malloc(size); err != nil {
			return err
		}
		return c.MemsetD8Async(p, 0, int(size), b.stream)
	})
	if err != nil {
		return kernels.Tensor{}, fmt.Errorf("gpu: alloc %d values: %w", n, err)
	}
	b.allocs[uintptr(p)] = size
	return kernels.Tensor{Len: n, Dev: uintptr(p)}, nil
}

// Free releases a tensor made by Alloc (views are ignored). It waits for
// queued work, which may still use the buffer.
func (b *Backend) Free(t kernels.Tensor) {
	b.mu.Lock()
	defer b.mu.Unlock()
	size, ok := b.allocs[t.Dev]
	if !ok {
		return
	}
	delete(b.allocs, t.Dev)
	err := b.do(func(c *rocm.Ctx) error {
		if err := c.SyncStream(b.stream); err != nil {
			return err
		}
		return c.Free(rocm.DevPtr(t.Dev), size)
	})
	if err != nil {
		slog.Error("gpu: free tensor", "dev", t.Dev, "err", err)
	}
}

func checkTensor(what string, t kernels.Tensor, n int) error {
	if t.Dev == 0 && n > 0 {
		return fmt.Errorf("gpu: %s: tensor is not on the GPU", what)
	}
	if t.Len < n {
		return fmt.Errorf("gpu: %s: tensor holds %d values, need %d", what, t.Len, n)
	}
	return nil
}

func f32bytes(v []float32) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))
}

// Write copies src into dst[off:] in the stream's order: after the queued
// ops (which may still read dst), before the ops queued next; src may be
// reused once it returns.
func (b *Backend) Write(dst kernels.Tensor, off int, src []float32) error {
	if off < 0 || off+len(src) > dst.Len {
		return fmt.Errorf("gpu: write %d values at %d into a tensor of %d", len(src), off, dst.Len)
	}
	if len(src) == 0 {
		return nil
	}
	if err := checkTensor("write", dst, off+len(src)); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.step.capturing {
		return fmt.Errorf("gpu: write while capturing a decode step")
	}
	return b.do(func(c *rocm.Ctx) error {
		// In the stream's order: after the ops queued before (which may
		// read dst), before those queued after.
		if err := c.CopyHtoDStream(rocm.DevPtr(dst.Dev+uintptr(off)*4), f32bytes(src), b.stream); err != nil {
			return fmt.Errorf("gpu: write: %w", err)
		}
		return nil
	})
}

// Read waits for all queued work and copies src[off : off+len(dst)].
func (b *Backend) Read(dst []float32, src kernels.Tensor, off int) error {
	if off < 0 || off+len(dst) > src.Len {
		return fmt.Errorf("gpu: read %d values at %d from a tensor of %d", len(dst), off, src.Len)
	}
	if len(dst) == 0 {
		return b.Sync()
	}
	if err := checkTensor("read", src, off+len(dst)); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.step.capturing {
		return fmt.Errorf("gpu: read while capturing a decode step")
	}
	return b.do(func(c *rocm.Ctx) error {
		if err := c.SyncStream(b.stream); err != nil {
			return fmt.Errorf("gpu: read: %w", err)
		}
		return c.CopyDtoH(f32bytes(dst), rocm.DevPtr(src.Dev+uintptr(off)*4))
	})
}

// kvBuf is a KVCache's storage: for each layer, keys then values, each
// [ctx][kvDim] elements of esize bytes.
type kvBuf struct {
	base  rocm.DevPtr
	size  int64
	esize int
}

// NewKVCache allocates a zeroed cache (f16, or f32 with Options.KVF32).
func (b *Backend) NewKVCache(layers, ctx, kvDim int) (*kernels.KVCache, error) {
	es := 2
	if b.opts.KVF32 {
		es = 4
	}
	return b.newKVCache(layers, ctx, kvDim, es)
}

// NewKVCacheF32 allocates a zeroed cache of float32 keys and values
// whatever Options.KVF32 says: for an evaluation whose result should be
// the CPU backend's computation (forge perplexity), at twice the memory.
func (b *Backend) NewKVCacheF32(layers, ctx, kvDim int) (*kernels.KVCache, error) {
	return b.newKVCache(layers, ctx, kvDim, 4)
}

// newKVCache allocates a zeroed cache of es-byte elements (2: f16, 4: f32).
func (b *Backend) newKVCache(layers, ctx, kvDim, es int) (*kernels.KVCache, error) {
	if layers <= 0 || ctx <= 0 || kvDim <= 0 {
		return nil, fmt.Errorf("gpu: kv cache %d layers × %d positions × %d", layers, ctx, kvDim)
	}
	size := int64(layers) * 2 * int64(ctx) * int64(kvDim) * int64(es)
	b.mu.Lock()
	defer b.mu.Unlock()
	var p rocm.DevPtr
	err := b.do(func(c *rocm.Ctx) error {
		var err error
		if p, err = c.Malloc(size); err != nil {
			return err
		}
		return c.MemsetD8Async(p, 0, int(size), b.stream)
	})
	if err != nil {
		return nil, fmt.Errorf("gpu: kv cache of %d bytes: %w", size, err)
	}
	return &kernels.KVCache{Layers: layers, Ctx: ctx, KVDim: kvDim, Impl: &kvBuf{base: p, size: size, esize: es}}, nil
}

// FreeKVCache releases a cache made by NewKVCache.
func (b *Backend) FreeKVCache(kc *kernels.KVCache) {
	if kc == nil {
		return
	}
	kb, ok := kc.Impl.(*kvBuf)
	if !ok || kb.base == 0 {
		return
	}
	b.freeAfterQueue("kv cache", kb.base, kb.size)
	kb.base = 0
	kc.Impl = nil
}

// freeAfterQueue frees device memory once the work queued on the stream
// (which may still read it) is done; a failure is logged, as a free has
// no caller to report to.
func (b *Backend) freeAfterQueue(what string, p rocm.DevPtr, size int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	err := b.do(func(c *rocm.Ctx) error {
		if err := c.SyncStream(b.stream); err != nil {
			return err
		}
		return c.Free(p, size)
	})
	if err != nil {
		slog.Error("gpu: free "+what, "err", err)
	}
}

// weightBytes is the size of w's blocks, checking its shape against its type.
func weightBytes(w *kernels.Weight) (int64, error) {
	if w == nil {
		return 0, fmt.Errorf("gpu: nil weight")
	}
	bs := w.Type.BlockSize()
	if bs == 0 {
		return 0, fmt.Errorf("gpu: weight %q: unknown type %s", w.Name, w.Type)
	}
	if w.Rows <= 0 || w.Cols <= 0 || w.Cols%bs != 0 {
		return 0, fmt.Errorf("gpu: weight %q: %d×%d is not whole %s blocks of %d", w.Name, w.Rows, w.Cols, w.Type, bs)
	}
	n := int64(w.Rows) * int64(w.Cols/bs) * int64(w.Type.BlockBytes())
	if w.Host != nil && int64(len(w.Host)) < n {
		return 0, fmt.Errorf("gpu: weight %q: %s %d×%d needs %d bytes, has %d", w.Name, w.Type, w.Rows, w.Cols, n, len(w.Host))
	}
	return n, nil
}

// LoadWeight copies w.Host to the device and sets w.Dev; FreeWeight (or
// Close) releases it. A weight whose Dev is already set is left alone.
func (b *Backend) LoadWeight(w *kernels.Weight) error {
	n, err := weightBytes(w)
	if err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.loadLocked(w, n)
}

func (b *Backend) loadLocked(w *kernels.Weight, n int64) error {
	if w.Dev != 0 {
		return nil
	}
	if w.Host == nil {
		return fmt.Errorf("gpu: weight %q: no host bytes and no device copy", w.Name)
	}
	var p rocm.DevPtr
	err := b.do(func(c *rocm.Ctx) error {
		var err error
		if p, err = c.Malloc(max(n, 256)); err != nil {
			return err
		}
		if err := b.copyInWait(c, p, w.Host[:n]); err != nil {
			c.Free(p, max(n, 256))
			return err
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("gpu: load weight %q (%s, %d bytes): %w", w.Name, w.Type, n, err)
	}
	w.Dev = uintptr(p)
	b.weights[w] = devBuf{p, max(n, 256)}
	return nil
}

// FreeWeight releases the device copy made by LoadWeight and clears w.Dev.
func (b *Backend) FreeWeight(w *kernels.Weight) {
	b.mu.Lock()
	defer b.mu.Unlock()
	d, ok := b.weights[w]
	if !ok {
		return
	}
	delete(b.weights, w)
	w.Dev = 0
	err := b.do(func(c *rocm.Ctx) error {
		if err := c.SyncStream(b.stream); err != nil {
			return err
		}
		return c.Free(d.ptr, d.size)
	})
	if err != nil {
		slog.Error("gpu: free weight", "name", w.Name, "err", err)
	}
}

// weightPtr checks w and returns its device address, uploading it first if
// only host bytes are there (kept until FreeWeight or Close). Call with b.mu
// held.
func (b *Backend) weightPtr(w *kernels.Weight) (rocm.DevPtr, error) {
	n, err := weightBytes(w)
	if err != nil {
		return 0, err
	}
	if err := b.loadLocked(w, n); err != nil {
		return 0, err
	}
	return rocm.DevPtr(w.Dev), nil
}

// copyInWait copies raw to newly allocated device memory p through the
// backend's stream and waits for it, so that any stream may read p once
// it returns (a synchronous pageable copy may return before its transfer
// ends: rocm.Ctx.CopyHtoDStream says why). Call with b.mu held, on the
// worker; never while capturing (the copy would become a node of the
// step's graph).
func (b *Backend) copyInWait(c *rocm.Ctx, p rocm.DevPtr, raw []byte) error {
	if b.step.capturing {
		return fmt.Errorf("gpu: copying %d bytes to the device while capturing a decode step", len(raw))
	}
	if err := c.CopyHtoDStream(p, raw, b.stream); err != nil {
		return err
	}
	return c.SyncStream(b.stream)
}
