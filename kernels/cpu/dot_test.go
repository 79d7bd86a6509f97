package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/forge-llm/forge/dequant"
	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/conformance"
)

// preparedRow quantizes x for weight type t the way MatMul does with the
// Go kernels.
func preparedRow(t gguf.Type, x []float32) *qrow { return preparedFor(goKernels[t].act, x) }

// preparedFor quantizes x into activation form k.
func preparedFor(k actKind, x []float32) *qrow {
	var a actBuf
	a.prepare(k, 1, len(x), x)
	a.quantRow(0, x)
	return &a.rows[0]
}

// exactDot is the float64 dot product of the decoded weight row with the
// activation row exactly as the kernel sees it (the quantized codes times
// their scales). Kernels must agree with it to float32 rounding, which
// checks every bit and scale of every format, not just "close enough".
func exactDot(t *testing.T, typ gguf.Type, w []byte, x *qrow, cols int) (dot, mag float64) {
	t.Helper()
	wf := make([]float32, cols)
	if err := dequant.ToFloat32(typ, w, wf); err != nil {
		t.Fatal(err)
	}
	for c := range cols {
		var xv float64
		switch {
		case x.f != nil:
			xv = float64(x.f[c])
		case len(x.bs) > 0 || typ.BlockSize() == 256:
			xv = float64(x.q[c]) * float64(x.d[c/256])
		default:
			xv = float64(x.q[c]) * float64(x.d[c/32])
		}
		dot += float64(wf[c]) * xv
		mag += math.Abs(float64(wf[c]) * xv)
	}
	if typ == gguf.TypeQ4_1 || typ == gguf.TypeQ5_1 {
		// The offset term m·Σx uses ggml's Q8_1 sum s (rounded to f16)
		// instead of the exact d_x·Σq: swap it in.
		bb := typ.BlockBytes()
		for b := range cols / 32 {
			m := float64(f16le(w[b*bb+2:])) // BlockQ4_1.M / BlockQ5_1.M
			var sum float64
			for _, q := range x.q[32*b : 32*b+32] {
				sum += float64(q)
			}
			dot += m * (float64(x.s[b]) - float64(x.d[b])*sum)
		}
	}
	return dot, mag
}

// TestKernelsExact checks the Go kernels and the kernels MatMul uses
// (assembly where the CPU has it) against exactDot on random rows of every
// type, at several row lengths.
func TestKernelsExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 1))
	for _, typ := range conformance.MatMulTypes {
		bs := max(typ.BlockSize(), 32)
		for _, nb := range []int{1, 2, 3, 8, 23} {
			cols := nb * bs
			w := conformance.RandomWeight(rng, "w", typ, 4, cols)
			rb := len(w.Host) / 4
			for r := range 4 {
				x := conformance.RandomVector(rng, cols, 1+3*rng.Float64())
				if r == 3 {
					clear(x[:bs]) // an all-zero block: zero scale
				}
				row := preparedRow(typ, x)
				wb := w.Host[r*rb : (r+1)*rb]
				want, mag := exactDot(t, typ, wb, row, cols)
				for _, k := range []struct {
					name string
					k    kernel
				}{{"go", goKernels[typ]}, {"fast", fastKernels[typ]}} {
					got := float64(k.k.dot(wb, preparedFor(k.k.act, x)))
					if math.Abs(got-want) > 2e-6*mag+1e-30 {
						t.Errorf("%s %s cols=%d row %d: got %g, want %g (Σ|w·x| = %g)", typ, k.name, cols, r, got, want, mag)
					}
				}
			}
		}
	}
}

// TestFastMatchesGo runs the whole MatMul with the fast table and with the
// Go table on the same inputs: the two must agree to float32 rounding,
// including the multi-token tiling.
func TestFastMatchesGo(t *testing.T) {
	t.Logf("assembly kernels enabled: %v", asmEnabled)
	rng := rand.New(rand.NewPCG(rand.Uint64(), 2))
	b := New(2)
	defer b.Close()
	for _, typ := range conformance.MatMulTypes {
		for _, sh := range [][3]int{{13, 768, 1}, {64, 2048, 3}, {300, 256, 9}, {37, 1024, 6}, {20, 4096, 4}, {5, 768, 13}, {11, 172, 6}, {3, 64, 5}} {
			rows, cols, n := sh[0], sh[1], sh[2]
			if cols%typ.BlockSize() != 0 {
				continue // 172: only the plain types (F16's ggml_vec_dot_f16 path)
			}
			w := conformance.RandomWeight(rng, "w", typ, rows, cols)
			x := kernels.Tensor{Len: n * cols, Host: conformance.RandomVector(rng, n*cols, 1)}
			fast := kernels.Tensor{Len: n * rows, Host: make([]float32, n*rows)}
			slow := kernels.Tensor{Len: n * rows, Host: make([]float32, n*rows)}
			if err := b.matmul(fast, w, x, n, fastKernels); err != nil {
				t.Fatal(err)
			}
			if err := b.matmul(slow, w, x, n, goKernels); err != nil {
				t.Fatal(err)
			}
			var num, den float64
			for i := range fast.Host {
				d := float64(fast.Host[i] - slow.Host[i])
				num += d * d
				den += float64(slow.Host[i]) * float64(slow.Host[i])
			}
			if e := math.Sqrt(num / den); !(e < 1e-5) {
				t.Errorf("%s %d×%d n=%d: fast and Go kernels differ by %.3g", typ, rows, cols, n, e)
			}
		}
	}
}

