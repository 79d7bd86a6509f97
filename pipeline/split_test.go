package pipeline

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/pipeline/synth"
)

// twoCPUs are two CPU backends standing for two devices.
func twoCPUs(t *testing.T) []kernels.Backend {
	a, b := cpu.New(2), cpu.New(2)
	t.Cleanup(a.Close)
	t.Cleanup(b.Close)
	return []kernels.Backend{a, b}
}

// synthModel writes one of synth's shapes as a Q4_K_M file (stories260K
// has no K-quant mix of several layers with biases; synth-kq one layer).
// "tiny-freqs" is tiny with Llama 3.1's rope_freqs (a global every
// device needs).
func synthModel(t *testing.T, preset string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), preset+".gguf")
	shape, ok := synth.Presets[preset]
	if preset == "tiny-freqs" {
		shape, ok = synth.Presets["tiny"], true
		shape.RopeFreqs = true
	}
	if !ok {
		t.Fatalf("no synth shape %q", preset)
	}
	if err := synth.WriteFile(context.Background(), path, synth.Options{Shape: shape, Mix: synth.MixQ4_KM, Seed: 9}); err != nil {
		t.Fatal(err)
	}
	return path
}

func splitGenerate(t *testing.T, path string, o Options, prompt []int32) ([]int32, *Model) {
	t.Helper()
	m, err := Open(context.Background(), path, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	res, err := m.Generate(context.Background(), "", GenerateOptions{PromptIDs: prompt, MaxTokens: 24, IgnoreEOG: true})
	if err != nil {
		t.Fatal(err)
	}
	return res.Tokens, m
}

// TestSplitOpen: a model split by layers over two CPU "devices" through
// Open (one load pipeline, an uploader per device, the devices' blocks
// interleaved) generates the single-device greedy tokens, under every
// strategy and split, with each device's memory accounted on its own.
func TestSplitOpen(t *testing.T) {
	prompt := []int32{1, 403, 407, 261, 378}
	for _, file := range []string{"stories260K-Q4_K_M.gguf", "tiny", "tiny-qwen2", "tiny-freqs"} {
		t.Run(file, func(t *testing.T) {
			path := synthOrBundled(t, file)
			for _, st := range []Strategy{Prefetch, Eager, Lazy, HostF32} {
				// host-f32 runs F32 copies: its own reference.
				want, _ := splitGenerate(t, path, Options{Device: "cpu", Threads: 2, Strategy: st}, prompt)
				for _, split := range [][]float64{nil, {1, 3}, {3, 1}} {
					t.Run(fmt.Sprintf("%s/%v", st, split), func(t *testing.T) {
						got, m := splitGenerate(t, path, Options{Backends: twoCPUs(t), Strategy: st, Split: split}, prompt)
						if !slices.Equal(got, want) {
							t.Fatalf("split tokens\n got %v\nwant %v", got, want)
						}
						devs := m.Devices()
						if len(devs) != 2 || devs[0].Lo != 0 || devs[0].Hi != devs[1].Lo || devs[1].Hi != m.Config().Layers {
							t.Fatalf("devices %+v", devs)
						}
						for _, d := range devs {
							if d.Memory.InUse() == 0 {
								t.Fatalf("device %s accounts nothing", d.Name)
							}
						}
						if !strings.Contains(m.String(), "cpu+cpu") {
							t.Fatalf("String() = %q", m.String())
						}
					})
				}
			}
		})
	}
}

func synthOrBundled(t *testing.T, name string) string {
	if strings.HasSuffix(name, ".gguf") {
		return testmodels.Path(t, name)
	}
	return synthModel(t, name)
}

// TestAssignLayers: shares of the layers, free memory less the first
// device's globals, at least one layer each; bad shares are refused.
func TestAssignLayers(t *testing.T) {
	for _, c := range []struct {
		layers  int
		shares  []float64
		free    []uint64
		globals int64
		want    []int
	}{
		{80, []float64{1, 1}, []uint64{0, 0}, 0, []int{0, 40, 80}},
		{32, []float64{3, 1}, []uint64{0, 0}, 0, []int{0, 24, 32}},
		{5, nil, []uint64{0, 0}, 0, []int{0, 3, 5}}, // unknown memory: equal shares
		{80, nil, []uint64{80 << 30, 80 << 30}, 8 << 30, []int{0, 38, 80}},
		{4, []float64{1, 0, 0}, []uint64{0, 0, 0}, 0, []int{0, 2, 3, 4}},
		{2, []float64{0, 1}, []uint64{0, 0}, 0, []int{0, 1, 2}},
	} {
		got, err := assignLayers(c.layers, c.shares, c.free, c.globals, 1<<30)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("assignLayers(%d, %v, %v) = %v, %v; want %v", c.layers, c.shares, c.free, got, err, c.want)
		}
	}
	for _, c := range []struct {
		layers int
		shares []float64
		n      int
	}{{1, nil, 2}, {8, []float64{1}, 2}, {8, []float64{0, 0}, 2}} {
		if _, err := assignLayers(c.layers, c.shares, make([]uint64, c.n), 0, 1); err == nil {
			t.Errorf("assignLayers(%d, %v) over %d devices: no error", c.layers, c.shares, c.n)
		}
	}
	for _, s := range []string{"1,-1", "a", "1,,2", "NaN"} {
		if _, err := ParseSplit(s); err == nil {
			t.Errorf("ParseSplit(%q): no error", s)
		}
	}
	if v, err := ParseSplit("3, 1"); err != nil || !slices.Equal(v, []float64{3, 1}) {
		t.Errorf("ParseSplit = %v, %v", v, err)
	}
	for _, d := range []string{"gpu:0,x", "gpu:-1,0"} {
		if _, err := splitDevice(d); err == nil {
			t.Errorf("splitDevice(%q): no error", d)
		}
	}
	if o, err := splitDevice("gpu:1,0,1"); err != nil || !slices.Equal(o, []int{1, 0, 1}) {
		t.Errorf("splitDevice = %v, %v", o, err)
	}
}

