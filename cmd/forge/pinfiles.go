package main

import (
	"bufio"
	"fmt"
	"os"
	"strings"

	"github.com/dustin/go-humanize"
)

// pinFilesFlag reads --pin-files: a size, 0, or "auto". Auto is a quarter
// of the host's memory (from /proc/meminfo; none where that cannot be
// read) when the server may swap models, none when it starts with exactly
// one model: pinning pays only when a model is loaded again, and while a
// file registers (~250 ms for 4.9 GB on an H100 host) its requests wait on
// the driver (bench/results/2026-11-25-night-swap-h100.md).
func pinFilesFlag(s string, models int) (int64, error) {
	if s == "auto" {
		if models == 1 {
			return 0, nil
		}
		return hostMemory() / 4, nil
	}
	n, err := humanize.ParseBytes(s)
	if err != nil || n > 1<<62 {
		return 0, fmt.Errorf("--pin-files %q: want a size, 0 or auto", s)
	}
	return int64(n), nil
}

// hostMemory is MemTotal of /proc/meminfo in bytes, 0 where unknown.
func hostMemory() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			var kb int64
			if _, err := fmt.Sscanf(strings.TrimSpace(rest), "%d kB", &kb); err == nil {
				return kb << 10
			}
		}
	}
	return 0
}
