package rocm

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// EnvRequireGPU turns "no GPU" from a skip into a failure: set it on the GPU
// machine so a missing driver cannot pass as a skipped run.
const EnvRequireGPU = "FORGE_REQUIRE_GPU"

var shared struct {
	once           sync.Once
	w              *Worker
	err            error
	openT, workerT time.Duration // driver load + init, context creation
}

func TestMain(m *testing.M) {
	if dir := os.Getenv(envCacheChild); dir != "" {
		os.Exit(cacheChild(dir))
	}
	code := m.Run()
	closeBench()
	if shared.w != nil {
		shared.w.Close()
	}
	os.Exit(code)
}

// gpu returns the package's shared worker on device 0, or skips the test
// naming every library and device it looked for.
func gpu(t testing.TB) *Worker {
	t.Helper()
	shared.once.Do(func() {
		var rt *Runtime
		t0 := time.Now()
		rt, shared.err = OpenAny()
		shared.openT = time.Since(t0)
		if shared.err == nil {
			shared.w, shared.err = rt.NewWorker(0)
			shared.workerT = time.Since(t0) - shared.openT
		}
	})
	if shared.err != nil {
		if os.Getenv(EnvRequireGPU) != "" {
			t.Fatalf("GPU required ($%s set): %v", EnvRequireGPU, shared.err)
		}
		t.Skipf("no GPU (set $%s to fail instead): %v", EnvRequireGPU, shared.err)
	}
	return shared.w
}

// do runs fn on w and fails the test on error.
func do(t testing.TB, w *Worker, fn func(*Ctx) error) {
	t.Helper()
	if err := w.Do(context.Background(), fn); err != nil {
		t.Fatal(err)
	}
}

// noLeaks fails the test if it ends holding more driver objects than at its
// start.
func noLeaks(t *testing.T) {
	before := Live()
	t.Cleanup(func() {
		if after := Live(); after != before {
			t.Errorf("leaked driver objects: before %+v, after %+v", before, after)
		}
	})
}

func randBytes(r *rand.Rand, b []byte) {
	for i := 0; i+8 <= len(b); i += 8 {
		*(*uint64)(unsafe.Pointer(&b[i])) = r.Uint64()
	}
	for i := len(b) &^ 7; i < len(b); i++ {
		b[i] = byte(r.Uint32())
	}
}

func f32s(b []byte) []float32 { return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4) }
func u32s(b []byte) []uint32  { return unsafe.Slice((*uint32)(unsafe.Pointer(&b[0])), len(b)/4) }

func TestDiscovery(t *testing.T) {
	w := gpu(t)
	devs, err := w.rt.Devices()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range devs {
		t.Logf("%v (cc %d.%d, L2 %d KiB, read-only register %v)", d, d.CCMajor, d.CCMinor, d.L2Bytes>>10, d.ReadOnlyRegister)
		if d.Name == "" || d.Arch == "" || d.Memory < 1<<30 || d.SMs <= 0 || (d.WarpSize != 32 && d.WarpSize != 64) {
			t.Errorf("implausible device properties: %+v", d)
		}
	}
	c, err := Choose(Selection{Kind: SelectAuto})
	if err != nil || c.CPU || c.Device.Name != devs[0].Name {
		t.Fatalf("auto with a GPU: %+v %v", c, err)
	}
	if _, err := Choose(Selection{Kind: SelectGPU, Ordinal: len(devs)}); err == nil {
		t.Fatalf("gpu:%d accepted with %d devices", len(devs), len(devs))
	}
	t.Logf("driver %s version %d; opening it took %v, the worker's context %v", w.rt.LibraryPath(), w.rt.Version, shared.openT, shared.workerT)
	do(t, w, func(c *Ctx) error {
		free, total, err := c.MemInfo()
		t.Logf("memory: %d MiB free of %d MiB", free>>20, total>>20)
		if err == nil && (free == 0 || free > total) {
			err = fmt.Errorf("implausible MemInfo %d/%d", free, total)
		}
		return err
	})
}

