package pipeline

import (
	"strings"

	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/kernels/gpu"
	"github.com/forge-llm/forge/pipeline/model"
	"github.com/forge-llm/forge/rocm"
)

// backendPlan is what a model's memory depends on in its backend: how the
// backend stores keys and values (it reports this itself, kernels.KVSizer)
// and whether requests run batched there. The Engine's estimate reads it
// before a model opens (planBackend); the model reads the same from its
// open backend (planOf, canBatch), so the estimate and the model follow
// one rule.
type backendPlan struct {
	kv      kernels.KVSizer
	gpu     bool // a GPU backend: it batches only where Batching.GPU asks (batches)
	batcher bool // it runs batched steps (kernels.Batcher)
}

// planOf is the plan of an open backend: its own sizes (KVF32 for a
// backend that reports none, as the accounting counts it).
func planOf(be kernels.Backend) backendPlan {
	kv, ok := kernels.As[kernels.KVSizer](be)
	if !ok {
		kv = kernels.KVF32
	}
	_, onGPU := kernels.As[*gpu.Backend](be)
	_, batcher := kernels.As[kernels.Batcher](be)
	return backendPlan{kv: kv, gpu: onGPU, batcher: batcher}
}

// planBackend is the plan of the backend openDevice will give a model
// under o, said before anything opens (the Engine's estimate): a backend
// the caller made answers for itself (the first of a split's); otherwise
// the backend package the device names reports its sizes (cpu.KV, gpu.KV
// with the options the device opens it with).
//
// "auto" is what the Engine's shared device turned out to be once it has
// opened (sharedGPU.found); before that, or outside an Engine, the CPU.
// Finding out sooner would mean starting the driver here, on the
// request's path and outside the overlap device_open.go arranges (the
// driver's start is the longest step of a fresh process), and a driver
// library that loads says nothing of a device (a HIP install without a
// GPU). Counting the CPU's float32 errs high: the first "auto" model of a
// GPU server is held at twice its cache, as before backends reported
// their sizes; erring low would let the Engine load past its budget.
func planBackend(o Options) backendPlan {
	be := o.Backend
	if be == nil && len(o.Backends) > 0 {
		be = o.Backends[0]
	}
	if be != nil {
		return planOf(be)
	}
	onCPU := backendPlan{kv: cpu.KV, batcher: true}
	onGPU := backendPlan{kv: gpu.KV(gpuOptions(o)), gpu: true, batcher: true}
	if splitName(o.Device) {
		return onGPU
	}
	sel, err := parseDevice(o.Device)
	switch {
	case err != nil || sel.Kind == rocm.SelectCPU:
		return onCPU // a bad name fails Open itself
	case sel.Kind == rocm.SelectGPU:
		return onGPU
	}
	if gpu, known := o.shared.found(); known && gpu {
		return onGPU
	}
	return onCPU
}

// found reports what the shared device turned out to be once an opening
// has finished: a GPU, or the CPU ("auto" without a usable GPU). known is
// false before (or while) it opens, after a failed opening, and for a nil
// sharedGPU (a model outside an Engine).
func (s *sharedGPU) found() (gpu, known bool) {
	if s == nil {
		return false, false
	}
	s.mu.Lock()
	d := s.cur
	s.mu.Unlock()
	if d == nil {
		return false, false
	}
	select {
	case <-d.done:
	default:
		return false, false
	}
	if d.err != nil {
		return false, false
	}
	return !d.cpu, true
}

// batches reports whether a model of cfg under b runs its requests
// batched on this backend (see canBatch for why a GPU mostly does not).
func (p backendPlan) batches(b Batching, cfg model.Config) bool {
	if p.gpu && (!b.GPU || cfg.Window > 0 || cfg.AttnSoftcap > 0) {
		return false
	}
	return p.batcher
}

// splitName reports whether name asks for a model split over GPUs
// ("gpu:N,M,…", "gpu:all"; splitDevice finds which).
func splitName(name string) bool {
	rest, ok := strings.CutPrefix(strings.ToLower(strings.TrimSpace(name)), "gpu:")
	return ok && (rest == "all" || strings.Contains(rest, ","))
}

// gpuOptions are the options a model's GPU backend is made with.
func gpuOptions(o Options) gpu.Options { return gpu.Options{MMQ: o.MMQ} }

// Both backends are batchers: planBackend says so of a backend not made
// yet.
var (
	_ kernels.Batcher = (*cpu.Backend)(nil)
	_ kernels.Batcher = (*gpu.Backend)(nil)
)
