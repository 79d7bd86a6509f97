package rocm

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/ebitengine/purego"
)

// Module is a loaded code object (cubin / AMD code object).
type Module struct {
	h     uintptr
	funcs map[string]Function
}

// Function is a kernel entry point (CUfunction / hipFunction_t).
type Function uintptr

// LoadModule loads a compiled code object (from Compiler.Compile).
func (c *Ctx) LoadModule(image []byte) (*Module, error) {
	if len(image) == 0 {
		return nil, fmt.Errorf("rocm: load module: empty image")
	}
	var m uintptr
	if err := c.call(c.name("cuModuleLoadData", "hipModuleLoadData"), c.moduleLoadData, uintptr(unsafe.Pointer(&m)), uintptr(unsafe.Pointer(&image[0]))); err != nil {
		return nil, fmt.Errorf("rocm: load module (%d bytes): %w", len(image), err)
	}
	live.modules.Add(1)
	return &Module{h: m, funcs: map[string]Function{}}, nil
}

// UnloadModule unloads m; its functions become invalid.
func (c *Ctx) UnloadModule(m *Module) error {
	if m == nil || m.h == 0 {
		return nil
	}
	if err := c.call(c.name("cuModuleUnload", "hipModuleUnload"), c.moduleUnload, m.h); err != nil {
		return err
	}
	m.h = 0
	live.modules.Add(-1)
	return nil
}

// Function looks up the kernel called name (declare kernels extern "C" so the
// name is not mangled).
func (c *Ctx) Function(m *Module, name string) (Function, error) {
	if f, ok := m.funcs[name]; ok {
		return f, nil
	}
	var f uintptr
	n := cstr(name)
	if err := c.call(c.name("cuModuleGetFunction", "hipModuleGetFunction"), c.moduleGetFunction, uintptr(unsafe.Pointer(&f)), m.h, uintptr(unsafe.Pointer(&n[0]))); err != nil {
		return 0, fmt.Errorf("rocm: kernel %q: %w", name, err)
	}
	m.funcs[name] = Function(f)
	return Function(f), nil
}

// LoadFunctions loads every kernel of m now and returns how many. The CUDA
// driver loads a module's kernels lazily, each at its first launch, so a
// first prompt that runs while the weights still stream in pays for every
// kernel it meets; loaded here, before the copies start, they cost ~3 ms
// in all. Where the driver cannot list a module's functions (before CUDA
// 12.4, and HIP, which loads modules whole) it does nothing.
func (c *Ctx) LoadFunctions(m *Module) (int, error) {
	if c.moduleFuncCount == 0 || c.moduleEnumFuncs == 0 || c.funcLoad == 0 || m == nil || m.h == 0 {
		return 0, nil
	}
	var n uint32
	if err := c.call("cuModuleGetFunctionCount", c.moduleFuncCount, uintptr(unsafe.Pointer(&n)), m.h); err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, nil
	}
	fs := make([]uintptr, n)
	if err := c.call("cuModuleEnumerateFunctions", c.moduleEnumFuncs, uintptr(unsafe.Pointer(&fs[0])), uintptr(n), m.h); err != nil {
		return 0, err
	}
	for i, f := range fs {
		if err := c.call("cuFuncLoad", c.funcLoad, f); err != nil {
			return i, err
		}
	}
	return int(n), nil
}

// Dim3 is a grid or block shape.
type Dim3 struct{ X, Y, Z uint32 }

// D1 is a one-dimensional Dim3.
func D1(x int) Dim3 { return Dim3{uint32(x), 1, 1} }

const (
	argDataSize = 3072 // bytes of argument values
	maxArgs     = 128  // pointers to them
	// launchExOffset is where cuLaunchKernelEx's CUlaunchConfig (56 bytes)
	// and its one CUlaunchAttribute (72 bytes) sit in the block.
	launchExOffset = argDataSize + maxArgs*8
	argBlockSize   = launchExOffset + 128 // C block owned by each worker
)

// The CUDA 12 driver ABI of cuLaunchKernelEx's arguments (cuda.h):
//
//	CUlaunchConfig    { u32 grid[3], block[3], sharedMemBytes; CUstream hStream (at 32);
//	                    CUlaunchAttribute* attrs (40); u32 numAttrs (48) }          56 bytes
//	CUlaunchAttribute { u32 id; pad to 8; union value (64 bytes) }                 72 bytes
const (
	launchConfigSize = 56
	// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION; its value is
	// the int programmaticStreamSerializationAllowed.
	attrProgrammaticSerialization = 6
)

// Args packs kernel arguments in the C ABI layout: each value at its natural
// alignment in a byte buffer, as the kernel's parameter list declares them.
// Build one per launch on the stack; Launch copies it into C memory.
//
//	var a rocm.Args
//	a.F32(alpha).Ptr(x).Ptr(y).I32(n) // saxpy(float, const float*, float*, int)
type Args struct {
	buf  [argDataSize]byte
	offs [maxArgs]uint16
	n    int
	used int
	err  error
}

