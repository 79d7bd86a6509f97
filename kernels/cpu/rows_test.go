package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/forge-llm/forge/kernels/conformance"
)

// TestRowLoopsMatchSingle checks that scoresF32 and axpyRowsF32 (assembly
// where available) give, bit for bit, what dotF32 and axpyF32 give called
// once per row: attention keeps its arithmetic whichever form runs, so the
// paged and contiguous caches, and the Go and assembly builds' per-row
// kernels, agree.
func TestRowLoopsMatchSingle(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 6))
	for _, hd := range []int{16, 32, 48, 64, 96, 100, 128, 256} {
		for _, count := range []int{1, 2, 7, 16, 33} {
			stride := hd + 3*rng.IntN(20)
			q := conformance.RandomVector(rng, hd, 1)
			k := conformance.RandomVector(rng, (count-1)*stride+hd, 1)
			got := make([]float32, count)
			scoresF32(q, k, stride, got)
			for p := range count {
				if want := dotF32(q, k[p*stride:p*stride+hd]); math.Float32bits(got[p]) != math.Float32bits(want) {
					t.Fatalf("scores hd=%d count=%d row %d: %g, want %g", hd, count, p, got[p], want)
				}
			}
			e := conformance.RandomVector(rng, count, 1)
			o := conformance.RandomVector(rng, hd, 1)
			want := append([]float32(nil), o...)
			axpyRowsF32(o, k, stride, e)
			for p := range count {
				axpyF32(want, k[p*stride:p*stride+hd], e[p])
			}
			for i := range o {
				if math.Float32bits(o[i]) != math.Float32bits(want[i]) {
					t.Fatalf("axpy rows hd=%d count=%d element %d: %g, want %g", hd, count, i, o[i], want[i])
				}
			}
		}
	}
}
