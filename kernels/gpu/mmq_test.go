package gpu

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/conformance"
	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/rocm"
)

// mmqBackend is the test backend, skipping where the mmq kernels cannot
// run (no mma.sync on 8-bit integers: HIP, CUDA before sm_80).
func mmqBackend(t testing.TB) *Backend {
	t.Helper()
	b := gpuBackend(t, false)
	d := b.w.Device
	if d.Backend != rocm.CUDA || d.CCMajor < 8 || b.warp != 32 {
		t.Skipf("mmq kernels need CUDA sm_80 or later (have %s)", d)
	}
	return b
}

var mmqShapes = []struct {
	typ        gguf.Type
	rows, cols int
}{
	// odd row counts (a partial last tile of 16), column counts whose
	// super-blocks do not divide among the warps' residues (768: 3 of
	// them, fewer than the warps), and the 8B model's widths
	{gguf.TypeQ4_K, 301, 4096}, {gguf.TypeQ4_K, 77, 14336}, {gguf.TypeQ4_K, 40, 768}, {gguf.TypeQ4_K, 33, 1280},
	{gguf.TypeQ6_K, 300, 4096}, {gguf.TypeQ6_K, 45, 14336}, {gguf.TypeQ6_K, 70, 768}, {gguf.TypeQ6_K, 19, 2560},
}

// TestMMQBatchInvariant: a row of x multiplied alone (MatMul n = 1, the
// one-row matrix-vector kernel) and among 15 or 63 random other rows, at
// a random place among them (MatMul n = 16 and 64, the mmq kernels), comes
// out bit for bit the same; also at n = 2…9 (the 8-row tile and the first
// 16-row one); every kernel variant.
func TestMMQBatchInvariant(t *testing.T) {
	b := mmqBackend(t)
	rng := rand.New(rand.NewPCG(rand.Uint64(), 25))
	for _, sh := range mmqShapes {
		w := conformance.RandomWeight(rng, "w", sh.typ, sh.rows, sh.cols)
		if err := b.LoadWeight(w); err != nil {
			t.Fatal(err)
		}
		if !b.mmqUse(w, rocm.DevPtr(w.Dev), 16) {
			t.Fatalf("%s %d×%d: mmq not chosen for 16 rows", sh.typ, sh.rows, sh.cols)
		}
		target := randVec(rng, sh.cols, 1)
		xt := upload(t, b, target)
		y1, _ := b.Alloc(sh.rows)
		if err := b.MatMul(y1, w, xt, 1); err != nil {
			t.Fatal(err)
		}
		alone := download(t, b, y1)
		b.Free(y1)
		for _, n := range []int{2, 3, 8, 9, 16, 64} {
			for trial := range 2 * len(mmqVariants[sh.typ]) {
				b.mmqVariant = mmqVariants[sh.typ][trial/2] // every variant
				at := rng.IntN(n)
				xs := randVec(rng, n*sh.cols, 1+float64(trial%2)) // other rows at another scale too
				copy(xs[at*sh.cols:], target)
				x := upload(t, b, xs)
				y, _ := b.Alloc(n * sh.rows)
				if err := b.Write(y, 0, nanVec(n*sh.rows)); err != nil {
					t.Fatal(err)
				}
				if err := b.MatMul(y, w, x, n); err != nil {
					t.Fatal(err)
				}
				got := download(t, b, y)
				if i := sameBits(got[at*sh.rows:(at+1)*sh.rows], alone); i >= 0 {
					t.Errorf("%s %d×%d variant %q: the row at %d of %d differs from it alone at output %d: %g vs %g",
						sh.typ, sh.rows, sh.cols, b.mmqVariant, at, n, i, got[at*sh.rows+i], alone[i])
				}
				for k := range got {
					if got[k] != got[k] {
						t.Fatalf("%s %d×%d n=%d: output %d (row %d) not written", sh.typ, sh.rows, sh.cols, n, k%sh.rows, k/sh.rows)
					}
				}
				b.Free(y)
				b.Free(x)
			}
		}
		b.mmqVariant = ""
		b.FreeWeight(w)
	}
}