// Every Do runs on the same OS thread, whichever goroutine calls it.
func TestWorkerThread(t *testing.T) {
	w := gpu(t)
	var tid int
	do(t, w, func(*Ctx) error { tid = unix.Gettid(); return nil })
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 4; j++ {
				errs <- w.Do(context.Background(), func(*Ctx) error {
					if got := unix.Gettid(); got != tid {
						return fmt.Errorf("ran on thread %d, want %d", got, tid)
					}
					return nil
				})
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Do(context.Background(), func(*Ctx) error { panic("boom") }); err == nil {
		t.Fatal("a panic inside Do must come back as an error")
	}
	do(t, w, func(*Ctx) error { return nil }) // the worker survived it
}

func TestWorkerClose(t *testing.T) {
	w := gpu(t)
	w2, err := w.rt.NewWorker(0)
	if err != nil {
		t.Fatal(err)
	}
	before := Live().Contexts
	w2.Close()
	w2.Close()
	if Live().Contexts != before-1 {
		t.Fatalf("context not destroyed: %d → %d", before, Live().Contexts)
	}
	if err := w2.Do(context.Background(), func(*Ctx) error { return nil }); err != ErrClosed {
		t.Fatalf("Do after Close: %v", err)
	}
}

// Arena regions, pinned buffers, async H2D / D2D / D2H copies and memsets.
func TestArenaPinnedCopies(t *testing.T) {
	w := gpu(t)
	noLeaks(t)
	const n = 8<<20 + 12 // not a multiple of anything nice
	r := rand.New(rand.NewPCG(1, uint64(os.Getpid())))
	do(t, w, func(c *Ctx) error {
		arena, err := c.NewArena(64 << 20)
		if err != nil {
			return err
		}
		defer c.FreeArena(arena)
		src, err := c.HostAlloc(n)
		if err != nil {
			return err
		}
		defer c.FreeHost(src)
		dst, err := c.HostAlloc(3 * n)
		if err != nil {
			return err
		}
		defer c.FreeHost(dst)
		s, err := c.NewStream()
		if err != nil {
			return err
		}
		defer c.DestroyStream(s)
		a, _ := arena.Alloc("a", n, 0)
		b, _ := arena.Alloc("b", n, 0)
		m, err := arena.Alloc("m", n, 4096)
		if err != nil {
			return err
		}
		if m.Ptr%4096 != 0 || b.Off < a.Off+a.Size || m.Off < b.Off+b.Size {
			return fmt.Errorf("bad carving %+v %+v %+v", a, b, m)
		}
		randBytes(r, src.Bytes())
		randBytes(r, dst.Bytes()) // poison
		steps := []error{
			c.CopyHtoDAsync(a.Ptr, src.Ptr, n, s),
			c.CopyDtoDAsync(b.Ptr, a.Ptr, n, s),
			c.MemsetD8Async(m.Ptr, 0xA5, n, s),
			c.MemsetD32Async(m.Ptr, 0xDEADBEEF, 1024, s),
			c.CopyDtoHAsync(dst.Ptr, a.Ptr, n, s),
			c.CopyDtoHAsync(dst.Ptr+n, b.Ptr, n, s),
			c.CopyDtoHAsync(dst.Ptr+2*n, m.Ptr, n, s),
			c.SyncStream(s),
		}
		for _, e := range steps {
			if e != nil {
				return e
			}
		}
		got := dst.Bytes()
		want := src.Bytes()
		if string(got[:n]) != string(want) || string(got[n:2*n]) != string(want) {
			return fmt.Errorf("H2D/D2D/D2H round trip differs")
		}
		for i, v := range u32s(got[2*n : 2*n+4096]) {
			if v != 0xDEADBEEF {
				return fmt.Errorf("memset32 word %d = %#x", i, v)
			}
		}
		for i, v := range got[2*n+4096 : 3*n] {
			if v != 0xA5 {
				return fmt.Errorf("memset8 byte %d = %#x", i, v)
			}
		}
		// Synchronous copies from Go memory.
		back := make([]byte, 4096)
		if err := c.CopyHtoD(a.Ptr, want[:4096]); err != nil {
			return err
		}
		if err := c.CopyDtoH(back, a.Ptr); err != nil {
			return err
		}
		if string(back) != string(want[:4096]) {
			return fmt.Errorf("sync copy differs")
		}
		return nil
	})
}

// mapFile writes size random bytes to a temp file and maps it read-only, as
// forge maps a GGUF file.
func mapFile(t testing.TB, dir string, size int, r *rand.Rand) (mapped, want []byte) {
	f, err := os.CreateTemp(dir, "forge-rocm-*.bin")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4<<20)
	randBytes(r, buf)
	want = make([]byte, 0, size)
	for len(want) < size {
		k := min(len(buf), size-len(want))
		buf[0]++ // make each chunk differ
		if _, err := f.Write(buf[:k]); err != nil {
			t.Fatal(err)
		}
		want = append(want, buf[:k]...)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(f.Name())
	return m, want
}

func TestRegisteredMmap(t *testing.T) {
	w := gpu(t)
	if !w.Device.ReadOnlyRegister {
		t.Skipf("%s does not support read-only host registration", w.Device.Name)
	}
	noLeaks(t)
	const size = 32<<20 + 4096
	m, want := mapFile(t, t.TempDir(), size, rand.New(rand.NewPCG(2, uint64(os.Getpid()))))
	defer unix.Munmap(m)
	do(t, w, func(c *Ctx) error {
		reg, err := c.Register(m, true)
		if err != nil {
			return err
		}
		defer c.Unregister(reg)
		d, err := c.Malloc(size)
		if err != nil {
			return err
		}
		defer c.Free(d, size)
		out, err := c.HostAlloc(size)
		if err != nil {
			return err
		}
		defer c.FreeHost(out)
		s, err := c.NewStream()
		if err != nil {
			return err
		}
		defer c.DestroyStream(s)
		// Several chunks in flight, as the uploader does.
		const chunk = 4 << 20
		for off := 0; off < size; off += chunk {
			k := min(chunk, size-off)
			if err := c.CopyHtoDAsync(d+DevPtr(off), reg.Ptr+uintptr(off), k, s); err != nil {
				return err
			}
		}
		if err := c.CopyDtoHAsync(out.Ptr, d, size, s); err != nil {
			return err
		}
		if err := c.SyncStream(s); err != nil {
			return err
		}
		if string(out.Bytes()) != string(want) {
			return fmt.Errorf("copy from registered mmap differs")
		}
		return nil
	})
}

// loadTestModule compiles testdata/saxpy.cu for w's device (through the cache
// in dir) and loads it.
func loadTestModule(t testing.TB, c *Ctx, dir string) (*Module, error) {
	comp, err := c.w.NewCompiler(dir)
	if err != nil {
		return nil, err
	}
	code, _, err := comp.Compile(testSource(t), "saxpy.cu", nil)
	if err != nil {
		return nil, err
	}
	return c.LoadModule(code)
}

func relErr(got []float32, want []float64) float64 {
	var num, den float64
	for i := range want {
		d := float64(got[i]) - want[i]
		if math.IsNaN(float64(got[i])) {
			return math.Inf(1)
		}
		num += d * d
		den += want[i] * want[i]
	}
	return math.Sqrt(num / den)
}

// saxpy on fresh random data, checked against float64 on the CPU.
func TestLaunchSaxpy(t *testing.T) {
	w := gpu(t)
	noLeaks(t)
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(3, uint64(os.Getpid())))
	for _, n := range []int{1, 1000, 1 << 20, 3<<20 + 7} {
		do(t, w, func(c *Ctx) error {
			mod, err := loadTestModule(t, c, dir)
			if err != nil {
				return err
			}
			defer c.UnloadModule(mod)
			// Where the driver lists a module's functions, every kernel of
			// the source is loaded up front.
			nfn, err := c.LoadFunctions(mod)
			if err != nil {
				return err
			}
			if want := strings.Count(testSource(t), "__global__"); c.funcLoad != 0 && nfn != want {
				return fmt.Errorf("LoadFunctions loaded %d kernels, the source has %d", nfn, want)
			}
			f, err := c.Function(mod, "saxpy")
			if err != nil {
				return err
			}
			if _, err := c.Function(mod, "no_such_kernel"); err == nil {
				return fmt.Errorf("missing kernel found")
			}
			host, err := c.HostAlloc(8 * n)
			if err != nil {
				return err
			}
			defer c.FreeHost(host)
			arena, err := c.NewArena(int64(8*n + 1024))
			if err != nil {
				return err
			}
			defer c.FreeArena(arena)
			x, _ := arena.Alloc("x", int64(4*n), 0)
			y, _ := arena.Alloc("y", int64(4*n), 0)
			hx, hy := f32s(host.Bytes()[:4*n]), f32s(host.Bytes()[4*n:])
			a := r.Float32()*4 - 2
			want := make([]float64, n)
			for i := range hx {
				hx[i], hy[i] = float32(r.NormFloat64()), float32(r.NormFloat64())
				want[i] = float64(a)*float64(hx[i]) + float64(hy[i])
			}
			s, err := c.NewStream()
			if err != nil {
				return err
			}
			defer c.DestroyStream(s)
			if err := c.CopyHtoDAsync(x.Ptr, host.Ptr, 4*n, s); err != nil {
				return err
			}
			if err := c.CopyHtoDAsync(y.Ptr, host.Ptr+uintptr(4*n), 4*n, s); err != nil {
				return err
			}
			var args Args
			args.F32(a).Ptr(x.Ptr).Ptr(y.Ptr).I32(int32(n))
			if err := c.Launch(f, D1((n+255)/256), D1(256), 0, s, &args); err != nil {
				return err
			}
			// The H2D copies read hy asynchronously: wait before poisoning it.
			if err := c.SyncStream(s); err != nil {
				return err
			}
			for i := range hy {
				hy[i] = float32(math.NaN()) // poison
			}
			if err := c.CopyDtoHAsync(host.Ptr+uintptr(4*n), y.Ptr, 4*n, s); err != nil {
				return err
			}
			if err := c.SyncStream(s); err != nil {
				return err
			}
			if e := relErr(hy, want); e > 1e-6 {
				return fmt.Errorf("n=%d: saxpy relative error %g", n, e)
			}
			return nil
		})
	}
}

