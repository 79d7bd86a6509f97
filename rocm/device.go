package rocm

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"unsafe"
)

// EnvBackend forces one backend ("cuda" or "hip") for Open.
const EnvBackend = "FORGE_GPU_BACKEND"

// Runtime is an opened and initialised driver library. One exists per backend
// per process; it is safe for concurrent use (it holds no thread state).
type Runtime struct {
	api
	Version int // cuDriverGetVersion / hipDriverGetVersion, e.g. 13000
}

var runtimes struct {
	mu   sync.Mutex
	open map[Backend]*Runtime
}

// Open loads and initialises the driver of backend b. It returns an error
// matching ErrNoDriver when the library cannot be found (listing where it
// looked) and ErrNoDevice when it loads but finds no GPU.
func Open(b Backend) (*Runtime, error) {
	runtimes.mu.Lock()
	defer runtimes.mu.Unlock()
	if rt := runtimes.open[b]; rt != nil {
		return rt, nil
	}
	rt := &Runtime{}
	rt.backend = b
	var err error
	if rt.lib, err = openDriverLibrary(b); err != nil {
		return nil, err
	}
	if err := rt.lib.resolve(b, rt.symbols()); err != nil {
		return nil, err
	}
	// A driver that loads but cannot initialise (no device node, no GPU,
	// driver/library mismatch) means "no usable device" to the caller, who
	// falls back to the CPU; the wrapped *Error keeps the library's reason.
	if err := rt.call(rt.name("cuInit", "hipInit"), rt.init, 0); err != nil {
		return nil, &noDeviceError{lib: rt.lib.path, err: err}
	}
	var v int32
	if err := rt.call(rt.name("cuDriverGetVersion", "hipDriverGetVersion"), rt.driverVersion, uintptr(unsafe.Pointer(&v))); err != nil {
		return nil, err
	}
	rt.Version = int(v)
	n, err := rt.DeviceCount()
	if err != nil {
		return nil, &noDeviceError{lib: rt.lib.path, err: err}
	}
	if n == 0 {
		return nil, &noDeviceError{lib: rt.lib.path, err: fmt.Errorf("%s reports 0 devices", rt.name("cuDeviceGetCount", "hipGetDeviceCount"))}
	}
	if runtimes.open == nil {
		runtimes.open = map[Backend]*Runtime{}
	}
	runtimes.open[b] = rt
	return rt, nil
}

// openDriverLibrary loads backend b's driver library without initialising
// it: Open, Probe and PreloadCompiler look in the same places.
func openDriverLibrary(b Backend) (*library, error) {
	switch b {
	case CUDA:
		return openLibrary(EnvCUDALib, "libcuda.so.1", "libcuda.so")
	case HIP:
		return openLibrary(EnvHIPLib, hipLibNames...)
	}
	return nil, fmt.Errorf("rocm: unknown backend %d", b)
}

// candidates are the backends OpenAny tries, in order: the one
// $FORGE_GPU_BACKEND names, or else CUDA and then HIP.
func candidates() []Backend {
	switch strings.ToLower(os.Getenv(EnvBackend)) {
	case "cuda":
		return []Backend{CUDA}
	case "hip", "rocm":
		return []Backend{HIP}
	}
	return []Backend{CUDA, HIP}
}

// OpenAny opens the backend named by $FORGE_GPU_BACKEND, or else CUDA and
// then HIP. Its error names every library and path it tried.
func OpenAny() (*Runtime, error) {
	if c := candidates(); len(c) == 1 {
		return Open(c[0])
	}
	rt, errC := Open(CUDA)
	if errC == nil {
		return rt, nil
	}
	rt, errH := Open(HIP)
	if errH == nil {
		return rt, nil
	}
	return nil, fmt.Errorf("rocm: no usable GPU:\n  cuda: %w\n  hip: %w", errC, errH)
}

// Backend reports which library family this runtime drives.
func (rt *Runtime) Backend() Backend { return rt.backend }

// LibraryPath is the file that was opened.
func (rt *Runtime) LibraryPath() string { return rt.lib.path }

func (a *api) name(cuda, hip string) string {
	if a.backend == HIP {
		return hip
	}
	return cuda
}

