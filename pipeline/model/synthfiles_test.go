package model_test

// The tests that write their models with pipeline/synth live in the
// external test package: synth derives its files from this package's
// architecture registry, so the internal tests can not import it.

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/pipeline/model"
	"github.com/forge-llm/forge/pipeline/synth"
)

// TestQwen2AgainstReference runs a synthetic Qwen2 model (Q/K/V biases,
// NeoX RoPE, tied head, grouped-query attention), written with the gguf
// writer through pipeline/synth, through prompt and decode, and checks the
// logits against the float64 reference.
func TestQwen2AgainstReference(t *testing.T) {
	dir := t.TempDir()
	for _, mix := range []synth.Mix{synth.MixF32, synth.MixQ8_0, synth.MixQ4_KM} {
		path := filepath.Join(dir, "qwen2-"+string(mix)+".gguf")
		if err := synth.WriteFile(context.Background(), path, synth.Options{Shape: synth.Presets["tiny-qwen2"], Mix: mix, Seed: 11}); err != nil {
			t.Fatal(err)
		}
		for _, b := range model.Backends(t) {
			t.Run(b.Name+"/"+string(mix), func(t *testing.T) {
				model.CheckAgainstReference(t, path, b.Backend, model.Tolerance(b.Name, mix != synth.MixF32 && mix != synth.MixF16))
			})
		}
	}
}

// TestRopeVariantsAgainstReference: Llama 3.1's rope_freqs tensor and
// linear RoPE scaling, each on a small synthetic Llama, against the float64
// reference (which reads rope_freqs from the file itself).
func TestRopeVariantsAgainstReference(t *testing.T) {
	dir := t.TempDir()
	cases := map[string]func(*synth.Shape){
		"rope_freqs": func(s *synth.Shape) { s.RopeFreqs = true; s.RopeBase = 500000 },
		"linear4":    func(s *synth.Shape) { s.RopeLinear = 4 },
	}
	for name, mod := range cases {
		s := synth.Presets["tiny"]
		mod(&s)
		path := filepath.Join(dir, name+".gguf")
		if err := synth.WriteFile(context.Background(), path, synth.Options{Shape: s, Mix: synth.MixF32, Seed: 5}); err != nil {
			t.Fatal(err)
		}
		for _, b := range model.Backends(t) {
			t.Run(name+"/"+b.Name, func(t *testing.T) {
				m := model.OpenModel(t, path, b.Backend, model.Options{})
				switch name {
				case "rope_freqs":
					if model.RopeParams(m).Freqs == nil {
						t.Fatal("rope_freqs.weight not picked up")
					}
				case "linear4":
					if m.Cfg.Rope.Scale != 0.25 {
						t.Fatalf("linear factor 4 gave position scale %g, want 0.25", m.Cfg.Rope.Scale)
					}
				}
				model.CheckAgainstReference(t, path, b.Backend, 1e-4)
			})
		}
	}
}

