package rocm

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/ebitengine/purego"
)

// EnvCacheDir overrides where compiled kernels are cached.
const EnvCacheDir = "FORGE_CACHE_DIR"

// rtc is nvrtc or hiprtc: the two mirror each other call for call.
type rtc struct {
	backend Backend
	lib     *library

	create, compile, codeSize, code uintptr
	logSize, log, destroy, version  uintptr
	errString                       uintptr
	ptxSize, ptx                    uintptr // nvrtc only: the PTX text (hiprtc: the code again)
	major, minor                    int
}

var rtcs struct {
	mu   sync.Mutex
	open map[Backend]*rtc
}

// openRTC loads the run-time compiler of backend b. Up to ROCm 5.2 hiprtc
// lives inside libamdhip64; later ROCm ships it as libhiprtc.
func openRTC(b Backend) (*rtc, error) {
	rtcs.mu.Lock()
	defer rtcs.mu.Unlock()
	if r := rtcs.open[b]; r != nil {
		return r, nil
	}
	r := &rtc{backend: b}
	var err error
	switch b {
	case CUDA:
		r.lib, err = openLibrary(EnvNVRTCLib, "libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2")
	case HIP:
		r.lib, err = openLibrary(EnvHIPRTC, hiprtcLibNames...)
	default:
		err = fmt.Errorf("rocm: unknown backend %d", b)
	}
	if err != nil {
		return nil, err
	}
	tab := []symbol{
		{&r.create, "nvrtcCreateProgram", "hiprtcCreateProgram", false},
		{&r.compile, "nvrtcCompileProgram", "hiprtcCompileProgram", false},
		{&r.codeSize, "nvrtcGetCUBINSize", "hiprtcGetCodeSize", false},
		{&r.code, "nvrtcGetCUBIN", "hiprtcGetCode", false},
		{&r.logSize, "nvrtcGetProgramLogSize", "hiprtcGetProgramLogSize", false},
		{&r.log, "nvrtcGetProgramLog", "hiprtcGetProgramLog", false},
		{&r.destroy, "nvrtcDestroyProgram", "hiprtcDestroyProgram", false},
		{&r.version, "nvrtcVersion", "hiprtcVersion", false},
		{&r.errString, "nvrtcGetErrorString", "hiprtcGetErrorString", false},
		{&r.ptxSize, "nvrtcGetPTXSize", "hiprtcGetCodeSize", false},
		{&r.ptx, "nvrtcGetPTX", "hiprtcGetCode", false},
	}
	if err := r.lib.resolve(b, tab); err != nil {
		return nil, err
	}
	var maj, min int32
	if err := r.call("Version", r.version, uintptr(unsafe.Pointer(&maj)), uintptr(unsafe.Pointer(&min))); err != nil {
		return nil, err
	}
	r.major, r.minor = int(maj), int(min)
	if rtcs.open == nil {
		rtcs.open = map[Backend]*rtc{}
	}
	rtcs.open[b] = r
	return r, nil
}

func (r *rtc) prefix() string {
	if r.backend == HIP {
		return "hiprtc"
	}
	return "nvrtc"
}

//go:uintptrescapes
func (r *rtc) call(name string, fn uintptr, args ...uintptr) error {
	res, _, _ := purego.SyscallN(fn, args...)
	if int32(res) == 0 {
		return nil
	}
	p, _, _ := purego.SyscallN(r.errString, res)
	return &Error{Backend: r.backend, Call: r.prefix() + name, Code: int(int32(res)), Name: gostr(p), Text: "run-time compilation (" + r.lib.path + ")"}
}

// archOption is the compiler flag selecting the target.
func (r *rtc) archOption(arch string) string {
	if r.backend == HIP {
		return "--offload-arch=" + arch
	}
	return "--gpu-architecture=" + arch
}

// build compiles src once, with no cache, and returns the code object.
func (r *rtc) build(src, name, arch string, opts []string) ([]byte, error) {
	return r.buildOut(src, name, arch, opts, false)
}

