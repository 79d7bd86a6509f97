// Package gpu is the GPU implementation of kernels.Backend: one kernel
// source for CUDA and HIP (cu/*.cu, embedded), shipped compiled in the
// binary for the common targets (shipped.go) and otherwise compiled at run
// time by nvrtc or hiprtc through package rocm and cached on disk, and the Go
// launchers that queue the kernels on one compute stream.
//
// Every op only queues work; Read (and the sampling helpers that return
// host values) wait for it. All driver calls go through the rocm.Worker
// that owns the device's context, so a Backend may be used from any
// goroutine; ops are serialised by a mutex, as they share one stream.
//
// Weights stay in their GGUF block form on the device: the matrix–vector
// kernels (matvec.cu) read the blocks directly (Q4_K and Q6_K, the bulk of
// a Q4_K_M model, on activations quantized to 8-bit blocks with dp4a; the
// other types on float activations), up to kernels.MaxBatchRows rows with
// each row's result independent of the others (batch.go: continuous
// batching, with a paged KV pool); the prompt path (more rows)
// dequantizes the weight to f16 on the device and multiplies through
// cuBLAS (rocBLAS on AMD) where it is installed, else through gemm.cu
// (mma.sync on NVIDIA, a plain FMA product on AMD).
// Measurements: bench/results/2026-11-22-kernels-h100.md,
// bench/results/2026-11-25-batch-matmul-h100.md.
package gpu

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/rocm"
)

// Options tune a Backend.
type Options struct {
	// CacheDir is where compiled kernels are cached ("" = rocm's default).
	CacheDir string
	// KVF32 stores the KV cache in float32 instead of f16: twice the memory,
	// no rounding of keys and values. For checks against a float reference.
	KVF32 bool
	// NoVendorGEMM keeps the prompt GEMM on gemm.cu even where cuBLAS (or
	// rocBLAS on AMD) is installed.
	NoVendorGEMM bool
	// GEMMFMA runs every prompt GEMM through gemm.cu's plain FMA product
	// (kernel gemm_f16_fma, no vendor library, no mma): the path an AMD GPU
	// without rocBLAS takes, so that it can be tested on an NVIDIA GPU.
	GEMMFMA bool
	// MMQ chooses the int8 tensor-core kernels of MatMul's rows (mmq.go,
	// ParseMMQ) and which types' prompt products take 8-bit x (mmq32.go):
	// "" the measured defaults, "off", or variants per type, for
	// comparisons.
	MMQ string
}

