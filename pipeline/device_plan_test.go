package pipeline

import (
	"testing"

	"github.com/forge-llm/forge/actors"
	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/kernels/gpu"
	"github.com/forge-llm/forge/pipeline/model"
	"github.com/forge-llm/forge/rocm"
)

// f16Backend is a GPU-shaped backend on the host: the CPU's ops, with keys
// and values reported at f16 as a GPU stores them.
type f16Backend struct{ kernels.Backend }

func (f16Backend) KVCacheBytes(layers, ctx, kvDim int) int64 {
	return kernels.KVF16.KVCacheBytes(layers, ctx, kvDim)
}

func (f16Backend) KVPoolBytes(layers, blocks, blockSize, kvDim int) int64 {
	return kernels.KVF16.KVPoolBytes(layers, blocks, blockSize, kvDim)
}

func (f f16Backend) Unwrap() kernels.Backend { return f.Backend }

// TestEstimateAsksTheBackend: the Engine's estimate counts a model's KV
// cache (or pool) as the backend it will run on reports it, not by the
// device's name: a caller's CPU backend as "cpu", a backend reporting f16
// half of that, a split of such backends per device; and a GPU, which
// keeps the single-sequence path unless Batching.GPU, is charged its
// cache, not the pool.
func TestEstimateAsksTheBackend(t *testing.T) {
	path := testmodels.Path(t, "stories260K-F32.gguf")
	be := cpu.New(1)
	defer be.Close()
	est := func(o Options) int64 {
		t.Helper()
		n, _, err := estimate(path, o)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	single, pooled := Batching{}, Batching{On: true, Seqs: 8}
	for _, b := range []Batching{single, pooled} {
		named, own := est(Options{Device: "cpu", Batching: b}), est(Options{Backend: be, Batching: b})
		if own != named {
			t.Errorf("batching %+v: the caller's CPU backend %d, \"cpu\" %d", b, own, named)
		}
	}
	// The f16 backend batches (it is not a GPU), so its pool counts; the
	// difference from the CPU is half the F32 cache or pool.
	cfg := testConfig(t, path)
	ctx := ctxPositions(cfg, Options{})
	_, blocks, bs := pooled.poolShape(ctx)
	for _, c := range []struct {
		b    Batching
		half int64
	}{
		{single, kvBytes(cfg.Layers, ctx, cfg.KVDim()) / 2},
		{pooled, kvBytes(cfg.Layers, blocks*bs, cfg.KVDim()) / 2},
	} {
		onCPU, f16 := est(Options{Device: "cpu", Batching: c.b}), est(Options{Backend: f16Backend{be}, Batching: c.b})
		if onCPU-f16 != c.half {
			t.Errorf("batching %+v: cpu %d, f16 backend %d: want %d less", c.b, onCPU, f16, c.half)
		}
		f16Split := est(Options{Backends: []kernels.Backend{f16Backend{be}, f16Backend{be}}, Batching: c.b})
		if f16Split != (f16+1)/2 {
			t.Errorf("batching %+v: split over two f16 backends %d per device, want %d", c.b, f16Split, (f16+1)/2)
		}
	}
	// A GPU without Batching.GPU keeps the single-sequence path: its cache
	// counts, not a pool (canBatch's rule, before the model opens).
	if gs, gp := est(Options{Device: "gpu:0"}), est(Options{Device: "gpu:0", Batching: pooled}); gs != gp {
		t.Errorf("gpu: single-sequence %d, Batching without GPU %d: want the same", gs, gp)
	}
}

// TestPlannedBackendIsTheOpenOne: what planBackend says of a device before
// it opens is what the backend Open would give reports: the CPU's F32,
// the GPU's f16 (for every name of a GPU, split ones included), "auto"
// the GPU only where a driver loads.
func TestPlannedBackendIsTheOpenOne(t *testing.T) {
	be := cpu.New(1)
	defer be.Close()
	open := planOf(be)
	if p := planBackend(Options{Device: "cpu"}); !sameSizes(p.kv, open.kv) || p.gpu || !p.batcher || p.kv != cpu.KV {
		t.Errorf("cpu: planned %+v, the open backend %+v", p, open)
	}
	if p := planOf(f16Backend{be}); p.kv != (f16Backend{be}) || p.gpu || !p.batcher {
		t.Errorf("a wrapped backend: %+v, want its own sizes, batching through Unwrap", p)
	}
	for _, name := range []string{"gpu", "gpu:1", "cuda", "hip", "gpu:0,1", "gpu:all"} {
		if p := planBackend(Options{Device: name}); p.kv != gpu.KV(gpu.Options{}) || p.kv != kernels.KVF16 || !p.gpu {
			t.Errorf("%s: planned %+v, want the GPU's f16", name, p)
		}
	}
	for _, name := range []string{"", "auto"} {
		if p := planBackend(Options{Device: name}); p.gpu || p.kv != cpu.KV {
			t.Errorf("%q outside an Engine: planned %+v, want the CPU's", name, p)
		}
	}
}

// TestPlannedAutoIsWhatTheEngineFound: "auto" in an Engine is planned as
// the CPU while the shared device has not opened (or is opening), then as
// what the opening found: the GPU, or the CPU where "auto" fell back.
func TestPlannedAutoIsWhatTheEngineFound(t *testing.T) {
	for _, found := range []string{"gpu", "cpu"} {
		s := newSharedGPU(Options{})
		entered, gate := make(chan struct{}), make(chan struct{})
		s.open = func(o Options, sel rocm.Selection, mem *actors.Memory, d *sharedDev) {
			close(entered)
			<-gate
			d.cpu = found == "cpu"
		}
		o := Options{shared: s}
		if p := planBackend(o); p.gpu {
			t.Errorf("%s: planned a GPU before the device opened", found)
		}
		opened := make(chan error, 1)
		go func() {
			_, err := s.acquire(rocm.Selection{Kind: rocm.SelectAuto}, nil)
			opened <- err
		}()
		<-entered
		if p := planBackend(o); p.gpu {
			t.Errorf("%s: planned a GPU while the device opened", found)
		}
		close(gate)
		if err := <-opened; err != nil {
			t.Fatal(err)
		}
		s.release()
		if p := planBackend(o); p.gpu != (found == "gpu") {
			t.Errorf("the device found the %s: planned %+v", found, p)
		}
		s.close()
	}
}

// testConfig is the architecture's configuration of the file at path.
func testConfig(t *testing.T, path string) model.Config {
	t.Helper()
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cfg, err := model.ConfigFromFile(f)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// sameSizes reports whether two KVSizers size a few caches and pools
// alike.
func sameSizes(a, b kernels.KVSizer) bool {
	for _, n := range []int{1, 7, 64} {
		if a.KVCacheBytes(n, 3*n, 2*n) != b.KVCacheBytes(n, 3*n, 2*n) || a.KVPoolBytes(n, n+1, 16, 2*n) != b.KVPoolBytes(n, n+1, 16, 2*n) {
			return false
		}
	}
	return true
}
