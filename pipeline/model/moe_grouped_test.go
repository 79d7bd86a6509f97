package model_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/pipeline/model"
	"github.com/forge-llm/forge/pipeline/synth"
)

// hostGrouper is hostRouter with kernels.ExpertGrouper composed of one
// MatMul per expert over its rows: the model's grouped prompt path
// (moe_grouped.go) runs on it without a GPU, so its wiring (which rows,
// which buffers, the in-place SiLUMul, the weighted sum) is checked
// against the per-expert path.
type hostGrouper struct{ hostRouter }

var _ kernels.ExpertGrouper = hostGrouper{}

func (hostGrouper) GroupsFit(kernels.ExpertTable) bool { return true }

func (g hostGrouper) GroupedMatMuls(dsts []kernels.Tensor, tables []kernels.ExpertTable, x kernels.Tensor, start []int32) error {
	for i, t := range tables {
		ws := t.([]*kernels.Weight)
		rows, cols := ws[0].Rows, ws[0].Cols
		for e := range len(start) - 1 {
			lo, n := int(start[e]), int(start[e+1]-start[e])
			if n == 0 {
				continue
			}
			if err := g.MatMul(dsts[i].View(lo*rows, n*rows), ws[e], x.View(lo*cols, n*cols), n); err != nil {
				return fmt.Errorf("hostGrouper: expert %d: %w", e, err)
			}
		}
	}
	return nil
}

// TestMoEGroupedPromptWiring: a prompt's mixture with its expert products
// grouped (run on the CPU through hostGrouper) gives the per-expert path's
// logits bit for bit over a 12-token prompt and 8 greedy decode steps,
// for both softmax mixtures in float and quantized mixes; it runs in every
// layer of the prompt but the last (whose feed-forward runs on the one row
// that needs logits, routed on the device as a decode step's), also where
// the layer's experts are still arriving: then both paths ask for all the
// experts a step routed to at once (DemandExperts) before they wait for
// any, and wait only for those.
func TestMoEGroupedPromptWiring(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	prompt := []int32{1, 403, 407, 261, 378, 12, 99, 300, 17, 5, 250, 401}
	for _, preset := range []string{"tiny-qwen3moe", "tiny-mixtral"} {
		for _, mix := range []synth.Mix{synth.MixF32, synth.MixQ4_KM} {
			path := filepath.Join(dir, preset+"-"+string(mix)+".gguf")
			if err := synth.WriteFile(ctx, path, synth.Options{Shape: synth.Presets[preset], Mix: mix, Seed: 7}); err != nil {
				t.Fatal(err)
			}
			layers := synth.Presets[preset].Layers
			t.Run(preset+"/"+string(mix), func(t *testing.T) {
				dev := hostGrouper{hostRouter{cpu.New(2)}}
				defer dev.Close()
				arriving := &demandLog{demanded: map[*model.LayerWeights]map[int]bool{}}
				for _, c := range []struct {
					name string
					mod  func(*model.LayerWeights)
				}{
					{"resident", nil},
					{"arriving", arriving.hook},
				} {
					grouped := openHooked(t, path, dev, c.mod)
					each := openHooked(t, path, dev, c.mod)
					model.MoENoGrouped(each)
					// a 12-token prompt would run as products by id
					// (mixtureRows): off in both, to compare these two
					model.MoENoRows(grouped)
					model.MoENoRows(each)
					sameLogitBits(t, grouped, each, prompt, 9, "expert by expert")
					if got := model.MoEGroupedRuns(grouped); got != layers-1 {
						t.Errorf("%s: %d layers grouped, want %d (the prompt's but its last)", c.name, got, layers-1)
					}
					if got := model.MoEGroupedRuns(each); got != 0 {
						t.Errorf("%s: %d layers grouped with the grouped path off", c.name, got)
					}
				}
				arriving.check(t)
			})
		}
	}
}

// demandLog is a layer hook whose experts are "arriving": it records the
// experts each layer asked for (DemandExperts) and every wait
// (ExpertReady), and check fails a wait for an expert not asked for
// before, or asks that never named several experts at once.
type demandLog struct {
	mu       sync.Mutex
	demanded map[*model.LayerWeights]map[int]bool
	waits    int
	unasked  []string
	widest   int // most experts in one ask
}

func (d *demandLog) hook(lw *model.LayerWeights) {
	lw.ExpertReady = func(_ context.Context, e int) error {
		d.mu.Lock()
		defer d.mu.Unlock()
		d.waits++
		if !d.demanded[lw][e] {
			d.unasked = append(d.unasked, fmt.Sprint(e))
		}
		return nil
	}
	lw.ExpertsReady = func() bool { return false }
	lw.DemandExperts = func(es []int) {
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.demanded[lw] == nil {
			d.demanded[lw] = map[int]bool{}
		}
		for _, e := range es {
			d.demanded[lw][e] = true
		}
		d.widest = max(d.widest, len(es))
	}
}

func (d *demandLog) check(t *testing.T) {
	t.Helper()
	if d.waits == 0 {
		t.Fatal("no expert waited for: the arriving hook did not take")
	}
	if len(d.unasked) > 0 {
		t.Errorf("%d of %d waits for experts not asked for first: %v", len(d.unasked), d.waits, d.unasked)
	}
	if d.widest < 2 {
		t.Errorf("each ask named at most %d expert: want a step's experts asked for together", d.widest)
	}
}

// TestMoEGroupedPromptExpertFails: on the grouped path with experts still
// arriving, an expert that cannot arrive (its ExpertReady fails) fails the
// prompt with ErrExpertUnavailable, naming the expert, after the step asked
// for its experts; the same model then runs a prompt whose experts do
// arrive, to the logits of a model that never failed.
func TestMoEGroupedPromptExpertFails(t *testing.T) {
	path := filepath.Join(t.TempDir(), "moe.gguf")
	if err := synth.WriteFile(context.Background(), path, synth.Options{Shape: synth.Presets["tiny-qwen3moe"], Mix: synth.MixF32, Seed: 7}); err != nil {
		t.Fatal(err)
	}
	dev := hostGrouper{hostRouter{cpu.New(2)}}
	defer dev.Close()
	var broken sync.Map // expert → true: its loads fail
	asked := 0
	hook := func(lw *model.LayerWeights) {
		lw.ExpertsReady = func() bool { return false }
		lw.DemandExperts = func(es []int) { asked++ }
		lw.ExpertReady = func(_ context.Context, e int) error {
			if _, bad := broken.Load(e); bad {
				return fmt.Errorf("expert %d: read error (test)", e)
			}
			return nil
		}
	}
	m := openHooked(t, path, dev, hook)
	for e := range synth.Presets["tiny-qwen3moe"].Experts {
		broken.Store(e, true)
	}
	prompt := []int32{1, 403, 407, 261, 378, 12}
	_, err := m.Forward(context.Background(), prompt, 0)
	if !errors.Is(err, model.ErrExpertUnavailable) || !strings.Contains(err.Error(), "read error (test)") {
		t.Fatalf("a prompt whose experts cannot arrive: %v, want ErrExpertUnavailable naming the expert", err)
	}
	if asked == 0 {
		t.Error("the step waited without asking for its experts")
	}
	broken.Clear()
	ref := openHooked(t, path, dev, nil)
	sameLogitBits(t, m, ref, prompt, 3, "a model that never failed")
}