// Backend runs the ops of kernels.Backend on one GPU.
type Backend struct {
	w      *rocm.Worker
	owned  bool // w was opened by Open and is closed by Close
	forked bool // made by Fork: the modules are the parent's, not unloaded by Close
	opts   Options
	name   string
	warp   int
	stream rocm.Stream
	mods   []*rocm.Module
	fns    map[string]rocm.Function
	// vendor is cuBLAS (rocBLAS on AMD) for the prompt GEMMs of
	// vendorMinN rows or more,
	// nil where absent. New opens it in the background (loading cuBLAS
	// and its first kernels takes a fresh process ~0.1–0.2 s, which must
	// not delay a short first prompt): it is set, under mu, before
	// vendorReady closes, and only read after.
	vendor      *VendorGEMM
	vendorReady chan struct{}

	mu      sync.Mutex
	allocs  map[uintptr]int64          // Alloc'd tensors and caches: base → bytes
	weights map[*kernels.Weight]devBuf // weights uploaded by LoadWeight
	scratch map[string]devBuf          // grow-only work buffers, by use
	closed  bool
	// mvVariant forces the Q4_K/Q6_K matvec kernel: "q{R}{U}" on
	// activations quantized to 8 bits, R rows per warp, U super-blocks per
	// lane in flight (q11, q21, q12, q22, q14); "p1", "p2" software-
	// pipelined, 1 or 2 rows per warp; "r{R}u{U}" direct loads, R rows per
	// warp, U super-blocks per lane in flight (U = 2 for Q4_K only); "s1",
	// "s2" Q6_K staged through shared memory; "n{R}{U}" Q4_K as q{R}{U}
	// with L1-bypassing weight loads; "t1", "t2" Q6_K on 8-bit activations
	// staged through shared memory. For Q4_0/Q4_1/Q5_0/Q5_1/Q8_0: "b1",
	// "b2" 8-bit activations, 1 or 2 rows per warp; "g" the generic float
	// kernel. "" chooses by shape. For tests and benchmarks.
	mvVariant string
	// mvBlocksPerSM caps the grid of the q*, n*, t* and b* kernels at that
	// many blocks per multiprocessor (they loop over rows); 0 launches one
	// block per row group.
	mvBlocksPerSM int
	// gemmKernel forces the prompt GEMM kernel ("gemm_f16": ldmatrix
	// fragments, "gemm_f16_lds": 32-bit shared loads, "gemm_f16_fma": the
	// FMA product, set by Options.GEMMFMA); "" is cuBLAS/rocBLAS where
	// found, else gemm_f16.
	gemmKernel string

	// rowsMax, when > 0, replaces kernels.MaxBatchRows as the most rows
	// MatMul sends to the multi-row matvec (benchmarks compare the GEMM).
	rowsMax int
	// mxVariant forces the Q4_K/Q6_K multi-row kernel ("x{NX}r{R}", see
	// planRows); "" is planRows' choice. For tests and benchmarks.
	mxVariant string
	// mmqOff keeps MatMul off the tensor-core kernels (mmq.go), mmqMin,
	// when > 0, replaces mmqMinRows, and mmqNoPrompt keeps MatMulPrompt's
	// pieces on the GEMM path, mmqVariant forces a kernel variant
	// (mmqVariants). For tests and benchmarks.
	mmqOff      bool
	mmqVariant  string
	mmqChoice   map[gguf.Type]string // the variant per type: mmqDefault, or as Options.MMQ says
	mmqMin      int
	mmqNoPrompt bool
	// overlap launches every kernel with programmatic stream serialization
	// (rocm.Ctx.LaunchDependent): the next kernel's blocks are scheduled
	// while the one before it finishes, which hides most of a launch's
	// latency in a decode step of hundreds of small kernels. Set by New
	// where launchOverlap allows it.
	overlap bool
	// tune holds the decode kernels' ways that give the same results and
	// differ only in speed (decodeTuning).
	tune decodeTuning
	lay  layoutState // the step layout of the Batcher ops (batch.go)

	step   stepState           // decode-step capture and replay (step.go)
	noFuse bool                // no rmsnorm_q8 / silu_mul_q8 (tests compare)
	graphs map[*stepGraph]bool // live recorded steps, destroyed by Close
	prof   *profiler           // per-kernel timing, when on (step.go)
	peer   peerState           // copies from other devices (peer.go)
	groups moeGroups           // the last expert groups GroupedMatMuls uploaded (moemmq.go)
}

type devBuf struct {
	ptr  rocm.DevPtr
	size int64
}

var _ kernels.Backend = (*Backend)(nil)

// Open opens the first GPU runtime that works (CUDA or HIP), starts a
// worker for device ordinal and returns a Backend on it; Close closes the
// worker too.
func Open(ordinal int, o Options) (*Backend, error) {
	rt, err := rocm.OpenAny()
	if err != nil {
		return nil, fmt.Errorf("gpu: %w", err)
	}
	w, err := rt.NewWorker(ordinal)
	if err != nil {
		return nil, fmt.Errorf("gpu: device %d: %w", ordinal, err)
	}
	b, err := New(w, o)
	if err != nil {
		w.Close()
		return nil, err
	}
	b.owned = true
	return b, nil
}

