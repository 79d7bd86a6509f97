package rocm

import (
	"os"
	"strings"
)

// PreloadCompiler loads the run-time compiler (nvrtc or hiprtc) of the
// backend OpenAny would pick, without initialising a driver: a worker's
// first Compiler needs it even when every kernel comes from the disk
// cache (the cache key holds the compiler's version), and loading it
// takes tens of milliseconds in a fresh process. Callers start it next to
// Open so that the two overlap. Errors are left for NewCompiler to report.
func PreloadCompiler() {
	b := CUDA
	switch strings.ToLower(os.Getenv(EnvBackend)) {
	case "hip", "rocm":
		b = HIP
	case "cuda":
	default:
		if _, err := openLibrary(EnvCUDALib, "libcuda.so.1", "libcuda.so"); err != nil {
			b = HIP
		}
	}
	_, _ = openRTC(b)
}
