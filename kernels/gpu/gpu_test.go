package gpu

import (
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/forge-llm/forge/dequant"
	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/conformance"
	"github.com/forge-llm/forge/rocm"
)

// EnvRequireGPU turns "no GPU" from a skip into a failure (as in package
// rocm): set it on the GPU machine so a missing driver cannot pass.
const EnvRequireGPU = "FORGE_REQUIRE_GPU"

// The package's tests share one worker and two backends on device 0, one
// with the default f16 KV cache and one with an f32 cache, so the kernels
// are compiled once per binary.
var shared struct {
	once     sync.Once
	w        *rocm.Worker
	b, bF32  *Backend
	err      error
	noDevice bool
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.b != nil {
		shared.b.Close()
	}
	if shared.bF32 != nil {
		shared.bF32.Close()
	}
	if shared.w != nil {
		shared.w.Close()
	}
	os.Exit(code)
}

func open() {
	rt, err := rocm.OpenAny()
	if err != nil {
		shared.err, shared.noDevice = err, true
		return
	}
	if shared.w, err = rt.NewWorker(0); err != nil {
		shared.err, shared.noDevice = err, errors.Is(err, rocm.ErrNoDevice)
		return
	}
	if shared.b, err = New(shared.w, Options{}); err != nil {
		shared.err = err
		return
	}
	shared.bF32, shared.err = New(shared.w, Options{KVF32: true})
}

// gpuBackend returns the shared backend (f32 KV cache if kvF32), skipping
// the test when no GPU is present.
func gpuBackend(t testing.TB, kvF32 bool) *Backend {
	t.Helper()
	shared.once.Do(open)
	if shared.err != nil {
		if shared.noDevice && os.Getenv(EnvRequireGPU) == "" {
			t.Skipf("no GPU (set $%s to fail instead): %v", EnvRequireGPU, shared.err)
		}
		t.Fatal(shared.err)
	}
	if kvF32 {
		return shared.bF32
	}
	return shared.b
}

// TestConformance runs the shared suite on the GPU. The suite compares
// attention with a float64 reference fed the exact keys and values, so it
// runs on the f32-cache backend; TestAttentionF16Cache covers the f16 cache.
func TestConformance(t *testing.T) {
	gpuBackend(t, true)
	conformance.Run(t, func(t *testing.T) kernels.Backend { return gpuBackend(t, true) })
}

func randVec(rng *rand.Rand, n int, sd float64) []float32 {
	return conformance.RandomVector(rng, n, sd)
}

func upload(t testing.TB, b *Backend, v []float32) kernels.Tensor {
	t.Helper()
	x, err := b.Alloc(len(v))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Free(x) })
	if err := b.Write(x, 0, v); err != nil {
		t.Fatal(err)
	}
	return x
}

func download(t testing.TB, b *Backend, x kernels.Tensor) []float32 {
	t.Helper()
	out := make([]float32, x.Len)
	if err := b.Read(out, x, 0); err != nil {
		t.Fatal(err)
	}
	return out
}

// relNorm is ‖got − want‖ / ‖want‖.
func relNorm(got []float32, want []float64) float64 {
	var num, den float64
	for i, w := range want {
		d := float64(got[i]) - w
		if math.IsNaN(d) || math.IsInf(d, 0) {
			return math.Inf(1)
		}
		num += d * d
		den += w * w
	}
	return math.Sqrt(num / den)
}

// matScale is, per output of a one-row product, √Σ_c (w[r][c]·x[c])²: the
// size of the dot product's terms. Rounding x to 8 bits perturbs each term
// by a fraction of itself, so its error is measured against this scale
// (as the conformance suite does) and not against the result, which the
// Q4_K/Q5_K/Q4_1 min terms can cancel to much less than its terms.
func matScale(t testing.TB, w *kernels.Weight, x []float32) []float64 {
	t.Helper()
	row := make([]float32, w.Cols)
	rb := len(w.Host) / w.Rows
	out := make([]float64, w.Rows)
	for r := range w.Rows {
		if err := dequant.ToFloat32(w.Type, w.Host[r*rb:(r+1)*rb], row); err != nil {
			t.Fatal(err)
		}
		var s float64
		for c, v := range row {
			p := float64(v) * float64(x[c])
			s += p * p
		}
		out[r] = math.Sqrt(s)
	}
	return out
}

// relScaled is ‖got − want‖ / ‖scale‖.
func relScaled(got []float32, want, scale []float64) float64 {
	var num, den float64
	for i, w := range want {
		d := float64(got[i]) - w
		if math.IsNaN(d) || math.IsInf(d, 0) {
			return math.Inf(1)
		}
		num += d * d
		den += scale[i] * scale[i]
	}
	return math.Sqrt(num / den)
}