// New loads every kernel module for the worker's device — the object
// shipped in the binary where one fits its arch (shipped.go), else compiled
// by nvrtc/hiprtc or read from the kernel cache — and returns a Backend that
// queues work on a new stream.
func New(w *rocm.Worker, o Options) (*Backend, error) {
	t0 := time.Now()
	mmqOff, mmqChoice, err := ParseMMQ(o.MMQ)
	if err != nil {
		return nil, err
	}
	var man *Manifest
	objs, err := ShippedObjects()
	if err == nil && objs != nil {
		man, err = ReadManifest(objs)
	}
	if err != nil {
		slog.Info("gpu: no shipped kernel objects; compiling at run time", "reason", err)
		man = nil
	}
	// The run-time compiler is opened only when a module needs it: with
	// every module shipped, nvrtc/hiprtc need not even be installed.
	var compOnce sync.Once
	var comp *rocm.Compiler
	var compErr error
	var tComp time.Duration
	getComp := func() (*rocm.Compiler, error) {
		compOnce.Do(func() {
			t := time.Now()
			comp, compErr = w.NewCompiler(o.CacheDir)
			tComp = time.Since(t)
			if compErr != nil {
				compErr = fmt.Errorf("gpu: %w", compErr)
			}
		})
		return comp, compErr
	}
	mods := Modules()
	codes := make([][]byte, len(mods))
	errs := make([]error, len(mods))
	whys := make([]string, len(mods))
	froms := make([]string, len(mods))
	// nvrtc compiles several programs at once; ROCm 5.2's hiprtc crashes
	// doing so, so HIP compiles one module at a time.
	parallel := w.Device.Backend == rocm.CUDA
	var wg sync.WaitGroup
	for i, m := range mods {
		wg.Add(1)
		load := func() {
			defer wg.Done()
			code, from, why, err := moduleCode(man, objs, m, w.Device, w.Runtime().Version, getComp)
			if err != nil {
				errs[i] = err
				return
			}
			slog.Debug("gpu: kernel module", "module", m, "arch", w.Device.Arch, "from", from, "bytes", len(code))
			codes[i], whys[i], froms[i] = code, why, from
		}
		if parallel {
			go load()
		} else {
			load()
		}
	}
	wg.Wait()
	for i, why := range whys {
		if why != "" {
			slog.Info("gpu: shipped kernel objects not used", "arch", w.Device.Arch, "module", mods[i], "reason", why)
			break // one line: the reason is the same for every module as a rule
		}
	}
	tCode := time.Since(t0)
	for _, e := range errs {
		if e != nil {
			return nil, e
		}
	}
	b := &Backend{
		w: w, opts: o, warp: w.Device.WarpSize,
		name:      fmt.Sprintf("%s:%d", strings.ToLower(w.Device.Backend.String()), w.Device.Ordinal),
		fns:       map[string]rocm.Function{},
		allocs:    map[uintptr]int64{},
		weights:   map[*kernels.Weight]devBuf{},
		scratch:   map[string]devBuf{},
		mmqOff:    mmqOff,
		mmqChoice: mmqChoice,
	}
	if b.warp <= 0 {
		return nil, fmt.Errorf("gpu: device %s reports warp size %d", w.Device.Name, b.warp)
	}
	var nfn int
	var tFuncs time.Duration
	err = b.do(func(c *rocm.Ctx) error {
		for i, code := range codes {
			m, err := c.LoadModule(code)
			if err != nil && strings.HasPrefix(froms[i], "shipped") {
				// A driver that cannot take the shipped object (an older
				// ELF ABI or PTX ISA than the generator's) gets one made
				// by its own toolkit's nvrtc.
				slog.Info("gpu: shipped kernel object did not load; compiling it", "module", mods[i], "arch", w.Device.Arch, "err", err)
				if code, _, cerr := compileModule(mods[i], w.Device, getComp); cerr != nil {
					err = fmt.Errorf("%w; compiling instead: %w", err, cerr)
				} else {
					m, err = c.LoadModule(code)
				}
			}
			if err != nil {
				return fmt.Errorf("gpu: load %s: %w", mods[i], err)
			}
			b.mods = append(b.mods, m)
		}
		// Every kernel now (137, ~3 ms on the H100), not at its first
		// launch (rocm.LoadFunctions): a first prompt runs while the
		// weights still stream in, and a 512-token one came ~30 ms
		// sooner (bench/results/2026-11-25-gpu-startup-h100.md).
		t := time.Now()
		for i, m := range b.mods {
			n, err := c.LoadFunctions(m)
			if err != nil {
				return fmt.Errorf("gpu: load the kernels of %s: %w", mods[i], err)
			}
			nfn += n
		}
		tFuncs = time.Since(t)
		allowed, err := parseLaunchOverlap(os.Getenv(EnvLaunchOverlap))
		if err != nil {
			return err
		}
		b.overlap = allowed && launchOverlap(w.Device, froms, c.HasDependentLaunch())
		if b.tune, err = parseDecodeTuning(os.Getenv(EnvDecodeTuning)); err != nil {
			return err
		}
		s, err := c.NewStream()
		if err != nil {
			return err
		}
		b.stream = s
		return nil
	})
	if err != nil {
		b.release()
		return nil, err
	}
	slog.Debug("gpu: backend", "compiler", tComp, "code", tCode, "modules loaded", time.Since(t0),
		"kernels", nfn, "kernels loaded in", tFuncs, "overlapped launches", b.overlap)
	if o.GEMMFMA {
		b.gemmKernel = "gemm_f16_fma"
	}
	b.vendorReady = make(chan struct{})
	if (w.Device.Backend == rocm.CUDA || w.Device.Backend == rocm.HIP) && !o.NoVendorGEMM && !o.GEMMFMA {
		go b.openVendor()
	} else {
		close(b.vendorReady)
	}
	return b, nil
}

