package rocm

import (
	"fmt"
	"unsafe"

	"github.com/ebitengine/purego"
)

// Backend names the library family behind a Runtime.
type Backend int

const (
	CUDA Backend = iota + 1 // NVIDIA: libcuda.so.1 + nvrtc
	HIP                     // AMD: libamdhip64 (+ hiprtc)
)

func (b Backend) String() string {
	switch b {
	case CUDA:
		return "cuda"
	case HIP:
		return "hip"
	}
	return "none"
}

// api holds the resolved addresses of every driver call forge makes. The two
// libraries' calls take the same arguments in the same order, so one field
// serves both; names are bound in symbols().
type api struct {
	backend Backend
	lib     *library

	init, driverVersion                             uintptr
	deviceCount, deviceGet, deviceName, deviceAttr  uintptr
	deviceTotalMem, deviceProps                     uintptr
	ctxCreate, ctxDestroy, ctxSetCurrent, ctxSync   uintptr
	setDevice                                       uintptr
	errName, errString                              uintptr
	memAlloc, memFree, memGetInfo                   uintptr
	hostAlloc, hostFree, hostRegister, hostUnreg    uintptr
	copyHtoDAsync, copyDtoHAsync, copyDtoDAsync     uintptr
	copyHtoD, copyDtoH                              uintptr
	memsetD8Async, memsetD32Async                   uintptr
	streamCreate, streamDestroy, streamSync         uintptr
	streamWaitEvent, streamQuery                    uintptr
	eventCreate, eventDestroy, eventRecord          uintptr
	eventQuery, eventSync, eventElapsed             uintptr
	beginCapture, endCapture                        uintptr
	graphInstantiate, graphLaunch, graphExecDestroy uintptr
	graphDestroy, graphGetNodes                     uintptr
	moduleLoadData, moduleUnload, moduleGetFunction uintptr
	launchKernel                                    uintptr
	// CUDA 12.0 and later (absent: 0): launches with attributes, for
	// programmatic dependent launch (LaunchDependent).
	launchKernelEx uintptr
	// CUDA 12.4 and later (absent: 0): a module's functions, loaded now.
	moduleFuncCount, moduleEnumFuncs, funcLoad uintptr
	// CUDA 11.2 and later, HIP 5.2 and later (absent: 0): stream-ordered
	// allocation from the device's default memory pool.
	memAllocAsync, memFreeAsync uintptr
	// Copies between devices (or two contexts of one), peer.go.
	copyPeerAsync, enablePeer, canAccessPeer uintptr
}

