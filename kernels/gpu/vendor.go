package gpu

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"time"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/forge-llm/forge/rocm"
)

// VendorGEMM is cuBLAS opened at run time with purego (cublasGemmEx: f16
// inputs, f32 accumulation and output). Measured on an H100 at 512 tokens
// it runs the prompt GEMM at 610–700 TFLOP/s against gemm.cu's 160–210, so
// the backend uses it where it is installed and falls back to gemm.cu.
// On AMD the same role is rocBLAS's rocblas_gemm_ex (rocblas.go).
type VendorGEMM struct {
	path                               string
	api                                vendorAPI
	create, destroy, setStream, gemmEx uintptr
	handle                             uintptr
	warm                               []devBuf // warmUp's operands, freed with the handle
	// scalars are rocblas_gemm_ex's alpha and beta, passed as host
	// pointers (read during the call); calls are serialized by the
	// backend's mutex.
	scalars [2]float32
	// call calls one of the library's functions; nil is purego.SyscallN
	// (tests put a recorder here to check the argument marshalling).
	call func(fn uintptr, args ...uintptr) uintptr
}

// vendorAPI is the library behind a VendorGEMM.
type vendorAPI int

const (
	apiCUBLAS vendorAPI = iota
	apiRocBLAS
)

// fnNames are the library's names of the functions bound, for errors.
func (a vendorAPI) fnNames() (create, setStream, destroy string) {
	if a == apiRocBLAS {
		return "rocblas_create_handle", "rocblas_set_stream", "rocblas_destroy_handle"
	}
	return "cublasCreate", "cublasSetStream", "cublasDestroy"
}

// invoke calls fn through v.call, or purego where none is set.
func (v *VendorGEMM) invoke(fn uintptr, args ...uintptr) uintptr {
	if v.call != nil {
		return v.call(fn, args...)
	}
	r, _, _ := purego.SyscallN(fn, args...)
	return r
}

// EnvCUBLASLib names libcublas explicitly.
const EnvCUBLASLib = "FORGE_CUBLAS_LIB"

var blasNames = []string{"libcublas.so", "libcublas.so.13", "libcublas.so.12", "libcublas.so.11"}

var blasDirs = []string{
	"/usr/local/cuda/lib64",
	"/usr/local/cuda/targets/x86_64-linux/lib",
	"/usr/lib/x86_64-linux-gnu",
	"/usr/local/cuda-*/lib64",
	"/opt/*/.venv/lib/python3*/site-packages/nvidia/cublas/lib",
	"/opt/*/.venv/lib/python3*/site-packages/nvidia/cu*/lib",
	"/usr/local/lib/python3*/dist-packages/nvidia/cublas/lib",
}

func openBLASLib() (uintptr, string, error) {
	var cands []string
	if p := os.Getenv(EnvCUBLASLib); p != "" {
		cands = append(cands, p)
	}
	cands = append(cands, blasNames...)
	for _, g := range blasDirs {
		dirs, _ := filepath.Glob(g)
		sort.Sort(sort.Reverse(sort.StringSlice(dirs)))
		for _, d := range dirs {
			for _, n := range blasNames {
				cands = append(cands, filepath.Join(d, n))
			}
		}
	}
	var lastErr error
	for _, p := range cands {
		// Lazy binding: cuBLAS and cublasLt export thousands of functions
		// of which forge calls four; resolving them all up front
		// (RTLD_NOW) is on a fresh process's path to its first prompt.
		h, err := purego.Dlopen(p, blasFlags())
		if err == nil {
			return h, p, nil
		}
		lastErr = err
	}
	return 0, "", fmt.Errorf("gpu: cuBLAS not found (%d places tried, last: %v)", len(cands), lastErr)
}

// blasFlags are the dlopen flags of cuBLAS: lazy binding, so that opening
// it does not resolve the thousands of symbols forge never calls.
func blasFlags() int {
	return purego.RTLD_LAZY | purego.RTLD_GLOBAL
}

// PreloadBLAS loads cuBLAS as OpenVendorGEMM will (same places, same
// flags) without touching the device: a program that opens a GPU in the
// background calls it next to the driver's start, and the backend's own
// dlopen then finds the library loaded. A library that is not there is
// left for OpenVendorGEMM to report.
func PreloadBLAS() { _, _, _ = openBLASLib() }

// OpenVendorGEMM loads cuBLAS and makes a handle bound to the backend's
// stream. CUDA only.
func (b *Backend) OpenVendorGEMM() (*VendorGEMM, error) { return b.openVendorOn(b.w) }

// openVendorOn is OpenVendorGEMM with the handle made on worker on (the
// backend's worker or a sibling sharing its context).
func (b *Backend) openVendorOn(on *rocm.Worker) (*VendorGEMM, error) {
	switch b.w.Device.Backend {
	case rocm.CUDA:
	case rocm.HIP:
		return b.openRocBLASOn(on)
	default:
		return nil, fmt.Errorf("gpu: vendor GEMM: no library bound for %s", b.w.Device.Backend)
	}
	h, path, err := openBLASLib()
	if err != nil {
		return nil, err
	}
	v := &VendorGEMM{path: path}
	for _, s := range []struct {
		p    *uintptr
		name string
	}{{&v.create, "cublasCreate_v2"}, {&v.destroy, "cublasDestroy_v2"}, {&v.setStream, "cublasSetStream_v2"}, {&v.gemmEx, "cublasGemmEx"}} {
		if *s.p, err = purego.Dlsym(h, s.name); err != nil {
			return nil, fmt.Errorf("gpu: %s: %s: %w", path, s.name, err)
		}
	}
	err = on.Do(context.Background(), func(c *rocm.Ctx) error { return v.bind(b.stream) })
	if err != nil {
		return nil, err
	}
	return v, nil
}