// matRef is x [n][cols] · wᵀ in float64 from dequant's decoding.
func matRef(t testing.TB, w *kernels.Weight, x []float32, n int) []float64 {
	t.Helper()
	row := make([]float32, w.Cols)
	rb := len(w.Host) / w.Rows
	out := make([]float64, n*w.Rows)
	for r := range w.Rows {
		if err := dequant.ToFloat32(w.Type, w.Host[r*rb:(r+1)*rb], row); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			var s float64
			for c, v := range row {
				s += float64(v) * float64(x[i*w.Cols+c])
			}
			out[i*w.Rows+r] = s
		}
	}
	return out
}

// TestMatMulBlocks32Q8 checks the 8-bit-activation kernels of the
// 32-element block types (one and two rows per warp, grid-striding too)
// against the float64 reference; shapes they cannot take (a row that is
// not a whole number of warp-wide runs) go to mxfp4.cu's staged kernels,
// on 8-bit activations too, and "g" to the generic float kernel.
func TestMatMulBlocks32Q8(t *testing.T) {
	b := gpuBackend(t, false)
	rng := rand.New(rand.NewPCG(rand.Uint64(), 7))
	for _, typ := range []gguf.Type{gguf.TypeQ4_0, gguf.TypeQ4_1, gguf.TypeQ5_0, gguf.TypeQ5_1, gguf.TypeQ8_0} {
		for _, sh := range [][2]int{{7, 2048}, {129, 4096}, {3000, 4096}, {1000, 14336}, {33, 96}} {
			rows, cols := sh[0], sh[1]
			w := conformance.RandomWeight(rng, "w", typ, rows, cols)
			if err := b.LoadWeight(w); err != nil {
				t.Fatal(err)
			}
			x := randVec(rng, cols, 1)
			xt := upload(t, b, x)
			want, scale := matRef(t, w, x, 1), matScale(t, w, x)
			for _, v := range []string{"b1", "b2", "b4", "b2@1", "g"} {
				v, perSM, _ := strings.Cut(v, "@")
				b.mvVariant = v
				b.mvBlocksPerSM, _ = strconv.Atoi(perSM) // "@1": one block per SM, rows grid-strided
				dst, _ := b.Alloc(rows)
				if err := b.Write(dst, 0, nanVec(rows)); err != nil {
					t.Fatal(err)
				}
				if err := b.MatMul(dst, w, xt, 1); err != nil {
					t.Fatal(err)
				}
				got := download(t, b, dst)
				bound, e := 1e-5, relNorm(got, want)
				if v != "g" { // 8-bit activations (staged where b32Fits refuses the shape)
					bound, e = 1.5e-2, relScaled(got, want, scale)
				}
				if !(e < bound) {
					t.Errorf("%s %d×%d %s: relative error %.3g > %.3g", typ, rows, cols, v, e, bound)
				} else if rows == 1000 {
					t.Logf("%s %d×%d %s: relative error %.2e", typ, rows, cols, v, e)
				}
				b.Free(dst)
			}
			b.mvVariant, b.mvBlocksPerSM = "", 0
			b.FreeWeight(w)
		}
	}
}

// nanVec is n NaNs: poison for outputs a kernel must overwrite.
func nanVec(n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(math.NaN())
	}
	return v
}

