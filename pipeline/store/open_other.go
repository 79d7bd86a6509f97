//go:build !unix

package store

import "os"

// openNonblock opens path for reading; without O_NONBLOCK here, the
// regular-file check after opening is what guards.
func openNonblock(path string) (*os.File, error) { return os.Open(path) }