// bind makes v's handle and binds it to stream; call on a worker thread
// of the device. A handle that cannot be bound is destroyed.
func (v *VendorGEMM) bind(stream rocm.Stream) error {
	create, setStream, _ := v.api.fnNames()
	if r := v.invoke(v.create, uintptr(unsafe.Pointer(&v.handle))); r != 0 {
		v.handle = 0
		return fmt.Errorf("gpu: %s: status %d", create, r)
	}
	if r := v.invoke(v.setStream, v.handle, uintptr(stream)); r != 0 {
		v.invoke(v.destroy, v.handle)
		v.handle = 0
		return fmt.Errorf("gpu: %s: status %d", setStream, r)
	}
	return nil
}

// warmUp runs one small GEMM on stream from worker on: cuBLAS loads its
// kernels on the first GEMM of a process (~25–70 ms on the H100), which a
// prompt would otherwise pay. It does not wait for the GEMM to run (the
// stream may be waiting for weights still in flight); the operands stay
// allocated until the handle is destroyed.
func (v *VendorGEMM) warmUp(on *rocm.Worker, stream rocm.Stream) (gemm time.Duration, err error) {
	const m, n, k = 128, 16, 256 // f16 W [m][k], X [n][k]; f32 C [n][m]
	err = on.Do(context.Background(), func(c *rocm.Ctx) error {
		for _, bytes := range []int64{m * k * 2, n * k * 2, m * n * 4} {
			p, err := c.Malloc(bytes)
			if err != nil {
				return fmt.Errorf("gpu: cuBLAS warm-up: %w", err)
			}
			v.warm = append(v.warm, devBuf{p, bytes})
		}
		for _, d := range v.warm {
			if err := c.MemsetD8Async(d.ptr, 0, int(d.size), stream); err != nil {
				return fmt.Errorf("gpu: cuBLAS warm-up: %w", err)
			}
		}
		t := time.Now()
		defer func() { gemm = time.Since(t) }()
		return v.gemm(v.warm[2].ptr, v.warm[0].ptr, v.warm[1].ptr, m, n, k)
	})
	return gemm, err
}

// Path is the library file that was loaded.
func (v *VendorGEMM) Path() string { return v.path }

// gemm queues C [n][m] f32 = X [n][k] · W [m][k]ᵀ (f16 operands), the
// layout of gemm_f16. In cuBLAS's column-major terms: C (m×n, ldc m) =
// Wᵀ · X with W a k×m matrix (lda k) transposed and X k×n (ldb k).
func (v *VendorGEMM) gemm(cOut, w, x rocm.DevPtr, m, n, k int) error {
	if v.api == apiRocBLAS {
		return v.rocblasGemm(cOut, w, x, m, n, k)
	}
	const (
		opN, opT    = 0, 1
		r16F, r32F  = 2, 0 // cudaDataType CUDA_R_16F, CUDA_R_32F
		compute32F  = 68   // CUBLAS_COMPUTE_32F
		algoDefault = -1   // CUBLAS_GEMM_DEFAULT
	)
	scalars := new([2]float32) // alpha, beta: host pointers read during the call
	scalars[0] = 1
	algo := int32(algoDefault)
	r, _, _ := purego.SyscallN(v.gemmEx, v.handle, opT, opN, uintptr(m), uintptr(n), uintptr(k),
		uintptr(unsafe.Pointer(&scalars[0])), uintptr(w), r16F, uintptr(k),
		uintptr(x), r16F, uintptr(k),
		uintptr(unsafe.Pointer(&scalars[1])), uintptr(cOut), r32F, uintptr(m),
		compute32F, uintptr(uint32(algo)))
	runtime.KeepAlive(scalars)
	if r != 0 {
		return fmt.Errorf("gpu: cublasGemmEx %d×%d×%d: status %d", m, n, k, r)
	}
	return nil
}

// VendorGEMMF16 queues the product on the backend's stream (see gemm).
func (b *Backend) VendorGEMMF16(v *VendorGEMM, cOut, w, x rocm.DevPtr, m, n, k int) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.do(func(c *rocm.Ctx) error { return v.gemm(cOut, w, x, m, n, k) })
}

// CloseVendorGEMM destroys a handle made by OpenVendorGEMM.
func (b *Backend) CloseVendorGEMM(v *VendorGEMM) error {
	return b.do(func(c *rocm.Ctx) error { return v.destroyLocked(c) })
}

// destroyLocked destroys the handle; call on the worker thread.
func (v *VendorGEMM) destroyLocked(c *rocm.Ctx) error {
	var first error
	for _, d := range v.warm {
		if err := c.Free(d.ptr, d.size); err != nil && first == nil {
			first = err
		}
	}
	v.warm = nil
	if v.handle == 0 {
		return first
	}
	r := v.invoke(v.destroy, v.handle)
	v.handle = 0
	if r != 0 {
		_, _, destroy := v.api.fnNames()
		return fmt.Errorf("gpu: %s: status %d", destroy, r)
	}
	return first
}
