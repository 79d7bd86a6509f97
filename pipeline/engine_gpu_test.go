package pipeline

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/forge-llm/forge/pipeline/synth"
)

// gpuEngineModels writes three synthetic models of different sizes (tens
// of MB apart on the device, so that which of them is loaded shows in the
// device's free memory). Their weights are zero: only memory matters here.
func gpuEngineModels(t *testing.T) []string {
	t.Helper()
	var paths []string
	for _, layers := range []int{2, 4, 6} {
		s := synth.Presets["bench86m"]
		s.Layers = layers
		p := filepath.Join(t.TempDir(), fmt.Sprintf("engine-%dl.gguf", layers))
		if err := synth.WriteFile(context.Background(), p, synth.Options{Shape: s, Mix: synth.MixF32, Zero: true, Name: filepath.Base(p)}); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	return paths
}

// near reports whether two free-memory readings agree within slack bytes,
// and logs them. With no model or one model loaded the readings agree
// exactly on the H100; with two models the device held 12 MiB more than
// the two footprints measured apart when each model had a context of its
// own (the driver's bookkeeping for a second context), so those readings
// get 24 MiB: still well under half the 66 MiB that separates the test's
// models, so the check tells which ones are loaded.
func near(t *testing.T, what string, got, want uint64, slack int64) {
	t.Helper()
	d := int64(got) - int64(want)
	t.Logf("%s: free %d MiB, expected %d MiB (diff %d bytes)", what, got>>20, want>>20, d)
	if d > slack || d < -slack {
		t.Errorf("%s: device free memory %d MiB, want %d MiB (±%d MiB)", what, got>>20, want>>20, slack>>20)
	}
}

const (
	slackOne = 4 << 20  // no model or one model on the device
	slackTwo = 24 << 20 // two models on the device
)

// TestEngineGPUUnloadsAndEvicts (issue 10): on the GPU, an Engine with
// keep-alive 0 unloads an idle model and the device's free memory returns
// to where it was with no model loaded (the engine's shared context,
// kernels and cuBLAS stay until Close); with a memory budget, loading a
// model that does not fit evicts the least recently used idle model, and
// the device then holds exactly the models still loaded. After Close the
// device is back where it started.
func TestEngineGPUUnloadsAndEvicts(t *testing.T) {
	needGPU(t)
	paths := gpuEngineModels(t)
	start := deviceFree(t)
	// warm opens an engine's shared device with a request (keep-alive 0
	// or an Unload leaves no model) and returns the device's free memory
	// then: the engine's baseline.
	warm := func(e *Engine) uint64 {
		t.Helper()
		if _, err := e.Generate(t.Context(), EngineRequest{Model: paths[0], Prompt: "Hi", MaxTokens: 2}); err != nil {
			t.Fatal(err)
		}
		if err := e.Unload(paths[0]); err != nil {
			t.Fatal(err)
		}
		return deviceFree(t)
	}

	// Keep-alive 0: each model alone, measuring what it holds while
	// leased (its footprint) and that all of it is returned on release.
	foot := map[string]uint64{}
	e0 := newTestEngine(t, EngineOptions{SingleSequence: true, KeepAlive: new(time.Duration(0)), Open: Options{Device: "gpu"}})
	free0 := warm(e0)
	for _, p := range paths {
		if _, err := e0.Generate(t.Context(), EngineRequest{Model: p, Prompt: "Hi", MaxTokens: 2}); err != nil {
			t.Fatal(err)
		}
		if st, _ := e0.StatusOf(p); st.State != StateUnloaded || st.MemoryBytes != 0 {
			t.Errorf("%s after a request with keep-alive 0: %+v", filepath.Base(p), st)
		}
		near(t, filepath.Base(p)+" unloaded after its request", deviceFree(t), free0, slackOne)
		l, err := e0.Acquire(t.Context(), p)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Model().Resident().Wait(t.Context()); err != nil {
			t.Fatal(err)
		}
		held := deviceFree(t)
		if held >= free0 {
			t.Fatalf("%s: loaded, yet device free memory %d MiB is not below %d MiB", filepath.Base(p), held>>20, free0>>20)
		}
		foot[p] = free0 - held
		st, _ := e0.StatusOf(p)
		t.Logf("%s holds %d MiB of the device (%d MiB accounted)", filepath.Base(p), foot[p]>>20, st.MemoryBytes>>20)
		l.Release() // keep-alive 0: unloads now
		if st, _ := e0.StatusOf(p); st.State != StateUnloaded {
			t.Errorf("%s after release: %s", filepath.Base(p), st.State)
		}
		near(t, filepath.Base(p)+" unloaded after release", deviceFree(t), free0, slackOne)
	}
	b, c, d := paths[0], paths[1], paths[2]
	if foot[c] < foot[b]+2*slackTwo || foot[d] < foot[c]+2*slackTwo {
		t.Fatalf("footprints %d, %d, %d MiB too close to tell the models apart", foot[b]>>20, foot[c]>>20, foot[d]>>20)
	}
	if err := e0.Close(); err != nil {
		t.Fatal(err)
	}
	near(t, "first engine closed", deviceFree(t), start, slackOne)

	// A budget with room for any two of the three, not all three.
	var est [3]int64
	for i, p := range paths {
		var err error
		if est[i], _, err = estimate(p, Options{}); err != nil {
			t.Fatal(err)
		}
	}
	budget := est[1] + est[2] + 1<<16
	if est[0]+est[1]+est[2] <= budget {
		t.Fatalf("estimates %v do not make the test", est)
	}
	e := newTestEngine(t, EngineOptions{SingleSequence: true, Budget: budget, KeepAlive: new(time.Duration(-1)), Open: Options{Device: "gpu"}})
	free0 = warm(e)
	state := func(p string) ModelState { st, _ := e.StatusOf(p); return st.State }
	gen := func(p string) { t.Helper(); useModel(t, e, p) }
	gen(b)
	gen(c)
	gen(b) // c is now the least recently used
	if state(b) != StateResident || state(c) != StateResident {
		t.Fatalf("b %s, c %s", state(b), state(c))
	}
	near(t, "b and c loaded", deviceFree(t), free0-foot[b]-foot[c], slackTwo)
	gen(d)
	if state(c) != StateEvicted || state(b) != StateResident || state(d) != StateResident {
		t.Errorf("after d: b %s, c %s, d %s (want c evicted)", state(b), state(c), state(d))
	}
	e.closing.Wait() // c closes beside d's load
	near(t, "c evicted for d", deviceFree(t), free0-foot[b]-foot[d], slackTwo)
	if err := e.Unload(b); err != nil {
		t.Fatal(err)
	}
	if err := e.Unload(d); err != nil {
		t.Fatal(err)
	}
	near(t, "everything unloaded", deviceFree(t), free0, slackOne)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	near(t, "engine closed", deviceFree(t), start, slackOne)
	// Goroutines: the package's TestMain checks that none is left.
}