// TestMMQMatchesCPU: the mmq kernels against the CPU backend (the
// reference) with the conformance suite's measure, the error relative to
// Σ|w·x| per output, for 2…64 rows.
func TestMMQMatchesCPU(t *testing.T) {
	b := mmqBackend(t)
	cb := cpu.New(2)
	defer cb.Close()
	rng := rand.New(rand.NewPCG(rand.Uint64(), 26))
	for _, sh := range mmqShapes {
		w := conformance.RandomWeight(rng, "w", sh.typ, sh.rows, sh.cols)
		for _, n := range []int{2, 13, 64} {
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
			if err := b.LoadWeight(w); err != nil {
				t.Fatal(err)
			}
			x := upload(t, b, xs)
			y, _ := b.Alloc(n * sh.rows)
			if err := b.MatMul(y, w, x, n); err != nil {
				t.Fatal(err)
			}
			got := download(t, b, y)
			worst := 0.0
			for i := range n {
				xi := xs[i*sh.cols : (i+1)*sh.cols]
				ref := make([]float64, sh.rows)
				for r := range ref {
					ref[r] = float64(want[i*sh.rows+r])
				}
				e := relScaled(got[i*sh.rows:(i+1)*sh.rows], ref, matScale(t, w, xi))
				worst = max(worst, e)
				// Both sides round x to 8 bits, in different groups (the
				// GPU by 32 values, the CPU's K-quant dot by 256), each up to
				// half a step of its group's largest value: a row can differ
				// by a few per cent of Σ|w·x|. 2e-2 was seen exceeded once
				// (0.0208, Q4_K 40×768, 64 rows, H100) on fresh inputs.
				if !(e < 3e-2) {
					t.Errorf("%s %d×%d n=%d row %d: error %.3g relative to Σ|w·x| against the CPU backend",
						sh.typ, sh.rows, sh.cols, n, i, e)
				}
			}
			t.Logf("%s %d×%d n=%d: worst error %.3g relative to Σ|w·x|", sh.typ, sh.rows, sh.cols, n, worst)
			b.Free(y)
			b.Free(x)
			b.FreeWeight(w)
		}
	}
}

// BenchmarkMMQ: the 8B shapes at 1…64 rows of x, the multi-row matrix-
// vector kernels ("mv") against the mmq kernels ("mmq{variant}"), each timing
// including the quantization of x as a step does; at 16…64 rows also the
// prompt path's dequantize + GEMM ("gemm"). n = 1 is the one-row kernel.
func BenchmarkMMQ(b *testing.B) {
	bk := mmqBackend(b)
	rng := rand.New(rand.NewPCG(5, 6))
	for _, sh := range []struct {
		typ        gguf.Type
		rows, cols int
	}{{gguf.TypeQ4_K, 4096, 4096}, {gguf.TypeQ4_K, 14336, 4096}, {gguf.TypeQ6_K, 4096, 14336}} {
		rows, cols := sh.rows, sh.cols
		w := conformance.RandomWeight(rng, "w", sh.typ, rows, cols)
		copies, free := weightCopies(b, bk, w)
		x := upload(b, bk, conformance.RandomVector(rng, kernels.MaxBatchRows*cols, 1))
		kt, _ := kernelType(sh.typ)
		for _, n := range []int{1, 2, 4, 8, 16, 32, 64} {
			paths := []string{"mv"}
			if n > 1 {
				for _, v := range mmqVariants[sh.typ] {
					paths = append(paths, "mmq"+v)
				}
			}
			if n >= 16 {
				paths = append(paths, "gemm")
			}
			for _, path := range paths {
				b.Run(fmt.Sprintf("%s/%dx%d/n=%d/%s", sh.typ, rows, cols, n, path), func(b *testing.B) {
					y, _ := bk.Alloc(n * rows)
					defer bk.Free(y)
					bk.mmqOff = !strings.HasPrefix(path, "mmq")
					bk.mmqVariant = strings.TrimPrefix(path, "mmq")
					defer func() { bk.mmqOff, bk.mmqVariant = false, "" }()
					var ms float32
					err := bk.do(func(c *rocm.Ctx) error {
						var err error
						ms, err = timeOn(c, bk.stream, 2*len(copies), b.N, func(i int) error {
							cw := copies[i%len(copies)]
							wp := rocm.DevPtr(cw.Dev)
							switch {
							case path == "gemm":
								return bk.gemm(c, kt, cw, wp, y, x, n)
							case n == 1:
								return bk.matvec(c, kt, cw, wp, dptr(y), dptr(x), 1, nil)
							default:
								return bk.matvecRows(c, kt, cw, wp, y, x, n, nil)
							}
						})
						return err
					})
					if err != nil {
						b.Fatal(err)
					}
					sec := float64(ms) / 1e3 / float64(b.N)
					b.ReportMetric(sec*1e6, "us/op")
					b.ReportMetric(float64(len(w.Host))/sec/1e9, "GB/s")
				})
			}
		}
		free()
	}
}
