package actors

import "golang.org/x/sys/unix"

// anonMemory maps n bytes of anonymous memory for the staging ring, asking
// for huge pages (fewer faults to page it in, fewer pages to pin); nil if
// the mapping fails.
func anonMemory(n int) []byte {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil
	}
	_ = unix.Madvise(b, unix.MADV_HUGEPAGE) // a hint
	return b
}

func freeAnonMemory(b []byte) error { return unix.Munmap(b) }

// populateWrite pages b in writable, in one call where the kernel can
// (Linux 5.14), else by touching every page.
func populateWrite(b []byte) {
	if unix.Madvise(b, unix.MADV_POPULATE_WRITE) == nil {
		return
	}
	for k := 0; k < len(b); k += pageSize {
		b[k] = 0
	}
}
