package pipeline

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/forge-llm/forge/actors"
	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/rocm"
)

// envSwapModels names two GGUF files (comma-separated) for
// TestEngineGPUSwap instead of the bundled ones: the 8B shape from
// `forge gen`, for swap times that mean something.
const envSwapModels = "FORGE_SWAP_MODELS"

// swapPrompt is the request of the swap test (greedy).
const swapPrompt = "Once upon a time"

// TestEngineGPUSwap (issue 18, fast swaps): an Engine whose budget holds
// one of two models, asked for each in turn, evicts the other every time;
// the models share one GPU context, kernel set, cuBLAS and staging ring,
// opened once. Each swapped-in model gives the tokens of a fresh load of
// its own (own context, no Engine); after each swap the device holds the
// shared pieces and the loaded model's own memory, exactly what the model
// held the first time (forge's count of driver objects, and the driver's
// free memory within the pool's granularity); after an unload it holds the
// shared pieces only, and after Close what it held before. The time from
// the request to its first token is logged per swap, next to a fresh
// load's (figures, not assertions).
func TestEngineGPUSwap(t *testing.T) {
	needGPU(t)
	if os.Getenv("FORGE_SWAP_DEBUG") == "1" {
		// The load's and the eviction's own figures (pipeline, actors
		// and gpu debug lines), on stderr.
		old := slog.Default()
		slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})))
		t.Cleanup(func() { slog.SetDefault(old) })
	}
	paths := []string{testmodels.Path(t, "stories260K-Q4_0.gguf"), testmodels.Path(t, "stories260K-Q4_K_M.gguf")}
	tokens, rounds := 8, 3
	if v := os.Getenv(envSwapModels); v != "" {
		paths = strings.Split(v, ",")
		if len(paths) != 2 {
			t.Fatalf("%s=%q: want two files", envSwapModels, v)
		}
		tokens, rounds = 4, 4
	}
	name := func(p string) string { return filepath.Base(p) }

	live0, free0 := rocm.Live(), deviceFree(t)
	// References: each model loaded alone, in a context of its own, as a
	// fresh process would.
	ref := map[string][]int32{}
	for _, p := range paths {
		for run := range 2 { // the first run also fills the kernel cache
			m, err := Open(context.Background(), p, Options{Device: "gpu"})
			if err != nil {
				t.Fatal(err)
			}
			first, err := timeFirstToken(context.Background(), m)
			if err != nil {
				m.Close()
				t.Fatal(err)
			}
			res, err := m.Generate(context.Background(), swapPrompt, GenerateOptions{MaxTokens: tokens, IgnoreEOG: true})
			if cerr := m.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				t.Fatal(err)
			}
			ref[p] = res.Tokens
			t.Logf("SWAP fresh load %s run %d: first token %.1f ms after Open (own context)", name(p), run, msf(first))
		}
	}
	if now := rocm.Live(); now != live0 {
		t.Errorf("fresh loads left driver objects: %+v, before %+v", now, live0)
		live0 = now // what follows is about the engine
	}

	var est [2]int64
	for i, p := range paths {
		var err error
		if est[i], _, err = estimate(p, Options{}); err != nil {
			t.Fatal(err)
		}
	}
	budget := max(est[0], est[1]) + min(est[0], est[1])/2
	// Files stay pinned between loads (PinFiles): from its second load on,
	// a model copies from its registered file.
	e := newTestEngine(t, EngineOptions{Budget: budget, KeepAlive: new(time.Duration(-1)), Open: Options{Device: "gpu"}, PinFiles: 1 << 40})
	// pinnedRanges waits until every pin is registered in full and
	// returns how many driver registrations they hold.
	pinnedRanges := func(loaded string) int {
		t.Helper()
		for { // the engine pins a model's file as it marks it resident
			if st, _ := e.StatusOf(loaded); st.State == StateResident {
				break
			}
			time.Sleep(time.Millisecond)
		}
		e.mu.Lock()
		var pins []*actors.PinnedFile
		for _, ent := range e.models {
			if ent.pin != nil {
				pins = append(pins, ent.pin.pf)
			}
		}
		e.mu.Unlock()
		n := 0
		for _, pf := range pins {
			for !pf.Complete() {
				time.Sleep(time.Millisecond)
			}
			n += int((pf.Size() + actors.DefaultPinPiece - 1) / actors.DefaultPinPiece)
		}
		return n
	}
	var t0 time.Time // the last request's start
	gen := func(p string, n int) ([]int32, time.Duration) {
		t.Helper()
		t0 = time.Now()
		res, err := e.Generate(t.Context(), EngineRequest{Model: p, Prompt: swapPrompt, MaxTokens: n, IgnoreEOG: true})
		if err != nil {
			t.Fatalf("%s: %v", name(p), err)
		}
		return res.Tokens, time.Since(t0)
	}
	check := func(p string, got []int32) {
		t.Helper()
		if !slices.Equal(got, ref[p]) {
			t.Errorf("%s in the engine: tokens %v, a fresh load gave %v", name(p), got, ref[p])
		}
	}

	// The first model opens the shared device; unloading it leaves the
	// shared pieces only: the baseline.
	_, first := gen(paths[0], 1)
	t.Logf("SWAP engine's first load %s (opens the device): first token %.1f ms after the request", name(paths[0]), msf(first))
	if err := e.Unload(paths[0]); err != nil {
		t.Fatal(err)
	}
	e.pinWG.Wait() // an unloaded model's file is let go
	if n := e.PinnedBytes(); n != 0 {
		t.Errorf("%d bytes pinned with no model loaded", n)
	}
	base, baseFree := rocm.Live(), sharedFree(t, e)
	if base.Contexts != live0.Contexts+1 || base.Modules <= live0.Modules {
		t.Errorf("shared device: %+v, before the engine %+v: want one more context and the kernel modules", base, live0)
	}
	if n := e.gpu.inUse(); n <= 0 || e.InUse() != n {
		t.Errorf("engine InUse %d with no model loaded, shared pieces %d: want the shared ring counted once", e.InUse(), n)
	}
	t.Logf("shared baseline: %+v, device free %d MiB, shared pieces %d MiB accounted", base, baseFree>>20, e.gpu.inUse()>>20)

	foot := map[string]rocm.LiveCounts{}
	footFree := map[string]int64{}
	var swaps []time.Duration
	var loaded string // the model loaded now
	for round := range rounds {
		for i := range 2 {
			p, other := paths[(i+1)%2], paths[i]
			wasLoaded := round > 0 || i > 0 // the other model is loaded: this request evicts it
			got1, d := gen(p, 1)
			loaded = p
			st, _ := e.StatusOf(other)
			if wasLoaded && st.State != StateEvicted {
				t.Errorf("round %d: %s is %s after %s's request, want evicted", round, name(other), st.State, name(p))
			}
			if len(got1) != 1 || len(ref[p]) == 0 || got1[0] != ref[p][0] {
				t.Errorf("round %d: %s's first token %v, want %v", round, name(p), got1, ref[p][:min(1, len(ref[p]))])
			}
			detail := loadDetail(t, e, p, t0)
			if wasLoaded {
				swaps = append(swaps, d)
				t.Logf("SWAP round %d %s → %s: first token %.1f ms after the request (%s)", round, name(other), name(p), msf(d), detail)
			} else {
				t.Logf("SWAP round %d load %s (nothing to evict): first token %.1f ms (%s)", round, name(p), msf(d), detail)
			}
			got, _ := gen(p, tokens)
			check(p, got)
			e.closing.Wait() // the evicted model closes beside the load

			ranges := pinnedRanges(p)
			now, free := rocm.Live(), sharedFree(t, e)
			held := diffLive(now, base)
			// The files pinned between loads hold registrations of their
			// own: exactly their ranges.
			if held.Registrations != int64(ranges) {
				t.Errorf("round %d: %d registrations beyond the shared pieces, the pinned files hold %d ranges", round, held.Registrations, ranges)
			}
			held.Registrations = 0
			if f, ok := foot[p]; !ok {
				foot[p], footFree[p] = held, int64(baseFree)-int64(free)
				t.Logf("%s holds %+v, %d MiB of the device", name(p), held, footFree[p]>>20)
			} else {
				if held != f {
					t.Errorf("round %d: with %s loaded the device holds %+v beyond the shared pieces, the first time %+v", round, name(p), held, f)
				}
				nearInt(t, fmt.Sprintf("round %d, %s loaded", round, name(p)), int64(baseFree)-int64(free), footFree[p], slackPool)
			}
		}
	}
	// The unload is what a swap's eviction does before the next load.
	t1 := time.Now()
	if err := e.Unload(loaded); err != nil {
		t.Fatal(err)
	}
	t.Logf("SWAP unloading %s took %.1f ms", name(loaded), msf(time.Since(t1)))
	// The evicted model's file stays pinned until it is unloaded too.
	for _, p := range paths {
		if err := e.Unload(p); err != nil {
			t.Fatal(err)
		}
	}
	e.pinWG.Wait()
	if n := e.PinnedBytes(); n != 0 {
		t.Errorf("%d bytes pinned after every model was unloaded", n)
	}
	if now := rocm.Live(); now != base {
		t.Errorf("everything unloaded: %+v, the shared baseline %+v", now, base)
	}
	nearInt(t, "everything unloaded", int64(sharedFree(t, e)), int64(baseFree), slackPool)
	slices.Sort(swaps)
	if len(swaps) > 0 {
		t.Logf("SWAP summary: %d swaps, first token after the request min %.1f / median %.1f / max %.1f ms",
			len(swaps), msf(swaps[0]), msf(swaps[len(swaps)/2]), msf(swaps[len(swaps)-1]))
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if now := rocm.Live(); now != live0 {
		t.Errorf("after Close: %+v, before the engine %+v", now, live0)
	}
	checkDeviceFree(t, free0)
}

