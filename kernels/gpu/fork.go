package gpu

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"time"

	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/rocm"
)

// Fork returns a Backend for one more model on b's device that reuses what
// is costly to make and the same for every model: the context, the loaded
// kernel modules, and cuBLAS's library and kernels. What belongs to one
// model is its own: a worker thread (a rocm.Worker.Sibling sharing the
// context, so that one model's driver calls, such as the frees of a model
// being unloaded, never queue another's), a compute stream, tensors, KV
// caches, scratch, recorded decode steps, the 8-bit vector cache and a
// cuBLAS handle bound to its stream (made in the background, as New does).
// A long-running program that swaps models keeps one parent Backend and
// forks one per model: opening a model then costs a stream instead of a
// context, module loads and cuBLAS's start (a fresh Backend's ~0.1-0.3 s).
//
// Close a fork before its parent: the fork's Close frees what the fork
// made, closes its thread, and leaves the modules and b's worker alone.
func (b *Backend) Fork() (*Backend, error) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, fmt.Errorf("gpu: fork of a closed backend")
	}
	f := &Backend{
		w: b.w, forked: true, opts: b.opts, name: b.name, warp: b.warp,
		mods:    b.mods, // read-only once New returned
		fns:     maps.Clone(b.fns),
		allocs:  map[uintptr]int64{},
		weights: map[*kernels.Weight]devBuf{},
		scratch: map[string]devBuf{},

		mvVariant: b.mvVariant, mvBlocksPerSM: b.mvBlocksPerSM, gemmKernel: b.gemmKernel, noFuse: b.noFuse,
		rowsMax: b.rowsMax, mxVariant: b.mxVariant, mmqOff: b.mmqOff, mmqMin: b.mmqMin, mmqNoPrompt: b.mmqNoPrompt,
		mmqVariant: b.mmqVariant, mmqChoice: b.mmqChoice, overlap: b.overlap, tune: b.tune,
	}
	b.mu.Unlock()
	if sw, err := b.w.Sibling(); err == nil {
		f.w, f.owned = sw, true
	} else {
		slog.Debug("gpu: fork shares its parent's thread", "err", err)
	}
	err := f.do(func(c *rocm.Ctx) error {
		s, err := c.NewStream()
		f.stream = s
		return err
	})
	if err != nil {
		if f.owned {
			f.w.Close()
		}
		return nil, fmt.Errorf("gpu: fork: %w", err)
	}
	f.vendorReady = make(chan struct{})
	go f.forkVendor(b)
	return f, nil
}

// forkVendor gives the fork a cuBLAS handle of its own, bound to its
// stream, once the parent's cuBLAS is open (the library and its kernels
// are then loaded: a handle costs milliseconds). A handle is not shared:
// two models' GEMMs on two streams would share its workspace. Without the
// parent's cuBLAS the fork's prompt GEMMs stay on gemm.cu, as the
// parent's do.
func (f *Backend) forkVendor(parent *Backend) {
	defer close(f.vendorReady)
	parent.waitVendor()
	parent.mu.Lock()
	pv := parent.vendor
	parent.mu.Unlock()
	if pv == nil {
		return
	}
	t0 := time.Now()
	v := &VendorGEMM{path: pv.path, api: pv.api, create: pv.create, destroy: pv.destroy, setStream: pv.setStream, gemmEx: pv.gemmEx}
	err := f.w.Do(context.Background(), func(c *rocm.Ctx) error { return v.bind(f.stream) })
	if err != nil {
		slog.Info("gpu: fork's prompt GEMM uses gemm.cu", "reason", err)
		return
	}
	f.mu.Lock()
	f.vendor = v
	f.mu.Unlock()
	slog.Debug("gpu: fork's cuBLAS handle ready", "in", time.Since(t0))
}