// DeviceCount returns the number of devices the driver reports.
func (rt *Runtime) DeviceCount() (int, error) {
	var n int32
	err := rt.call(rt.name("cuDeviceGetCount", "hipGetDeviceCount"), rt.deviceCount, uintptr(unsafe.Pointer(&n)))
	if err != nil {
		return 0, err
	}
	return int(n), nil
}

// DeviceInfo describes one GPU.
type DeviceInfo struct {
	Backend  Backend
	Ordinal  int
	Name     string
	Arch     string // "sm_90" on CUDA, the gcnArchName ("gfx90a:sramecc+:xnack-") on HIP
	CCMajor  int    // compute capability (CUDA) or the HIP-reported equivalent
	CCMinor  int
	Memory   uint64 // total device memory in bytes
	SMs      int    // multiprocessors / compute units
	WarpSize int    // 32 on NVIDIA and RDNA, 64 on CDNA: never assume
	L2Bytes  int
	// ReadOnlyRegister: host registration can take the read-only flag, so a
	// PROT_READ mmap of a model file can be registered and copied from.
	ReadOnlyRegister bool
}

func (d DeviceInfo) String() string {
	return fmt.Sprintf("%s:%d %s (%s, %d SMs, warp %d, %.1f GiB)", d.Backend, d.Ordinal, d.Name, d.Arch, d.SMs, d.WarpSize, float64(d.Memory)/(1<<30))
}

// Attribute numbers of cuDeviceGetAttribute (CUdevice_attribute) and
// hipDeviceGetAttribute (hipDeviceAttribute_t, ROCm ≥ 5 numbering).
var attrs = map[Backend]struct{ warp, sms, ccMajor, ccMinor, l2, roRegister int }{
	CUDA: {10, 16, 75, 76, 38, 113},
	HIP:  {87, 63, 23, 61, 19, -1},
}

func (rt *Runtime) attr(a, dev int) (int, error) {
	if a < 0 {
		return 0, nil
	}
	var v int32
	err := rt.call(rt.name("cuDeviceGetAttribute", "hipDeviceGetAttribute"), rt.deviceAttr, uintptr(unsafe.Pointer(&v)), uintptr(a), uintptr(dev))
	return int(v), err
}

func (rt *Runtime) device(ordinal int) (int, error) {
	var d int32
	err := rt.call(rt.name("cuDeviceGet", "hipDeviceGet"), rt.deviceGet, uintptr(unsafe.Pointer(&d)), uintptr(ordinal))
	return int(d), err
}

// Device returns the properties of device ordinal.
func (rt *Runtime) Device(ordinal int) (DeviceInfo, error) {
	info := DeviceInfo{Backend: rt.backend, Ordinal: ordinal}
	dev, err := rt.device(ordinal)
	if err != nil {
		return info, fmt.Errorf("rocm: device %d: %w", ordinal, err)
	}
	buf := make([]byte, 256)
	if err := rt.call(rt.name("cuDeviceGetName", "hipDeviceGetName"), rt.deviceName, uintptr(unsafe.Pointer(&buf[0])), 256, uintptr(dev)); err != nil {
		return info, err
	}
	info.Name = cString(buf)
	var mem uint64
	if err := rt.call(rt.name("cuDeviceTotalMem_v2", "hipDeviceTotalMem"), rt.deviceTotalMem, uintptr(unsafe.Pointer(&mem)), uintptr(dev)); err != nil {
		return info, err
	}
	info.Memory = mem
	at := attrs[rt.backend]
	for _, f := range []struct {
		dst *int
		a   int
	}{{&info.WarpSize, at.warp}, {&info.SMs, at.sms}, {&info.CCMajor, at.ccMajor}, {&info.CCMinor, at.ccMinor}, {&info.L2Bytes, at.l2}} {
		if *f.dst, err = rt.attr(f.a, dev); err != nil {
			return info, fmt.Errorf("rocm: device %d attribute %d: %w", ordinal, f.a, err)
		}
	}
	switch rt.backend {
	case CUDA:
		info.Arch = fmt.Sprintf("sm_%d%d", info.CCMajor, info.CCMinor)
		ro, err := rt.attr(at.roRegister, dev)
		info.ReadOnlyRegister = err == nil && ro != 0
	case HIP:
		info.Arch = rt.hipArch(dev)
	}
	return info, nil
}

