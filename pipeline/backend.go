package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/forge-llm/forge/actors"
	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/kernels/gpu"
	"github.com/forge-llm/forge/rocm"
)

// device is a backend opened before Open returns (the CPU, a backend the
// caller made, or a GPU where the file's types force the choice up front)
// and what the load pipeline needs of it.
type device struct {
	be    kernels.Backend
	close func() // nil for a backend the caller owns
	// uploader makes the backend's default Uploader (nil: the pipeline's
	// host one).
	uploader func(s Strategy, mem *actors.Memory) actors.Uploader
	// ctxAt is when the GPU context became current (zero on the CPU).
	ctxAt time.Time
}

// openBackend opens the device asked for, waiting for it: "cpu"; "gpu" or
// "gpu:N" (an error when no GPU works); "auto" or "" (a GPU if package
// rocm finds one, else the CPU, logged).
func openBackend(o Options) (device, error) {
	if o.Backend != nil {
		d := device{be: o.Backend}
		if g, ok := o.Backend.(*gpu.Backend); ok {
			d.uploader = gpuUploader(g.Worker(), o.Upload)
		}
		return d, nil
	}
	sel, err := parseDevice(o.Device)
	if err != nil {
		return device{}, err
	}
	ch, err := rocm.Choose(sel)
	if err != nil {
		return device{}, fmt.Errorf("pipeline: device %q: %w", o.Device, err)
	}
	if ch.CPU {
		return cpuDevice(o, sel, ch.Reason), nil
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
		uploader: gpuUploader(w, o.Upload),
		ctxAt:    ctxAt,
	}, nil
}

func parseDevice(name string) (rocm.Selection, error) {
	sel, err := rocm.ParseDevice(name)
	if err != nil {
		return sel, fmt.Errorf("pipeline: device %q is not available (have: auto, cpu, gpu, gpu:N): %w", name, err)
	}
	return sel, nil
}