// openVendor opens cuBLAS on a thread of its own (a sibling of the
// backend's worker, so that the backend's queue is not held up meanwhile)
// and runs one small GEMM, which makes cuBLAS load its kernels, then hands
// it to the prompt GEMMs. Where cuBLAS is missing they stay on gemm.cu.
func (b *Backend) openVendor() {
	defer close(b.vendorReady)
	t0 := time.Now()
	on := b.w
	if sw, err := b.w.Sibling(); err == nil {
		defer sw.Close()
		on = sw
	}
	v, err := b.openVendorOn(on)
	tOpen := time.Since(t0)
	var tGEMM time.Duration
	if err == nil {
		tGEMM, err = v.warmUp(on, b.stream)
		if err != nil {
			_ = on.Do(context.Background(), func(c *rocm.Ctx) error { return v.destroyLocked(c) })
		}
	}
	if err != nil {
		slog.Info("gpu: prompt GEMM uses gemm.cu", "reason", err)
		return
	}
	b.mu.Lock()
	b.vendor = v
	b.mu.Unlock()
	slog.Debug("gpu: cuBLAS ready", "after", time.Since(t0), "handle", tOpen, "warm-up GEMM", tGEMM)
}

// waitVendor waits until the background cuBLAS open has finished (either
// way). Call without mu held.
func (b *Backend) waitVendor() {
	if b.vendorReady != nil {
		<-b.vendorReady
	}
}

// Name is "cuda:0" or "hip:0".
func (b *Backend) Name() string { return b.name }

// Worker is the rocm worker the backend runs on.
func (b *Backend) Worker() *rocm.Worker { return b.w }

// Stream is the compute stream every op is queued on.
func (b *Backend) Stream() rocm.Stream { return b.stream }

// WarpSize is the device's warp (wavefront) size.
func (b *Backend) WarpSize() int { return b.warp }

func (b *Backend) do(fn func(c *rocm.Ctx) error) error {
	return b.w.Do(context.Background(), fn)
}

// fn returns the kernel called name from whichever module defines it.
func (b *Backend) fn(c *rocm.Ctx, name string) (rocm.Function, error) {
	if f, ok := b.fns[name]; ok {
		return f, nil
	}
	for _, m := range b.mods {
		if f, err := c.Function(m, name); err == nil {
			b.fns[name] = f
			return f, nil
		}
	}
	return 0, fmt.Errorf("gpu: no kernel %q in any module", name)
}

// launch queues kernel name on the compute stream.
func (b *Backend) launch(c *rocm.Ctx, name string, grid, block rocm.Dim3, a *rocm.Args) error {
	f, err := b.fn(c, name)
	if err != nil {
		return err
	}
	if b.step.capturing {
		b.step.launches++
	}
	if b.prof != nil && !b.step.capturing {
		return b.prof.launch(c, name, func() error { return c.Launch(f, grid, block, 0, b.stream, a) }, b.stream)
	}
	launch := c.Launch
	if b.overlap {
		launch = c.LaunchDependent
	}
	if err := launch(f, grid, block, 0, b.stream, a); err != nil {
		return fmt.Errorf("gpu: launch %s grid %v block %v: %w", name, grid, block, err)
	}
	return nil
}

// EnvDecodeTuning chooses among decode kernels' ways that give the same
// results and differ only in speed, for comparing them on one machine: a
// comma-separated list of "wide" (the router's rows 32 columns a lane in
// flight), "minsplit=N" (decode attention splits of at least N positions),
// "q4grid=N" (the one-row Q4_K products' grid capped at N blocks per
// multiprocessor instead of 8) and "q6grid=N" (the same for the one-row
// Q6_K products of fewer than 8192 rows, instead of 12); "none" (none of
// them) and "default" (defaultTuning) start the list over; "" is
// "default".
const EnvDecodeTuning = "FORGE_DECODE_TUNING"

// decodeTuning is EnvDecodeTuning parsed.
type decodeTuning struct {
	routeWide      bool
	attnMinSplit   int
	q4Grid, q6Grid int // blocks per multiprocessor; 0: the kernel's default
}

