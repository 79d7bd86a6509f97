package constrain

import (
	"sync/atomic"
	"time"
)

// Stats are process-wide counters of constrained decoding, for benchmarks
// and metrics: how much mask work there was and how much of it a caller
// waited for (the rest overlapped the model's step).
type Stats struct {
	Masks   int64         // masks handed out by Allowed
	Walks   int64         // vocabulary walks (cache misses and budget-bound masks)
	Compute time.Duration // time spent computing masks, in the background
	Blocked time.Duration // time Allowed's callers waited for a mask
}

var stats struct {
	masks, walks, compute, blocked atomic.Int64
}

// ReadStats returns the counters since the process started.
func ReadStats() Stats {
	return Stats{Masks: stats.masks.Load(), Walks: stats.walks.Load(),
		Compute: time.Duration(stats.compute.Load()), Blocked: time.Duration(stats.blocked.Load())}
}

// Sub is s minus an earlier reading.
func (s Stats) Sub(o Stats) Stats {
	return Stats{s.Masks - o.Masks, s.Walks - o.Walks, s.Compute - o.Compute, s.Blocked - o.Blocked}
}
