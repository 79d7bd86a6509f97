package rocm

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/ebitengine/purego"
)

// Peer names another worker's context for a copy out of its memory: its
// CUcontext on CUDA, its device on HIP.
type Peer struct {
	cuCtx   uintptr
	dev     int // CUdevice on CUDA, the ordinal on HIP
	Ordinal int
}

// Peer returns what a copy from w's memory, made on another worker, needs.
// The context was set up before NewWorker (or Sibling) returned and is
// read-only since.
func (w *Worker) Peer() Peer {
	return Peer{cuCtx: w.ctx.cuCtx, dev: w.ctx.dev, Ordinal: w.Device.Ordinal}
}

// ErrNoPeerCopy: the driver has no peer copy (an old library).
var ErrNoPeerCopy = errors.New("rocm: the driver has no peer copy")

// resPeerAlreadyEnabled is CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED (and
// hipErrorPeerAccessAlreadyEnabled, which copies its number): nothing to
// do.
const resPeerAlreadyEnabled = 704

// EnablePeer lets this context's copies and kernels reach p's memory over
// the link between the two devices (NVLink or PCIe peer-to-peer) where
// the driver allows it, and reports whether it does. Two contexts of one
// device need nothing (true). Where it is not allowed, a peer copy still
// works: the driver stages it through host memory.
func (c *Ctx) EnablePeer(p Peer) (bool, error) {
	if c.enablePeer == 0 || c.canAccessPeer == 0 {
		return false, nil
	}
	if p.dev == c.dev {
		return true, nil
	}
	var can int32
	if err := c.call(c.name("cuDeviceCanAccessPeer", "hipDeviceCanAccessPeer"), c.canAccessPeer, uintptr(unsafe.Pointer(&can)), uintptr(c.dev), uintptr(p.dev)); err != nil {
		return false, err
	}
	if can == 0 {
		return false, nil
	}
	var r uintptr
	switch c.backend {
	case CUDA:
		r, _, _ = purego.SyscallN(c.enablePeer, p.cuCtx, 0)
	case HIP:
		r, _, _ = purego.SyscallN(c.enablePeer, uintptr(p.dev), 0)
	}
	switch int32(r) {
	case resSuccess, resPeerAlreadyEnabled:
		return true, nil
	}
	return false, c.err(c.name("cuCtxEnablePeerAccess", "hipDeviceEnablePeerAccess"), int32(r))
}

// CopyPeerAsync queues on s (a stream of this context) a copy of n bytes
// from src, in p's memory, to dst, in this context's: directly over the
// link where EnablePeer allowed it, else staged by the driver through
// host memory.
func (c *Ctx) CopyPeerAsync(dst DevPtr, src DevPtr, p Peer, n int, s Stream) error {
	if c.copyPeerAsync == 0 {
		return ErrNoPeerCopy
	}
	var r uintptr
	switch c.backend {
	case CUDA:
		r, _, _ = purego.SyscallN(c.copyPeerAsync, uintptr(dst), c.cuCtx, uintptr(src), p.cuCtx, uintptr(n), uintptr(s))
	case HIP:
		r, _, _ = purego.SyscallN(c.copyPeerAsync, uintptr(dst), uintptr(c.dev), uintptr(src), uintptr(p.dev), uintptr(n), uintptr(s))
	default:
		return fmt.Errorf("rocm: peer copy on %s", c.backend)
	}
	return c.check("cuMemcpyPeerAsync", "hipMemcpyPeerAsync", r)
}
