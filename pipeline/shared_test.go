package pipeline

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/forge-llm/forge/actors"
	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/rocm"
)

// fakeShared is a sharedGPU whose opening is counted and scripted: no GPU
// is needed for the sharing logic. Its device says "CPU", so models on it
// run the CPU backend, as "auto" on a machine without a usable GPU does.
type fakeShared struct {
	opens, closes atomic.Int32
	gate          chan struct{} // each opening waits for it (nil: none)
	fail          atomic.Bool   // the next opening fails
}

var errFakeOpen = errors.New("fake device failed to open")

func (f *fakeShared) make(o Options) *sharedGPU {
	s := newSharedGPU(o)
	s.open = func(o Options, sel rocm.Selection, mem *actors.Memory, d *sharedDev) {
		f.opens.Add(1)
		if f.gate != nil {
			<-f.gate
		}
		if f.fail.Swap(false) {
			d.err = errFakeOpen
			return
		}
		_ = mem.Alloc(64<<20, "staging ring") // the shared pieces, counted once
		d.cpu, d.reason = true, "fake"
		d.close = func() { f.closes.Add(1); mem.Free(64 << 20) }
	}
	return s
}

// TestSharedDeviceOpensOnce: models opened one after another, and several
// at once, on an engine's shared device open it once; each gets its own
// backend; the device closes once, after the last model let go of it,
// and refuses models afterwards.
func TestSharedDeviceOpensOnce(t *testing.T) {
	f := &fakeShared{gate: make(chan struct{})}
	o := Options{Device: "gpu", Threads: 1}
	s := f.make(o)
	o.shared = s
	sel := rocm.Selection{Kind: rocm.SelectGPU}

	// Three models ask while the device is still opening.
	var devs []*device
	for range 3 {
		devs = append(devs, startDevice(o, sel))
	}
	close(f.gate)
	seen := map[any]bool{}
	for i, p := range devs {
		be, err := p.backend(context.Background())
		if err != nil {
			t.Fatalf("model %d: %v", i, err)
		}
		if _, ok := be.(*cpu.Backend); !ok || seen[be] {
			t.Errorf("model %d: backend %T (shared with another: %v), want a CPU backend of its own", i, be, seen[be])
		}
		seen[be] = true
	}
	// Models in turn, as an Engine swapping them does.
	for range 3 {
		p := startDevice(o, sel)
		if _, err := p.backend(context.Background()); err != nil {
			t.Fatal(err)
		}
		p.close()
	}
	if n := f.opens.Load(); n != 1 {
		t.Errorf("device opened %d times, want once", n)
	}
	if s.inUse() != 64<<20 {
		t.Errorf("shared pieces accounted %d, want the ring once", s.inUse())
	}
	for _, p := range devs {
		p.close()
	}
	// Close waits for the models still holding the device (a GPU model
	// holds it until it has freed what it made there).
	if _, err := s.acquire(sel, nil); err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	go func() { s.close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("shared device closed while a model held it")
	case <-time.After(20 * time.Millisecond):
	}
	s.release()
	<-closed
	if f.closes.Load() != 1 || s.inUse() != 0 {
		t.Errorf("closed %d times, %d bytes still accounted", f.closes.Load(), s.inUse())
	}
	p := startDevice(o, sel)
	if _, err := p.backend(context.Background()); !errors.Is(err, errSharedClosed) {
		t.Errorf("model after close: %v, want the shared device closed", err)
	}
	p.close()
}

// TestSharedDeviceRetry: an opening that fails fails the models waiting
// for it with a DeviceError, and the next model opens the device again;
// a model closed while the device opens stops waiting.
func TestSharedDeviceRetry(t *testing.T) {
	f := &fakeShared{}
	f.fail.Store(true)
	o := Options{Device: "gpu", Threads: 1}
	s := f.make(o)
	o.shared = s
	sel := rocm.Selection{Kind: rocm.SelectGPU}

	p := startDevice(o, sel)
	_, err := p.backend(context.Background())
	var de *DeviceError
	if !errors.As(err, &de) || !errors.Is(err, errFakeOpen) {
		t.Errorf("failed opening: %v, want a DeviceError wrapping it", err)
	}
	p.close()
	p = startDevice(o, sel)
	if _, err := p.backend(context.Background()); err != nil {
		t.Errorf("after a failed opening: %v, want it opened again", err)
	}
	p.close()
	if f.opens.Load() != 2 {
		t.Errorf("opened %d times, want 2", f.opens.Load())
	}
	s.close()
	if f.closes.Load() != 1 {
		t.Errorf("closed %d times", f.closes.Load())
	}

	// Closed while opening: the model gives up, the opening goes on and
	// is closed with the device.
	f2 := &fakeShared{gate: make(chan struct{})}
	o.shared = f2.make(o)
	p = startDevice(o, sel)
	var wg sync.WaitGroup
	wg.Go(p.discard)
	wg.Wait()
	if _, err := p.backend(context.Background()); !errors.Is(err, errAborted) {
		t.Errorf("discarded while opening: %v", err)
	}
	close(f2.gate)
	o.shared.close()
	if f2.opens.Load() != 1 || f2.closes.Load() != 1 {
		t.Errorf("opened %d, closed %d times", f2.opens.Load(), f2.closes.Load())
	}
}

// TestEngineCPUNeverOpensGPU: an Engine running CPU models, loading two in
// turn with a budget that holds one, never opens its shared GPU, and
// counts nothing for it.
func TestEngineCPUNeverOpensGPU(t *testing.T) {
	paths := []string{testmodels.Path(t, "stories260K-Q4_0.gguf"), testmodels.Path(t, "stories260K-Q4_K_M.gguf")}
	f := &fakeShared{}
	var est [2]int64
	for i, p := range paths {
		var err error
		// What the engine will estimate: CPU models batch (pool included).
		if est[i], _, err = estimate(p, Options{Device: "cpu", Batching: Batching{On: true}}); err != nil {
			t.Fatal(err)
		}
	}
	e := newTestEngine(t, EngineOptions{Budget: max(est[0], est[1]) + min(est[0], est[1])/2,
		KeepAlive: new(time.Duration(-1)), Open: Options{Device: "cpu"}})
	e.gpu = f.make(e.o.Open)
	for range 2 {
		for _, p := range paths {
			useModel(t, e, p)
		}
	}
	st, _ := e.StatusOf(paths[0])
	if st.State != StateEvicted {
		t.Errorf("%s: %s, want evicted", paths[0], st.State)
	}
	if f.opens.Load() != 0 || e.gpu.inUse() != 0 {
		t.Errorf("CPU models opened the shared GPU %d times (%d bytes)", f.opens.Load(), e.gpu.inUse())
	}
}