func (a *Args) put(size, align int) []byte {
	off := (a.used + align - 1) &^ (align - 1)
	if a.n == maxArgs || off+size > argDataSize {
		if a.err == nil {
			a.err = fmt.Errorf("rocm: kernel arguments exceed %d values / %d bytes", maxArgs, argDataSize)
		}
		return make([]byte, size)
	}
	a.offs[a.n] = uint16(off)
	a.n++
	a.used = off + size
	return a.buf[off : off+size]
}

// Ptr appends a device pointer.
func (a *Args) Ptr(p DevPtr) *Args { return a.U64(uint64(p)) }

// U64 appends a 64-bit integer.
func (a *Args) U64(v uint64) *Args {
	b := a.put(8, 8)
	*(*uint64)(unsafe.Pointer(&b[0])) = v
	return a
}

// U32 appends a 32-bit unsigned integer.
func (a *Args) U32(v uint32) *Args {
	b := a.put(4, 4)
	*(*uint32)(unsafe.Pointer(&b[0])) = v
	return a
}

// I32 appends a 32-bit integer.
func (a *Args) I32(v int32) *Args { return a.U32(uint32(v)) }

// F32 appends a float.
func (a *Args) F32(v float32) *Args { return a.U32(math.Float32bits(v)) }

// Raw appends a by-value struct of len(b) bytes aligned to align.
func (a *Args) Raw(b []byte, align int) *Args {
	copy(a.put(len(b), align), b)
	return a
}

// Reset empties a for reuse.
func (a *Args) Reset() { a.n, a.used, a.err = 0, 0, nil }

// Len is the number of arguments packed.
func (a *Args) Len() int { return a.n }

// Launch queues f on s with grid × block threads and shmem bytes of dynamic
// shared memory. The driver copies the argument values during the call, so the
// worker's one C argument block is reused by every launch.
func (c *Ctx) Launch(f Function, grid, block Dim3, shmem int, s Stream, a *Args) error {
	if err := c.packArgs(a); err != nil {
		return err
	}
	r, _, _ := purego.SyscallN(c.launchKernel, uintptr(f),
		uintptr(grid.X), uintptr(grid.Y), uintptr(grid.Z),
		uintptr(block.X), uintptr(block.Y), uintptr(block.Z),
		uintptr(shmem), uintptr(s), c.args+argDataSize, 0)
	return c.check("cuLaunchKernel", "hipModuleLaunchKernel", r)
}

// HasDependentLaunch reports whether LaunchDependent can overlap kernels:
// a CUDA driver with cuLaunchKernelEx (12.0 and later). Whether the device
// honours it (compute capability 9.0 and later) is the caller's to check.
func (c *Ctx) HasDependentLaunch() bool { return c.backend == CUDA && c.launchKernelEx != 0 }

// LaunchDependent is Launch with programmatic stream serialization: f's
// blocks may be scheduled before the kernel queued ahead of it on s has
// finished, once every block of that kernel has started or signalled
// (griddepcontrol.launch_dependents). f must therefore wait for its
// predecessor (griddepcontrol.wait) before it touches memory; the kernels of
// kernels/gpu all start so (GRID_DEPEND in common.h). Recorded into a graph,
// the dependency stays programmatic. Without HasDependentLaunch it is Launch.
func (c *Ctx) LaunchDependent(f Function, grid, block Dim3, shmem int, s Stream, a *Args) error {
	if !c.HasDependentLaunch() {
		return c.Launch(f, grid, block, shmem, s, a)
	}
	if err := c.packArgs(a); err != nil {
		return err
	}
	cfg := unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(nil), c.args+launchExOffset)), argBlockSize-launchExOffset)
	clear(cfg)
	u32 := func(off int, v uint32) { *(*uint32)(unsafe.Pointer(&cfg[off])) = v }
	u64 := func(off int, v uint64) { *(*uint64)(unsafe.Pointer(&cfg[off])) = v }
	u32(0, grid.X)
	u32(4, grid.Y)
	u32(8, grid.Z)
	u32(12, block.X)
	u32(16, block.Y)
	u32(20, block.Z)
	u32(24, uint32(shmem))
	u64(32, uint64(s))
	u64(40, uint64(c.args+launchExOffset+launchConfigSize))
	u32(48, 1)
	u32(launchConfigSize, attrProgrammaticSerialization)
	u32(launchConfigSize+8, 1)
	r, _, _ := purego.SyscallN(c.launchKernelEx, c.args+launchExOffset, uintptr(f), c.args+argDataSize, 0)
	return c.check("cuLaunchKernelEx", "", r)
}

// packArgs copies a's values and the pointers to them into the worker's C
// argument block.
func (c *Ctx) packArgs(a *Args) error {
	if a.err != nil {
		return a.err
	}
	base := unsafe.Add(unsafe.Pointer(nil), c.args)
	copy(unsafe.Slice((*byte)(base), argDataSize), a.buf[:a.used])
	ptrs := unsafe.Slice((*uintptr)(unsafe.Add(base, argDataSize)), maxArgs)
	for i := 0; i < a.n; i++ {
		ptrs[i] = c.args + uintptr(a.offs[i])
	}
	return nil
}
