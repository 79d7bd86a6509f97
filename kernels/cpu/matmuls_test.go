package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/conformance"
)

// TestMatMulsMatchesMatMul: several weights times one input in one loop
// (a layer's Q, K, V; gate and up) give MatMul's numbers bit for bit, for
// decode steps (one shared loop) and longer ones (one MatMul each), with
// weights of one type, of types sharing an activation form, and of types
// that do not (one MatMul each again).
func TestMatMulsMatchesMatMul(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	const cols = 512
	sets := [][]gguf.Type{
		{gguf.TypeQ4_K, gguf.TypeQ4_K, gguf.TypeQ4_K},
		{gguf.TypeQ4_K, gguf.TypeQ6_K},
		{gguf.TypeQ8_0, gguf.TypeQ8_0},
		{gguf.TypeQ8_0, gguf.TypeQ4_K, gguf.TypeF32},
		// a mixture's decode step: 8 experts' gate and up (maxMulti)
		{gguf.TypeQ4_K, gguf.TypeQ4_K, gguf.TypeQ4_K, gguf.TypeQ4_K, gguf.TypeQ4_K, gguf.TypeQ4_K, gguf.TypeQ4_K, gguf.TypeQ4_K,
			gguf.TypeQ4_K, gguf.TypeQ4_K, gguf.TypeQ4_K, gguf.TypeQ4_K, gguf.TypeQ4_K, gguf.TypeQ4_K, gguf.TypeQ4_K, gguf.TypeQ4_K},
	}
	b := New(2)
	defer b.Close()
	for _, types := range sets {
		var ws []*kernels.Weight
		for i, ty := range types {
			ws = append(ws, conformance.RandomWeight(rng, "w", ty, 64+36*i, cols))
		}
		for _, n := range []int{1, 2, 3, 5} {
			x := kernels.Tensor{Len: n * cols, Host: conformance.RandomVector(rng, n*cols, 1)}
			var got, want []kernels.Tensor
			for _, w := range ws {
				got = append(got, kernels.Tensor{Len: n * w.Rows, Host: make([]float32, n*w.Rows)})
				want = append(want, kernels.Tensor{Len: n * w.Rows, Host: make([]float32, n*w.Rows)})
			}
			for i, w := range ws {
				if err := b.MatMul(want[i], w, x, n); err != nil {
					t.Fatal(err)
				}
			}
			if err := b.MatMuls(got, ws, x, n); err != nil {
				t.Fatal(err)
			}
			for i := range ws {
				for j, v := range want[i].Host {
					if math.Float32bits(got[i].Host[j]) != math.Float32bits(v) {
						t.Fatalf("%v, n=%d: weight %d value %d: %g, MatMul %g", types, n, i, j, got[i].Host[j], v)
					}
				}
			}
		}
	}
	if err := b.MatMuls(make([]kernels.Tensor, 1), make([]*kernels.Weight, 2), kernels.Tensor{}, 1); err == nil {
		t.Error("two weights for one output: no error")
	}
}
