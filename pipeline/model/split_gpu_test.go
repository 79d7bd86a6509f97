package model

import (
	"context"
	"path/filepath"
	"slices"
	"testing"

	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/kernels"
)

// TestGPUSplit: on one card, a model split over two GPU backends (two
// contexts of device 0, each with its own stream, KV cache and scratch;
// the activations crossing by peer copy) gives the single backend's
// logits at every position, op by op and with each part's decode stage
// recorded and replayed, for stories260K and a K-quant synth model with
// rope_freqs.
func TestGPUSplit(t *testing.T) {
	one := openGPU(t)
	a, b := openGPU(t), openGPU(t)
	// (A synthetic model with rope_freqs, which the split copies to every
	// device, is in pipeline's TestGPUSplitTokens: synth imports this
	// package, so this test cannot make one.)
	freqs := testmodels.Path(t, "stories260K-Q8_0.gguf") // (synth-kq has one layer: nothing to split)
	ctx := context.Background()
	prompt := []int32{1, 403, 407, 261, 378, 9, 13}
	for _, path := range []string{testmodels.Path(t, "stories260K-Q4_K_M.gguf"), testmodels.Path(t, "stories260K-F32.gguf"), freqs} {
		for _, noGraph := range []bool{false, true} {
			t.Run(filepath.Base(path)+map[bool]string{false: "/graph", true: "/ops"}[noGraph], func(t *testing.T) {
				o := Options{Ctx: 64, NoGraph: noGraph}
				_, cfg, w := openWeights(t, path)
				ref, err := New(one, cfg, w, o)
				if err != nil {
					t.Fatal(err)
				}
				defer ref.Close()
				// Each part has weights of its own: a GPU backend uploads a
				// host weight on first use and keeps the device address in
				// it.
				_, _, wa := openWeights(t, path)
				_, _, wb := openWeights(t, path)
				m, err := NewSplit(cfg, []Part{
					{Backend: a, Weights: wa, Lo: 0, Hi: cfg.Layers / 2},
					{Backend: b, Weights: wb, Lo: cfg.Layers / 2, Hi: cfg.Layers},
				}, o)
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				lr, err := ref.Forward(ctx, prompt, 0)
				if err != nil {
					t.Fatal(err)
				}
				lr = slices.Clone(lr)
				ls, err := m.Forward(ctx, prompt, 0)
				if err != nil {
					t.Fatal(err)
				}
				worst := 0.0
				var ids []int32
				for pos := len(prompt); len(ids) < 32; pos++ {
					e := relErr(ls, f64s(lr))
					worst = max(worst, e)
					if e > 1e-5 {
						t.Fatalf("position %d: split logits differ by %.3g", pos, e)
					}
					id := argmax(lr)
					if got := argmax(ls); got != id {
						t.Fatalf("position %d: split picks %d, single %d", pos, got, id)
					}
					ids = append(ids, id)
					if lr, err = ref.Forward(ctx, []int32{id}, pos); err != nil {
						t.Fatal(err)
					}
					lr = slices.Clone(lr)
					if ls, err = m.Forward(ctx, []int32{id}, pos); err != nil {
						t.Fatal(err)
					}
				}
				sp := m.split
				if !noGraph && (sp.graphOff || slices.Contains(sp.stages, kernels.StepGraph(nil))) {
					t.Fatalf("decode stages not recorded (off %v)", sp.graphOff)
				}
				if m.HostCrossings() != 0 {
					t.Errorf("%d crossings through the host; want every one a peer copy", m.HostCrossings())
				}
				// The device argmax from a fresh start agrees.
				next, err := m.Greedy(ctx, prompt, 0)
				if err != nil || next != ids[0] {
					t.Fatalf("Greedy = %d, %v; want %d", next, err, ids[0])
				}
				for p, want := range ids[1:] {
					if next, err = m.Greedy(ctx, []int32{next}, len(prompt)+p); err != nil || next != want {
						t.Fatalf("Greedy at %d = %d, %v; want %d", len(prompt)+p, next, err, want)
					}
				}
				t.Logf("32 ids equal; worst relative logits difference %.2e", worst)
			})
		}
	}
}
