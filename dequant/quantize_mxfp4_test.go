package dequant

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/forge-llm/forge/gguf"
)

// TestQuantizeMXFP4: the block's exponent puts its largest magnitude in
// E2M1's top binade, values on the grid come back exactly, and random
// values come back within half the coarsest grid step at the block's
// scale, except those beyond the largest code (ggml's rule saturates
// magnitudes over 1.5·2^⌊log₂ amax⌋ there).
func TestQuantizeMXFP4(t *testing.T) {
	x := make([]float32, 32)
	// amax 6: ⌊log₂ 6⌋ = 2, E = 127, scale 2^-1; the codes' values ×0.5.
	copy(x, []float32{6, 1, -3, 0.5, -6, 2, 4, -0.5})
	b := make([]byte, 17)
	if err := Quantize(gguf.TypeMXFP4, x, b); err != nil {
		t.Fatal(err)
	}
	if b[0] != 127 {
		t.Fatalf("exponent %d, want 127", b[0])
	}
	y := make([]float32, 32)
	if err := ToFloat32(gguf.TypeMXFP4, b, y); err != nil {
		t.Fatal(err)
	}
	for i := range x {
		if y[i] != x[i] {
			t.Errorf("value %d: %v came back as %v", i, x[i], y[i])
		}
	}

	r := rand.New(rand.NewPCG(1, 2))
	x = make([]float32, 32*64)
	for i := range x {
		x[i] = float32(r.NormFloat64()) * 0.25
	}
	b = make([]byte, 17*64)
	y = make([]float32, len(x))
	if err := Quantize(gguf.TypeMXFP4, x, b); err != nil {
		t.Fatal(err)
	}
	if err := ToFloat32(gguf.TypeMXFP4, b, y); err != nil {
		t.Fatal(err)
	}
	for blk := range 64 {
		d := E8M0ToF32Half(b[17*blk])
		for j := range 32 {
			i := 32*blk + j
			// The coarsest gap of E2M1 is 4 (8 → 12) at the doubled scale.
			top := 12 * float64(d)
			if math.Abs(float64(x[i])) > top {
				if math.Abs(float64(y[i])) != top {
					t.Fatalf("block %d value %d: %v beyond the top code came back as %v, want ±%v", blk, j, x[i], y[i], top)
				}
				continue
			}
			if e := math.Abs(float64(y[i] - x[i])); e > 2*float64(d)*1.0001 {
				t.Fatalf("block %d value %d: %v came back as %v (scale %v)", blk, j, x[i], y[i], d)
			}
		}
	}
}
