package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/forge-llm/forge/actors"
	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/kernels/gpu"
	"github.com/forge-llm/forge/rocm"
)

// This file is the one path by which a model gets its device
// (openDevice). A device is one type whichever way it opens:
//
//   - at once (resolvedDevice): a backend the caller made, the CPU, or a
//     GPU that "auto" picks for a file with types its kernels do not read
//     (the load plan must then ask the backend which types it reads);
//   - in the background (startDevice, run or runShared): a GPU, while
//     Open returns and the loader reads the file. The driver, the context
//     and the kernels are made there; the model's uploader (lazyUploader)
//     waits for the context, its executor for the backend.
//
// Either way Model reads it the same way: backend waits for the backend,
// ctxReady/ctxAt say when the context was current, close frees what it
// opened.

// openDevice is a model's device: early (earlyDevice, started before the
// file was parsed) where it is still wanted, else one started now in the
// background, or one resolved at once. A device that cannot be had at
// all (a bad name, "gpu" without a driver) fails here; one that fails in
// the background fails the model's futures and requests (DeviceError).
func openDevice(o Options, f *gguf.File, early *device) (*device, error) {
	if o.Backend != nil {
		early.discard()
		var upW *rocm.Worker
		if g, ok := o.Backend.(*gpu.Backend); ok {
			upW = g.Worker()
		}
		return resolvedDevice(o.Backend, nil, upW, time.Time{}), nil
	}
	sel, background, err := backgroundDevice(o, f, early != nil)
	if err != nil || !background {
		early.discard()
	}
	if err != nil {
		return nil, err
	}
	if background {
		if early != nil {
			return early, nil
		}
		return startDevice(o, sel), nil
	}
	return openNow(o, sel)
}

// openNow opens the device, waiting for it: the CPU, or the GPU that
// "auto" chose for a file it does not read every type of (an error when
// the chosen GPU cannot be opened).
func openNow(o Options, sel rocm.Selection) (*device, error) {
	ch, err := rocm.Choose(sel)
	if err != nil {
		return nil, fmt.Errorf("pipeline: device %q: %w", o.Device, err)
	}
	if ch.CPU {
		be, closeFn := cpuDevice(o, sel, ch.Reason)
		return resolvedDevice(be, closeFn, nil, time.Time{}), nil
	}
	w, err := ch.Runtime.NewWorker(ch.Device.Ordinal)
	if err != nil {
		return nil, fmt.Errorf("pipeline: %s: %w", ch.Device, err)
	}
	ctxAt := time.Now()
	b, err := gpu.New(w, gpuOptions(o))
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("pipeline: %s: %w", ch.Device, err)
	}
	if sel.Kind == rocm.SelectAuto {
		slog.Info("pipeline: running on the GPU", "device", ch.Device.String())
	}
	return resolvedDevice(b, func() { b.Close(); w.Close() }, w, ctxAt), nil
}

// resolvedDevice is a device that is open already: be, closed by closeFn
// (nil for a backend the caller owns), whose uploader copies on upW (nil:
// the host's uploader), its context current since ctxAt (zero on the
// CPU).
func resolvedDevice(be kernels.Backend, closeFn func(), upW *rocm.Worker, ctxAt time.Time) *device {
	d := &device{
		abort: make(chan struct{}), ctxReady: make(chan struct{}), done: make(chan struct{}),
		resolved: true, cpu: upW == nil, w: upW, upW: upW, ctxAt: ctxAt, be: be, closeFn: closeFn,
	}
	close(d.ctxReady)
	close(d.done)
	return d
}

