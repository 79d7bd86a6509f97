package gpu

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels/conformance"
	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/rocm"
)

// TestMMQ32MatchesCPU: the prompt products of the weight types the CPU
// multiplies on 8-bit activations (MatMulPrompt: the mmq32 kernels for
// Q4_0 and Q8_0 up to mmq32MaxRows rows, the GEMM on q8_to_f16's operand
// beyond and for the other types) give the CPU backend's results far more
// closely than the f16 GEMM they replaced (logged for comparison), by the
// conformance suite's measure, the error relative to Σ|w·x| per output:
// under 1e-4 through mmq32 (the same codes, block sums and float steps),
// under 1e-3 and a quarter of the f16 GEMM's through the GEMM (only the
// f16 rounding of q·d and of the weights differs). Pieces of 16 to 130
// rows (every tile, partial tiles of x and of the 64 weight rows of a
// block), stories260K's widths (64, 96 columns: two and three blocks) and
// the 8B model's. Every type's 8-bit choice is on for it (q8Every), after
// a check of the default: Q4_0 alone.
func TestMMQ32MatchesCPU(t *testing.T) {
	b := mmqBackend(t)
	rng := rand.New(rand.NewPCG(rand.Uint64(), 32))
	for _, typ := range []gguf.Type{gguf.TypeQ4_0, gguf.TypeQ8_0, gguf.TypeQ5_0} { // the default: Q4_0 alone (mmqDefault)
		w := conformance.RandomWeight(rng, "w", typ, 64, 64)
		if err := b.LoadWeight(w); err != nil {
			t.Fatal(err)
		}
		q4 := typ == gguf.TypeQ4_0
		if b.q8GEMM(w) != q4 || b.mmq32Fits(w, rocm.DevPtr(w.Dev)) != q4 {
			t.Errorf("%s by default: q8 GEMM %v, mmq32 %v; want %v", typ, b.q8GEMM(w), b.mmq32Fits(w, rocm.DevPtr(w.Dev)), q4)
		}
		b.FreeWeight(w)
	}
	defer q8Every(b)()
	cb := cpu.New(2)
	defer cb.Close()
	for _, sh := range []struct {
		typ        gguf.Type
		rows, cols int
	}{
		{gguf.TypeQ4_0, 32, 64}, {gguf.TypeQ4_0, 172, 64}, {gguf.TypeQ4_0, 45, 96}, {gguf.TypeQ4_0, 301, 4096}, {gguf.TypeQ4_0, 70, 14336},
		{gguf.TypeQ8_0, 512, 64}, {gguf.TypeQ8_0, 33, 96}, {gguf.TypeQ8_0, 300, 4096}, {gguf.TypeQ8_0, 19, 14336},
		{gguf.TypeQ5_0, 40, 96}, {gguf.TypeQ4_1, 33, 64}, {gguf.TypeQ5_1, 70, 4096}, {gguf.TypeIQ4_NL, 45, 2048},
	} {
		w := conformance.RandomWeight(rng, "w", sh.typ, sh.rows, sh.cols)
		if err := b.LoadWeight(w); err != nil {
			t.Fatal(err)
		}
		mma := sh.typ == gguf.TypeQ4_0 || sh.typ == gguf.TypeQ8_0
		if b.mmq32Fits(w, rocm.DevPtr(w.Dev)) != mma || !b.q8GEMM(w) {
			t.Fatalf("%s %d×%d: mmq32 fits %v (want %v), q8 GEMM %v", sh.typ, sh.rows, sh.cols, !mma, mma, b.q8GEMM(w))
		}
		for _, n := range []int{16, 17, 32, 64, 65, 130} {
			xs := randVec(rng, n*sh.cols, 1)
			cx, _ := cb.Alloc(n * sh.cols)
			cy, _ := cb.Alloc(n * sh.rows)
			if err := cb.Write(cx, 0, xs); err != nil {
				t.Fatal(err)
			}
			if err := cb.MatMul(cy, w, cx, n); err != nil {
				t.Fatal(err)
			}
			want := make([]float32, n*sh.rows)
			if err := cb.Read(want, cy, 0); err != nil {
				t.Fatal(err)
			}
			cb.Free(cx)
			cb.Free(cy)
			x := upload(t, b, xs)
			y, _ := b.Alloc(n * sh.rows)
			var errs [2]float64 // mmq32, then the f16 GEMM
			for i, off := range []bool{false, true} {
				if err := b.Write(y, 0, nanVec(n*sh.rows)); err != nil {
					t.Fatal(err)
				}
				b.mmqOff = off
				err := b.MatMulPrompt(y, w, x, n)
				b.mmqOff = false
				if err != nil {
					t.Fatal(err)
				}
				got := download(t, b, y)
				for r := range n {
					xi := xs[r*sh.cols : (r+1)*sh.cols]
					ref := make([]float64, sh.rows)
					for k := range ref {
						ref[k] = float64(want[r*sh.rows+k])
					}
					errs[i] = max(errs[i], relScaled(got[r*sh.rows:(r+1)*sh.rows], ref, matScale(t, w, xi)))
				}
			}
			path, bound := "mmq32", 1e-4
			if !mma || n > mmq32MaxRows {
				path, bound = "q8 GEMM", min(1e-3, errs[1]/4)
			}
			if !(errs[0] < bound) {
				t.Errorf("%s %d×%d n=%d: %s off the CPU by %.3g relative to Σ|w·x|, over %.3g (f16 GEMM: %.3g)",
					sh.typ, sh.rows, sh.cols, n, path, errs[0], bound, errs[1])
			}
			t.Logf("%s %d×%d n=%d: %s worst row against the CPU %.3g (f16 GEMM %.3g)", sh.typ, sh.rows, sh.cols, n, path, errs[0], errs[1])
			b.Free(y)
			b.Free(x)
		}
		b.FreeWeight(w)
	}
}

