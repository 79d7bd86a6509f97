package cpu

import (
	"syscall"
	"testing"
	"time"
)

// cpuTime returns the CPU time (user + system) this process has used, over
// all threads. The shared development machine is often oversubscribed, so
// the benchmarks also report work per CPU-second of this process: unlike
// wall-clock rates it does not fall when other processes take the cores.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuMeter reports, at the end of a benchmark, the CPU seconds used per
// iteration and a rate per CPU-second of the given unit.
type cpuMeter struct {
	b     *testing.B
	start time.Duration
}

func startCPU(b *testing.B) *cpuMeter { return &cpuMeter{b: b, start: cpuTime()} }

// report adds "<unit>/cpu-s": perIter units of work per iteration divided
// by the CPU seconds used.
func (m *cpuMeter) report(perIter float64, unit string) {
	used := (cpuTime() - m.start).Seconds()
	if used > 0 {
		m.b.ReportMetric(perIter*float64(m.b.N)/used, unit+"/cpu-s")
	}
}