// Stream s2 waits on an event recorded on s1 behind a large copy; the kernel
// on s2 must see the copied data. Timing events measure it.
func TestEventsStreamWait(t *testing.T) {
	w := gpu(t)
	noLeaks(t)
	const n = 16 << 20 // words
	r := rand.New(rand.NewPCG(4, uint64(os.Getpid())))
	do(t, w, func(c *Ctx) error {
		mod, err := loadTestModule(t, c, t.TempDir())
		if err != nil {
			return err
		}
		defer c.UnloadModule(mod)
		f, err := c.Function(mod, "affine_u32")
		if err != nil {
			return err
		}
		host, err := c.HostAlloc(8 * n)
		if err != nil {
			return err
		}
		defer c.FreeHost(host)
		in, out := u32s(host.Bytes()[:4*n]), u32s(host.Bytes()[4*n:])
		for i := range in {
			in[i] = r.Uint32()
			out[i] = 0xFFFFFFFF
		}
		d, err := c.Malloc(8 * n)
		if err != nil {
			return err
		}
		defer c.Free(d, 8*n)
		s1, err := c.NewStream()
		if err != nil {
			return err
		}
		defer c.DestroyStream(s1)
		s2, err := c.NewStream()
		if err != nil {
			return err
		}
		defer c.DestroyStream(s2)
		copied, err := c.NewEvent(false)
		if err != nil {
			return err
		}
		defer c.DestroyEvent(copied)
		t0, _ := c.NewEvent(true)
		defer c.DestroyEvent(t0)
		t1, _ := c.NewEvent(true)
		defer c.DestroyEvent(t1)
		// Poison the output region, then fill it after the wait.
		if err := c.MemsetD8Async(d+4*n, 0, 4*n, s2); err != nil {
			return err
		}
		if err := c.SyncStream(s2); err != nil {
			return err
		}
		if err := c.Record(t0, s1); err != nil {
			return err
		}
		if err := c.CopyHtoDAsync(d, host.Ptr, 4*n, s1); err != nil {
			return err
		}
		if err := c.Record(copied, s1); err != nil {
			return err
		}
		if err := c.WaitEvent(s2, copied); err != nil {
			return err
		}
		var args Args
		args.Ptr(d).Ptr(d + 4*n).I32(n)
		if err := c.Launch(f, D1(n/256), D1(256), 0, s2, &args); err != nil {
			return err
		}
		if err := c.Record(t1, s2); err != nil {
			return err
		}
		if err := c.CopyDtoHAsync(host.Ptr+4*n, d+4*n, 4*n, s2); err != nil {
			return err
		}
		if err := c.SyncEvent(t1); err != nil {
			return err
		}
		if err := c.SyncStream(s2); err != nil {
			return err
		}
		done, err := c.Query(copied)
		if err != nil || !done {
			return fmt.Errorf("event not complete after sync: %v %v", done, err)
		}
		ms, err := c.Elapsed(t0, t1)
		if err != nil {
			return err
		}
		if !(ms > 0) {
			return fmt.Errorf("elapsed %v ms", ms)
		}
		t.Logf("64 MiB copy + kernel across two streams: %.3f ms", ms)
		for i := range in {
			if out[i] != in[i]*2+1 {
				return fmt.Errorf("word %d: got %d want %d", i, out[i], in[i]*2+1)
			}
		}
		return nil
	})
}

