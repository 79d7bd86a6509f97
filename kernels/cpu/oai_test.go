package cpu

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
)

func f32Vec(name string, v []float32) *kernels.Weight {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return &kernels.Weight{Name: name, Type: gguf.TypeF32, Cols: len(v), Rows: 1, Host: b}
}

// TestAttentionSinks: with sinks, Attention gives a float64 reference's
// softmax in which each head's sink is one more score with no value, with
// and without a window.
func TestAttentionSinks(t *testing.T) {
	const heads, kvHeads, hd, n = 4, 2, 8, 6
	r := rand.New(rand.NewPCG(3, 4))
	fill := func(k int) []float32 {
		v := make([]float32, k)
		for i := range v {
			v[i] = float32(r.NormFloat64())
		}
		return v
	}
	q, k, v := fill(n*heads*hd), fill(n*kvHeads*hd), fill(n*kvHeads*hd)
	sinks := []float32{2, -1, 0.5, 4}
	for _, window := range []int{0, 3} {
		a := kernels.Attn{Heads: heads, KVHeads: kvHeads, HeadDim: hd, Scale: 0.3, Window: window, Sinks: f32Vec("sinks", sinks)}
		be := New(2)
		c, err := be.NewKVCache(1, 16, kvHeads*hd)
		if err != nil {
			t.Fatal(err)
		}
		ten := func(x []float32) kernels.Tensor {
			return kernels.Tensor{Len: len(x), Host: append([]float32(nil), x...)}
		}
		out := ten(make([]float32, n*heads*hd))
		if err := be.Attention(out, ten(q), ten(k), ten(v), c, 0, 0, n, a); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			for h := range heads {
				g := h / (heads / kvHeads)
				first := a.First(i)
				mx := float64(sinks[h])
				sc := make([]float64, i+1)
				for p := first; p <= i; p++ {
					var s float64
					for j := range hd {
						s += float64(q[(i*heads+h)*hd+j]) * float64(k[(p*kvHeads+g)*hd+j])
					}
					sc[p] = s * float64(a.Scale)
					mx = math.Max(mx, sc[p])
				}
				sum := math.Exp(float64(sinks[h]) - mx)
				for p := first; p <= i; p++ {
					sum += math.Exp(sc[p] - mx)
				}
				for j := range hd {
					var want float64
					for p := first; p <= i; p++ {
						want += math.Exp(sc[p]-mx) / sum * float64(v[(p*kvHeads+g)*hd+j])
					}
					if got := out.Host[(i*heads+h)*hd+j]; math.Abs(float64(got)-want) > 1e-5 {
						t.Fatalf("window %d token %d head %d dim %d: %v, want %v", window, i, h, j, got, want)
					}
				}
			}
		}
		be.FreeKVCache(c)
		be.Close()
	}
}

// TestSwiGLUOAI: the clamps and the gated product, value by value.
func TestSwiGLUOAI(t *testing.T) {
	be := New(1)
	defer be.Close()
	gate := []float32{-2, 0, 1, 7, 9, 3}
	up := []float32{0.5, 3, -9, 2, 8, -1}
	dst := kernels.Tensor{Len: 6, Host: make([]float32, 6)}
	if err := be.SwiGLUOAI(dst, kernels.Tensor{Len: 6, Host: gate}, kernels.Tensor{Len: 6, Host: up}, 6, 1.702, 7); err != nil {
		t.Fatal(err)
	}
	for i := range gate {
		g := math.Min(float64(gate[i]), 7)
		u := math.Max(math.Min(float64(up[i]), 7), -7)
		want := g / (1 + math.Exp(-1.702*g)) * (u + 1)
		if math.Abs(float64(dst.Host[i])-want) > 1e-5*math.Max(1, math.Abs(want)) {
			t.Errorf("gate %v up %v: %v, want %v", gate[i], up[i], dst.Host[i], want)
		}
	}
	if err := be.SwiGLUOAI(dst, kernels.Tensor{Len: 6, Host: gate}, kernels.Tensor{Len: 6, Host: up}, 6, 1.702, 0); err == nil {
		t.Error("a limit of 0 was accepted")
	}
}