// slackPool is how far the driver's free memory may move between two
// readings with the same models loaded: stream-ordered frees go back to
// the driver at its next synchronisation, in the pool's granularity. A
// leaked arena, KV cache or ring is far more (and forge's own count of
// driver objects is checked exactly).
const slackPool = 16 << 20

func nearInt(t *testing.T, what string, got, want, slack int64) {
	t.Helper()
	d := got - want
	t.Logf("%s: %d MiB, expected %d MiB (diff %d bytes)", what, got>>20, want>>20, d)
	if d > slack || d < -slack {
		t.Errorf("%s: %d MiB, want %d MiB (±%d MiB)", what, got>>20, want>>20, slack>>20)
	}
}

// diffLive is a - b, field by field.
func diffLive(a, b rocm.LiveCounts) rocm.LiveCounts {
	return rocm.LiveCounts{
		DeviceAllocs: a.DeviceAllocs - b.DeviceAllocs, DeviceBytes: a.DeviceBytes - b.DeviceBytes,
		HostAllocs: a.HostAllocs - b.HostAllocs, HostBytes: a.HostBytes - b.HostBytes, Registrations: a.Registrations - b.Registrations,
		Streams: a.Streams - b.Streams, Events: a.Events - b.Events, Graphs: a.Graphs - b.Graphs, Modules: a.Modules - b.Modules,
		Contexts: a.Contexts - b.Contexts,
	}
}