// TestInterleave: the globals first, then the devices' blocks in turn
// (by the share of each device's bytes loaded), every unit once.
func TestInterleave(t *testing.T) {
	m, err := Open(context.Background(), testmodels.Path(t, "stories260K-F32.gguf"), Options{Backends: twoCPUs(t), Split: []float64{1, 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Resident().Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	order := interleave([]int{0, 2, 5})(m.sys.Plan())
	var layers []int
	for _, u := range order {
		layers = append(layers, u.Layer)
	}
	// Five equal blocks, two on the first device and three on the second.
	if want := []int{Globals, 0, 2, 3, 1, 4}; !slices.Equal(layers, want) {
		t.Fatalf("load order %v, want %v", layers, want)
	}
}

// TestSplitFaults: an upload that fails on the second device, and a load
// cancelled while the second device's blocks are read, resolve every
// readiness future and fail the request with the cause; nothing is left
// running (TestMain's goleak).
func TestSplitFaults(t *testing.T) {
	path := testmodels.Path(t, "stories260K-Q4_0.gguf")
	prompt := GenerateOptions{PromptIDs: []int32{1, 403}, MaxTokens: 4}
	t.Run("upload on the second device", func(t *testing.T) {
		boom := errors.New("device 1 lost")
		m, err := Open(context.Background(), path, Options{Backends: twoCPUs(t), Split: []float64{1, 1}, Hooks: Hooks{
			Upload: func(tensor string) error {
				if strings.HasPrefix(tensor, "blk.3.") {
					return boom
				}
				return nil
			},
		}})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		if _, err := m.Generate(context.Background(), "", prompt); !errors.Is(err, boom) {
			t.Fatalf("request: %v, want the upload's error", err)
		}
		for i := range m.Config().Layers {
			err := m.Layer(i).Wait(context.Background())
			if i >= 3 && !errors.Is(err, boom) {
				t.Errorf("layer %d: %v, want the failure", i, err)
			}
		}
		if err := m.Resident().Wait(context.Background()); !errors.Is(err, boom) {
			t.Errorf("Resident: %v", err)
		}
	})
	t.Run("cancelled on the second device", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		started := make(chan struct{}, 1)
		m, err := Open(ctx, path, Options{Backends: twoCPUs(t), Split: []float64{1, 1}, Hooks: Hooks{
			Read: func(rctx context.Context, tensor string, off, n int64) error {
				if !strings.HasPrefix(tensor, "blk.4.") {
					return nil
				}
				select {
				case started <- struct{}{}:
				default:
				}
				<-rctx.Done() // a disk that never answers, until the load is cancelled
				return rctx.Err()
			},
		}})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		<-started
		cancel()
		for i := range m.Config().Layers {
			wctx, wcancel := context.WithTimeout(context.Background(), time.Minute)
			err := m.Layer(i).Wait(wctx)
			wcancel()
			if errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("layer %d never resolved", i)
			}
			if i == 4 && !errors.Is(err, context.Canceled) {
				t.Errorf("layer 4: %v, want the cancellation", err)
			}
		}
		if err := m.Resident().Wait(context.Background()); !errors.Is(err, context.Canceled) {
			t.Errorf("Resident: %v", err)
		}
		if _, err := m.Generate(context.Background(), "", prompt); err == nil {
			t.Error("request on a cancelled load succeeded")
		}
	})
}

// TestEngineSplitBudget: an Engine over two devices counts a split model
// by what it holds on its fullest device: a budget below the whole model
// but above each half loads it, and its requests run (one at a time).
func TestEngineSplitBudget(t *testing.T) {
	path := testmodels.Path(t, "stories260K-F32.gguf")
	whole, _, err := estimate(path, Options{Batching: Batching{On: true}})
	if err != nil {
		t.Fatal(err)
	}
	bes := twoCPUs(t)
	o := Options{Backends: bes, Split: []float64{1, 1}, Batching: Batching{On: true}}
	half, _, err := estimate(path, o)
	if err != nil {
		t.Fatal(err)
	}
	if 2*half < whole || half >= whole {
		t.Fatalf("per-device estimate %d of a whole %d", half, whole)
	}
	budget := half + (whole-half)/4
	e := newTestEngine(t, EngineOptions{Budget: budget, Open: Options{Backends: bes, Split: []float64{1, 1}}, KeepAlive: new(time.Duration(-1))})
	useModel(t, e, path)
	l, err := e.Acquire(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	m := l.Model()
	if len(m.Devices()) != 2 {
		t.Fatalf("devices %+v", m.Devices())
	}
	if n := m.deviceInUse(); n > budget || n >= m.Devices()[0].Memory.InUse()+m.Devices()[1].Memory.InUse() {
		t.Fatalf("device use %d, budget %d", n, budget)
	}
	// The same budget refuses the model on one device.
	one := newTestEngine(t, EngineOptions{Budget: budget})
	if _, err := one.Acquire(t.Context(), path); !errors.Is(err, ErrBudget) {
		t.Fatalf("whole model within a per-device budget: %v", err)
	}
}
