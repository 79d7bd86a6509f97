package model_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/pipeline/internal/archtest"
	"github.com/forge-llm/forge/pipeline/model"
	"github.com/forge-llm/forge/pipeline/synth"
)

// hostRouter is the CPU backend with kernels.ExpertRouter composed of its
// own ops and the host router: the model's device-routed decode path
// (moe_gpu.go) runs on it without a GPU, so its wiring (which buffers,
// which slots, which order) is checked against the host path.
type hostRouter struct{ *cpu.Backend }

var _ kernels.ExpertRouter = hostRouter{}

func (hostRouter) NewExpertTable(ws []*kernels.Weight) (kernels.ExpertTable, error) {
	return slices.Clone(ws), nil
}

func (hostRouter) FreeExpertTable(kernels.ExpertTable) {}

func (r hostRouter) RouteTopK(ids, w, logits kernels.Tensor, n, experts, k int, rule kernels.Routing) error {
	sel := make([]int32, n*k)
	switch rule {
	case kernels.RouteSoftmax:
		model.RouteOnHost(logits.Host[:n*experts], n, experts, k, sel, w.Host[:n*k])
	case kernels.RouteTopKSoftmax:
		model.RouteTopKOnHost(logits.Host[:n*experts], n, experts, k, sel, w.Host[:n*k])
	default:
		return fmt.Errorf("hostRouter: rule %d", rule)
	}
	for i, e := range sel {
		ids.Host[i] = kernels.IDBits(e)
	}
	return nil
}

func (r hostRouter) ExpertMatMuls(dsts []kernels.Tensor, tables []kernels.ExpertTable, ids, x kernels.Tensor, k int, shared bool) error {
	for i, t := range tables {
		ws := t.([]*kernels.Weight)
		rows, cols := ws[0].Rows, ws[0].Cols
		for j := range k {
			xj := x.View(0, cols)
			if !shared {
				xj = x.View(j*cols, cols)
			}
			if err := r.MatMul(dsts[i].View(j*rows, rows), ws[kernels.IDOf(ids.Host[j])], xj, 1); err != nil {
				return err
			}
		}
	}
	return nil
}

func (r hostRouter) AddExpertBias(dst kernels.Tensor, table kernels.ExpertTable, ids kernels.Tensor, k, cols int) error {
	ws := table.([]*kernels.Weight)
	for j := range k {
		if err := r.AddBias(dst.View(j*cols, cols), ws[kernels.IDOf(ids.Host[j])], 1); err != nil {
			return err
		}
	}
	return nil
}

var _ kernels.ExpertBiaser = hostRouter{}

func (r hostRouter) MixSlots(dst, src, w kernels.Tensor, n, k, cols int) error {
	seq := make([]int32, n*k)
	for j := range seq {
		seq[j] = int32(j)
	}
	return r.MixRows(dst, src, seq, w.Host[:n*k], n, k, cols)
}

var _ kernels.RouterFuser = hostRouter{}

// RouteFused is the product, the bias and RouteTopK as the model queues
// them.
func (r hostRouter) RouteFused(ids, w, logits, x kernels.Tensor, gate, bias *kernels.Weight, k int, rule kernels.Routing) (bool, error) {
	if err := r.MatMul(logits, gate, x, 1); err != nil {
		return true, err
	}
	if bias != nil {
		if err := r.AddBias(logits, bias, 1); err != nil {
			return true, err
		}
	}
	return true, r.RouteTopK(ids, w, logits, 1, gate.Rows, k, rule)
}

var _ kernels.MixNormer = hostRouter{}

// MixAddRMSNormQ8 is MixSlots then the residual add and the norm as the
// model's preNorm queues them on the CPU.
func (r hostRouter) MixAddRMSNormQ8(dst, x, res, src, w kernels.Tensor, k int, nw *kernels.Weight, eps float32, q kernels.Q8) (kernels.Q8, error) {
	if err := r.MixSlots(res, src, w, 1, k, nw.Cols); err != nil {
		return kernels.Q8{}, err
	}
	if err := r.Add(x, x, res, nw.Cols); err != nil {
		return kernels.Q8{}, err
	}
	return kernels.Q8{}, r.RMSNorm(dst, x, nw, 1, eps)
}