// TestQuantQ8_K checks the Q8_K activation quantizer against dequant's
// reference encoder byte for byte (same codes, scale and sums).
func TestQuantQ8_K(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 3))
	for _, nb := range []int{1, 3, 16} {
		x := conformance.RandomVector(rng, 256*nb, 2)
		clear(x[:256*min(nb-1, 1)]) // an all-zero block when nb > 1
		x[256*nb-1] = -7            // a negative extreme
		q := make([]int8, len(x))
		d := make([]float32, nb)
		bs := make([]int16, 16*nb)
		quantQ8_K(x, q, d, bs)
		ref := make([]byte, nb*gguf.TypeQ8_K.BlockBytes())
		if err := dequant.Quantize(gguf.TypeQ8_K, x, ref); err != nil {
			t.Fatal(err)
		}
		for b := range nb {
			blk := ref[b*292 : (b+1)*292] // dequant.BlockQ8_K: D f32, Qs[256], Bsums[16]
			if got, want := math.Float32bits(d[b]), uint32(blk[0])|uint32(blk[1])<<8|uint32(blk[2])<<16|uint32(blk[3])<<24; got != want {
				t.Fatalf("block %d: d bits %#x, want %#x", b, got, want)
			}
			for i := range 256 {
				if q[256*b+i] != int8(blk[4+i]) {
					t.Fatalf("block %d code %d: %d, want %d", b, i, q[256*b+i], int8(blk[4+i]))
				}
			}
			for g := range 16 {
				if want := int16(uint16(blk[260+2*g]) | uint16(blk[261+2*g])<<8); bs[16*b+g] != want {
					t.Fatalf("block %d sum %d: %d, want %d", b, g, bs[16*b+g], want)
				}
			}
		}
	}
}

// TestQuantQ8_0 checks the Q8_0/Q8_1 activation quantizer against the x86
// llama.cpp formula evaluated independently: d = f16(max|x|/127), codes
// round-half-even(x·127/max|x|), s = d·Σq (Q8_0) or f16(max/127·Σq) (Q8_1).
func TestQuantQ8_0(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 4))
	x := conformance.RandomVector(rng, 32*40, 3)
	clear(x[64:96])
	x[5] = 127.0 / 2 // exact half-way products: ties must go to even
	x[6] = 127.0 / 2 * 0
	for _, q81 := range []bool{false, true} {
		q := make([]int8, len(x))
		d := make([]float32, 40)
		s := make([]float32, 40)
		quantQ8_0(x, q, d, s, q81)
		for b := range 40 {
			var amax float64
			for _, v := range x[32*b : 32*b+32] {
				amax = math.Max(amax, math.Abs(float64(v)))
			}
			wantD := dequant.F16ToF32(dequant.F32ToF16(float32(amax) / 127))
			if d[b] != wantD {
				t.Fatalf("block %d: d = %g, want %g", b, d[b], wantD)
			}
			var sum int32
			for i, v := range x[32*b : 32*b+32] {
				var want int8
				if amax > 0 {
					want = int8(math.RoundToEven(float64(v * (127 / float32(amax)))))
				}
				if q[32*b+i] != want {
					t.Fatalf("block %d code %d: %d, want %d (x = %g)", b, i, q[32*b+i], want, v)
				}
				sum += int32(want)
			}
			wantS := wantD * float32(sum)
			if q81 {
				wantS = dequant.F16ToF32(dequant.F32ToF16(float32(amax) / 127 * float32(sum)))
			}
			if s[b] != wantS {
				t.Fatalf("q81=%v block %d: s = %g, want %g", q81, b, s[b], wantS)
			}
		}
	}
}

// TestFloatLoops checks the attention vector loops (assembly where
// available) against the Go loops at odd lengths.
func TestFloatLoops(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 5))
	for _, n := range []int{1, 15, 16, 31, 32, 33, 64, 100, 128, 1000} {
		a, c := conformance.RandomVector(rng, n, 1), conformance.RandomVector(rng, n, 1)
		var want, mag float64
		for i := range a {
			want += float64(a[i]) * float64(c[i])
			mag += math.Abs(float64(a[i]) * float64(c[i]))
		}
		for _, f := range []func(a, b []float32) float32{dotF32, dotF32Go} {
			if got := float64(f(a, c)); math.Abs(got-want) > 1e-6*mag {
				t.Errorf("dot n=%d: %g, want %g", n, got, want)
			}
		}
		for _, f := range []func(y, x []float32, a float32){axpyF32, axpyF32Go} {
			y := append([]float32(nil), c...)
			f(y, a, 0.5)
			for i := range y {
				if want := c[i] + 0.5*a[i]; math.Abs(float64(y[i]-want)) > 1e-6*(math.Abs(float64(want))+1) {
					t.Fatalf("axpy n=%d element %d: %g, want %g", n, i, y[i], want)
				}
			}
		}
	}
}