// buildOut compiles src once; ptx selects nvrtc's PTX text (for a virtual
// arch such as compute_80) instead of the cubin.
func (r *rtc) buildOut(src, name, arch string, opts []string, ptx bool) ([]byte, error) {
	var prog uintptr
	csrc, cname := cstr(src), cstr(name)
	if err := r.call("CreateProgram", r.create, uintptr(unsafe.Pointer(&prog)), uintptr(unsafe.Pointer(&csrc[0])), uintptr(unsafe.Pointer(&cname[0])), 0, 0, 0); err != nil {
		return nil, fmt.Errorf("rocm: compile %s: %w", name, err)
	}
	defer r.call("DestroyProgram", r.destroy, uintptr(unsafe.Pointer(&prog)))

	all := append([]string{r.archOption(arch)}, opts...)
	// The option strings and the array of pointers to them are C data for
	// the call's duration; a runtime.Pinner keeps the Go buffers fixed and
	// lets a Go-allocated array hold pointers to them.
	var pin runtime.Pinner
	defer pin.Unpin()
	cs := make([][]byte, len(all))
	ptrs := make([]uintptr, len(all))
	for i, o := range all {
		cs[i] = cstr(o)
		pin.Pin(&cs[i][0])
		ptrs[i] = uintptr(unsafe.Pointer(&cs[i][0]))
	}
	cerr := r.call("CompileProgram", r.compile, prog, uintptr(len(all)), uintptr(unsafe.Pointer(&ptrs[0])))
	runtime.KeepAlive(cs)
	if cerr != nil {
		if e, ok := cerr.(*Error); ok {
			e.Log = r.programLog(prog)
			e.Text = fmt.Sprintf("compiling %s for %s with %s", name, arch, strings.Join(all, " "))
		}
		return nil, fmt.Errorf("rocm: compile %s: %w", name, cerr)
	}
	sizeFn, codeFn, what := r.codeSize, r.code, "Code"
	if ptx {
		sizeFn, codeFn, what = r.ptxSize, r.ptx, "PTX"
	}
	var n uintptr
	if err := r.call("Get"+what+"Size", sizeFn, prog, uintptr(unsafe.Pointer(&n))); err != nil {
		return nil, fmt.Errorf("rocm: compile %s for %s: %w", name, arch, err)
	}
	if n == 0 {
		return nil, fmt.Errorf("rocm: compile %s for %s: compiler returned no code (log: %s)", name, arch, r.programLog(prog))
	}
	code := make([]byte, n)
	if err := r.call("Get"+what, codeFn, prog, uintptr(unsafe.Pointer(&code[0]))); err != nil {
		return nil, fmt.Errorf("rocm: compile %s for %s: %w", name, arch, err)
	}
	// PTX text ends in a NUL, which cuModuleLoadData needs: it is kept.
	return code, nil
}

func (r *rtc) programLog(prog uintptr) string {
	var n uintptr
	if r.call("GetProgramLogSize", r.logSize, prog, uintptr(unsafe.Pointer(&n))) != nil || n <= 1 {
		return ""
	}
	b := make([]byte, n)
	if r.call("GetProgramLog", r.log, prog, uintptr(unsafe.Pointer(&b[0]))) != nil {
		return ""
	}
	return strings.TrimSpace(cString(b))
}

// CompileHIP compiles HIP source through hiprtc for arch (e.g. "gfx90a",
// "gfx1030") without needing a device or the cache: the AMD compile check on
// a machine with no GPU.
func CompileHIP(src, name, arch string, opts []string) ([]byte, error) {
	r, err := openRTC(HIP)
	if err != nil {
		return nil, err
	}
	return r.build(src, name, arch, opts)
}

// CompileCUDA compiles CUDA source through nvrtc to a cubin for arch (e.g.
// "sm_90") without a device or the cache.
func CompileCUDA(src, name, arch string, opts []string) ([]byte, error) {
	r, err := openRTC(CUDA)
	if err != nil {
		return nil, err
	}
	return r.build(src, name, arch, opts)
}

// CompilePTX compiles CUDA source through nvrtc to PTX text for a virtual
// arch (e.g. "compute_80"): the driver compiles it at load time for any
// newer device, the fallback for an arch with no shipped cubin. The result
// keeps its terminating NUL, as cuModuleLoadData expects.
func CompilePTX(src, name, arch string, opts []string) ([]byte, error) {
	r, err := openRTC(CUDA)
	if err != nil {
		return nil, err
	}
	return r.buildOut(src, name, arch, opts, true)
}

// RTCVersion reports the version of backend b's run-time compiler (nvrtc or
// hiprtc), loading it if needed: the generator of the shipped kernel
// objects records it.
func RTCVersion(b Backend) (major, minor int, err error) {
	r, err := openRTC(b)
	if err != nil {
		return 0, 0, err
	}
	return r.major, r.minor, nil
}

