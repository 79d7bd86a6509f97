package pipeline

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/forge-llm/forge/actors"
	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/kernels/gpu"
	"github.com/forge-llm/forge/rocm"
)

// device is an opened backend and what the load pipeline needs of it.
type device struct {
	be    kernels.Backend
	close func() // nil for a backend the caller owns
	// uploader makes the backend's default Uploader (nil: the pipeline's
	// host one).
	uploader func(s Strategy, mem *actors.Memory) actors.Uploader
	// ctxAt is when the GPU context became current (zero on the CPU).
	ctxAt time.Time
}

// openBackend opens the device asked for: "cpu"; "gpu" or "gpu:N" (an
// error when no GPU works); "auto" or "" (a GPU if package rocm finds one,
// else the CPU, logged).
func openBackend(o Options) (device, error) {
	if o.Backend != nil {
		d := device{be: o.Backend}
		if g, ok := o.Backend.(*gpu.Backend); ok {
			d.uploader = gpuUploader(g.Worker())
		}
		return d, nil
	}
	sel, err := rocm.ParseDevice(o.Device)
	if err != nil {
		return device{}, fmt.Errorf("pipeline: device %q is not available (have: auto, cpu, gpu, gpu:N): %w", o.Device, err)
	}
	ch, err := rocm.Choose(sel)
	if err != nil {
		return device{}, fmt.Errorf("pipeline: device %q: %w", o.Device, err)
	}
	if ch.CPU {
		if sel.Kind == rocm.SelectAuto {
			// Debug, not Info: on a machine without a GPU this is the
			// normal case, and the CLI's stderr carries progress (its
			// golden outputs); -v shows it.
			slog.Debug("pipeline: running on the CPU", "device", o.Device, "reason", ch.Reason)
		}
		b := cpu.New(o.Threads)
		return device{be: b, close: b.Close}, nil
	}
	w, err := ch.Runtime.NewWorker(ch.Device.Ordinal)
	if err != nil {
		return device{}, fmt.Errorf("pipeline: %s: %w", ch.Device, err)
	}
	ctxAt := time.Now()
	b, err := gpu.New(w, gpu.Options{})
	if err != nil {
		w.Close()
		return device{}, fmt.Errorf("pipeline: %s: %w", ch.Device, err)
	}
	if sel.Kind == rocm.SelectAuto {
		slog.Info("pipeline: running on the GPU", "device", ch.Device.String())
	}
	return device{
		be:       b,
		close:    func() { b.Close(); w.Close() },
		uploader: gpuUploader(w),
		ctxAt:    ctxAt,
	}, nil
}

// gpuUploader streams weights into one device arena on w (per tensor for
// host-f32, whose tensors are F32 copies).
func gpuUploader(w *rocm.Worker) func(Strategy, *actors.Memory) actors.Uploader {
	return func(s Strategy, mem *actors.Memory) actors.Uploader {
		// FORGE_GPU_STAGING=1 copies through the pinned staging ring even
		// where the mapped file can be registered (for comparisons).
		return &actors.DeviceUploader{W: w, Mem: mem, PerTensor: s == HostF32, Staging: os.Getenv("FORGE_GPU_STAGING") == "1"}
	}
}

// prefetchFile asks the kernel to start reading f's tensor data into the
// page cache (globals first, then the blocks in file order) while the GPU
// driver starts: MADV_WILLNEED only queues readahead, so this costs the
// caller little and the loader later finds the pages resident.
func prefetchFile(f *gguf.File) {
	for i := range f.Tensors {
		b, err := f.TensorData(&f.Tensors[i])
		if err != nil || len(b) == 0 {
			continue
		}
		willNeed(b)
	}
}

// accounted charges a backend's activation buffers and KV cache to a
// Memory, so one accountant sees everything a model holds on its device
// and a limit fails these allocations like the device would.
type accounted struct {
	kernels.Backend
	mem *actors.Memory
}

func (a accounted) Alloc(n int) (kernels.Tensor, error) {
	if err := a.mem.Alloc(int64(n)*4, "activation buffer"); err != nil {
		return kernels.Tensor{}, err
	}
	t, err := a.Backend.Alloc(n)
	if err != nil {
		a.mem.Free(int64(n) * 4)
	}
	return t, err
}

func (a accounted) Free(t kernels.Tensor) {
	a.Backend.Free(t)
	a.mem.Free(int64(t.Len) * 4)
}

// kvBytes is what a KV cache of float32 keys and values takes.
func kvBytes(layers, ctx, kvDim int) int64 { return 2 * 4 * int64(layers) * int64(ctx) * int64(kvDim) }

func (a accounted) NewKVCache(layers, ctx, kvDim int) (*kernels.KVCache, error) {
	n := kvBytes(layers, ctx, kvDim)
	if err := a.mem.Alloc(n, "KV cache"); err != nil {
		return nil, err
	}
	c, err := a.Backend.NewKVCache(layers, ctx, kvDim)
	if err != nil {
		a.mem.Free(n)
	}
	return c, err
}

func (a accounted) FreeKVCache(c *kernels.KVCache) {
	a.Backend.FreeKVCache(c)
	a.mem.Free(kvBytes(c.Layers, c.Ctx, c.KVDim))
}