// Capture saxpy into a graph and replay it k times: y = y0 + k·a·x.
func TestGraphCaptureReplay(t *testing.T) {
	w := gpu(t)
	noLeaks(t)
	const n, k = 1 << 16, 7
	r := rand.New(rand.NewPCG(5, uint64(os.Getpid())))
	do(t, w, func(c *Ctx) error {
		mod, err := loadTestModule(t, c, t.TempDir())
		if err != nil {
			return err
		}
		defer c.UnloadModule(mod)
		f, _ := c.Function(mod, "saxpy")
		host, err := c.HostAlloc(8 * n)
		if err != nil {
			return err
		}
		defer c.FreeHost(host)
		hx, hy := f32s(host.Bytes()[:4*n]), f32s(host.Bytes()[4*n:])
		a := r.Float32() + 0.5
		want := make([]float64, n)
		for i := range hx {
			hx[i], hy[i] = float32(r.NormFloat64()), float32(r.NormFloat64())
			want[i] = float64(hy[i]) + k*float64(a)*float64(hx[i])
		}
		d, err := c.Malloc(8 * n)
		if err != nil {
			return err
		}
		defer c.Free(d, 8*n)
		s, err := c.NewStream()
		if err != nil {
			return err
		}
		defer c.DestroyStream(s)
		if err := c.CopyHtoDAsync(d, host.Ptr, 8*n, s); err != nil {
			return err
		}
		if err := c.SyncStream(s); err != nil {
			return err
		}
		if err := c.BeginCapture(s); err != nil {
			return err
		}
		var args Args
		args.F32(a).Ptr(d).Ptr(d + 4*n).I32(n)
		lerr := c.Launch(f, D1(n/256), D1(256), 0, s, &args)
		g, err := c.EndCapture(s)
		if lerr != nil {
			return lerr
		}
		if err != nil {
			return err
		}
		defer c.DestroyGraph(g)
		for i := 0; i < k; i++ {
			if err := c.LaunchGraph(g, s); err != nil {
				return err
			}
		}
		for i := range hy {
			hy[i] = float32(math.NaN())
		}
		if err := c.CopyDtoHAsync(host.Ptr+4*n, d+4*n, 4*n, s); err != nil {
			return err
		}
		if err := c.SyncStream(s); err != nil {
			return err
		}
		if e := relErr(hy, want); e > 1e-5 {
			return fmt.Errorf("graph replayed %d times: relative error %g", k, e)
		}
		return nil
	})
}