// hipArch reads gcnArchName from hipDeviceProp_t. The struct's layout changed
// between ROCm 5 and 6, so rather than hard-code an offset we hand the call a
// generous buffer and take the first "gfx…" string after the name field.
func (rt *Runtime) hipArch(dev int) string {
	buf := make([]byte, 16<<10)
	if rt.call("hipGetDeviceProperties", rt.deviceProps, uintptr(unsafe.Pointer(&buf[0])), uintptr(dev)) != nil {
		return ""
	}
	for i := 256; i+4 < len(buf); i++ {
		if buf[i] == 'g' && buf[i+1] == 'f' && buf[i+2] == 'x' && buf[i-1] == 0 {
			return cString(buf[i:])
		}
	}
	return ""
}

// Devices lists every device of the runtime.
func (rt *Runtime) Devices() ([]DeviceInfo, error) {
	n, err := rt.DeviceCount()
	if err != nil {
		return nil, err
	}
	out := make([]DeviceInfo, 0, n)
	for i := 0; i < n; i++ {
		d, err := rt.Device(i)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

func cString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// Selection is a parsed --device flag.
type Selection struct {
	Kind    SelectKind
	Ordinal int // for SelectGPU
}

// SelectKind is what --device asked for.
type SelectKind int

const (
	SelectAuto SelectKind = iota // a GPU if one works, else the CPU
	SelectCPU                    // the CPU backend, no driver is opened
	SelectGPU                    // GPU Ordinal; failing to open it is an error
)

func (s Selection) String() string {
	switch s.Kind {
	case SelectCPU:
		return "cpu"
	case SelectGPU:
		return "gpu:" + strconv.Itoa(s.Ordinal)
	}
	return "auto"
}

// ParseDevice parses "auto", "cpu", "gpu" (= gpu:0) or "gpu:N".
func ParseDevice(s string) (Selection, error) {
	switch t := strings.ToLower(strings.TrimSpace(s)); {
	case t == "" || t == "auto":
		return Selection{Kind: SelectAuto}, nil
	case t == "cpu":
		return Selection{Kind: SelectCPU}, nil
	case t == "gpu" || t == "cuda" || t == "hip":
		return Selection{Kind: SelectGPU}, nil
	case strings.HasPrefix(t, "gpu:"):
		n, err := strconv.Atoi(t[4:])
		if err != nil || n < 0 {
			return Selection{}, fmt.Errorf("rocm: --device %q: want auto, cpu or gpu:N with N ≥ 0", s)
		}
		return Selection{Kind: SelectGPU, Ordinal: n}, nil
	}
	return Selection{}, fmt.Errorf("rocm: --device %q: want auto, cpu or gpu:N", s)
}

// Choice is the outcome of Choose: either a GPU (Runtime and Device set) or
// the CPU, with Reason saying why when auto fell back.
type Choice struct {
	Runtime *Runtime
	Device  DeviceInfo
	CPU     bool
	Reason  string
}

// Choose resolves a Selection. "auto" falls back to the CPU when no driver or
// no device is found (Reason holds the error naming what was looked for);
// "gpu:N" returns that error instead.
func Choose(sel Selection) (Choice, error) {
	if sel.Kind == SelectCPU {
		return Choice{CPU: true, Reason: "--device cpu"}, nil
	}
	rt, err := OpenAny()
	if err == nil {
		var n int
		if n, err = rt.DeviceCount(); err == nil && sel.Ordinal >= n {
			err = fmt.Errorf("rocm: %s has %d device(s), no gpu:%d: %w", rt.backend, n, sel.Ordinal, ErrNoDevice)
		}
	}
	if err != nil {
		if sel.Kind == SelectAuto && (errors.Is(err, ErrNoDriver) || errors.Is(err, ErrNoDevice)) {
			return Choice{CPU: true, Reason: err.Error()}, nil
		}
		return Choice{}, err
	}
	d, err := rt.Device(sel.Ordinal)
	if err != nil {
		return Choice{}, err
	}
	return Choice{Runtime: rt, Device: d}, nil
}

// noDeviceError: the library loaded but offers no usable device.
type noDeviceError struct {
	lib string
	err error
}

func (e *noDeviceError) Error() string {
	return fmt.Sprintf("rocm: no GPU device: %s loaded, but %v", e.lib, strings.TrimPrefix(e.err.Error(), "rocm: "))
}

func (e *noDeviceError) Unwrap() []error { return []error{ErrNoDevice, e.err} }
