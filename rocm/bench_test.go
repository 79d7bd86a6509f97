package rocm

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/ebitengine/purego"
	"golang.org/x/sys/unix"
)

// Benchmarks on a GPU. Set-up (pinning GiBs, writing and registering a file)
// costs seconds, so it is done once per process and shared by every run of
// the copy benchmarks; TestMain frees it.
//
// $FORGE_BENCH_BYTES sets the copy size (default 2 GiB), $FORGE_BENCH_DIR the
// folder of the mmap'd file (default the temp dir).

const benchChunk = 64 << 20 // bytes per async copy; several are in flight

var bench struct {
	once    sync.Once
	err     error
	size    int
	pinned  *HostBuf
	dev     DevPtr
	streams [4]Stream
	mapped  []byte
	reg     *Registered
	regTime time.Duration
}

func benchEnv(b *testing.B) *Worker {
	w := gpu(b)
	bench.once.Do(func() {
		bench.size = 2 << 30
		if v, err := strconv.Atoi(os.Getenv("FORGE_BENCH_BYTES")); err == nil && v > 0 {
			bench.size = v &^ (benchChunk - 1)
		}
		bench.err = w.Do(context.Background(), func(c *Ctx) error {
			var err error
			if bench.pinned, err = c.HostAlloc(bench.size); err != nil {
				return err
			}
			randBytes(rand.New(rand.NewPCG(9, 9)), bench.pinned.Bytes())
			if bench.dev, err = c.Malloc(int64(bench.size)); err != nil {
				return err
			}
			for i := range bench.streams {
				if bench.streams[i], err = c.NewStream(); err != nil {
					return err
				}
			}
			return nil
		})
		if bench.err != nil || !w.Device.ReadOnlyRegister {
			return
		}
		// The file is written, then read once, so it sits in page cache as a
		// model file does on a second start.
		bench.mapped, _ = mapFile(b, os.Getenv("FORGE_BENCH_DIR"), bench.size, rand.New(rand.NewPCG(10, 10)))
		var sum byte // touch every page once
		for i := 0; i < len(bench.mapped); i += 4096 {
			sum += bench.mapped[i]
		}
		runtime.KeepAlive(sum)
		bench.err = w.Do(context.Background(), func(c *Ctx) error {
			t0 := time.Now()
			var err error
			bench.reg, err = c.Register(bench.mapped, true)
			bench.regTime = time.Since(t0)
			return err
		})
	})
	if bench.err != nil {
		b.Fatal(bench.err)
	}
	return w
}

func closeBench() {
	if shared.w == nil || bench.size == 0 {
		return
	}
	shared.w.Do(context.Background(), func(c *Ctx) error {
		c.Unregister(bench.reg)
		c.FreeHost(bench.pinned)
		c.Free(bench.dev, int64(bench.size))
		for _, s := range bench.streams {
			c.DestroyStream(s)
		}
		return nil
	})
	if bench.mapped != nil {
		unix.Munmap(bench.mapped)
	}
}

// h2d runs sub-benchmarks copying bench.size bytes from host address src to
// the device in chunks spread round-robin over 1 or 4 streams.
func h2d(b *testing.B, w *Worker, src uintptr) {
	for _, chunk := range []int{8 << 20, benchChunk, 512 << 20} {
		for _, streams := range []int{1, 4} {
			b.Run(fmt.Sprintf("chunk=%dMiB/streams=%d", chunk>>20, streams), func(b *testing.B) {
				h2dRun(b, w, src, chunk, bench.streams[:streams])
			})
		}
	}
}

func h2dRun(b *testing.B, w *Worker, src uintptr, chunk int, streams []Stream) {
	b.SetBytes(int64(bench.size))
	err := w.Do(context.Background(), func(c *Ctx) error {
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			for off, k := 0, 0; off < bench.size; off, k = off+chunk, k+1 {
				s := streams[k%len(streams)]
				if err := c.CopyHtoDAsync(bench.dev+DevPtr(off), src+uintptr(off), min(chunk, bench.size-off), s); err != nil {
					return err
				}
			}
			for _, s := range streams {
				if err := c.SyncStream(s); err != nil {
					return err
				}
			}
		}
		b.StopTimer()
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(bench.size)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
}

func BenchmarkH2DPinned(b *testing.B) {
	w := benchEnv(b)
	h2d(b, w, bench.pinned.Ptr)
}

func BenchmarkH2DRegisteredMmap(b *testing.B) {
	w := benchEnv(b)
	if bench.reg == nil {
		b.Skipf("%s: no read-only host registration", w.Device.Name)
	}
	b.Logf("registering the %d MiB mapping read-only took %v (%.1f GB/s)", bench.size>>20, bench.regTime, float64(bench.size)/bench.regTime.Seconds()/1e9)
	h2d(b, w, bench.reg.Ptr)
}

// Registering (page-locking) a page-cached, read-only mapping: the one-off
// cost the registered path pays instead of a staging copy.
func BenchmarkRegisterMmap(b *testing.B) {
	w := gpu(b)
	if !w.Device.ReadOnlyRegister {
		b.Skipf("%s: no read-only host registration", w.Device.Name)
	}
	const size = 512 << 20
	m, _ := mapFile(b, os.Getenv("FORGE_BENCH_DIR"), size, rand.New(rand.NewPCG(12, 12)))
	defer unix.Munmap(m)
	b.SetBytes(size)
	do(b, w, func(c *Ctx) error {
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			r, err := c.Register(m, true)
			if err != nil {
				return err
			}
			if err := c.Unregister(r); err != nil {
				return err
			}
		}
		b.StopTimer()
		return nil
	})
	b.ReportMetric(float64(size)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
}

// The slow path, for comparison: synchronous copies from ordinary Go memory.
func BenchmarkH2DPageable(b *testing.B) {
	w := benchEnv(b)
	const n = 256 << 20
	src := make([]byte, n)
	randBytes(rand.New(rand.NewPCG(11, 11)), src)
	b.SetBytes(n)
	do(b, w, func(c *Ctx) error {
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if err := c.CopyHtoD(bench.dev, src); err != nil {
				return err
			}
		}
		b.StopTimer()
		return nil
	})
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
}