const envCacheChild = "FORGE_ROCM_CACHE_CHILD"

// cacheChild is a second process compiling the test kernel: it prints
// whether it hit the cache left by its parent.
func cacheChild(dir string) int {
	var b Backend
	var arch string
	var driver int
	fmt.Sscanf(os.Getenv(envCacheChild+"_KEY"), "%d %s %d", &b, &arch, &driver)
	c, err := NewCompiler(b, arch, dir, driver)
	if err != nil {
		fmt.Println("child:", err)
		return 1
	}
	code, hit, err := c.Compile(saxpySource, "saxpy.cu", nil)
	if err != nil {
		fmt.Println("child:", err)
		return 1
	}
	fmt.Printf("cache-hit=%v bytes=%d\n", hit, len(code))
	return 0
}

// Compile once, then again from a second Compiler and from a second process:
// both must be cache hits returning the same code, and the code must load.
func TestCompileCacheDevice(t *testing.T) {
	w := gpu(t)
	noLeaks(t)
	dir := t.TempDir()
	c1, err := w.NewCompiler(dir)
	if err != nil {
		t.Fatal(err)
	}
	maj, min := c1.CompilerVersion()
	t.Logf("%s compiler %d.%d for %s, cache %s", c1.Backend, maj, min, c1.Arch, dir)
	code1, hit, err := c1.Compile(testSource(t), "saxpy.cu", nil)
	if err != nil || hit {
		t.Fatalf("first compile: hit=%v %v", hit, err)
	}
	c2, _ := w.NewCompiler(dir)
	code2, hit, err := c2.Compile(testSource(t), "saxpy.cu", nil)
	if err != nil || !hit || string(code1) != string(code2) {
		t.Fatalf("second compiler: hit=%v err=%v", hit, err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), envCacheChild+"="+dir, fmt.Sprintf("%s_KEY=%d %s %d", envCacheChild, c1.Backend, c1.Arch, c1.Driver))
	out, err := cmd.CombinedOutput()
	if err != nil || !containsLine(string(out), fmt.Sprintf("cache-hit=true bytes=%d", len(code1))) {
		t.Fatalf("second process: %v\n%s", err, out)
	}
	do(t, w, func(c *Ctx) error {
		m, err := c.LoadModule(code2)
		if err != nil {
			return err
		}
		return c.UnloadModule(m)
	})
}

