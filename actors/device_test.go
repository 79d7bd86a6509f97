package actors

import (
	"bytes"
	"context"
	"errors"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/rocm"
)

// TestGaps: the parts of a page range that earlier registration ranges do
// not cover (the driver refuses overlapping registrations), and merging a
// range into the covered set.
func TestGaps(t *testing.T) {
	covered := []span{{10, 20}, {30, 40}, {40, 50}}
	for _, c := range []struct {
		lo, hi uintptr
		want   []span
	}{
		{0, 10, []span{{0, 10}}},
		{0, 15, []span{{0, 10}}},
		{12, 18, nil},
		{15, 35, []span{{20, 30}}},
		{5, 60, []span{{5, 10}, {20, 30}, {50, 60}}},
		{50, 60, []span{{50, 60}}},
		{45, 55, []span{{50, 55}}},
	} {
		if got := gaps(covered, c.lo, c.hi); !slices.Equal(got, c.want) {
			t.Errorf("[%d, %d): got %v, want %v", c.lo, c.hi, got, c.want)
		}
	}
	if got := gaps(nil, 4096, 8192); !slices.Equal(got, []span{{4096, 8192}}) {
		t.Errorf("nothing covered: got %v", got)
	}
	for _, c := range []struct {
		add  span
		want []span
	}{
		{span{0, 5}, []span{{0, 5}, {10, 20}, {30, 40}, {40, 50}}},
		{span{20, 30}, []span{{10, 50}}},
		{span{15, 35}, []span{{10, 50}}}, // touching spans merge
		{span{60, 70}, []span{{10, 20}, {30, 40}, {40, 50}, {60, 70}}},
		{span{5, 55}, []span{{5, 55}}},
	} {
		in := slices.Clone(covered)
		if got := insertSpan(in, c.add); !slices.Equal(got, c.want) {
			t.Errorf("insert %v: got %v, want %v", c.add, got, c.want)
		}
	}
}