// BenchmarkMMQ32: the prompt product of Q4_0 weights of the 8B shapes at
// 64 to 512 rows of x: the mmq32 kernels (with the quantization of x)
// against the dequantize + f16 GEMM path they replace (cuBLAS from
// vendorMinN rows where found). Reports µs per product and the rate in
// TOPS (2·rows·cols·n operations).
func BenchmarkMMQ32(b *testing.B) {
	bk := mmqBackend(b)
	defer q8Every(bk)()
	bk.waitVendor()
	rng := rand.New(rand.NewPCG(7, 8))
	for _, sh := range [][2]int{{4096, 4096}, {14336, 4096}, {4096, 14336}} {
		rows, cols := sh[0], sh[1]
		w := conformance.RandomWeight(rng, "w", gguf.TypeQ4_0, rows, cols)
		copies, free := weightCopies(b, bk, w)
		const maxN = 512
		x := upload(b, bk, conformance.RandomVector(rng, maxN*cols, 1))
		for _, n := range []int{64, 128, 512} {
			for _, path := range []string{"mmq32", "gemm"} {
				b.Run(fmt.Sprintf("q4_0/%dx%d/n=%d/%s", rows, cols, n, path), func(b *testing.B) {
					y, _ := bk.Alloc(n * rows)
					defer bk.Free(y)
					var ms float32
					err := bk.do(func(c *rocm.Ctx) error {
						var err error
						ms, err = timeOn(c, bk.stream, 2*len(copies), b.N, func(i int) error {
							cw := copies[i%len(copies)]
							wp := rocm.DevPtr(cw.Dev)
							if path == "gemm" {
								return bk.gemm(c, "q4_0", cw, wp, y, x, n)
							}
							return bk.mmq32(c, "q4_0", cw, wp, y, x, n, nil)
						})
						return err
					})
					if err != nil {
						b.Fatal(err)
					}
					sec := float64(ms) / 1e3 / float64(b.N)
					b.ReportMetric(sec*1e6, "us/op")
					b.ReportMetric(2*float64(rows)*float64(cols)*float64(n)/sec/1e12, "TOPS")
				})
			}
		}
		free()
	}
}

// q8Every chooses the 8-bit prompt product for every type that has one
// (mmqVariants' "q8") and returns what puts b's choice back.
func q8Every(b *Backend) (restore func()) {
	was := b.mmqChoice
	b.mmqChoice = maps.Clone(was)
	for typ, vs := range mmqVariants {
		if slices.Contains(vs, "q8") {
			b.mmqChoice[typ] = "q8"
		}
	}
	return func() { b.mmqChoice = was }
}