// layerHook is the file's weights with each layer changed by mod first.
type layerHook struct {
	*model.FileWeights
	mod func(*model.LayerWeights)
}

func (h layerHook) Layer(ctx context.Context, i int) (*model.LayerWeights, error) {
	lw, err := h.FileWeights.Layer(ctx, i)
	if err == nil && h.mod != nil {
		h.mod(lw)
	}
	return lw, err
}

func openHooked(t *testing.T, path string, be kernels.Backend, mod func(*model.LayerWeights)) *model.Model {
	t.Helper()
	cfg, w := archtest.OpenWeights(t, path)
	m, err := model.New(be, cfg, layerHook{w, mod}, model.Options{Ctx: 64})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

// sameGreedy runs a prompt and 8 greedy decode steps on a and b and fails
// unless every step's logits are the same bits.
func sameGreedy(t *testing.T, a, b *model.Model) {
	t.Helper()
	sameLogitBits(t, a, b, []int32{1, 403, 407, 261, 378}, 9, "host-routed expert by expert")
}

// TestMoEDeviceRoutedDecode: the device-routed decode path (router,
// expert products by id, weighted sum from device weights), run on the
// CPU through hostRouter, gives the host path's logits bit for bit for
// both softmax-routed mixtures in float and quantized mixes, and runs in
// every layer of every decode step; it stays off where a layer records a
// usage profile or cannot say that all its experts are resident. The
// prompt's layers run as products by id over every (token, slot) pair
// (mixtureRows) in every case, reading the routing back where it must.
func TestMoEDeviceRoutedDecode(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	for _, preset := range []string{"tiny-qwen3moe", "tiny-mixtral", "tiny-gpt-oss"} {
		for _, mix := range []synth.Mix{synth.MixF32, synth.MixQ4_KM} {
			path := filepath.Join(dir, preset+"-"+string(mix)+".gguf")
			if err := synth.WriteFile(ctx, path, synth.Options{Shape: synth.Presets[preset], Mix: mix, Seed: 11}); err != nil {
				t.Fatal(err)
			}
			layers := synth.Presets[preset].Layers
			t.Run(preset+"/"+string(mix), func(t *testing.T) {
				plain := cpu.New(2)
				defer plain.Close()
				dev := hostRouter{cpu.New(2)}
				defer dev.Close()
				// every decode step's layers, and the prompt's last layer
				// (its feed-forward runs on the one row that needs logits)
				all := 8*layers + 1
				for _, c := range []struct {
					name  string
					mod   func(*model.LayerWeights)
					steps int
				}{
					{"resident", nil, all},
					{"all experts ready", func(lw *model.LayerWeights) {
						lw.ExpertReady = func(context.Context, int) error { return nil }
						lw.ExpertsReady = func() bool { return true }
					}, all},
					{"readiness unknown", func(lw *model.LayerWeights) {
						lw.ExpertReady = func(context.Context, int) error { return nil }
					}, 0},
					{"usage profile", func(lw *model.LayerWeights) { lw.ExpertUsed = func(int, int) {} }, 0},
				} {
					for _, fused := range []bool{true, false} {
						m := openHooked(t, path, dev, c.mod)
						if !fused {
							model.MoENoMixNorm(m)
							model.MoENoFusedRoute(m)
						}
						host := model.OpenModel(t, path, plain, model.Options{Ctx: 64})
						model.MoEPerExpert(host)
						sameGreedy(t, m, host)
						if got := model.MoEDeviceSteps(m); got != c.steps {
							t.Errorf("%s: %d layers routed on the device, want %d", c.name, got, c.steps)
						}
						if got, want := model.MixNormed(m), 0; fused && c.steps > 0 && got == want {
							t.Errorf("%s: no weighted sum was fused with the norm after it", c.name)
						}
						// the 5-token prompt's layers but the last, whose
						// feed-forward runs on one row: products by id
						if got, want := model.MoERowRuns(m), layers-1; got != want {
							t.Errorf("%s: %d prompt layers ran as products by id, want %d", c.name, got, want)
						}
					}
				}
			})
		}
	}
}
