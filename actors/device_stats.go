// This file holds the DeviceUploader's statistics: DeviceStats says
// where a load's time went (registration, staging, copies, the ring's
// pinning), so benchmarks and profiles can tell one copy path from another
// (bench/results), and deviceStats is its lock-guarded accumulator.

package actors

import (
	"sync"
	"sync/atomic"
	"time"
)

// DeviceStats says where a load's time went (for benchmarks and
// profiles).
type DeviceStats struct {
	Registrations   int           // ranges registered
	RegisteredBytes int64         // bytes registered
	RegisterTime    time.Duration // summed over the registration threads
	RegisterWait    time.Duration // chunks waiting for their ranges, summed
	StagedBytes     int64         // bytes copied through the ring
	PinnedBytes     int64         // bytes copied from a kept registration (Pinned)
	StageCopyTime   time.Duration // stagers' memcpy, summed
	RingWait        time.Duration // stagers waiting for a free buffer, summed
	CopyCalls       int           // asynchronous copies queued
	Batches         int           // copy-thread round trips
	ReclaimWait     time.Duration // copy thread waiting for a ring buffer's copy
	RingPinTime     time.Duration // pinning the ring
	RingReused      bool          // the ring was lent by Rings, pinned before
	ArenaAsync      bool          // the arena was allocated in stream order
	UnregisterTime  time.Duration // in Release
	// From the start of Reserve: Reserve's end (arena, events, stream),
	// the first chunk handed to Upload, the ring registered, the first and
	// the last copy queued.
	Reserved, FirstUpload, RingReady, FirstCopy, LastCopy time.Duration
}

type deviceStats struct {
	mu    sync.Mutex
	first atomic.Bool // FirstUpload is set
	DeviceStats
}

func (s *deviceStats) add(f func(*DeviceStats)) {
	s.mu.Lock()
	f(&s.DeviceStats)
	s.mu.Unlock()
}

// Stats returns the counters so far.
func (d *DeviceUploader) Stats() DeviceStats {
	d.stats.mu.Lock()
	defer d.stats.mu.Unlock()
	return d.stats.DeviceStats
}