func cpuDevice(o Options, sel rocm.Selection, reason string) device {
	if sel.Kind == rocm.SelectAuto {
		// Debug, not Info: on a machine without a GPU this is the normal
		// case, and the CLI's stderr carries progress (its golden
		// outputs); -v shows it.
		slog.Debug("pipeline: running on the CPU", "device", o.Device, "reason", reason)
	}
	b := cpu.New(o.Threads)
	return device{be: b, close: b.Close}
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
		return sel, false, nil // auto: the CPU, decided by openBackend
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

// pendingDevice is a device opening in the background: the driver is
// initialised, the GPU context made and the kernels loaded from the cache
// (a few milliseconds), then the uploader and the executor start. Where a
// kernel is not cached yet its compilation holds both back (the first run
// on a machine).
type pendingDevice struct {
	o     Options
	sel   rocm.Selection
	abort chan struct{} // closed by Model.Close: stop after the current step

	// Set before ctxReady closes.
	ctxReady chan struct{}
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

func startDevice(o Options, sel rocm.Selection) *pendingDevice {
	p := &pendingDevice{o: o, sel: sel, abort: make(chan struct{}), ctxReady: make(chan struct{}), done: make(chan struct{})}
	if o.shared != nil {
		go p.runShared()
	} else {
		go p.run()
	}
	return p
}

// earlyDevice starts an explicitly named GPU ("gpu", "gpu:N") before the
// model file is parsed, nil otherwise ("auto" must see the file's types
// first; backgroundDevice decides and reports errors).
func earlyDevice(o Options) *pendingDevice {
	if o.Backend != nil {
		return nil
	}
	sel, err := parseDevice(o.Device)
	if err != nil || sel.Kind != rocm.SelectGPU || rocm.Probe() != nil {
		return nil
	}
	return startDevice(o, sel)
}

// discard stops a device that is no longer wanted and waits for it to
// close what it opened (nil: nothing to do).
func (p *pendingDevice) discard() {
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

func (p *pendingDevice) aborted() bool {
	select {
	case <-p.abort:
		return true
	default:
		return false
	}
}

func (p *pendingDevice) run() {
	defer close(p.done)
	t0 := time.Now()
	// The run-time compiler (the kernel cache needs its version: ~70 ms
	// to load in a fresh process) loads next to the driver's start;
	// cuBLAS's library (a ~100 ms dlopen) once the driver is initialised,
	// while the context is made: loaded next to cuInit, it held the
	// loader's lock that cuInit needs, and the context came ~100 ms later
	// (bench/results/2026-11-25-gpu-h100.md). FORGE_GPU_PRELOAD (for
	// measurements): "early" both next to the driver, "split" cuBLAS
	// after the context, "late" both after it, "0" neither.
	preloads := &p.preloads
	preloadWhen := os.Getenv("FORGE_GPU_PRELOAD")
	preloadRTC := func() { preloads.Go(rocm.PreloadCompiler) }
	preloadBLAS := func() {
		preloads.Go(func() {
			t := time.Now()
			gpu.PreloadBLAS()
			slog.Debug("pipeline: cuBLAS preloaded", "in", time.Since(t), "from start", time.Since(t0))
		})
	}
	switch preloadWhen {
	case "early":
		preloadRTC()
		preloadBLAS()
	case "", "split":
		preloadRTC()
	}
	ctxSet := false
	setCtx := func(err error) {
		p.ctxErr, ctxSet = err, true
		close(p.ctxReady)
	}
	defer func() {
		if !ctxSet {
			setCtx(p.err)
		}
	}()
	ch, err := rocm.Choose(p.sel)
	if err != nil {
		p.err = &DeviceError{Device: p.o.Device, Err: err}
		return
	}
	if ch.CPU {
		d := cpuDevice(p.o, p.sel, ch.Reason)
		p.cpu, p.be, p.closeFn, p.beAt = true, d.be, d.close, time.Now()
		setCtx(nil)
		return
	}
	if p.aborted() {
		p.err = errAborted
		return
	}
	if preloadWhen == "" {
		preloadBLAS()
	}
	w, err := ch.Runtime.NewWorker(ch.Device.Ordinal)
	if err != nil {
		p.err = &DeviceError{Device: p.o.Device, Err: fmt.Errorf("%s: %w", ch.Device, err)}
		return
	}
	p.ctxAt = time.Now()
	tCtx := time.Since(t0)
	switch preloadWhen {
	case "late":
		preloadRTC()
		preloadBLAS()
	case "split":
		preloadBLAS()
	}
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
	b, err := gpu.New(w, gpu.Options{})
	if err != nil {
		p.err, p.closeFn = &DeviceError{Device: p.o.Device, Err: fmt.Errorf("%s: %w", ch.Device, err)}, closeWorkers
		return
	}
	p.closeFn = func() { b.Close(); closeWorkers() }
	tKernels := time.Since(t0)
	setCtx(nil)
	if p.sel.Kind == rocm.SelectAuto {
		slog.Info("pipeline: running on the GPU", "device", ch.Device.String())
	}
	p.be, p.beAt = b, time.Now()
	slog.Debug("pipeline: device open", "device", ch.Device.String(), "context", tCtx, "kernels", tKernels)
}

// runShared is run on an Engine's shared GPU (Options.shared): the
// context, kernels and cuBLAS are there already (or being opened by the
// first model); the model gets a fork of the backend and the staging ring
// pool, and gives them back on close.
func (p *pendingDevice) runShared() {
	defer close(p.done)
	ctxSet := false
	setCtx := func(err error) {
		p.ctxErr, ctxSet = err, true
		close(p.ctxReady)
	}
	defer func() {
		if !ctxSet {
			setCtx(p.err)
		}
	}()
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
		c := cpuDevice(p.o, p.sel, d.reason)
		p.cpu, p.be, p.closeFn, p.beAt = true, c.be, c.close, time.Now()
		setCtx(nil)
		return
	}
	p.w, p.upW, p.rings, p.ctxAt = d.w, d.upW, d.rings, time.Now()
	p.closeFn = sh.release
	if p.aborted() {
		p.err = errAborted
		return
	}
	setCtx(nil)
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
func (p *pendingDevice) uploader(t UploadTuning, s Strategy, mem *actors.Memory) actors.Uploader {
	d := deviceUploader(p.upW, t, s, mem)
	if p.rings != nil {
		d.Rings, d.Compute = p.rings, p.computeStream
	}
	return d
}

// computeStream is the stream the model's kernels run on, 0 while the
// backend is not made (no kernel has run then).
func (p *pendingDevice) computeStream() rocm.Stream {
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
func (p *pendingDevice) backend(ctx context.Context) (kernels.Backend, error) {
	select {
	case <-p.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return p.be, p.err
}

// close waits for the device to finish opening and closes what it opened.
func (p *pendingDevice) close() {
	<-p.done
	p.preloads.Wait()
	if p.closeFn != nil {
		p.closeFn()
	}
}

// lazyUploader is the Uploader of a model whose device is still opening:
// Reserve waits for the GPU context (or the CPU), then makes the device's
// own Uploader and hands everything to it. A device that fails to open
// fails Reserve, which fails every future with its error.
type lazyUploader struct {
	dev  *pendingDevice
	ctx  context.Context // the load
	make func(cpu bool) actors.Uploader

	// after holds Reserve (the arena's allocation and the ring's
	// borrowing) until each channel is closed: the uploaders of the
	// models an Engine evicted for this one, released (Engine.open).
	// released is closed once this uploader's own Release has returned
	// (nil: not watched).
	after    []<-chan struct{}
	released chan struct{}
	relOnce  sync.Once

	mu sync.Mutex
	up actors.Uploader
}

func (l *lazyUploader) inner() actors.Uploader {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.up
}

// Reserve implements actors.Uploader.
func (l *lazyUploader) Reserve(p *actors.Plan) error {
	select {
	case <-l.dev.ctxReady:
	case <-l.dev.abort:
		return actors.ErrClosed
	case <-l.ctx.Done():
		return fmt.Errorf("load cancelled while the device opened: %w", context.Cause(l.ctx))
	}
	if l.dev.ctxErr != nil {
		return l.dev.ctxErr
	}
	for _, ch := range l.after {
		select {
		case <-ch:
		case <-l.dev.abort:
			return actors.ErrClosed
		case <-l.ctx.Done():
			return fmt.Errorf("load cancelled while an evicted model freed its device memory: %w", context.Cause(l.ctx))
		}
	}
	if !l.dev.cpu {
		slog.Debug("pipeline: reserving device memory", "after context", time.Since(l.dev.ctxAt))
	}
	up := l.make(l.dev.cpu)
	l.mu.Lock()
	l.up = up
	l.mu.Unlock()
	return up.Reserve(p)
}

var errNotReserved = errors.New("pipeline: uploader used before Reserve")

// failed is the backend's error once it is known to have failed after the
// context was made: the remaining units fail with it.
func (l *lazyUploader) failed() error {
	select {
	case <-l.dev.done:
		return l.dev.err
	default:
		return nil
	}
}

// Dest implements actors.Uploader.
func (l *lazyUploader) Dest(t *actors.Tensor, off, n int64) ([]byte, error) {
	up := l.inner()
	if up == nil {
		return nil, errNotReserved
	}
	return up.Dest(t, off, n)
}

// Upload implements actors.Uploader.
func (l *lazyUploader) Upload(t *actors.Tensor, off int64, data []byte) error {
	up := l.inner()
	if up == nil {
		return errNotReserved
	}
	if err := l.failed(); err != nil {
		return err
	}
	return up.Upload(t, off, data)
}

// Flush implements actors.Uploader.
func (l *lazyUploader) Flush(u *actors.Unit) (actors.Fence, error) {
	up := l.inner()
	if up == nil {
		return nil, errNotReserved
	}
	if err := l.failed(); err != nil {
		return nil, err
	}
	return up.Flush(u)
}

// Weight implements actors.Uploader.
func (l *lazyUploader) Weight(name string) (*kernels.Weight, bool) {
	up := l.inner()
	if up == nil {
		return nil, false
	}
	return up.Weight(name)
}

// Release implements actors.Uploader.
func (l *lazyUploader) Release() {
	if up := l.inner(); up != nil {
		up.Release()
	}
	if l.released != nil {
		l.relOnce.Do(func() { close(l.released) })
	}
}

// gpuUploader streams weights into one device arena on w (per tensor for
// host-f32, whose tensors are F32 copies).
func gpuUploader(w *rocm.Worker, t UploadTuning) func(Strategy, *actors.Memory) actors.Uploader {
	return func(s Strategy, mem *actors.Memory) actors.Uploader {
		return deviceUploader(w, t, s, mem)
	}
}

func deviceUploader(w *rocm.Worker, t UploadTuning, s Strategy, mem *actors.Memory) *actors.DeviceUploader {
	if spec := os.Getenv("FORGE_GPU_UPLOAD"); spec != "" {
		var err error
		if t, err = t.Parse(spec); err != nil {
			slog.Warn("pipeline: FORGE_GPU_UPLOAD ignored", "err", err)
		}
	}
	return &actors.DeviceUploader{
		W: w, Mem: mem, PerTensor: s == HostF32, Ahead: s != Lazy,
		Register:    t.Register,
		RingBuffers: t.RingBuffers, RingBytes: t.RingBytes, Stagers: t.Stagers,
		RegThreads: t.RegThreads, RegBytes: t.RegBytes,
	}
}

// Parse sets the fields named in spec, a comma-separated list of "reg"
// (Register) and key=value: st stagers, rn ring buffers, rs ring MiB, rt
// registration threads, rb registration MiB. FORGE_GPU_UPLOAD takes the
// same list, for benchmarks of a whole process (forge run, forge bench
// load).
func (t UploadTuning) Parse(spec string) (UploadTuning, error) {
	for _, kv := range strings.Split(spec, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		if kv == "reg" {
			t.Register = true
			continue
		}
		k, v, _ := strings.Cut(kv, "=")
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return t, fmt.Errorf("upload setting %q: want a positive number", kv)
		}
		switch k {
		case "st":
			t.Stagers = n
		case "rn":
			t.RingBuffers = n
		case "rs":
			t.RingBytes = n << 20
		case "rt":
			t.RegThreads = n
		case "rb":
			t.RegBytes = int64(n) << 20
		default:
			return t, fmt.Errorf("unknown upload setting %q (reg, st, rn, rs, rt, rb)", kv)
		}
	}
	return t, nil
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

// kvCacheSizer is a backend that says what a KV cache takes on its device
// (a GPU storing f16 keys and values); without it a cache counts as F32.
type kvCacheSizer interface {
	KVCacheBytes(layers, ctx, kvDim int) int64
}

// cacheBytes is what be's KV cache of this shape is charged.
func cacheBytes(be kernels.Backend, layers, ctx, kvDim int) int64 {
	if s, ok := kernels.As[kvCacheSizer](be); ok {
		return s.KVCacheBytes(layers, ctx, kvDim)
	}
	return kvBytes(layers, ctx, kvDim)
}

func (a accounted) NewKVCache(layers, ctx, kvDim int) (*kernels.KVCache, error) {
	n := cacheBytes(a.Backend, layers, ctx, kvDim)
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
	a.mem.Free(cacheBytes(a.Backend, c.Layers, c.Ctx, c.KVDim))
}

// Unwrap lets the model find the backend's optional capabilities (a
// recorded decode step, an argmax on the device) behind the accounting.
func (a accounted) Unwrap() kernels.Backend { return a.Backend }
