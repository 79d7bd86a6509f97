package gpu

import (
	"math/rand/v2"
	"strings"
	"testing"
	"unsafe"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels/conformance"
	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/rocm"
)

// rocblasCall is one recorded call into the fake rocBLAS.
type rocblasCall struct {
	fn    uintptr
	args  []uintptr
	alpha float32 // alpha and beta as a gemm_ex call would read them
	beta  float32
}

// fakeRocBLAS is a VendorGEMM of api rocBLAS whose function pointers are
// the numbers 1–4 and whose calls are recorded; status is what each call
// returns.
func fakeRocBLAS(status uintptr) (*VendorGEMM, *[]rocblasCall) {
	var calls []rocblasCall
	v := &VendorGEMM{api: apiRocBLAS, create: 1, destroy: 2, setStream: 3, gemmEx: 4}
	v.call = func(fn uintptr, args ...uintptr) uintptr {
		c := rocblasCall{fn: fn, args: append([]uintptr(nil), args...)}
		switch fn {
		case v.create:
			if args[0] == uintptr(unsafe.Pointer(&v.handle)) {
				v.handle = 0xabc // what rocblas_create_handle writes through its argument
			}
		case v.gemmEx:
			c.alpha, c.beta = v.scalars[0], v.scalars[1] // what the library reads through arguments 6 and 13
		}
		calls = append(calls, c)
		return status
	}
	return v, &calls
}

// TestRocBLASMarshalling checks the values and order of the arguments
// passed to rocblas_create_handle, rocblas_set_stream and rocblas_gemm_ex
// against their declarations in rocBLAS's headers (rocblas.go), with a
// fake function table in place of the library.
func TestRocBLASMarshalling(t *testing.T) {
	v, calls := fakeRocBLAS(0)
	const stream = rocm.Stream(0x5157)
	if err := v.bind(stream); err != nil {
		t.Fatal(err)
	}
	if v.handle != 0xabc {
		t.Fatalf("handle %#x, want the 0xabc the create call wrote", v.handle)
	}
	if len(*calls) != 2 || (*calls)[0].fn != v.create || len((*calls)[0].args) != 1 ||
		(*calls)[1].fn != v.setStream || len((*calls)[1].args) != 2 || (*calls)[1].args[0] != 0xabc || (*calls)[1].args[1] != uintptr(stream) {
		t.Fatalf("bind calls %+v: want rocblas_create_handle(&handle), rocblas_set_stream(handle, stream)", *calls)
	}

	*calls = nil
	const m, n, k = 4096, 512, 14336
	const cOut, w, x = rocm.DevPtr(0xc000), rocm.DevPtr(0xa000), rocm.DevPtr(0xb000)
	if err := v.gemm(cOut, w, x, m, n, k); err != nil {
		t.Fatal(err)
	}
	if len(*calls) != 1 || (*calls)[0].fn != v.gemmEx {
		t.Fatalf("gemm calls %+v, want one rocblas_gemm_ex", *calls)
	}
	c := (*calls)[0]
	want := []struct {
		name string
		val  uintptr
	}{
		{"handle", 0xabc},
		{"trans_a", 112}, // rocblas_operation_transpose: W [m][k] row-major is k×m column-major
		{"trans_b", 111}, // rocblas_operation_none
		{"m", m}, {"n", n}, {"k", k},
		{"alpha", 0},                                   // set below
		{"a", uintptr(w)}, {"a_type", 150}, {"lda", k}, // rocblas_datatype_f16_r
		{"b", uintptr(x)}, {"b_type", 150}, {"ldb", k},
		{"beta", 0},
		{"c", uintptr(cOut)}, {"c_type", 151}, {"ldc", m}, // rocblas_datatype_f32_r
		{"d", uintptr(cOut)}, {"d_type", 151}, {"ldd", m},
		{"compute_type", 151}, // f32 accumulation
		{"algo", 0},           // rocblas_gemm_algo_standard
		{"solution_index", 0},
		{"flags", 0}, // rocblas_gemm_flags_none
	}
	if len(c.args) != len(want) {
		t.Fatalf("rocblas_gemm_ex got %d arguments, want %d", len(c.args), len(want))
	}
	want[6].val = uintptr(unsafe.Pointer(&v.scalars[0])) // host pointers to 1.0f and 0.0f
	want[13].val = uintptr(unsafe.Pointer(&v.scalars[1]))
	for i, a := range want {
		if c.args[i] != a.val {
			t.Errorf("argument %d (%s) = %d (%#x), want %d", i, a.name, c.args[i], c.args[i], a.val)
		}
	}
	if c.alpha != 1 || c.beta != 0 {
		t.Errorf("alpha %g beta %g, want 1 and 0", c.alpha, c.beta)
	}

	// A failing status is an error naming the call; a failing set_stream
	// destroys the handle it made.
	bad, badCalls := fakeRocBLAS(7)
	if err := bad.gemm(cOut, w, x, m, n, k); err == nil || !strings.Contains(err.Error(), "rocblas_gemm_ex") || !strings.Contains(err.Error(), "status 7") {
		t.Errorf("failed gemm_ex: error %v", err)
	}
	*badCalls = nil
	bad.call = func(fn uintptr, args ...uintptr) uintptr {
		*badCalls = append(*badCalls, rocblasCall{fn: fn, args: args})
		if fn == bad.setStream {
			return 1
		}
		return 0
	}
	if err := bad.bind(stream); err == nil || !strings.Contains(err.Error(), "rocblas_set_stream") {
		t.Errorf("failed set_stream: error %v", err)
	}
	if n := len(*badCalls); n != 3 || (*badCalls)[2].fn != bad.destroy || bad.handle != 0 {
		t.Errorf("after a failed set_stream: calls %+v handle %#x, want the handle destroyed", *badCalls, bad.handle)
	}
}

