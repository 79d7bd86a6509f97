//go:build unix

package pipeline

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// willNeed queues readahead of b (a view of the mapped file). Errors are
// ignored: it is only a hint, and the loader reports real read failures
// naming the tensor.
func willNeed(b []byte) {
	const page = 4096
	off := int(uintptr(unsafe.Pointer(unsafe.SliceData(b))) % page)
	r := unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(b)), -off)), len(b)+off)
	_ = unix.Madvise(r, unix.MADV_WILLNEED)
}
