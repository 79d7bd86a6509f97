package dequant

import (
	"syscall"
	"time"
)

// threadCPU returns the CPU time the calling OS thread has used. The
// benchmarks lock their goroutine to its thread and report throughput
// per CPU-second next to the wall-clock figure, because the development
// machine is shared and wall time there includes time spent descheduled.
func threadCPU() (time.Duration, bool) {
	const rusageThread = 1 // RUSAGE_THREAD
	var ru syscall.Rusage
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