// sharedFree is the device's free memory read on the engine's own
// context (a reading through a new context would count that context too),
// after synchronising it: memory freed in stream order goes back to the
// driver at a synchronisation (in a server, the next load's first ones).
func sharedFree(t *testing.T, e *Engine) uint64 {
	t.Helper()
	e.gpu.mu.Lock()
	d := e.gpu.cur
	e.gpu.mu.Unlock()
	if d == nil || d.w == nil {
		t.Fatal("the engine's GPU is not open")
	}
	var free uint64
	if err := d.w.Do(context.Background(), func(c *rocm.Ctx) error {
		if err := c.Sync(); err != nil {
			return err
		}
		var err error
		free, _, err = c.MemInfo()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return free
}

// timeFirstToken asks m for one token of swapPrompt and returns how long
// after Open began it came.
func timeFirstToken(ctx context.Context, m *Model) (time.Duration, error) {
	_, err := m.Generate(ctx, swapPrompt, GenerateOptions{MaxTokens: 1, IgnoreEOG: true})
	return time.Since(m.Started()), err
}

// loadDetail describes the loaded model p's last load, asked for at
// asked: when Open began (after the evicted model was closed), when its
// context was current and its weights resident (from Open), and its
// uploader's figures.
func loadDetail(t *testing.T, e *Engine, p string, asked time.Time) string {
	t.Helper()
	l, err := e.Acquire(t.Context(), p)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	m := l.Model()
	if err := m.Resident().Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	var resident time.Duration
	for _, ev := range collectNow(m) {
		if ev, ok := ev.(AllResident); ok {
			resident = ev.At
		}
	}
	s := fmt.Sprintf("Open began %.1f ms after the request; context %.1f ms, all resident %.1f ms after Open",
		msf(m.Started().Sub(asked)), msf(m.ContextCurrent()), msf(resident))
	if lu, ok := m.up.(*lazyUploader); ok {
		if du, ok := lu.inner().(*actors.DeviceUploader); ok {
			st := du.Stats()
			s += fmt.Sprintf("; uploader: reserved %.1f ms, ring ready %.1f ms (reused %v), first copy %.1f ms, last copy %.1f ms after Reserve, arena in stream order %v, %d MB from the pinned file, %d MB staged",
				msf(st.Reserved), msf(st.RingReady), st.RingReused, msf(st.FirstCopy), msf(st.LastCopy), st.ArenaAsync, st.PinnedBytes>>20, st.StagedBytes>>20)
		}
	}
	return s
}