// placement is how a model on d places its weights: the uploader
// (o.uploader where a test gave one), the channel its Release closes
// (nil where not watched), the types its kernels read as they are (nil:
// every type), and whether the file's readers default to a GPU's count.
func (d *device) placement(ctx context.Context, o Options, mem *actors.Memory) (up actors.Uploader, released chan struct{}, reads func(gguf.Type) bool, gpuReads bool) {
	up = o.uploader
	if !d.resolved {
		if up == nil {
			lu := &lazyUploader{dev: d, ctx: ctx, make: func(cpu bool) actors.Uploader {
				if cpu {
					return &actors.HostUploader{Mem: mem, PerTensor: o.Strategy == HostF32}
				}
				return withPinned(d.uploader(o.Upload, o.Strategy, mem), o)
			}, after: o.afterRelease, released: make(chan struct{})}
			up, released = lu, lu.released
		}
		// The GPU's types; for "auto" every type of the file is one of
		// them (backgroundDevice), so the CPU reads the same plan.
		return up, released, gpu.Supported, true
	}
	if up == nil && d.upW != nil {
		up, gpuReads = withPinned(d.uploader(o.Upload, o.Strategy, mem), o), true
	}
	if r, ok := d.be.(typeReader); ok {
		reads = r.Reads
	}
	return up, nil, reads, gpuReads
}

// withPinned gives a device uploader the file's kept registration (an
// Engine's, see pinfiles.go), so that it copies from the file's pages.
func withPinned(u actors.Uploader, o Options) actors.Uploader {
	if du, ok := u.(*actors.DeviceUploader); ok {
		du.Pinned = o.pinned
	}
	return u
}

func parseDevice(name string) (rocm.Selection, error) {
	sel, err := rocm.ParseDevice(name)
	if err != nil {
		return sel, fmt.Errorf("pipeline: device %q is not available (have: auto, cpu, gpu, gpu:N): %w", name, err)
	}
	return sel, nil
}

// cpuDevice is the CPU backend and its close.
func cpuDevice(o Options, sel rocm.Selection, reason string) (kernels.Backend, func()) {
	if sel.Kind == rocm.SelectAuto {
		// Debug, not Info: on a machine without a GPU this is the normal
		// case, and the CLI's stderr carries progress (its golden
		// outputs); -v shows it.
		slog.Debug("pipeline: running on the CPU", "device", o.Device, "reason", reason)
	}
	b := cpu.New(o.Threads)
	return b, b.Close
}

// backgroundDevice decides whether the device can open in the background
// while Open returns: a GPU ("gpu", "gpu:N", or "auto" where a driver
// library loads and the GPU reads every type of the file, so that the
// load plan is the same whichever device "auto" ends on). A missing
// driver is found here at once (a dlopen), so "gpu" on a machine without
// one fails Open as before and "auto" picks the CPU without delay.
//
// probed says earlyDevice has already found the driver (and started it):
// probing again would dlopen while the driver's own initialisation holds
// the loader's lock, which costs Open tens of milliseconds.
func backgroundDevice(o Options, f *gguf.File, probed bool) (rocm.Selection, bool, error) {
	if o.Backend != nil {
		return rocm.Selection{}, false, nil
	}
	sel, err := parseDevice(o.Device)
	if err != nil || sel.Kind == rocm.SelectCPU {
		return sel, false, err
	}
	if probed {
		return sel, true, nil
	}
	if err := rocm.Probe(); err != nil {
		if sel.Kind == rocm.SelectGPU {
			return sel, false, fmt.Errorf("pipeline: device %q: %w", o.Device, err)
		}
		return sel, false, nil // auto: the CPU, decided by openNow
	}
	if sel.Kind == rocm.SelectAuto {
		for i := range f.Tensors {
			if !gpu.Supported(f.Tensors[i].Type) {
				return sel, false, nil
			}
		}
	}
	return sel, true, nil
}

