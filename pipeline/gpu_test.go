package pipeline

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/forge-llm/forge/actors"
	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/rocm"
)

// envRequireGPU turns "no GPU" from a skip into a failure, as in packages
// rocm and kernels/gpu: the GPU machine sets it so a missing driver can not
// pass.
const envRequireGPU = "FORGE_REQUIRE_GPU"

// needGPU skips (or, with FORGE_REQUIRE_GPU=1, fails) without a GPU.
func needGPU(t testing.TB) {
	t.Helper()
	ch, err := rocm.Choose(rocm.Selection{Kind: rocm.SelectGPU})
	if err == nil && !ch.CPU {
		return
	}
	if os.Getenv(envRequireGPU) == "1" {
		t.Fatalf("no GPU, and %s=1: %v", envRequireGPU, err)
	}
	t.Skipf("no GPU (set %s=1 to make this a failure): %v", envRequireGPU, err)
}

// deviceFree is the device's free memory, read through a worker of its own
// (closed before returning, so it holds nothing afterwards).
func deviceFree(t *testing.T) uint64 {
	t.Helper()
	rt, err := rocm.OpenAny()
	if err != nil {
		t.Fatal(err)
	}
	w, err := rt.NewWorker(0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	var free uint64
	if err := w.Do(context.Background(), func(c *rocm.Ctx) error {
		var err error
		free, _, err = c.MemInfo()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return free
}

// checkDeviceFree checks that free device memory is back to before (the
// driver's own bookkeeping may move it by a few pages; a leaked arena or
// staging ring is megabytes).
func checkDeviceFree(t *testing.T, before uint64) {
	t.Helper()
	after := deviceFree(t)
	t.Logf("device free memory: before %d MiB, after %d MiB (diff %d bytes)", before>>20, after>>20, int64(after)-int64(before))
	if before > after && before-after > 2<<20 {
		t.Errorf("device free memory %d bytes lower after Close: leaked", before-after)
	}
}

// TestGPUTokensMatchCPU: every strategy on the GPU gives the CPU backend's
// greedy tokens, and the device's memory is back where it started.
func TestGPUTokensMatchCPU(t *testing.T) {
	needGPU(t)
	refs := references(t)
	before := deviceFree(t)
	for _, file := range []string{"stories260K-F32.gguf", "stories260K-Q4_0.gguf", "synth-kq-Q4_K_M.gguf"} {
		ref := refs[file]
		path := testmodels.Path(t, file)
		t.Run(file, func(t *testing.T) {
			cpu := generateWith(t, path, Options{Device: "cpu"}, ref)
			for _, s := range []Strategy{Prefetch, Eager, Lazy, HostF32} {
				got := generateWith(t, path, Options{Device: "gpu", Strategy: s}, ref)
				if !slices.Equal(got, cpu) {
					t.Errorf("%s on the GPU: got %v\nCPU gave %v", s, got, cpu)
				} else {
					t.Logf("%s %s: GPU = CPU (%d tokens)", file, s, len(got))
				}
			}
		})
	}
	checkDeviceFree(t, before)
}

// TestGPUFaults: a failed upload and a device out of memory fail the
// request naming the tensor or layer, resolve every future, and leave no
// device memory and no goroutine behind.
func TestGPUFaults(t *testing.T) {
	needGPU(t)
	path := testmodels.Path(t, "stories260K-Q4_0.gguf")
	before := deviceFree(t)
	faultCase(t, path, Options{Device: "gpu", Hooks: Hooks{Upload: func(tensor string) error {
		if tensor == "blk.1.attn_q.weight" {
			return fmt.Errorf("injected copy failure")
		}
		return nil
	}}}, "layer 1", "blk.1.attn_q.weight", "injected copy failure")
	err := faultCase(t, path, Options{Device: "gpu", Memory: NewMemory(64 << 10)}, "weight arena", "out of memory")
	if !errors.Is(err, actors.ErrOutOfMemory) {
		t.Errorf("error %v is not ErrOutOfMemory", err)
	}
	err = faultCase(t, path, Options{Device: "gpu", Strategy: HostF32, Memory: NewMemory(600 << 10)}, "tensor", "out of memory")
	var le *actors.LoadError
	if !errors.As(err, &le) || le.Tensor == "" {
		t.Errorf("host-f32 error %v does not name a tensor", err)
	}
	checkDeviceFree(t, before)
	goleak.VerifyNone(t)
}

// TestGPUCancelMidLoad: cancelling the load while the blocks are held back
// fails the waiting request quickly and Close releases the device.
func TestGPUCancelMidLoad(t *testing.T) {
	needGPU(t)
	path := testmodels.Path(t, "stories260K-Q4_0.gguf")
	before := deviceFree(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m, err := Open(ctx, path, Options{Device: "gpu", Hooks: Hooks{Read: slowReads}})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Ready().Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := m.Generate(context.Background(), "", GenerateOptions{PromptIDs: storiesPrompt, MaxTokens: 4})
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond) // the request is waiting on layer 0
	t0 := time.Now()
	cancel()
	err = <-errc
	dGen := time.Since(t0)
	if err == nil || !errors.Is(err, context.Canceled) {
		t.Errorf("request error %v, want cancelled", err)
	}
	t1 := time.Now()
	if err := m.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	dClose := time.Since(t1)
	t.Logf("cancel → request returned in %v; Close took %v", dGen, dClose)
	if dGen > 100*time.Millisecond {
		t.Errorf("request returned %v after cancel (issue asks < 100 ms)", dGen)
	}
	checkDeviceFree(t, before)
}

// TestGPUOpenInBackground: Open returns before the device is open (its
// time is logged: no timed assertion), a model closed while its device is
// still opening releases everything, and a device that cannot be opened
// fails every future and the request with its error.
func TestGPUOpenInBackground(t *testing.T) {
	needGPU(t)
	path := testmodels.Path(t, "stories260K-Q4_0.gguf")
	before := deviceFree(t)
	for i := range 3 {
		t0 := time.Now()
		m, err := Open(context.Background(), path, Options{Device: "gpu"})
		if err != nil {
			t.Fatal(err)
		}
		open := time.Since(t0)
		if i == 1 { // once with a request queued behind the opening device
			go m.Generate(context.Background(), "", GenerateOptions{PromptIDs: storiesPrompt, MaxTokens: 4})
		}
		ctxAt := m.ContextCurrent()
		if err := m.Close(); err != nil {
			t.Errorf("close while opening: %v", err)
		}
		t.Logf("open returned in %v, context current at Close: %v (0: not yet), Close took %v", open, ctxAt, time.Since(t0)-open)
		for name, f := range map[string]*Future{"ready": m.Ready(), "layer 0": m.Layer(0), "resident": m.Resident()} {
			select {
			case <-f.Done():
			default:
				t.Errorf("%s unresolved after Close", name)
			}
		}
	}
	checkDeviceFree(t, before)
	goleak.VerifyNone(t)

	// A GPU that does not exist: the driver is there, so Open returns and
	// the opening fails in the background.
	m, err := Open(context.Background(), path, Options{Device: "gpu:99"})
	if err != nil {
		t.Fatalf("Open with a driver present: %v", err)
	}
	_, gerr := m.Generate(context.Background(), "", GenerateOptions{PromptIDs: storiesPrompt, MaxTokens: 4})
	for name, err := range map[string]error{"ready": m.Ready().Wait(context.Background()), "layer 3": m.Layer(3).Wait(context.Background()),
		"resident": m.Resident().Wait(context.Background()), "request": gerr} {
		if err == nil || !strings.Contains(err.Error(), "gpu:99") {
			t.Errorf("%s: %v, want the device's error naming gpu:99", name, err)
		} else if name == "request" {
			t.Logf("request error: %v", err)
		}
	}
	if err := m.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	goleak.VerifyNone(t)
}

// loadFigures is one measured load.
type loadFigures struct {
	open, ctx, ready, resident, kernels, tokenizer, built, first, again, short, close time.Duration
	bytes                                                                             int64
	stats                                                                             actors.DeviceStats
	tokens                                                                            int
}

func (f loadFigures) String() string {
	st := f.stats
	return fmt.Sprintf("open %.1f ms, context current %.1f ms, ready %.1f ms (%.1f ms after context), all resident %.1f ms (%.2f GB/s after context), kernels %.1f ms, tokenizer %.1f ms, executor built %.1f ms, first token %.1f ms (%.1f ms after all resident; 26-token prompt, request made at open), the same request again %.1f ms, a 5-token prompt %.1f ms, close %.1f ms, %d file bytes, %d tokens | registrations %d (%.0f MB, %.1f ms summed), chunks waiting for registration %.1f ms summed, staged %.0f MB (memcpy %.1f ms, ring wait %.1f ms summed), copies %d in %d batches, reclaim wait %.1f ms, ring pinned in %.1f ms, release %.1f ms",
		msf(f.open), msf(f.ctx), msf(f.ready), msf(f.ready-f.ctx), msf(f.resident), float64(f.bytes)/(f.resident-f.ctx).Seconds()/1e9,
		msf(f.kernels), msf(f.tokenizer), msf(f.built), msf(f.first), msf(f.first-f.resident), msf(f.again), msf(f.short), msf(f.close), f.bytes, f.tokens,
		st.Registrations, float64(st.RegisteredBytes)/1e6, msf(st.RegisterTime), msf(st.RegisterWait), float64(st.StagedBytes)/1e6,
		msf(st.StageCopyTime), msf(st.RingWait), st.CopyCalls, st.Batches, msf(st.ReclaimWait), msf(st.RingPinTime), msf(st.UnregisterTime))
}

// longPrompt is 26 tokens, as "Once upon a time" is in a byte-level
// vocabulary (what forge run's first request is on a forge gen model):
// the prompt path (GEMM), not the matrix–vector kernels.
func longPrompt() []int32 {
	p := make([]int32, 26)
	for i := range p {
		p[i] = storiesPrompt[i%len(storiesPrompt)]
	}
	return p
}

// measureLoad opens path and asks for one token of a 26-token prompt at
// once (as forge run does), waits for everything to be resident, asks
// again (kernels warm) and then with a 5-token prompt, and closes: the
// times are from the start of Open.
func measureLoad(t testing.TB, path string, o Options) loadFigures {
	t.Helper()
	var f loadFigures
	t0 := time.Now()
	m, err := Open(context.Background(), path, o)
	if err != nil {
		t.Fatal(err)
	}
	f.open = time.Since(t0)
	res, err := m.Generate(context.Background(), "", GenerateOptions{PromptIDs: longPrompt(), MaxTokens: 1, IgnoreEOG: true})
	f.first = time.Since(m.Started())
	if err == nil {
		err = m.Ready().Wait(context.Background())
	}
	if err == nil {
		err = m.Resident().Wait(context.Background())
	}
	if err != nil {
		m.Close()
		t.Fatal(err)
	}
	f.tokens = len(res.Tokens)
	// The futures' own times, from the bus.
	for _, e := range collectNow(m) {
		switch e := e.(type) {
		case ModelReady:
			f.ready = e.At
		case AllResident:
			f.resident = e.At
		}
	}
	f.ctx = m.ContextCurrent()
	if m.dev != nil {
		<-m.dev.done
		if !m.dev.beAt.IsZero() {
			f.kernels = m.dev.beAt.Sub(m.start)
		}
	}
	<-m.tokDone
	f.tokenizer = m.tokAt.Sub(m.start)
	f.built = time.Duration(m.builtAt.Load())
	for _, r := range []struct {
		d      *time.Duration
		prompt []int32
	}{{&f.again, longPrompt()}, {&f.short, storiesPrompt}} {
		t1 := time.Now()
		if _, err := m.Generate(context.Background(), "", GenerateOptions{PromptIDs: r.prompt, MaxTokens: 1, IgnoreEOG: true}); err != nil {
			m.Close()
			t.Fatal(err)
		}
		*r.d = time.Since(t1)
	}
	for _, u := range m.sys.Plan().Units {
		f.bytes += u.Bytes
	}
	var du *actors.DeviceUploader
	if lu, ok := m.up.(*lazyUploader); ok {
		du, _ = lu.inner().(*actors.DeviceUploader)
	}
	t2 := time.Now()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	f.close = time.Since(t2)
	if du != nil {
		f.stats = du.Stats()
	}
	return f
}

// collectNow returns the events published so far.
func collectNow(m *Model) []Event {
	sub := m.Subscribe()
	defer sub.Close()
	var evs []Event
	for {
		select {
		case e, ok := <-sub.C:
			if !ok {
				return evs
			}
			evs = append(evs, e)
		case <-time.After(20 * time.Millisecond):
			return evs
		}
	}
}

// BenchmarkGPULoadTiming logs the start-up figures of the GPU pipeline:
// Open's return, the context becoming current, ready (embedding and head
// resident), all resident, the kernels loaded, the tokenizer built, the
// first token of a request made at Open and a second request's time, for
// stories260K and, when FORGE_BIG_MODEL names a file, a big one. Figures,
// not assertions (docs/DESIGN.md): a benchmark, run once with
// -test.bench GPULoadTiming -test.benchtime 1x (bench/device.sh load).
// FORGE_LOAD_GRID lists uploader settings to compare on the big file (see
// uploadGrid).
func BenchmarkGPULoadTiming(b *testing.B) {
	needGPU(b)
	paths := []string{testmodels.Path(b, "stories260K-Q4_0.gguf")}
	big := os.Getenv("FORGE_BIG_MODEL")
	if big != "" {
		paths = append(paths, big)
	}
	grid := uploadGrid(b, os.Getenv("FORGE_LOAD_GRID"))
	for b.Loop() {
		for _, path := range paths {
			if os.Getenv("FORGE_LOAD_GRID_ONLY") == "1" {
				break
			}
			small := strings.HasPrefix(filepath.Base(path), "stories")
			for _, s := range []Strategy{Prefetch, Eager, Lazy, HostF32} {
				runs := 3 // the first run also pays for compiling kernels into the cache
				if s == HostF32 || s == Lazy || small && s != Prefetch {
					runs = 1
				}
				for run := range runs {
					f := measureLoad(b, path, Options{Device: "gpu", Strategy: s})
					b.Logf("GPU-LOAD %s %s run %d: %v", filepath.Base(path), s, run, f)
				}
			}
		}
		if big == "" {
			continue
		}
		for _, g := range grid {
			for run := range 2 {
				f := measureLoad(b, big, g.o)
				b.Logf("GPU-GRID %s run %d: %v", g.name, run, f)
			}
		}
	}
}

// TestUploadTuningParse: the --gpu-upload / grid settings (no GPU).
func TestUploadTuningParse(t *testing.T) {
	got, err := UploadTuning{Stagers: 3}.Parse("rn=32, rs=8,reg,rt=2,rb=16,unpaced")
	want := UploadTuning{Stagers: 3, RingBuffers: 32, RingBytes: 8 << 20, Register: true, RegThreads: 2, RegBytes: 16 << 20, Unpaced: true}
	if err != nil || got != want {
		t.Errorf("got %+v, %v; want %+v", got, err, want)
	}
	for _, bad := range []string{"rn=0", "rs=x", "zz=1", "stage"} {
		if _, err := (UploadTuning{}).Parse(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

type gridPoint struct {
	name string
	o    Options
}

// uploadGrid parses "st=8,rn=16,rs=4;reg,rt=1,rb=64,rd=4": points
// separated by ";", each an UploadTuning.Parse list plus rd (readers) and
// ch (chunk MiB).
func uploadGrid(t testing.TB, spec string) []gridPoint {
	var out []gridPoint
	for _, p := range strings.Split(spec, ";") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		o := Options{Device: "gpu"}
		var rest []string
		for _, kv := range strings.Split(p, ",") {
			k, v, _ := strings.Cut(kv, "=")
			n, _ := strconv.Atoi(v)
			switch k {
			case "rd":
				o.Readers = n
			case "ch":
				o.ChunkBytes = int64(n) << 20
			default:
				rest = append(rest, kv)
			}
		}
		var err error
		if o.Upload, err = o.Upload.Parse(strings.Join(rest, ",")); err != nil {
			t.Fatalf("FORGE_LOAD_GRID %q: %v", p, err)
		}
		out = append(out, gridPoint{name: p, o: o})
	}
	return out
}

func msf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