// perSM is the grid cap the tuning sets for a one-row product of a
// weight of type t and rows rows, or 0 for the kernel's default.
func (t decodeTuning) perSM(typ gguf.Type, rows int) int {
	switch {
	case typ == gguf.TypeQ4_K:
		return t.q4Grid
	case typ == gguf.TypeQ6_K && rows < 8192:
		return t.q6Grid
	}
	return 0
}

// defaultTuning is the ways measured fastest: on the H100, Qwen3-MoE
// decoded 1–2 % faster with the router's wide rows and 5–6 % slower with
// splits of at least 64 positions
// (bench/results/2026-11-26-decode-launches-h100.md, calls 8 and 9).
var defaultTuning = decodeTuning{routeWide: true}

// parseDecodeTuning reads EnvDecodeTuning's value; "" is defaultTuning.
func parseDecodeTuning(v string) (decodeTuning, error) {
	if v == "" {
		return defaultTuning, nil
	}
	var t decodeTuning
	for _, f := range strings.Split(v, ",") {
		switch k, val, _ := strings.Cut(strings.TrimSpace(f), "="); k {
		case "wide":
			t.routeWide = true
		case "minsplit":
			n, err := strconv.Atoi(val)
			if err != nil || n < 0 {
				return t, fmt.Errorf("gpu: $%s: minsplit=%q is not a count of positions", EnvDecodeTuning, val)
			}
			t.attnMinSplit = n
		case "q4grid", "q6grid":
			n, err := strconv.Atoi(val)
			if err != nil || n < 1 || n > 64 {
				return t, fmt.Errorf("gpu: $%s: %s=%q is not a count of blocks per multiprocessor (1–64)", EnvDecodeTuning, k, val)
			}
			if k == "q4grid" {
				t.q4Grid = n
			} else {
				t.q6Grid = n
			}
		case "default": // the defaults, then what follows
			t = defaultTuning
		case "none": // every way off, then what follows
			t = decodeTuning{}
		case "":
		default:
			return t, fmt.Errorf("gpu: $%s: unknown way %q (wide, minsplit=N, q4grid=N, q6grid=N, none, default)", EnvDecodeTuning, k)
		}
	}
	return t, nil
}

// EnvLaunchOverlap set to "off" launches kernels one after another as
// before programmatic dependent launch (for comparisons); "on" (or unset)
// overlaps them where launchOverlap allows.
const EnvLaunchOverlap = "FORGE_LAUNCH_OVERLAP"

// parseLaunchOverlap reads EnvLaunchOverlap's value: whether overlapped
// launches are allowed.
func parseLaunchOverlap(v string) (bool, error) {
	switch v {
	case "", "on":
		return true, nil
	case "off":
		return false, nil
	}
	return false, fmt.Errorf("gpu: $%s=%q: want on or off", EnvLaunchOverlap, v)
}

// launchOverlap reports whether kernels may be launched overlapped
// (Backend.overlap): a CUDA device of compute capability 9.0 or later whose
// every module's code was built for such an arch (the shipped sm_90 cubin,
// or compiled for the device), since GRID_DEPEND's wait exists only there,
// and a driver with cuLaunchKernelEx (EnvLaunchOverlap is checked apart). froms
// says where each module's code came from (moduleCode).
func launchOverlap(dev rocm.DeviceInfo, froms []string, driverHasIt bool) bool {
	if dev.Backend != rocm.CUDA || !driverHasIt || archNumber(dev.Arch) < 90 {
		return false
	}
	for _, f := range froms {
		_, arch, shipped := strings.Cut(f, "shipped ")
		if shipped {
			if _, a, _ := strings.Cut(arch, " "); archNumber(a) < 90 {
				return false
			}
		}
	}
	return true
}

// Sync waits for all queued work.
func (b *Backend) Sync() error {
	return b.do(func(c *rocm.Ctx) error { return c.SyncStream(b.stream) })
}

// Close waits for queued work and frees everything the backend allocated:
// tensors not yet freed, loaded weights, scratch, the stream and the
// modules; it closes the worker if Open made it.
func (b *Backend) Close() error {
	b.waitVendor() // it uses the worker and the stream
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	err := b.release()
	if b.owned {
		b.w.Close()
	}
	return err
}

