package gpu

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/forge-llm/forge/rocm"
)

// rocBLAS, the prompt GEMM on AMD: rocblas_gemm_ex on f16 operands with
// f32 accumulation and output, opened at run time with purego as cuBLAS is
// (vendor.go), gemm.cu's FMA product where it is missing. Debian bookworm
// packages no rocBLAS, so this binding has not run here: the enum values
// and the function signatures below are those of rocBLAS's published
// headers, library/include/internal/rocblas-types.h and
// rocblas-functions.h of ROCm/rocBLAS at rocBLAS 4.x (ROCm 6.x), which
// keep the values and argument order of rocBLAS 2.x (ROCm 5); the
// marshalling is unit-tested against them (rocblas_test.go).
//
//	rocblas_status rocblas_create_handle(rocblas_handle* handle);
//	rocblas_status rocblas_destroy_handle(rocblas_handle handle);
//	rocblas_status rocblas_set_stream(rocblas_handle handle, hipStream_t stream);
//	rocblas_status rocblas_gemm_ex(rocblas_handle handle,
//	    rocblas_operation trans_a, rocblas_operation trans_b,
//	    rocblas_int m, rocblas_int n, rocblas_int k, const void* alpha,
//	    const void* a, rocblas_datatype a_type, rocblas_int lda,
//	    const void* b, rocblas_datatype b_type, rocblas_int ldb,
//	    const void* beta, const void* c, rocblas_datatype c_type, rocblas_int ldc,
//	    void* d, rocblas_datatype d_type, rocblas_int ldd,
//	    rocblas_datatype compute_type, rocblas_gemm_algo algo,
//	    int32_t solution_index, uint32_t flags);
//
// rocblas_int is int32 (the LP64 build every ROCm release ships); enums
// are C ints; status 0 is rocblas_status_success.
const (
	rocblasOperationNone      = 111 // rocblas_operation_none
	rocblasOperationTranspose = 112 // rocblas_operation_transpose
	rocblasDatatypeF16R       = 150 // rocblas_datatype_f16_r
	rocblasDatatypeF32R       = 151 // rocblas_datatype_f32_r
	rocblasGemmAlgoStandard   = 0   // rocblas_gemm_algo_standard
	rocblasGemmFlagsNone      = 0   // rocblas_gemm_flags_none
)

// rocblasNames are the sonames tried: rocBLAS 5 (ROCm 7), 4 (ROCm 6), 0
// (ROCm 5, librocblas.so.0), then the development symlink.
var rocblasNames = []string{"librocblas.so.5", "librocblas.so.4", "librocblas.so.0", "librocblas.so"}

// rocblasDirs are searched after the loader's own path.
var rocblasDirs = []string{"/opt/rocm/lib", "/opt/rocm-*/lib", "/usr/lib/x86_64-linux-gnu"}

// rocblasCandidates lists the library files tried, in order.
func rocblasCandidates() []string {
	cands := append([]string(nil), rocblasNames...)
	for _, g := range rocblasDirs {
		dirs, _ := filepath.Glob(g)
		sort.Sort(sort.Reverse(sort.StringSlice(dirs))) // newest ROCm first
		for _, d := range dirs {
			for _, n := range rocblasNames {
				cands = append(cands, filepath.Join(d, n))
			}
		}
	}
	return cands
}

func openRocBLASLib() (uintptr, string, error) {
	cands := rocblasCandidates()
	var lastErr error
	for _, p := range cands {
		h, err := purego.Dlopen(p, purego.RTLD_LAZY|purego.RTLD_GLOBAL)
		if err == nil {
			return h, p, nil
		}
		lastErr = err
	}
	return 0, "", fmt.Errorf("gpu: rocBLAS not found (%d places tried, last: %v)", len(cands), lastErr)
}

// openRocBLASOn loads rocBLAS and makes a handle bound to the backend's
// stream on worker on.
func (b *Backend) openRocBLASOn(on *rocm.Worker) (*VendorGEMM, error) {
	h, path, err := openRocBLASLib()
	if err != nil {
		return nil, err
	}
	v := &VendorGEMM{path: path, api: apiRocBLAS}
	for _, s := range []struct {
		p    *uintptr
		name string
	}{{&v.create, "rocblas_create_handle"}, {&v.destroy, "rocblas_destroy_handle"}, {&v.setStream, "rocblas_set_stream"}, {&v.gemmEx, "rocblas_gemm_ex"}} {
		if *s.p, err = purego.Dlsym(h, s.name); err != nil {
			return nil, fmt.Errorf("gpu: %s: %s: %w", path, s.name, err)
		}
	}
	if err := on.Do(context.Background(), func(c *rocm.Ctx) error { return v.bind(b.stream) }); err != nil {
		return nil, err
	}
	return v, nil
}

// rocblasGemm queues C [n][m] f32 = X [n][k] · W [m][k]ᵀ (f16 operands)
// through rocblas_gemm_ex, in the column-major terms cuBLAS's call uses
// (VendorGEMM.gemm): D = C (m×n, ldd m) = Wᵀ·X, W a k×m matrix (lda k)
// transposed, X k×n (ldb k); beta 0, so C is only written (C and D are
// the same buffer, as rocBLAS allows when ldc = ldd). alpha and beta are
// host pointers (the handle's default pointer mode).
func (v *VendorGEMM) rocblasGemm(cOut, w, x rocm.DevPtr, m, n, k int) error {
	v.scalars = [2]float32{1, 0}
	r := v.invoke(v.gemmEx, v.handle, rocblasOperationTranspose, rocblasOperationNone,
		uintptr(m), uintptr(n), uintptr(k),
		uintptr(unsafe.Pointer(&v.scalars[0])),
		uintptr(w), rocblasDatatypeF16R, uintptr(k),
		uintptr(x), rocblasDatatypeF16R, uintptr(k),
		uintptr(unsafe.Pointer(&v.scalars[1])),
		uintptr(cOut), rocblasDatatypeF32R, uintptr(m),
		uintptr(cOut), rocblasDatatypeF32R, uintptr(m),
		rocblasDatatypeF32R, rocblasGemmAlgoStandard, 0, rocblasGemmFlagsNone)
	if r != 0 {
		return fmt.Errorf("gpu: rocblas_gemm_ex %d×%d×%d: status %d", m, n, k, r)
	}
	return nil
}