// TestMatMulFastAndGEMM checks the paths the conformance suite's unaligned
// activations do not reach: the Q4_K/Q6_K fast kernels with one and two
// rows per warp (16-byte aligned x), and the f16 GEMM path with odd row and
// token counts across several tiles.
func TestMatMulFastAndGEMM(t *testing.T) {
	b := gpuBackend(t, false)
	rng := rand.New(rand.NewPCG(rand.Uint64(), 6))
	for _, typ := range []gguf.Type{gguf.TypeQ4_K, gguf.TypeQ6_K} {
		for _, sh := range [][2]int{{7, 256}, {129, 768}, {4096, 4096}, {1000, 14336}} {
			rows, cols := sh[0], sh[1]
			w := conformance.RandomWeight(rng, "w", typ, rows, cols)
			if err := b.LoadWeight(w); err != nil {
				t.Fatal(err)
			}
			x := randVec(rng, cols, 1)
			xt := upload(t, b, x)
			want, scale := matRef(t, w, x, 1), matScale(t, w, x)
			variants := []string{"n21", "n12", "n14", "q11", "q21", "q12", "q22", "q14", "p1", "p2", "p4", "r1u1", "r2u1", "r1u2", "r2u2"}
			if typ == gguf.TypeQ6_K {
				variants = []string{"t1", "t2", "t4", "c1", "c2", "q11", "q21", "q12", "q22", "q14", "p1", "p2", "p4", "r1u1", "r2u1", "s1", "s2"} // s*: unaligned shapes fall back to p2
			}
			for _, r := range variants {
				b.mvVariant = r
				b.mvBlocksPerSM = 0
				if r == "q21" || r == "t2" || r == "n21" || r == "c2" || r == "c1" {
					b.mvBlocksPerSM = 2 // grid-stride over rows
				}
				dst, _ := b.Alloc(rows)
				if err := b.MatMul(dst, w, xt, 1); err != nil {
					t.Fatal(err)
				}
				// float activations: float32 rounding; 8-bit activations
				// ("q*", "n*", "t*"): about 0.5 % of the terms' scale
				// (llama.cpp's Q8_1 trade-off).
				got := download(t, b, dst)
				bound, e := 1e-5, relNorm(got, want)
				if strings.ContainsRune("qntc", rune(r[0])) {
					bound, e = 1.5e-2, relScaled(got, want, scale)
				}
				if !(e < bound) {
					t.Errorf("%s %d×%d %s: relative error %.3g > %.3g", typ, rows, cols, r, e, bound)
				} else if bound > 1e-5 && rows == 4096 {
					t.Logf("%s %d×%d %s: relative error %.2e", typ, rows, cols, r, e)
				}
				b.Free(dst)
			}
			b.mvVariant, b.mvBlocksPerSM = "", 0
			b.FreeWeight(w)
		}
	}
	for _, typ := range []gguf.Type{gguf.TypeQ4_K, gguf.TypeQ8_0, gguf.TypeF16, gguf.TypeBF16, gguf.TypeIQ4_XS} {
		// n > kernels.MaxBatchRows: the GEMM (fewer rows take the matvec kernels)
		for _, sh := range [][3]int{{257, 256, 65}, {300, 512, 200}, {1024, 4096, 130}} {
			rows, cols, n := sh[0], sh[1], sh[2]
			w := conformance.RandomWeight(rng, "w", typ, rows, cols)
			if err := b.LoadWeight(w); err != nil {
				t.Fatal(err)
			}
			x := randVec(rng, n*cols, 1)
			dst, _ := b.Alloc(n * rows)
			// A type whose GEMM multiplies the 8-bit form of x (mmq32.go,
			// TestMMQ32MatchesCPU): mmqOff keeps it on the f16 x checked here.
			b.mmqOff = true
			err := b.MatMul(dst, w, upload(t, b, x), n)
			b.mmqOff = false
			if err != nil {
				t.Fatal(err)
			}
			// f16 operands: about 2^-11 relative rounding on each side.
			if e := relNorm(download(t, b, dst), matRef(t, w, x, n)); !(e < 2e-3) {
				t.Errorf("%s %d×%d n=%d GEMM: relative error %.3g", typ, rows, cols, n, e)
			} else {
				t.Logf("%s %d×%d n=%d GEMM: relative error %.2e", typ, rows, cols, n, e)
			}
			b.Free(dst)
			b.FreeWeight(w)
		}
	}
}

// TestDequantize decodes every type on the device and compares with
// dequant's CPU decoding.
func TestDequantize(t *testing.T) {
	b := gpuBackend(t, false)
	rng := rand.New(rand.NewPCG(rand.Uint64(), 7))
	for _, typ := range conformance.MatMulTypes {
		rows, cols := 5, 512
		w := conformance.RandomWeight(rng, "w", typ, rows, cols)
		dst, _ := b.Alloc(rows * cols)
		if err := b.Dequantize(dst, w); err != nil {
			t.Fatal(err)
		}
		want32 := make([]float32, rows*cols)
		if err := dequant.ToFloat32(typ, w.Host, want32); err != nil {
			t.Fatal(err)
		}
		want := make([]float64, len(want32))
		for i, v := range want32 {
			want[i] = float64(v)
		}
		if e := relNorm(download(t, b, dst), want); !(e < 1e-6) {
			t.Errorf("%s: relative error %.3g against dequant", typ, e)
		}
		b.Free(dst)
		b.FreeWeight(w)
	}
	bad := &kernels.Weight{Name: "odd", Type: gguf.TypeIQ2_XXS, Rows: 1, Cols: 256, Host: make([]byte, 66)}
	if err := b.Dequantize(kernels.Tensor{Len: 256, Dev: 1}, bad); err == nil {
		t.Error("dequantize of IQ2_XXS returned no error")
	}
}

