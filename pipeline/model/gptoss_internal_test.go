package model

import (
	"math"
	"slices"
	"testing"
)

// TestRouteTopK: gpt-oss's router picks the k largest logits, best first
// (ties: the lower index; NaN last), and weights them by the softmax over
// those k alone.
func TestRouteTopK(t *testing.T) {
	nan := float32(math.NaN())
	logits := []float32{
		0.5, 3, -1, 3, 2, 0, // token 0: 1 and 3 tie
		nan, 1, nan, 0, -2, -3, // token 1: NaN below any number
	}
	sel, w := make([]int32, 6), make([]float32, 6)
	routeTopK(logits, 2, 6, 3, sel, w)
	if want := []int32{1, 3, 4, 1, 3, 4}; !slices.Equal(sel, want) {
		t.Fatalf("selected %v, want %v", sel, want)
	}
	e := math.Exp(-1)
	for i, want := range []float64{1 / (2 + e), 1 / (2 + e), e / (2 + e)} {
		if math.Abs(float64(w[i])-want) > 1e-6 {
			t.Errorf("token 0 weight %d: %v, want %v", i, w[i], want)
		}
	}
	if s := w[3] + w[4] + w[5]; math.Abs(float64(s)-1) > 1e-6 {
		t.Errorf("token 1's weights sum to %v", s)
	}
}

// TestYaRNDivisors: the fast pairs (below YaRN's low correction dimension)
// keep their frequency, the slow ones (above the high one) are divided by
// the factor, and those between blend monotonically; gpt-oss-20b's ramp
// runs from pair 8 to pair 18 (ggml's corr dims for 64 dimensions, base
// 150000, 4096 positions).
func TestYaRNDivisors(t *testing.T) {
	lo, hi := yarnCorrDims(64, 4096, 150000)
	if lo != 8 || hi != 18 {
		t.Fatalf("corr dims %v…%v, want 8…18", lo, hi)
	}
	d := yarnDivisors(64, 4096, 150000, 32)
	for k, v := range d {
		switch {
		case k <= 8 && v != 1:
			t.Errorf("pair %d: divisor %v, want 1", k, v)
		case k >= 18 && math.Abs(float64(v)-32) > 1e-4:
			t.Errorf("pair %d: divisor %v, want 32", k, v)
		case k > 0 && v < d[k-1]:
			t.Errorf("pair %d: divisor %v below pair %d's %v", k, v, k-1, d[k-1])
		}
	}
	if m := yarnMScale(32); math.Abs(float64(m)-(1+0.1*math.Log(32))) > 1e-6 || yarnMScale(1) != 1 {
		t.Errorf("mscale %v", m)
	}
}
