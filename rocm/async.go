package rocm

import (
	"errors"
	"fmt"
	"unsafe"
)

// ErrNoAsyncAlloc is returned by MallocAsync where the library has no
// stream-ordered allocator (CUDA before 11.2, HIP before 5.2).
var ErrNoAsyncAlloc = errors.New("rocm: no stream-ordered allocator in this library")

// HasAsyncAlloc reports whether MallocAsync and FreeAsync are bound.
func (c *Ctx) HasAsyncAlloc() bool { return c.memAllocAsync != 0 && c.memFreeAsync != 0 }

// MallocAsync allocates size bytes from the device's default memory pool,
// in s's order (cuMemAllocAsync): work queued on s after it may use the
// memory, other streams once they wait for an event recorded on s after
// it. Free it with FreeAsync. A device without memory pools fails with the
// driver's "not supported" error: callers fall back to Malloc.
func (c *Ctx) MallocAsync(size int64, s Stream) (DevPtr, error) {
	if !c.HasAsyncAlloc() {
		return 0, ErrNoAsyncAlloc
	}
	var p uintptr
	if err := c.call(c.name("cuMemAllocAsync", "hipMallocAsync"), c.memAllocAsync, uintptr(unsafe.Pointer(&p)), uintptr(size), uintptr(s)); err != nil {
		return 0, fmt.Errorf("rocm: allocating %d bytes on a stream: %w", size, err)
	}
	live.devAllocs.Add(1)
	live.devBytes.Add(size)
	return DevPtr(p), nil
}

// FreeAsync queues the free of memory from MallocAsync on s and returns
// at once: the memory goes back to the pool when s reaches the free, with
// no device-wide synchronisation (cuMemFree waits for the whole device).
// Work on other streams that may still read it must be ordered before it
// (make s wait for their events first). The pool keeps no freed memory by
// default: the driver takes it back at the next synchronisation. size
// keeps the live byte count right.
func (c *Ctx) FreeAsync(p DevPtr, size int64, s Stream) error {
	if p == 0 {
		return nil
	}
	if !c.HasAsyncAlloc() {
		return ErrNoAsyncAlloc
	}
	if err := c.call(c.name("cuMemFreeAsync", "hipFreeAsync"), c.memFreeAsync, uintptr(p), uintptr(s)); err != nil {
		return err
	}
	live.devAllocs.Add(-1)
	live.devBytes.Add(-size)
	return nil
}
