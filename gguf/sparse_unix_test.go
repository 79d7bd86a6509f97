//go:build unix

package gguf

import (
	"os"
	"syscall"
	"testing"
)

// diskBytes is the disk space a file takes (allocated 512-byte blocks).
func diskBytes(t *testing.T, path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Sys().(*syscall.Stat_t).Blocks * 512
}