// device is a model's backend, open or opening (see the top of this
// file). A background one is a GPU opening: the driver is initialised,
// the GPU context made and the kernels loaded from the cache (a few
// milliseconds), then the uploader and the executor start. Where a kernel
// is not cached yet its compilation holds both back (the first run on a
// machine).
type device struct {
	o     Options
	sel   rocm.Selection
	abort chan struct{} // closed by Model.Close: stop after the current step
	// resolved says the device was open before Open went on
	// (resolvedDevice): ctxReady and done are closed from the start.
	resolved bool

	// Set before ctxReady closes (setCtx, once).
	ctxReady chan struct{}
	ctxOnce  sync.Once
	ctxErr   error        // no context (or CPU backend) could be had
	cpu      bool         // "auto" found no usable GPU: the CPU runs it
	w        *rocm.Worker // the backend's worker
	upW      *rocm.Worker // its sibling for the uploader's copies (or w)
	ctxAt    time.Time
	rings    *actors.RingPool // the shared device's staging rings (nil: the uploader pins its own)

	// Set before done closes.
	done    chan struct{}
	err     error // the backend could not be made
	be      kernels.Backend
	closeFn func()
	beAt    time.Time // when the backend (kernels) was ready

	// preloads are the libraries loading next to the device (they may
	// finish after done): close waits for them.
	preloads sync.WaitGroup
}

func startDevice(o Options, sel rocm.Selection) *device {
	p := &device{o: o, sel: sel, abort: make(chan struct{}), ctxReady: make(chan struct{}), done: make(chan struct{})}
	if o.shared != nil {
		go p.runShared()
	} else {
		go p.run()
	}
	return p
}

// earlyDevice starts an explicitly named GPU ("gpu", "gpu:N") before the
// model file is parsed, nil otherwise ("auto" must see the file's types
// first; openDevice decides and reports errors).
func earlyDevice(o Options) *device {
	if o.Backend != nil {
		return nil
	}
	sel, err := parseDevice(o.Device)
	if err != nil || sel.Kind != rocm.SelectGPU || rocm.Probe() != nil {
		return nil
	}
	return startDevice(o, sel)
}

// discard stops a device that is no longer wanted (one opening in the
// background) and waits for it to
// close what it opened (nil: nothing to do).
func (p *device) discard() {
	if p == nil {
		return
	}
	close(p.abort)
	p.close()
}

// DeviceError is a device that could not be opened in the background: the
// error every readiness future and request of the model fails with
// (errors.As finds it through their wrapping).
type DeviceError struct {
	Device string // as asked for: "gpu", "gpu:1", "auto"
	Err    error
}

func (e *DeviceError) Error() string { return fmt.Sprintf("pipeline: device %q: %v", e.Device, e.Err) }

func (e *DeviceError) Unwrap() error { return e.Err }

// errAborted: the model was closed while its device was opening.
var errAborted = errors.New("pipeline: closed while the device was opening")

func (p *device) aborted() bool {
	select {
	case <-p.abort:
		return true
	default:
		return false
	}
}

func (p *device) run() {
	defer close(p.done)
	t0 := time.Now()
	// The run-time compiler (the kernel cache needs its version: ~70 ms
	// to load in a fresh process) loads next to the driver's start;
	// cuBLAS's library (a ~100 ms dlopen) once the driver is initialised,
	// while the context is made: loaded next to cuInit, it held the
	// loader's lock that cuInit needs, and the context came ~100 ms later
	// (bench/results/2026-11-25-gpu-h100.md, which also measured both
	// next to the driver, cuBLAS after the context and both after it).
	preloads := &p.preloads
	preloads.Go(rocm.PreloadCompiler)
	defer func() { p.setCtx(p.err) }() // if nothing said sooner
	ch, err := rocm.Choose(p.sel)
	if err != nil {
		p.err = &DeviceError{Device: p.o.Device, Err: err}
		return
	}
	if ch.CPU {
		p.be, p.closeFn = cpuDevice(p.o, p.sel, ch.Reason)
		p.cpu, p.beAt = true, time.Now()
		p.setCtx(nil)
		return
	}
	if p.aborted() {
		p.err = errAborted
		return
	}
	preloads.Go(func() {
		t := time.Now()
		gpu.PreloadBLAS()
		slog.Debug("pipeline: cuBLAS preloaded", "in", time.Since(t), "from start", time.Since(t0))
	})
	w, err := ch.Runtime.NewWorker(ch.Device.Ordinal)
	if err != nil {
		p.err = &DeviceError{Device: p.o.Device, Err: fmt.Errorf("%s: %w", ch.Device, err)}
		return
	}
	p.ctxAt = time.Now()
	tCtx := time.Since(t0)
	upW, err := w.Sibling()
	if err != nil {
		slog.Debug("pipeline: no thread of its own for the uploader", "err", err)
		upW = w
	}
	p.w, p.upW = w, upW
	closeWorkers := func() {
		if upW != w {
			upW.Close()
		}
		w.Close()
	}
	// The kernel modules load before the context is handed to the
	// uploader: beside the first copies a module load took 40–70 ms and
	// held the copies back that long; alone it takes ~4 ms (bench/results/
	// 2026-11-25-gpu-startup-h100.md).
	if p.aborted() {
		p.err, p.closeFn = errAborted, closeWorkers
		return
	}
	b, err := gpu.New(w, gpuOptions(p.o))
	if err != nil {
		p.err, p.closeFn = &DeviceError{Device: p.o.Device, Err: fmt.Errorf("%s: %w", ch.Device, err)}, closeWorkers
		return
	}
	p.closeFn = func() { b.Close(); closeWorkers() }
	tKernels := time.Since(t0)
	p.setCtx(nil)
	if p.sel.Kind == rocm.SelectAuto {
		slog.Info("pipeline: running on the GPU", "device", ch.Device.String())
	}
	p.be, p.beAt = b, time.Now()
	slog.Debug("pipeline: device open", "device", ch.Device.String(), "context", tCtx, "kernels", tKernels)
}