// TestAttentionF16Cache runs prompt and decode steps through the f16 cache
// and the f32 cache; the two differ only by the rounding of keys and values
// to f16 (the f32 path is checked against float64 by the conformance suite).
func TestAttentionF16Cache(t *testing.T) {
	b16, b32 := gpuBackend(t, false), gpuBackend(t, true)
	rng := rand.New(rand.NewPCG(rand.Uint64(), 8))
	a := kernels.Attn{Heads: 32, KVHeads: 8, HeadDim: 128, Scale: float32(1 / math.Sqrt(128))}
	kvDim := a.KVHeads * a.HeadDim
	steps := []int{70, 1, 1, 9, 1}
	c16, err := b16.NewKVCache(2, 100, kvDim)
	if err != nil {
		t.Fatal(err)
	}
	defer b16.FreeKVCache(c16)
	c32, err := b32.NewKVCache(2, 100, kvDim)
	if err != nil {
		t.Fatal(err)
	}
	defer b32.FreeKVCache(c32)
	pos := 0
	for _, n := range steps {
		q, k, v := randVec(rng, n*a.Heads*a.HeadDim, 1), randVec(rng, n*kvDim, 1), randVec(rng, n*kvDim, 1)
		var outs [2][]float32
		for i, bk := range []*Backend{b16, b32} {
			c := []*kernels.KVCache{c16, c32}[i]
			out, _ := bk.Alloc(n * a.Heads * a.HeadDim)
			if err := bk.Attention(out, upload(t, bk, q), upload(t, bk, k), upload(t, bk, v), c, 1, pos, n, a); err != nil {
				t.Fatal(err)
			}
			outs[i] = download(t, bk, out)
			bk.Free(out)
		}
		want := make([]float64, len(outs[1]))
		for i, v := range outs[1] {
			want[i] = float64(v)
		}
		if e := relNorm(outs[0], want); !(e < 3e-3) {
			t.Errorf("pos %d n %d: f16 cache differs from f32 cache by %.3g", pos, n, e)
		} else {
			t.Logf("pos %d n %d: f16 vs f32 cache %.2e", pos, n, e)
		}
		pos += n
	}
}

// TestArgmaxTopK checks sampling helpers against a sort on the host, at a
// Llama 3 vocabulary size (several top-k reduction rounds) and a tiny one.
func TestArgmaxTopK(t *testing.T) {
	b := gpuBackend(t, false)
	rng := rand.New(rand.NewPCG(rand.Uint64(), 9))
	for _, cols := range []int{128256, 32000, 37} {
		rows := 3
		x := randVec(rng, rows*cols, 3)
		xt := upload(t, b, x)
		got, err := b.Argmax(xt, rows, cols)
		if err != nil {
			t.Fatal(err)
		}
		for r := range rows {
			best := 0
			for c := range cols {
				if x[r*cols+c] > x[r*cols+best] {
					best = c
				}
			}
			if int(got[r]) != best {
				t.Errorf("argmax row %d of %d: got %d, want %d", r, cols, got[r], best)
			}
		}
		row := x[:cols]
		order := make([]int, cols)
		for i := range order {
			order[i] = i
		}
		sort.SliceStable(order, func(i, j int) bool { return row[order[i]] > row[order[j]] })
		for _, k := range []int{1, 5, 37, 64} {
			if k > cols {
				continue
			}
			idx, vals, err := b.TopK(xt, cols, k)
			if err != nil {
				t.Fatal(err)
			}
			for i := range k {
				if int(idx[i]) != order[i] || vals[i] != row[order[i]] {
					t.Fatalf("top-%d of %d: entry %d = (%d, %g), want (%d, %g)", k, cols, i, idx[i], vals[i], order[i], row[order[i]])
				}
			}
		}
	}
	if _, _, err := b.TopK(kernels.Tensor{Len: 4, Dev: 1}, 4, 5); err == nil {
		t.Error("top-5 of 4 values returned no error")
	}
}