func (a *api) symbols() []symbol {
	return []symbol{
		{&a.init, "cuInit", "hipInit", false},
		{&a.driverVersion, "cuDriverGetVersion", "hipDriverGetVersion", false},
		{&a.deviceCount, "cuDeviceGetCount", "hipGetDeviceCount", false},
		{&a.deviceGet, "cuDeviceGet", "hipDeviceGet", false},
		{&a.deviceName, "cuDeviceGetName", "hipDeviceGetName", false},
		{&a.deviceAttr, "cuDeviceGetAttribute", "hipDeviceGetAttribute", false},
		{&a.deviceTotalMem, "cuDeviceTotalMem_v2", "hipDeviceTotalMem", false},
		{&a.deviceProps, "", "hipGetDevicePropertiesR0600|hipGetDeviceProperties", false},
		{&a.ctxCreate, "cuCtxCreate_v2", "", false},
		{&a.ctxDestroy, "cuCtxDestroy_v2", "", false},
		{&a.ctxSetCurrent, "cuCtxSetCurrent", "", false},
		{&a.ctxSync, "cuCtxSynchronize", "hipDeviceSynchronize", false},
		{&a.setDevice, "", "hipSetDevice", false},
		{&a.errName, "cuGetErrorName", "hipGetErrorName", false},
		{&a.errString, "cuGetErrorString", "hipGetErrorString", false},
		{&a.memAlloc, "cuMemAlloc_v2", "hipMalloc", false},
		{&a.memFree, "cuMemFree_v2", "hipFree", false},
		{&a.memGetInfo, "cuMemGetInfo_v2", "hipMemGetInfo", false},
		{&a.hostAlloc, "cuMemHostAlloc", "hipHostMalloc", false},
		{&a.hostFree, "cuMemFreeHost", "hipHostFree", false},
		{&a.hostRegister, "cuMemHostRegister_v2", "hipHostRegister", false},
		{&a.hostUnreg, "cuMemHostUnregister", "hipHostUnregister", false},
		{&a.copyHtoDAsync, "cuMemcpyHtoDAsync_v2", "hipMemcpyHtoDAsync", false},
		{&a.copyDtoHAsync, "cuMemcpyDtoHAsync_v2", "hipMemcpyDtoHAsync", false},
		{&a.copyDtoDAsync, "cuMemcpyDtoDAsync_v2", "hipMemcpyDtoDAsync", false},
		{&a.copyHtoD, "cuMemcpyHtoD_v2", "hipMemcpyHtoD", false},
		{&a.copyDtoH, "cuMemcpyDtoH_v2", "hipMemcpyDtoH", false},
		{&a.memsetD8Async, "cuMemsetD8Async", "hipMemsetD8Async", false},
		{&a.memsetD32Async, "cuMemsetD32Async", "hipMemsetD32Async", false},
		{&a.streamCreate, "cuStreamCreate", "hipStreamCreateWithFlags", false},
		{&a.streamDestroy, "cuStreamDestroy_v2", "hipStreamDestroy", false},
		{&a.streamSync, "cuStreamSynchronize", "hipStreamSynchronize", false},
		{&a.streamWaitEvent, "cuStreamWaitEvent", "hipStreamWaitEvent", false},
		{&a.streamQuery, "cuStreamQuery", "hipStreamQuery", false},
		{&a.eventCreate, "cuEventCreate", "hipEventCreateWithFlags", false},
		{&a.eventDestroy, "cuEventDestroy_v2", "hipEventDestroy", false},
		{&a.eventRecord, "cuEventRecord", "hipEventRecord", false},
		{&a.eventQuery, "cuEventQuery", "hipEventQuery", false},
		{&a.eventSync, "cuEventSynchronize", "hipEventSynchronize", false},
		{&a.eventElapsed, "cuEventElapsedTime|cuEventElapsedTime_v2", "hipEventElapsedTime", false},
		{&a.beginCapture, "cuStreamBeginCapture_v2", "hipStreamBeginCapture", false},
		{&a.endCapture, "cuStreamEndCapture", "hipStreamEndCapture", false},
		{&a.graphInstantiate, "cuGraphInstantiateWithFlags", "hipGraphInstantiateWithFlags", false},
		{&a.graphLaunch, "cuGraphLaunch", "hipGraphLaunch", false},
		{&a.graphExecDestroy, "cuGraphExecDestroy", "hipGraphExecDestroy", false},
		{&a.graphDestroy, "cuGraphDestroy", "hipGraphDestroy", false},
		{&a.graphGetNodes, "cuGraphGetNodes", "hipGraphGetNodes", false},
		{&a.moduleLoadData, "cuModuleLoadData", "hipModuleLoadData", false},
		{&a.moduleUnload, "cuModuleUnload", "hipModuleUnload", false},
		{&a.moduleGetFunction, "cuModuleGetFunction", "hipModuleGetFunction", false},
		{&a.launchKernel, "cuLaunchKernel", "hipModuleLaunchKernel", false},
		{&a.launchKernelEx, "cuLaunchKernelEx", "", true},
		{&a.moduleFuncCount, "cuModuleGetFunctionCount", "", true},
		{&a.moduleEnumFuncs, "cuModuleEnumerateFunctions", "", true},
		{&a.funcLoad, "cuFuncLoad", "", true},
		{&a.memAllocAsync, "cuMemAllocAsync", "hipMallocAsync", true},
		{&a.memFreeAsync, "cuMemFreeAsync", "hipFreeAsync", true},
		{&a.copyPeerAsync, "cuMemcpyPeerAsync", "hipMemcpyPeerAsync", true},
		{&a.enablePeer, "cuCtxEnablePeerAccess", "hipDeviceEnablePeerAccess", true},
		{&a.canAccessPeer, "cuDeviceCanAccessPeer", "hipDeviceCanAccessPeer", true},
	}
}

// Result codes shared by both libraries (hipError_t copies CUresult's numbers
// for these).
const (
	resSuccess  = 0
	resNoDevice = 100
	resNotReady = 600
)

// call runs fn with args and turns a non-zero result into an *Error naming
// the call. Pointers to Go memory may be passed as uintptr(unsafe.Pointer(p))
// written in the call expression: go:uintptrescapes keeps them alive (and
// moves them to the heap) for the duration of the call.
//
//go:uintptrescapes
func (a *api) call(name string, fn uintptr, args ...uintptr) error {
	r, _, _ := purego.SyscallN(fn, args...)
	if int32(r) != resSuccess {
		return a.err(name, int32(r))
	}
	return nil
}

// err builds the error for result code r of call name.
func (a *api) err(name string, r int32) error {
	e := &Error{Backend: a.backend, Call: name, Code: int(r)}
	switch a.backend {
	case CUDA:
		var p uintptr
		if a.errName != 0 {
			purego.SyscallN(a.errName, uintptr(r), uintptr(unsafe.Pointer(&p)))
			e.Name = gostr(p)
			p = 0
			purego.SyscallN(a.errString, uintptr(r), uintptr(unsafe.Pointer(&p)))
			e.Text = gostr(p)
		}
	case HIP:
		if a.errName != 0 {
			p, _, _ := purego.SyscallN(a.errName, uintptr(r))
			e.Name = gostr(p)
			p, _, _ = purego.SyscallN(a.errString, uintptr(r))
			e.Text = gostr(p)
		}
	}
	return e
}

// Error is a failed driver, runtime or compiler call.
type Error struct {
	Backend Backend
	Call    string // the library function that failed, e.g. "cuMemAlloc_v2"
	Code    int    // CUresult / hipError_t / nvrtcResult / hiprtcResult
	Name    string // e.g. "CUDA_ERROR_OUT_OF_MEMORY"
	Text    string // the library's description
	Log     string // compiler log, for compile errors
}

func (e *Error) Error() string {
	s := fmt.Sprintf("rocm: %s: %s failed: %s (%d): %s", e.Backend, e.Call, e.Name, e.Code, e.Text)
	if e.Log != "" {
		s += "\n" + e.Log
	}
	return s
}

// Is lets errors.Is(err, ErrNoDevice) match a driver's "no device" result.
func (e *Error) Is(target error) bool {
	return target == ErrNoDevice && e.Code == resNoDevice
}
