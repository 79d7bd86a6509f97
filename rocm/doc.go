// Package rocm is forge's GPU runtime: one Go API over the HIP runtime
// (libamdhip64, AMD) and the CUDA driver API (libcuda.so.1, NVIDIA), both
// opened at run time with purego so that a CGO_ENABLED=0 binary runs on any
// Linux host, with or without a driver.
//
// HIP's module API mirrors the CUDA driver API call for call (hipModuleLaunchKernel
// ≈ cuLaunchKernel, hipMemcpyHtoDAsync ≈ cuMemcpyHtoDAsync_v2, …) with the
// same argument layout, so one table of resolved symbol addresses serves both
// (api.go); the few calls that differ (context setup, error strings, the arch
// name) are switched on Backend.
//
// Threads: a CUDA context and HIP's current device belong to an OS thread.
// Every GPU call therefore runs inside Worker.Do, on a goroutine that holds
// runtime.LockOSThread for its whole life; the methods of *Ctx are only valid
// inside Do. Handles (DevPtr, Stream, Event, Module, Graph, Arena, HostBuf)
// outlive a Do call and are passed into later ones.
//
// Hot paths (launch, async copy, event record) call purego.SyscallN on the
// resolved addresses; no reflection per call. Kernel arguments are packed into
// a C-allocated (pinned host) block owned by the worker, so no Go pointer is
// handed to the driver.
//
// Run-time compilation (compile.go) goes through nvrtc or hiprtc and caches
// the code object on disk, keyed by source, arch, options, driver and
// compiler versions. CompileHIP works without a device.
package rocm