func containsLine(out, line string) bool {
	for _, l := range strings.Split(out, "\n") {
		if strings.TrimSpace(l) == line {
			return true
		}
	}
	return false
}

// A failing call reports the library's error name and text and the call.
func TestErrorsNameTheCall(t *testing.T) {
	w := gpu(t)
	noLeaks(t)
	err := w.Do(context.Background(), func(c *Ctx) error {
		_, err := c.Malloc(1 << 52) // 4 PiB
		return err
	})
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("want *Error, got %v", err)
	}
	wantCall, wantName := "cuMemAlloc_v2", "CUDA_ERROR_OUT_OF_MEMORY"
	if e.Backend == HIP {
		wantCall, wantName = "hipMalloc", "hipErrorOutOfMemory"
	}
	if e.Call != wantCall || e.Name != wantName || e.Text == "" || !strings.Contains(err.Error(), "4503599627370496 bytes") {
		t.Fatalf("error lacks call/name/text/size: %v (%+v)", err, e)
	}
	t.Logf("%v", err)
	// A hot-path call names its call too.
	err = w.Do(context.Background(), func(c *Ctx) error {
		return c.WaitEvent(0, 0) // null event: rejected before anything is queued
	})
	if !errors.As(err, &e) || !strings.Contains(e.Call, "StreamWaitEvent") {
		t.Fatalf("hot-path error: %v", err)
	}
	t.Logf("%v", err)
}