// gpuWorker returns a worker on GPU 0, or skips (fails with
// FORGE_REQUIRE_GPU=1) without one.
func gpuWorker(t testing.TB) *rocm.Worker {
	t.Helper()
	rt, err := rocm.OpenAny()
	var w *rocm.Worker
	if err == nil {
		w, err = rt.NewWorker(0)
	}
	if err != nil {
		if os.Getenv("FORGE_REQUIRE_GPU") == "1" {
			t.Fatalf("no GPU, and FORGE_REQUIRE_GPU=1: %v", err)
		}
		t.Skipf("no GPU (set FORGE_REQUIRE_GPU=1 to make this a failure): %v", err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

// TestDeviceUploaderRoundTrip uploads every tensor of a real file in odd
// chunks (neighbouring chunks share pages) through the staging ring (the
// default), from the registered mapping (Register), and as Lazy does
// (Register without Ahead: the ring), waits on the unit fences and reads
// the arena back: the device holds the file's bytes, and Release leaves
// no driver object behind.
func TestDeviceUploaderRoundTrip(t *testing.T) {
	w := gpuWorker(t)
	for _, mode := range []string{"staging", "register", "lazy"} {
		f, err := gguf.Open(testmodels.Path(t, "stories260K-Q4_0.gguf"))
		if err != nil {
			t.Fatal(err)
		}
		p, err := NewPlan(f, 5)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Convert(Conversion{}); err != nil {
			t.Fatal(err)
		}
		live := rocm.Live()
		mem := NewMemory(0)
		// Small ring buffers and registration ranges: chunks cross
		// buffers and ranges, and neighbouring tensors share pages.
		d := &DeviceUploader{W: w, Mem: mem, Register: mode != "staging", Ahead: mode != "lazy",
			RingBuffers: 3, RingBytes: 1 << 12, RegBytes: 3 << 12, Stagers: 3, RegThreads: 2}
		if err := d.Reserve(p); err != nil {
			t.Fatal(err)
		}
		for _, u := range p.Units {
			for _, tn := range u.Tensors {
				if tn.src, err = f.TensorData(tn.Info); err != nil {
					t.Fatal(err)
				}
				const chunk = 3000 // not a page multiple
				for off := int64(0); off < tn.OutBytes; off += chunk {
					end := min(off+chunk, tn.OutBytes)
					if err := d.Upload(tn, off, tn.src[off:end]); err != nil {
						t.Fatalf("%s: %v", mode, err)
					}
				}
			}
			fence, err := d.Flush(u)
			if err != nil {
				t.Fatal(err)
			}
			if fence.Event() == 0 {
				t.Errorf("%s: fence has no event", u.Name())
			}
			if err := fence.Wait(context.Background()); err != nil {
				t.Fatalf("%s: %s: %v", mode, u.Name(), err)
			}
			if !fence.Done() {
				t.Errorf("%s: fence not done after Wait", u.Name())
			}
		}
		for name, tn := range p.ByName {
			wt, ok := d.Weight(name)
			if !ok || wt.Dev == 0 {
				t.Fatalf("%s: no device weight", name)
			}
			got := make([]byte, tn.OutBytes)
			if err := w.Do(context.Background(), func(c *rocm.Ctx) error { return c.CopyDtoH(got, rocm.DevPtr(wt.Dev)) }); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, tn.src) {
				t.Errorf("%s: %s: device bytes differ from the file", mode, name)
			}
		}
		if mem.InUse() == 0 {
			t.Errorf("arena not accounted")
		}
		st := d.Stats()
		t.Logf("%s: %d registrations (%d bytes) for %d tensors, %d bytes staged, %d copies", mode, st.Registrations, st.RegisteredBytes, len(p.ByName), st.StagedBytes, st.CopyCalls)
		reg := mode == "register" && w.Device.Backend == rocm.CUDA && w.Device.ReadOnlyRegister
		if reg != (st.Registrations > 0) || reg == (st.StagedBytes > 0) {
			t.Errorf("%s: registered path expected: %v; %+v", mode, reg, st)
		}
		d.Release()
		d.Release() // twice is harmless
		if mem.InUse() != 0 {
			t.Errorf("%d bytes accounted after Release", mem.InUse())
		}
		if after := rocm.Live(); after != live {
			t.Errorf("driver objects after Release %+v, before %+v", after, live)
		}
		f.Close()
	}
}

// TestDeviceUploaderOutOfMemory: an arena past the Memory limit fails
// Reserve with ErrOutOfMemory, and Release after it is safe.
func TestDeviceUploaderOutOfMemory(t *testing.T) {
	w := gpuWorker(t)
	f, err := gguf.Open(testmodels.Path(t, "stories260K-Q4_0.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p, err := NewPlan(f, 5)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Convert(Conversion{}); err != nil {
		t.Fatal(err)
	}
	live := rocm.Live()
	d := &DeviceUploader{W: w, Mem: NewMemory(1 << 10)}
	if err := d.Reserve(p); err == nil || !errors.Is(err, ErrOutOfMemory) {
		t.Errorf("Reserve: %v, want out of memory", err)
	}
	d.Release()
	if after := rocm.Live(); after != live {
		t.Errorf("driver objects after Release %+v, before %+v", after, live)
	}
}

// BenchmarkDeviceRates measures, on the file FORGE_BIG_MODEL names (in page
// cache), the host-side steps the uploader is built from, each on a fresh
// mapping (no page table entries yet, as in a new process): paging the
// mapping in (MADV_POPULATE_READ), registering it read-only (with and
// without the pages mapped first), copying it into pinned memory, pinning
// staging memory, and the copy to the device from registered ranges.
// Figures, not assertions, so a benchmark: they say what bounds the load.
// Run it once, with -test.bench DeviceRates -test.benchtime 1x
// (bench/device.sh load); each iteration repeats every measurement.
func BenchmarkDeviceRates(b *testing.B) {
	path := os.Getenv("FORGE_BIG_MODEL")
	if path == "" {
		b.Skip("FORGE_BIG_MODEL is not set")
	}
	w := gpuWorker(b)
	for b.Loop() {
		deviceRates(b, w, path)
	}
}

// deviceRates is one round of BenchmarkDeviceRates's measurements.
func deviceRates(t testing.TB, w *rocm.Worker, path string) {
	fd, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	st, err := fd.Stat()
	if err != nil {
		t.Fatal(err)
	}
	size := int(st.Size()) &^ (osPage - 1)
	const piece = 64 << 20
	mapping := func() []byte {
		b, err := unix.Mmap(int(fd.Fd()), 0, size, unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	rate := func(d time.Duration) float64 { return float64(size) / d.Seconds() / 1e9 }
	pieceOf := func(m []byte, i int) []byte { return m[i*piece : min((i+1)*piece, size)] }

	// Paging in.
	for _, n := range []int{1, 4, 8, 16} {
		m := mapping()
		d := overPieces(size, piece, n, func(_, i int) error { return pageIn(pieceOf(m, i)) })
		t.Logf("RATE populate %2d threads: %6.1f ms, %5.1f GB/s", n, msf(d), rate(d))
		unix.Munmap(m)
	}
	// Registering read-only, on threads sharing the context.
	sibs := []*rocm.Worker{w}
	for range 7 {
		s, err := w.Sibling()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		sibs = append(sibs, s)
	}
	for _, pre := range []bool{false, true} {
		for _, n := range []int{1, 2, 4, 8} {
			m := mapping()
			if pre {
				overPieces(size, piece, 16, func(_, i int) error { return pageIn(pieceOf(m, i)) })
			}
			regs := make([]*rocm.Registered, (size+piece-1)/piece)
			d := overPieces(size, piece, n, func(g, i int) error {
				return sibs[g].Do(context.Background(), func(c *rocm.Ctx) error {
					var err error
					regs[i], err = c.Register(pieceOf(m, i), true)
					return err
				})
			})
			// Copy everything to the device from the registrations.
			var dev rocm.DevPtr
			var copyT time.Duration
			err := w.Do(context.Background(), func(c *rocm.Ctx) error {
				var err error
				if dev, err = c.Malloc(int64(size)); err != nil {
					return err
				}
				s, err := c.NewStream()
				if err != nil {
					return err
				}
				defer c.DestroyStream(s)
				t0 := time.Now()
				for i, r := range regs {
					if err := c.CopyHtoDAsync(dev+rocm.DevPtr(i*piece), r.Ptr, r.Size, s); err != nil {
						return err
					}
				}
				err = c.SyncStream(s)
				copyT = time.Since(t0)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			t1 := time.Now()
			overPieces(size, piece, n, func(g, i int) error {
				return sibs[g].Do(context.Background(), func(c *rocm.Ctx) error { return c.Unregister(regs[i]) })
			})
			un := time.Since(t1)
			w.Do(context.Background(), func(c *rocm.Ctx) error { return c.Free(dev, int64(size)) })
			t.Logf("RATE register (pages mapped first: %v) %d threads: %6.1f ms, %5.1f GB/s; copy to device %5.1f GB/s; unregister %6.1f ms", pre, n, msf(d), rate(d), rate(copyT), msf(un))
			unix.Munmap(m)
		}
	}
	// Copying into pinned memory (one 64 MiB pinned buffer per thread).
	var bufs []*rocm.HostBuf
	t0 := time.Now()
	err = w.Do(context.Background(), func(c *rocm.Ctx) error {
		for range 16 {
			b, err := c.HostAlloc(4 << 20)
			if err != nil {
				return err
			}
			bufs = append(bufs, b)
		}
		return nil
	})
	pin := time.Since(t0)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("RATE pin 16 x 4 MiB with cuMemHostAlloc: %.1f ms (%.2f GB/s)", msf(pin), float64(64<<20)/pin.Seconds()/1e9)
	for _, pre := range []bool{false, true} {
		for _, n := range []int{1, 4, 8, 12} {
			m := mapping()
			if pre {
				overPieces(size, piece, 16, func(_, i int) error { return pageIn(pieceOf(m, i)) })
			}
			d := overPieces(size, piece, n, func(g, i int) error {
				src := pieceOf(m, i)
				dst := bufs[g].Bytes()
				for len(src) > 0 {
					k := copy(dst, src)
					src = src[k:]
				}
				return nil
			})
			t.Logf("RATE memcpy to pinned (pages mapped first: %v) %2d threads: %6.1f ms, %5.1f GB/s", pre, n, msf(d), rate(d))
			unix.Munmap(m)
		}
	}
	w.Do(context.Background(), func(c *rocm.Ctx) error {
		for _, b := range bufs {
			c.FreeHost(b)
		}
		return nil
	})
}

// overPieces runs fn(goroutine, piece) for every piece of a size-byte
// range on n goroutines and returns the time it took.
func overPieces(size, piece, n int, fn func(g, i int) error) time.Duration {
	var next atomic.Int64
	var wg sync.WaitGroup
	var first atomic.Pointer[error]
	t0 := time.Now()
	for g := range n {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i*piece >= size {
					return
				}
				if err := fn(g, i); err != nil {
					first.CompareAndSwap(nil, &err)
					return
				}
			}
		})
	}
	wg.Wait()
	if e := first.Load(); e != nil {
		panic(*e)
	}
	return time.Since(t0)
}

func msf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
