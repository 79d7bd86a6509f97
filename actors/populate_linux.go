package actors

import (
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/forge-llm/forge/gguf"
)

// noPopulate is set once the kernel has refused MADV_POPULATE_READ (before
// Linux 5.14), so later chunks go straight to touch.
var noPopulate atomic.Bool

// pageIn makes the pages of b (a view of the mapped file) resident. On
// Linux it asks the kernel to populate them in one call
// (MADV_POPULATE_READ), which faults a whole range at once and reports a
// page past the end of a truncated file or an I/O error as an error
// instead of SIGBUS; older kernels fall back to touch.
func pageIn(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if !noPopulate.Load() {
		// madvise wants a page-aligned start.
		// The mapping starts on a page, so stepping back to the page
		// start stays inside it.
		off := int(uintptr(unsafe.Pointer(unsafe.SliceData(b))) % pageSize)
		r := unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(b)), -off)), len(b)+off)
		err := unix.Madvise(r, unix.MADV_POPULATE_READ)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, unix.EINVAL):
			noPopulate.Store(true)
		default:
			// EFAULT: a page would raise SIGBUS (past the end of a
			// truncated file); EIO: the disk failed.
			return &gguf.FaultError{Offset: -1, Err: fmt.Errorf("madvise(MADV_POPULATE_READ): %w", err)}
		}
	}
	return touch(b)
}