// TestPresetsRoundTrip: every preset's shape gives a valid configuration,
// and the small presets' files, written by synth from the registry's
// table, read back as that configuration and pass the loader's shape
// checks and weights view.
func TestPresetsRoundTrip(t *testing.T) {
	dir := t.TempDir()
	for _, name := range synth.PresetNames() {
		s := synth.Presets[name]
		want, err := s.Config()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if s.Params() <= 0 {
			t.Errorf("%s: %d parameters", name, s.Params())
		}
		if want.Layers > 4 {
			continue // real shapes: the configuration only
		}
		path := filepath.Join(dir, name+".gguf")
		if err := synth.WriteFile(context.Background(), path, synth.Options{Shape: s, Mix: synth.MixQ8_0, Seed: 1}); err != nil {
			t.Fatal(err)
		}
		f, err := gguf.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		got, err := model.ConfigFromFile(f)
		if err == nil && got != want {
			err = fmt.Errorf("config read back\n got %+v\nwant %+v", got, want)
		}
		if err == nil {
			err = model.CheckShapes(f, got)
		}
		if err == nil {
			_, err = model.NewFileWeights(f, got)
		}
		f.Close()
		if err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestSlidingWindow: a file whose metadata sets llama.attention.sliding_window
// attends through the window: the logits of the positions inside the
// first window equal those of the same weights without one, the later ones
// differ, and the backends agree on them.
func TestSlidingWindow(t *testing.T) {
	const window, n = 4, 10
	dir := t.TempDir()
	logits := map[string][]float32{}
	for _, w := range []int{0, window} {
		s := synth.Presets["tiny-mistral"]
		s.SlidingWindow = w
		path := filepath.Join(dir, fmt.Sprintf("w%d.gguf", w))
		if err := synth.WriteFile(context.Background(), path, synth.Options{Shape: s, Seed: 7, Std: 0.25}); err != nil {
			t.Fatal(err)
		}
		for _, b := range model.Backends(t) {
			m := model.OpenModel(t, path, b.Backend, model.Options{AllLogits: true, Ctx: 32})
			if got := m.Cfg.LayerAttn(1).Window; got != w {
				t.Fatalf("window %d read back as %d", w, got)
			}
			prompt := []int32{1, 300, 301, 302, 303, 304, 305, 306, 307, 308}
			l, err := m.Forward(context.Background(), prompt[:n], 0)
			if err != nil {
				t.Fatal(err)
			}
			logits[fmt.Sprintf("%s/%d", b.Name, w)] = slices.Clone(l)
		}
	}
	v := len(logits["host/0"]) / n
	rowDiff := func(a, b []float32, r int) float64 {
		var d float64
		for i := r * v; i < (r+1)*v; i++ {
			d = max(d, math.Abs(float64(a[i]-b[i])))
		}
		return d
	}
	for r := range n {
		d := rowDiff(logits["host/0"], logits[fmt.Sprintf("host/%d", window)], r)
		if r < window && d > 1e-4 {
			t.Errorf("position %d (inside the window): logits differ by %g", r, d)
		}
		if r >= window && d < 1e-3 {
			t.Errorf("position %d (past the window): logits equal the unwindowed ones", r)
		}
		if d := rowDiff(logits["host/4"], logits["cpu/4"], r); d > 1e-3 {
			t.Errorf("position %d: host and cpu differ by %g", r, d)
		}
	}
}

// TestPhi3RowViews: Phi-3's Q, K, V, gate and up weights are row views of
// the fused tensors (the same bytes, not copies), and LongRoPE takes the
// short factors within the original context and the long ones beyond it.
func TestPhi3RowViews(t *testing.T) {
	path := filepath.Join(t.TempDir(), "phi3.gguf")
	if err := synth.WriteFile(context.Background(), path, synth.Options{Shape: synth.Presets["tiny-phi3"], Mix: synth.MixQ8_0, Seed: 2}); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c, err := model.ConfigFromFile(f)
	if err != nil {
		t.Fatal(err)
	}
	fw, err := model.NewFileWeights(f, c)
	if err != nil {
		t.Fatal(err)
	}
	lw, err := fw.Layer(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	rb, _ := lw.QKV.Type.RowBytes(uint64(c.Embd))
	same := func(what string, view []byte, parent []byte, row int) {
		if &view[0] != &parent[row*int(rb)] || len(view) == 0 {
			t.Errorf("%s is not a view of its fused tensor at row %d", what, row)
		}
	}
	same("Q", lw.Q.Host, lw.QKV.Host, 0)
	same("K", lw.K.Host, lw.QKV.Host, c.QDim())
	same("V", lw.V.Host, lw.QKV.Host, c.QDim()+c.KVDim())
	same("gate", lw.Gate.Host, lw.GateUp.Host, 0)
	same("up", lw.Up.Host, lw.GateUp.Host, c.FF)
	if lw.V.Rows != c.KVDim() || lw.Up.Rows != c.FF {
		t.Errorf("view rows %d, %d", lw.V.Rows, lw.Up.Rows)
	}
	g := fw.Globals()
	if c.RopeOrigCtx != 32 || c.RopeAttnFactor <= 1 || g.RopeLong == nil || g.RopeShort == nil {
		t.Fatalf("LongRoPE not read: orig %d, factor %g, factors %v %v", c.RopeOrigCtx, c.RopeAttnFactor, g.RopeLong != nil, g.RopeShort != nil)
	}
	for ctx, want := range map[int]string{16: "rope_factors_short.weight", 32: "rope_factors_short.weight", 64: "rope_factors_long.weight"} {
		m := model.OpenModel(t, path, model.Backends(t)[0].Backend, model.Options{Ctx: ctx})
		if got := model.RopeParams(m).Freqs; got == nil || got.Name != want {
			t.Errorf("context %d: rope factors %v, want %s", ctx, got, want)
		}
	}
}
