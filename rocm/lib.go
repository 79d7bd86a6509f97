package rocm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"
)

// Environment variables that name a library file directly, for hosts where
// the library is not on the loader path (e.g. nvrtc inside a Python wheel).
const (
	EnvCUDALib  = "FORGE_CUDA_LIB"  // path of libcuda.so.1
	EnvNVRTCLib = "FORGE_NVRTC_LIB" // path of libnvrtc.so*
	EnvHIPLib   = "FORGE_HIP_LIB"   // path of libamdhip64.so* (hiprtc lives in it up to ROCm 5)
	EnvHIPRTC   = "FORGE_HIPRTC_LIB"
)

// libDirs are searched, after the dynamic loader's own path, for each library.
// They cover distribution packages, the NVIDIA container toolkit's mount, the
// CUDA toolkit and ROCm default prefixes.
var libDirs = []string{
	"/usr/lib/x86_64-linux-gnu",
	"/usr/lib64",
	"/usr/lib",
	"/usr/local/nvidia/lib64",
	"/usr/local/nvidia/lib",
	"/usr/local/cuda/lib64",
	"/usr/local/cuda/targets/x86_64-linux/lib",
	"/opt/rocm/lib",
	"/opt/rocm/hip/lib",
}

// libGlobs find libraries installed outside the usual prefixes: versioned
// CUDA toolkits and nvrtc shipped inside Python wheels (nvidia-cuda-nvrtc).
var libGlobs = []string{
	"/usr/local/cuda-*/lib64",
	"/usr/local/cuda-*/targets/x86_64-linux/lib",
	"/opt/rocm-*/lib",
	"/opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib",
	"/usr/local/lib/python3*/dist-packages/nvidia/*/lib",
	"/usr/lib/python3/dist-packages/nvidia/*/lib",
}

// library is one opened shared object.
type library struct {
	path   string
	handle uintptr
}

// The HIP libraries' names, unversioned first (a development install's
// symlink), then the sonames of ROCm 7, 6 and 5: a runtime-only install
// (a container with just the ROCm runtime packages) has only the versioned
// file, and forge must find it rather than fall back to the CPU silently.
// Up to ROCm 5.2 hiprtc lives inside libamdhip64, hence its names last.
var (
	hipLibNames    = []string{"libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5"}
	hiprtcLibNames = []string{"libhiprtc.so", "libhiprtc.so.7", "libhiprtc.so.6", "libhiprtc.so.5", "libamdhip64.so", "libamdhip64.so.5"}
)

// openLibrary tries, in order: the file named by env (only that, if set),
// then each name through the dynamic loader, then each name in libDirs and
// libGlobs. The error lists every place looked at, so a user without a
// driver sees exactly what forge looked for.
func openLibrary(env string, names ...string) (*library, error) {
	var tried []string
	try := func(p string) (*library, error) {
		h, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			tried = append(tried, p+" ("+shortDlerr(err)+")")
			return nil, err
		}
		return &library{path: p, handle: h}, nil
	}
	if env != "" {
		if p := os.Getenv(env); p != "" {
			if l, err := try(p); err == nil {
				return l, nil
			}
			return nil, &NotFoundError{What: names[0], Tried: tried}
		}
	}
	for _, n := range names {
		if l, err := try(n); err == nil {
			return l, nil
		}
	}
	dirs := append([]string(nil), libDirs...)
	for _, g := range libGlobs {
		m, _ := filepath.Glob(g)
		sort.Sort(sort.Reverse(sort.StringSlice(m))) // newest version first
		dirs = append(dirs, m...)
	}
	for _, d := range dirs {
		for _, n := range names {
			p := filepath.Join(d, n)
			if _, err := os.Stat(p); err != nil {
				continue
			}
			if l, err := try(p); err == nil {
				return l, nil
			}
		}
	}
	if env != "" {
		tried = append(tried, "$"+env+" (unset)")
	}
	tried = append(tried, fmt.Sprintf("%s in %d directories (%s, …)", strings.Join(names, "|"), len(dirs), strings.Join(dirs[:min(4, len(dirs))], ", ")))
	return nil, &NotFoundError{What: names[0], Tried: tried}
}

func shortDlerr(err error) string {
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 && strings.Contains(s, "cannot open") {
		return strings.TrimSpace(s[i+2:])
	}
	return s
}

// sym resolves name, returning 0 if it is absent.
func (l *library) sym(name string) uintptr {
	p, err := purego.Dlsym(l.handle, name)
	if err != nil {
		return 0
	}
	return p
}

// symbol binds one function address in a table to its name in each backend.
// An empty name means the backend has no such call; optional symbols may be
// missing from older libraries.
type symbol struct {
	addr     *uintptr
	cuda     string
	hip      string
	optional bool
}

// resolve fills every address of tab from l for backend b.
func (l *library) resolve(b Backend, tab []symbol) error {
	var missing []string
	for _, s := range tab {
		name := s.cuda
		if b == HIP {
			name = s.hip
		}
		if name == "" {
			continue
		}
		// A name list "a|b" tries each in turn (newer ABI first).
		for _, n := range strings.Split(name, "|") {
			if *s.addr = l.sym(n); *s.addr != 0 {
				break
			}
		}
		if *s.addr == 0 && !s.optional {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("rocm: %s lacks %s", l.path, strings.Join(missing, ", "))
	}
	return nil
}

// cstr returns s as a NUL-terminated byte slice; pass &b[0] to C.
func cstr(s string) []byte {
	b := make([]byte, len(s)+1)
	copy(b, s)
	return b
}

// gostr copies the NUL-terminated C string at p.
func gostr(p uintptr) string {
	if p == 0 {
		return ""
	}
	var n int
	for *(*byte)(unsafe.Add(unsafe.Pointer(nil), p+uintptr(n))) != 0 {
		n++
	}
	return string(unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(nil), p)), n))
}

// NotFoundError says that a GPU library could not be opened and where forge
// looked. Callers (forge's device selection) treat it as "use the CPU".
type NotFoundError struct {
	What  string
	Tried []string
}

func (e *NotFoundError) Error() string {
	return fmt.Sprintf("rocm: %s not found (looked for: %s)", e.What, strings.Join(e.Tried, "; "))
}

// Is makes errors.Is(err, ErrNoDriver) true.
func (e *NotFoundError) Is(target error) bool { return target == ErrNoDriver }

var (
	// ErrNoDriver: no GPU library could be opened.
	ErrNoDriver = errors.New("rocm: no GPU driver library")
	// ErrNoDevice: the library opened but reports no usable device.
	ErrNoDevice = errors.New("rocm: no GPU device")
)