// setCtx records whether a context could be had and wakes those waiting
// for it; only its first call counts.
func (p *device) setCtx(err error) {
	p.ctxOnce.Do(func() {
		p.ctxErr = err
		close(p.ctxReady)
	})
}

// runShared is run on an Engine's shared GPU (Options.shared): the
// context, kernels and cuBLAS are there already (or being opened by the
// first model); the model gets a fork of the backend and the staging ring
// pool, and gives them back on close.
func (p *device) runShared() {
	defer close(p.done)
	defer func() { p.setCtx(p.err) }() // if nothing said sooner
	sh := p.o.shared
	d, err := sh.acquire(p.sel, p.abort)
	if errors.Is(err, errAborted) {
		p.err = errAborted
		return
	}
	if err != nil {
		p.err = &DeviceError{Device: p.o.Device, Err: err}
		return
	}
	if d.cpu {
		sh.release()
		p.be, p.closeFn = cpuDevice(p.o, p.sel, d.reason)
		p.cpu, p.beAt = true, time.Now()
		p.setCtx(nil)
		return
	}
	p.w, p.upW, p.rings, p.ctxAt = d.w, d.upW, d.rings, time.Now()
	p.closeFn = sh.release
	if p.aborted() {
		p.err = errAborted
		return
	}
	p.setCtx(nil)
	b, err := d.base.Fork()
	if err != nil {
		p.err = &DeviceError{Device: p.o.Device, Err: err}
		return
	}
	p.closeFn = func() {
		if err := b.Close(); err != nil {
			slog.Warn("pipeline: closing a model's GPU backend", "err", err)
		}
		sh.release()
	}
	p.be, p.beAt = b, time.Now()
}

// uploader is the DeviceUploader of a model on this device (after
// ctxReady, on a GPU).
func (p *device) uploader(t UploadTuning, s Strategy, mem *actors.Memory) actors.Uploader {
	d := deviceUploader(p.upW, t, s, mem)
	if p.rings != nil {
		d.Rings, d.Compute = p.rings, p.computeStream
	}
	return d
}

// computeStream is the stream the model's kernels run on, 0 while the
// backend is not made (no kernel has run then).
func (p *device) computeStream() rocm.Stream {
	select {
	case <-p.done:
		if b, ok := p.be.(*gpu.Backend); ok {
			return b.Stream()
		}
	default:
	}
	return 0
}

// backend waits for the backend.
func (p *device) backend(ctx context.Context) (kernels.Backend, error) {
	select {
	case <-p.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return p.be, p.err
}

// close waits for the device to finish opening and closes what it opened.
func (p *device) close() {
	<-p.done
	p.preloads.Wait()
	if p.closeFn != nil {
		p.closeFn()
	}
}