func (b *Backend) release() error {
	return b.do(func(c *rocm.Ctx) error {
		var first error
		keep := func(err error) {
			if err != nil && first == nil {
				first = err
			}
		}
		if b.stream != 0 {
			keep(c.SyncStream(b.stream))
		}
		if b.vendor != nil {
			keep(b.vendor.destroyLocked(c))
			b.vendor = nil
		}
		for p, n := range b.allocs {
			keep(c.Free(rocm.DevPtr(p), n))
		}
		for w, d := range b.weights {
			keep(c.Free(d.ptr, d.size))
			w.Dev = 0
		}
		for g := range b.graphs {
			keep(c.DestroyGraph(g.g))
		}
		b.graphs = nil
		keep(b.freeLayout(c))
		keep(b.prof.release(c))
		b.prof = nil
		keep(b.releasePeer(c))
		for _, d := range b.scratch {
			keep(c.Free(d.ptr, d.size))
		}
		b.allocs, b.weights, b.scratch = map[uintptr]int64{}, map[*kernels.Weight]devBuf{}, map[string]devBuf{}
		if b.stream != 0 {
			keep(c.DestroyStream(b.stream))
			b.stream = 0
		}
		if !b.forked {
			for _, m := range b.mods {
				keep(c.UnloadModule(m))
			}
		}
		b.mods = nil
		return first
	})
}

// scratchBuf returns a device buffer of at least n bytes for one use (key),
// growing it when needed. Growing waits for queued work, which may still
// read the old buffer, and makes a recorded step that used it stale.
func (b *Backend) scratchBuf(c *rocm.Ctx, key string, n int64) (rocm.DevPtr, error) {
	d, ok := b.scratch[key]
	if ok && d.size >= n {
		if b.step.used != nil {
			b.step.used[key] = d.ptr
		}
		return d.ptr, nil
	}
	if b.step.capturing {
		return 0, fmt.Errorf("gpu: scratch %s must grow (%d bytes) while a decode step is captured", key, n)
	}
	if ok {
		if err := c.SyncStream(b.stream); err != nil {
			return 0, err
		}
		if err := c.Free(d.ptr, d.size); err != nil {
			return 0, err
		}
		delete(b.scratch, key)
	}
	if ok {
		// a buffer that grows (a prompt piece's parts, with its rows and
		// its prefix) grows by a quarter at least: a growth waits for the
		// stream, frees and allocates
		n = max(n, d.size+d.size/4)
	}
	n = (n + 1<<20 - 1) &^ (1<<20 - 1)
	p, err := c.Malloc(n)
	if err != nil {
		return 0, fmt.Errorf("gpu: scratch %s (%d bytes): %w", key, n, err)
	}
	b.scratch[key] = devBuf{p, n}
	return p, nil
}

// zeroedScratch is scratchBuf for a buffer that must start zeroed (the
// kernels that use it leave it zeroed again): it is cleared when it is
// allocated or grown.
func (b *Backend) zeroedScratch(c *rocm.Ctx, key string, n int64) (rocm.DevPtr, error) {
	old := b.scratch[key]
	p, err := b.scratchBuf(c, key, n)
	if err != nil || (p == old.ptr && b.scratch[key].size == old.size) {
		return p, err
	}
	return p, c.MemsetD8Async(p, 0, int(b.scratch[key].size), b.stream)
}

// kernelType is the suffix of a type's kernels ("q4_k"), and whether the
// GPU reads that type at all.
func kernelType(t gguf.Type) (string, bool) {
	switch t {
	case gguf.TypeF32, gguf.TypeF16, gguf.TypeBF16,
		gguf.TypeQ4_0, gguf.TypeQ4_1, gguf.TypeQ5_0, gguf.TypeQ5_1, gguf.TypeQ8_0,
		gguf.TypeQ2_K, gguf.TypeQ3_K, gguf.TypeQ4_K, gguf.TypeQ5_K, gguf.TypeQ6_K,
		gguf.TypeIQ4_NL, gguf.TypeIQ4_XS, gguf.TypeMXFP4:
		return strings.ToLower(t.String()), true
	}
	return "", false
}

// Supported reports whether the GPU multiplies, embeds and dequantizes t.
func Supported(t gguf.Type) bool { _, ok := kernelType(t); return ok }

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// grid1 is a one-dimensional grid of 256-thread blocks covering n items
// with grid-stride loops past 65535 blocks.
func grid1(n int) rocm.Dim3 {
	g := ceilDiv(max(n, 1), 256)
	return rocm.D1(min(g, 65535))
}