// Compiler compiles kernel sources for one device and caches the code objects
// on disk, so that later starts skip compilation. The cache key covers
// everything that changes the output: source, name, options, arch, backend,
// driver version and compiler version.
type Compiler struct {
	Backend Backend
	Arch    string
	Dir     string
	Driver  int // driver version in the key (a new driver may change codegen expectations)

	rtc          *rtc
	hits, misses atomic.Int64
}

// DefaultCacheDir is $FORGE_CACHE_DIR, else the user cache dir's
// forge/kernels, else a folder under the temp dir.
func DefaultCacheDir() string {
	if d := os.Getenv(EnvCacheDir); d != "" {
		return d
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "forge", "kernels")
	}
	return filepath.Join(os.TempDir(), "forge-kernels")
}

// NewCompiler makes a compiler for backend b and arch, caching in dir
// ("" = DefaultCacheDir()).
func NewCompiler(b Backend, arch, dir string, driverVersion int) (*Compiler, error) {
	r, err := openRTC(b)
	if err != nil {
		return nil, err
	}
	if dir == "" {
		dir = DefaultCacheDir()
	}
	return &Compiler{Backend: b, Arch: arch, Dir: dir, Driver: driverVersion, rtc: r}, nil
}

// NewCompiler makes a compiler for the worker's device.
func (w *Worker) NewCompiler(dir string) (*Compiler, error) {
	return NewCompiler(w.rt.backend, w.Device.Arch, dir, w.rt.Version)
}

// CompilerVersion is nvrtc's / hiprtc's version.
func (c *Compiler) CompilerVersion() (major, minor int) { return c.rtc.major, c.rtc.minor }

// Stats returns cache hits and misses so far.
func (c *Compiler) Stats() (hits, misses int64) { return c.hits.Load(), c.misses.Load() }

// Key returns the cache key of one compilation.
func (c *Compiler) Key(src, name string, opts []string) string {
	h := sha256.New()
	fmt.Fprintf(h, "forge-rocm-kernel-cache-v1\x00%s\x00%s\x00driver=%d\x00rtc=%d.%d\x00%s\x00", c.Backend, c.Arch, c.Driver, c.rtc.major, c.rtc.minor, name)
	for _, o := range opts {
		fmt.Fprintf(h, "%s\x00", o)
	}
	h.Write([]byte(src))
	return hex.EncodeToString(h.Sum(nil))
}

func (c *Compiler) path(key string) string {
	arch := strings.NewReplacer(":", "_", "+", "p", "-", "m", "/", "_").Replace(c.Arch)
	return filepath.Join(c.Dir, fmt.Sprintf("%s-%s-%s.bin", c.Backend, arch, key[:40]))
}

// Compile returns the code object for src, from the cache when present
// (hit = true). A cache file is a SHA-256 of the code followed by the code,
// so a truncated or corrupted file is recompiled rather than loaded.
func (c *Compiler) Compile(src, name string, opts []string) (code []byte, hit bool, err error) {
	p := c.path(c.Key(src, name, opts))
	if b, err := os.ReadFile(p); err == nil && len(b) > sha256.Size {
		sum := sha256.Sum256(b[sha256.Size:])
		if bytes.Equal(sum[:], b[:sha256.Size]) {
			c.hits.Add(1)
			return b[sha256.Size:], true, nil
		}
	}
	code, err = c.rtc.build(src, name, c.Arch, opts)
	if err != nil {
		return nil, false, err
	}
	c.misses.Add(1)
	if err := writeCache(p, code); err != nil {
		return code, false, fmt.Errorf("rocm: kernel cache %s: %w", p, err)
	}
	return code, false, nil
}

// writeCache writes atomically: a temp file in the same folder, renamed, so
// a concurrent reader (another forge process) sees all or nothing.
func writeCache(p string, code []byte) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(p), ".tmp-*")
	if err != nil {
		return err
	}
	sum := sha256.Sum256(code)
	_, err1 := f.Write(sum[:])
	_, err2 := f.Write(code)
	err3 := f.Close()
	for _, e := range []error{err1, err2, err3} {
		if e != nil {
			os.Remove(f.Name())
			return e
		}
	}
	if err := os.Rename(f.Name(), p); err != nil {
		os.Remove(f.Name())
		return err
	}
	return nil
}
