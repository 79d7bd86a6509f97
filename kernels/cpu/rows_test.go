package cpu

import (
	"math"
	"math/rand/v2"
	"slices"
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

// TestQuantMatchesGo checks the activation quantizers MatMul uses
// (assembly where available) against the Go ones bit for bit, on rows with
// the awkward cases: all-zero blocks, a maximum magnitude reached by both
// signs (the first one sets Q8_K's sign), exact half-way products (ties to
// even), and tiny and huge magnitudes.
func TestQuantMatchesGo(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 7))
	for trial := range 40 {
		nb := 1 + rng.IntN(6)
		x := conformance.RandomVector(rng, 256*nb, math.Pow(10, float64(rng.IntN(9)-4)))
		switch trial % 5 {
		case 1:
			clear(x[256*rng.IntN(nb):][:256])
		case 2:
			for b := range nb {
				i, j := 256*b+rng.IntN(256), 256*b+rng.IntN(256)
				x[i], x[j] = 3, -3 // both signs at the maximum
			}
		case 3:
			for b := range 8 * nb {
				x[32*b] = 127 // max 127: codes are the values, halves tie
				for i := 1; i < 32; i++ {
					x[32*b+i] = float32(rng.IntN(255)-127) / 2
				}
			}
		case 4:
			clear(x[:32])
		}
		q1, q2 := make([]int8, len(x)), make([]int8, len(x))
		d1, d2 := make([]float32, nb), make([]float32, nb)
		bs1, bs2 := make([]int16, 16*nb), make([]int16, 16*nb)
		quantQ8_K(x, q1, d1, bs1)
		quantQ8_KGo(x, q2, d2, bs2)
		if !slices.Equal(q1, q2) || !slices.Equal(bs1, bs2) || !bitsEqual(d1, d2) {
			t.Fatalf("trial %d: Q8_K differs from the Go quantizer:\nd %v / %v\nbs %v / %v", trial, d1, d2, bs1, bs2)
		}
		for _, q81 := range []bool{false, true} {
			n32 := len(x) / 32
			d1, d2 := make([]float32, n32), make([]float32, n32)
			s1, s2 := make([]float32, n32), make([]float32, n32)
			quantQ8_0(x, q1, d1, s1, q81)
			quantQ8_0Go(x, q2, d2, s2, q81)
			if !slices.Equal(q1, q2) || !bitsEqual(d1, d2) || !bitsEqual(s1, s2) {
				t.Fatalf("trial %d q81=%v: Q8_0 differs from the Go quantizer", trial, q81)
			}
		}
	}
}

func bitsEqual(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// TestRowKernelsMatchSingle checks every four-row decode kernel against the
// one-row kernel of its type bit for bit, so that a row's result does not
// depend on which rows it was computed with.
func TestRowKernelsMatchSingle(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 8))
	for typ, k := range fastKernels {
		if k.dotR4 == nil {
			continue
		}
		bs := max(typ.BlockSize(), 32)
		for _, nb := range []int{1, 3, 24, 64} {
			cols := nb * bs
			w := conformance.RandomWeight(rng, "w", typ, 4, cols)
			rb := len(w.Host) / 4
			x := preparedFor(k.act, conformance.RandomVector(rng, cols, 1))
			var out [4]float32
			k.dotR4(w.Host, rb, x, &out)
			for r := range 4 {
				if want := k.dot(w.Host[r*rb:(r+1)*rb], x); math.Float32bits(out[r]) != math.Float32bits(want) {
					t.Errorf("%s cols=%d row %d: four-row kernel %g, one-row %g", typ, cols, r, out[r], want)
				}
			}
		}
	}
}

// TestExpLoopsMatchGo checks SiLUMul's and softmax's exponential loops
// (assembly where available) against the Go loops bit for bit, over
// magnitudes from 1e-9 to 1e3, both signs, lengths that are not multiples
// of 8, and infinities and NaN among them (which the assembly leaves to
// the Go loop).
func TestExpLoopsMatchGo(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 9))
	for trial := range 200 {
		n := rng.IntN(100)
		g, u := make([]float32, n), make([]float32, n)
		for i := range g {
			g[i] = float32(math.Pow(10, rng.Float64()*12-9) * float64(1-2*rng.IntN(2)))
			u[i] = float32(rng.NormFloat64())
			if trial%7 == 3 && rng.IntN(10) == 0 {
				g[i] = []float32{float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 700.5, -745.2, 88.7}[rng.IntN(6)]
			}
		}
		d1, d2 := make([]float32, n), make([]float32, n)
		siluMul(d1, g, u)
		siluMulGo(d2, g, u)
		if !bitsEqual(d1, d2) {
			t.Fatalf("trial %d: silu·mul differs from the Go loop\n%v\n%v", trial, d1, d2)
		}
		m := float32(0)
		if n > 0 {
			m = g[rng.IntN(n)]
		}
		x1, x2 := append([]float32(nil), g...), append([]float32(nil), g...)
		expShift(x1, m)
		expShiftGo(x2, m)
		if !bitsEqual(x1, x2) {
			t.Fatalf("trial %d: exp shift differs from the Go loop\n%v\n%v", trial, x1, x2)
		}
	}
}

// TestTokenKernelsMatchSingle checks the two-, four- and eight-token kernels
// against the one-token kernel of their type bit for bit on every token
// (the batch invariance MatMul promises up to kernels.MaxBatchRows rows).
func TestTokenKernelsMatchSingle(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 10))
	for typ, k := range fastKernels {
		if k.inexact4 || (k.dot4 == nil && k.dot8 == nil) {
			continue
		}
		bs := max(typ.BlockSize(), 32)
		for _, nb := range []int{1, 3, 8} {
			cols := nb * bs
			w := conformance.RandomWeight(rng, "w", typ, 1, cols)
			x := conformance.RandomVector(rng, 8*cols, 1)
			var a actBuf
			a.prepare(k.act, 8, cols, x)
			for j := range 8 {
				a.quantRow(j, x[j*cols:(j+1)*cols])
			}
			var got [8]float32
			if k.dot8 != nil {
				k.dot8(w.Host, &a, 0, &got)
			} else {
				var o [4]float32
				for j := 0; j < 8; j += 4 {
					k.dot4(w.Host, &a, j, &o)
					copy(got[j:], o[:])
				}
			}
			for j := range 8 {
				if want := k.dot(w.Host, &a.rows[j]); math.Float32bits(got[j]) != math.Float32bits(want) {
					t.Errorf("%s cols=%d token %d: multi-token kernel %g, one-token %g", typ, cols, j, got[j], want)
				}
			}
			if k.dot2 != nil {
				var o [2]float32
				for j := 0; j < 8; j += 2 {
					k.dot2(w.Host, &a, j, &o)
					for i, v := range o {
						if want := k.dot(w.Host, &a.rows[j+i]); math.Float32bits(v) != math.Float32bits(want) {
							t.Errorf("%s cols=%d token %d: two-token kernel %g, one-token %g", typ, cols, j+i, v, want)
						}
					}
				}
			}
		}
	}
}