// TestRocBLASCandidates: the ROCm 7, 6 and 5 sonames are tried, newest first.
func TestRocBLASCandidates(t *testing.T) {
	c := rocblasCandidates()
	idx := func(s string) int {
		for i, p := range c {
			if p == s {
				return i
			}
		}
		return -1
	}
	a, b, z := idx("librocblas.so.5"), idx("librocblas.so.4"), idx("librocblas.so.0")
	if a < 0 || b < 0 || z < 0 || !(a < b && b < z) {
		t.Errorf("candidates %v: want librocblas.so.5, .4, .0 in that order", c)
	}
}

// TestPromptGEMMFMAFallback runs prompt products (more rows than the
// vendor library's threshold) on a backend made with Options.GEMMFMA,
// which sends them through gemm_f16_fma, the plain FMA product that AMD
// GPUs without rocBLAS run, and compares with the CPU backend. On an
// NVIDIA GPU this is the only test of that path (its own gemm_f16 is the
// mma kernel).
func TestPromptGEMMFMAFallback(t *testing.T) {
	gpuBackend(t, false)
	b, err := New(shared.w, Options{GEMMFMA: true})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	b.waitVendor()
	if b.vendor != nil || b.gemmKernel != "gemm_f16_fma" {
		t.Fatalf("GEMMFMA backend: vendor %v, kernel %q; want no vendor library and gemm_f16_fma", b.vendor != nil, b.gemmKernel)
	}
	cb := cpu.New(2)
	defer cb.Close()
	rng := rand.New(rand.NewPCG(27, 4))
	for _, typ := range []gguf.Type{gguf.TypeQ4_K, gguf.TypeQ6_K, gguf.TypeQ8_0, gguf.TypeQ4_0, gguf.TypeF16} {
		for _, sh := range [][3]int{{1024, 1024, vendorMinN}, {300, 768, 200}, {130, 256, 129}} {
			rows, cols, n := sh[0], sh[1], sh[2]
			w := conformance.RandomWeight(rng, "w", typ, rows, cols)
			if err := b.LoadWeight(w); err != nil {
				t.Fatal(err)
			}
			x := randVec(rng, n*cols, 1)
			dst, err := b.Alloc(n * rows)
			if err != nil {
				t.Fatal(err)
			}
			if err := b.MatMul(dst, w, upload(t, b, x), n); err != nil {
				t.Fatal(err)
			}
			got := download(t, b, dst)
			cx, _ := cb.Alloc(n * cols)
			cy, _ := cb.Alloc(n * rows)
			if err := cb.Write(cx, 0, x); err != nil {
				t.Fatal(err)
			}
			if err := cb.MatMul(cy, w, cx, n); err != nil {
				t.Fatal(err)
			}
			want32 := make([]float32, n*rows)
			if err := cb.Read(want32, cy, 0); err != nil {
				t.Fatal(err)
			}
			// Against the CPU backend (8-bit activations for the quantized
			// types): the conformance measure, error relative to Σ|w·x|
			// per output row, as TestMMQMatchesCPU.
			worst := 0.0
			for i := range n {
				ref := make([]float64, rows)
				for r := range ref {
					ref[r] = float64(want32[i*rows+r])
				}
				worst = max(worst, relScaled(got[i*rows:(i+1)*rows], ref, matScale(t, w, x[i*cols:(i+1)*cols])))
			}
			if !(worst < 2e-2) {
				t.Errorf("%s %d×%d n=%d FMA GEMM: error %.3g relative to Σ|w·x| against the CPU backend", typ, rows, cols, n, worst)
			}
			// Against the float64 product: f16 operands, about 2^-11
			// relative rounding on each side (as TestMatMulFastAndGEMM).
			// A type the GEMM multiplies on x's 8-bit form (q8GEMM: Q4_0
			// here by default, as the CPU does) carries the 8-bit rounding of x
			// instead, and answers to the CPU backend, tightly.
			e := relNorm(got, matRef(t, w, x, n))
			if b.q8GEMM(w) {
				if !(worst < 2e-3) {
					t.Errorf("%s %d×%d n=%d FMA GEMM on 8-bit x: error %.3g relative to Σ|w·x| against the CPU backend", typ, rows, cols, n, worst)
				}
			} else if !(e < 2e-3) {
				t.Errorf("%s %d×%d n=%d FMA GEMM: relative error %.3g against float64", typ, rows, cols, n, e)
			}
			t.Logf("%s %d×%d n=%d FMA GEMM: %.2e against the CPU backend, %.2e against float64", typ, rows, cols, n, worst, e)
			b.Free(dst)
			b.FreeWeight(w)
		}
	}
}
