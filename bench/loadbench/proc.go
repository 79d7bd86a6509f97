package loadbench

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// procStatus reads fields of /proc/self/status in bytes ("VmHWM",
// "RssAnon"); missing fields are 0.
func procStatus(fields ...string) map[string]int64 {
	out := map[string]int64{}
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		for _, want := range fields {
			if k == want {
				kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				if err == nil {
					out[k] = kb << 10
				}
			}
		}
	}
	return out
}

// Evict drops a file's pages from the page cache with
// posix_fadvise(POSIX_FADV_DONTNEED), which needs no root. Dirty pages are
// written first (they cannot be dropped); pages mapped by a running
// process stay.
func Evict(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("loadbench: evict: %w", err)
	}
	defer f.Close()
	if err := unix.Fdatasync(int(f.Fd())); err != nil {
		return fmt.Errorf("loadbench: evict %s: fdatasync: %w", path, err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("loadbench: evict %s: fadvise: %w", path, err)
	}
	return nil
}

// Warm reads a file through so its pages are in the page cache.
func Warm(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("loadbench: warm: %w", err)
	}
	defer f.Close()
	buf := make([]byte, 4<<20)
	for {
		_, err := f.Read(buf)
		if err != nil {
			break
		}
	}
	return nil
}

// CachedFraction is the fraction of a file's pages in the page cache
// (mincore over a read-only mapping), to check that Evict and Warm did what
// they say.
func CachedFraction(path string) (float64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("loadbench: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || st.Size() == 0 {
		return 0, err
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return 0, fmt.Errorf("loadbench: mmap %s: %w", path, err)
	}
	defer unix.Munmap(m)
	page := os.Getpagesize()
	vec := make([]byte, (len(m)+page-1)/page)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		return 0, fmt.Errorf("loadbench: mincore %s: %w", path, e)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return float64(n) / float64(len(vec)), nil
}
