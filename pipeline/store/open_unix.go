//go:build unix

package store

import (
	"os"
	"syscall"
)

// openNonblock opens path for reading without waiting for a writer (a
// FIFO) or a carrier (a device).
func openNonblock(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
}
