package rocm

import (
	"fmt"
	"unsafe"
)

// Sibling starts another worker on w's device that shares w's context (on
// CUDA its thread makes w's CUcontext current; on HIP it selects the same
// device): device pointers, streams and events of one are valid in the
// other. It lets work that must not wait behind w's queue (the load
// pipeline's copies and host registrations, while w loads kernel modules
// or launches kernels) run on a thread of its own, and several host
// registrations run at once.
//
// A sibling never destroys the context: close every sibling before w.
func (w *Worker) Sibling() (*Worker, error) {
	select {
	case <-w.closed:
		return nil, ErrClosed
	default:
	}
	parent := &w.ctx // set up before NewWorker returned, read-only since
	s := newWorker(w.rt, w.Device)
	setup := func(c *Ctx) error {
		c.dev = parent.dev
		switch c.backend {
		case CUDA:
			if err := c.call("cuCtxSetCurrent", c.ctxSetCurrent, parent.cuCtx); err != nil {
				return fmt.Errorf("rocm: sibling worker of device %d: %w", w.Device.Ordinal, err)
			}
			// Kept so that a sibling of this sibling finds the context.
			c.cuCtx = parent.cuCtx
		case HIP:
			if err := c.call("hipSetDevice", c.setDevice, uintptr(w.Device.Ordinal)); err != nil {
				return fmt.Errorf("rocm: sibling worker of device %d: %w", w.Device.Ordinal, err)
			}
		}
		var p uintptr
		if err := c.call(c.name("cuMemHostAlloc", "hipHostMalloc"), c.hostAlloc, uintptr(unsafe.Pointer(&p)), argBlockSize, 0); err != nil {
			return fmt.Errorf("rocm: sibling kernel argument block: %w", err)
		}
		c.args = p
		return nil
	}
	teardown := func(c *Ctx) {
		c.cuCtx = 0 // the parent's: (*Ctx).teardown must not destroy it
		c.teardown()
	}
	if err := s.start(setup, teardown); err != nil {
		return nil, err
	}
	return s, nil
}