func benchKernel(b *testing.B, c *Ctx, name string) (*Module, Function) {
	mod, err := loadTestModule(b, c, b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	f, err := c.Function(mod, name)
	if err != nil {
		b.Fatal(err)
	}
	return mod, f
}

// One op = one kernel launched directly; synchronised once at the end, so
// ns/op is the sustained cost per launch.
func BenchmarkLaunchDirect(b *testing.B) {
	w := gpu(b)
	do(b, w, func(c *Ctx) error {
		mod, f := benchKernel(b, c, "empty")
		defer c.UnloadModule(mod)
		s, err := c.NewStream()
		if err != nil {
			return err
		}
		defer c.DestroyStream(s)
		var a Args
		a.I32(1)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if err := c.Launch(f, D1(1), D1(32), 0, s, &a); err != nil {
				return err
			}
		}
		err = c.SyncStream(s)
		b.StopTimer()
		return err
	})
}

// One op = one kernel inside a replayed graph of graphKernels launches.
func BenchmarkLaunchGraph(b *testing.B) {
	const graphKernels = 256
	w := gpu(b)
	do(b, w, func(c *Ctx) error {
		mod, f := benchKernel(b, c, "empty")
		defer c.UnloadModule(mod)
		s, err := c.NewStream()
		if err != nil {
			return err
		}
		defer c.DestroyStream(s)
		var a Args
		a.I32(1)
		if err := c.BeginCapture(s); err != nil {
			return err
		}
		for i := 0; i < graphKernels; i++ {
			if err := c.Launch(f, D1(1), D1(32), 0, s, &a); err != nil {
				c.EndCapture(s)
				return err
			}
		}
		g, err := c.EndCapture(s)
		if err != nil {
			return err
		}
		defer c.DestroyGraph(g)
		b.ResetTimer()
		for i := 0; i < b.N; i += graphKernels {
			if err := c.LaunchGraph(g, s); err != nil {
				return err
			}
		}
		err = c.SyncStream(s)
		b.StopTimer()
		return err
	})
}

// Host cost of recording an event (a hot-path call through SyscallN).
func BenchmarkEventRecord(b *testing.B) {
	w := gpu(b)
	do(b, w, func(c *Ctx) error {
		s, err := c.NewStream()
		if err != nil {
			return err
		}
		defer c.DestroyStream(s)
		e, err := c.NewEvent(false)
		if err != nil {
			return err
		}
		defer c.DestroyEvent(e)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if err := c.Record(e, s); err != nil {
				return err
			}
		}
		b.StopTimer()
		return c.SyncStream(s)
	})
}

// Round trip of Worker.Do from another goroutine, parking at once versus
// polling first (DefaultSpin).
func BenchmarkWorkerDo(b *testing.B) {
	w := gpu(b)
	ctx := context.Background()
	nop := func(*Ctx) error { return nil }
	for _, spin := range []time.Duration{0, 10 * time.Microsecond, 50 * time.Microsecond} {
		b.Run("spin="+spin.String(), func(b *testing.B) {
			w.SetSpin(spin)
			defer w.SetSpin(DefaultSpin)
			for i := 0; i < b.N; i++ {
				if err := w.Do(ctx, nop); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// The cost of one trivial driver call (cuDriverGetVersion) through a direct
// purego.SyscallN versus a purego.RegisterFunc wrapper (reflection): why the
// hot paths use SyscallN.
func BenchmarkCallOverhead(b *testing.B) {
	w := gpu(b)
	rt := w.rt
	b.Run("SyscallN", func(b *testing.B) {
		var v int32
		for i := 0; i < b.N; i++ {
			purego.SyscallN(rt.driverVersion, uintptr(unsafe.Pointer(&v)))
		}
	})
	b.Run("RegisterFunc", func(b *testing.B) {
		var fn func(*int32) int32
		purego.RegisterFunc(&fn, rt.driverVersion)
		var v int32
		for i := 0; i < b.N; i++ {
			fn(&v)
		}
	})
}

// Compiling the test kernel with nvrtc/hiprtc (a cache miss) …
func BenchmarkCompileMiss(b *testing.B) {
	w := gpu(b)
	comp, err := w.NewCompiler(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	src := testSource(b)
	for i := 0; i < b.N; i++ {
		// A distinct define per iteration defeats the cache.
		if _, hit, err := comp.Compile(src, "saxpy.cu", []string{fmt.Sprintf("-DITER=%d", i)}); err != nil || hit {
			b.Fatal(hit, err)
		}
	}
}

// … versus a second start: cache hit and module load.
func BenchmarkCompileHitLoad(b *testing.B) {
	w := gpu(b)
	dir := b.TempDir()
	src := testSource(b)
	warm, err := w.NewCompiler(dir)
	if err != nil {
		b.Fatal(err)
	}
	if _, _, err := warm.Compile(src, "saxpy.cu", nil); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		comp, _ := w.NewCompiler(dir)
		code, hit, err := comp.Compile(src, "saxpy.cu", nil)
		if err != nil || !hit {
			b.Fatal(hit, err)
		}
		do(b, w, func(c *Ctx) error {
			m, err := c.LoadModule(code)
			if err != nil {
				return err
			}
			if _, err := c.Function(m, "saxpy"); err != nil {
				return err
			}
			return c.UnloadModule(m)
		})
	}
}
