package conformance

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
)

// gpt-oss's ops (kernels/oai.go): Attention with attention sinks, and the
// clamped SwiGLU. Both are optional capabilities; a backend that lacks one
// skips its check, saying so.

// sinkLogit is value h of an F32 sinks weight on the host.
func sinkLogit(w *kernels.Weight, h int) float64 {
	return float64(math.Float32frombits(binary.LittleEndian.Uint32(w.Host[4*h:])))
}

// sinksWeight is an F32 weight of the given per-head logits, loaded on b.
func sinksWeight(t *testing.T, b kernels.Backend, v []float32) *kernels.Weight {
	raw := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(x))
	}
	w := &kernels.Weight{Name: "attn_sinks", Type: gguf.TypeF32, Cols: len(v), Rows: 1, Host: raw}
	load(t, b, w)
	return w
}

func (s *suite) attentionSinks(t *testing.T) {
	b := s.newBackend(t)
	if sa, ok := kernels.As[kernels.SinkAttender](b); !ok || !sa.AttentionSinks() {
		t.Skipf("backend %s has no attention sinks (kernels.SinkAttender)", b.Name())
	}
	rng := s.rng(t)
	cases := []struct {
		name  string
		a     kernels.Attn
		steps []int
	}{
		// gpt-oss's two kinds of layer (head size 64, grouped queries):
		// windowed and full, prompts and decode steps.
		{"sinks-window", kernels.Attn{Heads: 8, KVHeads: 2, HeadDim: 64, Window: 6}, []int{9, 1, 1, 4, 1}},
		{"sinks", kernels.Attn{Heads: 8, KVHeads: 2, HeadDim: 64}, []int{7, 1, 2, 1}},
		{"sinks-long", kernels.Attn{Heads: 4, KVHeads: 1, HeadDim: 64, Window: 128}, []int{300, 1, 2}},
		{"sinks-mha", kernels.Attn{Heads: 4, KVHeads: 4, HeadDim: 32}, []int{5, 1, 1}},
	}
	for _, c := range cases {
		a := c.a
		a.Scale = float32(1 / math.Sqrt(float64(a.HeadDim)))
		// Logits from well below the scores to well above them, so that
		// some heads are dominated by their sink.
		v := RandomVector(rng, a.Heads, 2)
		v[0] = 6
		a.Sinks = sinksWeight(t, b, v)
		attentionSteps(t, b, rng, c.name, a, c.steps)
	}
}

func (s *suite) swigluOAI(t *testing.T) {
	b := s.newBackend(t)
	be, ok := kernels.As[kernels.SwiGLUOAIer](b)
	if !ok {
		t.Skipf("backend %s has no clamped SwiGLU (kernels.SwiGLUOAIer)", b.Name())
	}
	rng := s.rng(t)
	const alpha, limit = 1.702, 7.0 // gpt-oss's
	for _, n := range vecSizes {
		g, u := RandomVector(rng, n, 8), RandomVector(rng, n, 8) // across both clamps
		dst := alloc(t, b, n)
		if err := be.SwiGLUOAI(dst, upload(t, b, g), upload(t, b, u), n, alpha, limit); err != nil {
			t.Fatal(err)
		}
		want := make([]float64, n)
		for i := range want {
			x := min(float64(g[i]), limit)
			y := min(max(float64(u[i]), -limit), limit)
			want[i] = x / (1 + math.Exp(-alpha*x)) * (y + 1)
		}
		check(t, name("swiglu oai n=%d", n), download(t, b, dst), want, 1e-5)
	}
	if err := be.SwiGLUOAI(alloc(t, b, 4), alloc(t, b, 4), alloc(t, b, 4), 4, alpha, 0); err == nil {
		t.Error("swiglu oai with limit 0 accepted")
	}
}