// TestVendorGEMM runs gemm.cu and cuBLAS on the same f16 operands: both
// accumulate in float32, so they agree to rounding. Skipped where cuBLAS is
// not installed (it is optional).
func TestVendorGEMM(t *testing.T) {
	b := gpuBackend(t, false)
	v, err := b.OpenVendorGEMM()
	if err != nil {
		t.Skipf("no cuBLAS: %v", err)
	}
	defer b.CloseVendorGEMM(v)
	rng := rand.New(rand.NewPCG(rand.Uint64(), 10))
	for _, sh := range [][3]int{{4096, 512, 4096}, {1000, 77, 288}, {130, 300, 64}} {
		m, n, k := sh[0], sh[1], sh[2]
		w := conformance.RandomWeight(rng, "w", gguf.TypeF16, m, k)
		xw := conformance.RandomWeight(rng, "x", gguf.TypeF16, n, k)
		for _, ww := range []*kernels.Weight{w, xw} {
			if err := b.LoadWeight(ww); err != nil {
				t.Fatal(err)
			}
		}
		c2, _ := b.Alloc(m * n)
		if err := b.VendorGEMMF16(v, rocm.DevPtr(c2.Dev), rocm.DevPtr(w.Dev), rocm.DevPtr(xw.Dev), m, n, k); err != nil {
			t.Fatal(err)
		}
		ref := download(t, b, c2)
		want := make([]float64, len(ref))
		for i, r := range ref {
			want[i] = float64(r)
		}
		for _, kern := range []string{"gemm_f16", "gemm_f16_lds"} {
			b.gemmKernel = kern
			c1, _ := b.Alloc(m * n)
			if err := b.GEMMF16(rocm.DevPtr(c1.Dev), rocm.DevPtr(w.Dev), rocm.DevPtr(xw.Dev), m, n, k); err != nil {
				t.Fatal(err)
			}
			if e := relNorm(download(t, b, c1), want); !(e < 1e-5) {
				t.Errorf("%d×%d×%d: %s differs from cuBLAS by %.3g", m, n, k, kern, e)
			}
			b.Free(c1)
		}
		b.gemmKernel = ""
		b.Free(c2)
		b.FreeWeight(w)
		b.FreeWeight(xw)
	}
}

// TestVendorOpensInBackground: New returns before cuBLAS is open; a
// backend closed at once waits for the open to finish and closes cleanly,
// its device memory all returned; one left open gets cuBLAS for prompts
// of vendorMinN rows (where cuBLAS is installed), and a prompt GEMM of
// that size waits for it rather than running on gemm.cu.
func TestVendorOpensInBackground(t *testing.T) {
	sb := gpuBackend(t, false)
	sb.waitVendor() // cuBLAS's own kernels are loaded once per context: before measuring
	w := sb.Worker()
	free := func() uint64 {
		var f uint64
		if err := w.Do(t.Context(), func(c *rocm.Ctx) error {
			var err error
			f, _, err = c.MemInfo()
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return f
	}
	before := free()
	for range 3 {
		b, err := New(w, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Close(); err != nil {
			t.Fatalf("closing while cuBLAS opens: %v", err)
		}
	}
	// The driver's bookkeeping may move a few pages; a backend's modules,
	// stream, cuBLAS handle and warm-up buffers are far more.
	if after := free(); after+(4<<20) < before {
		t.Errorf("device free memory %d bytes before, %d after three backends opened and closed at once", before, after)
	} else {
		t.Logf("device free memory before %d, after %d", before, after)
	}

	b, err := New(w, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const m, k = 256, 256
	rng := rand.New(rand.NewPCG(rand.Uint64(), 11))
	wt := conformance.RandomWeight(rng, "w", gguf.TypeF16, m, k)
	xw := conformance.RandomWeight(rng, "x", gguf.TypeF16, vendorMinN, k)
	for _, ww := range []*kernels.Weight{wt, xw} {
		if err := b.LoadWeight(ww); err != nil {
			t.Fatal(err)
		}
	}
	c1, _ := b.Alloc(m * vendorMinN)
	if err := b.GEMMF16(rocm.DevPtr(c1.Dev), rocm.DevPtr(wt.Dev), rocm.DevPtr(xw.Dev), m, vendorMinN, k); err != nil {
		t.Fatal(err)
	}
	select {
	case <-b.vendorReady:
	default:
		t.Fatal("a GEMM of vendorMinN rows ran before cuBLAS's open had finished")
	}
	if b.vendor == nil {
		if _, _, err := openBLASLib(); err == nil {
			t.Fatal("cuBLAS is installed, yet the backend did not open it")
		}
		t.Log("no cuBLAS here: prompts stay on gemm.cu")
	}
	got := download(t, b, c1)
	b.gemmKernel = "gemm_f16"
	c2, _ := b.Alloc(m * vendorMinN)
	if err := b.GEMMF16(rocm.DevPtr(c2.Dev), rocm.DevPtr(wt.Dev), rocm.DevPtr(xw.Dev), m, vendorMinN, k); err != nil {
		t.Fatal(err)
	}
	b.gemmKernel = ""
	want := make([]float64, len(got))
	for i, r := range download(t, b, c2) {
		want[i] = float64(r)
	}
	if e := relNorm(got, want); !(e < 1e-5) {
		t.Errorf("cuBLAS and gemm_f16 differ by %.3g", e)
	}
}
