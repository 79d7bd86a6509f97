package actors

import (
	"fmt"
	"sync"

	"github.com/dustin/go-humanize"
)

// ErrOutOfMemory is wrapped by allocation failures of a Memory.
var ErrOutOfMemory = fmt.Errorf("out of memory")

// Memory accounts the bytes a device holds for models: the weight arena (or,
// for host-f32, every per-tensor copy). A limit makes allocations past it
// fail like a device out of memory, which is how tests inject that fault and
// how a user caps what a model may take. One Memory may be shared by several
// models on the same device. The zero value has no limit.
type Memory struct {
	mu    sync.Mutex
	limit int64
	inUse int64
	peak  int64
}

// NewMemory returns an accountant that fails allocations past limit bytes
// (≤ 0: no limit).
func NewMemory(limit int64) *Memory { return &Memory{limit: limit} }

// Alloc accounts n bytes for what, or fails with ErrOutOfMemory.
func (m *Memory) Alloc(n int64, what string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.limit > 0 && m.inUse+n > m.limit {
		return fmt.Errorf("%s: %w: %s needed, %s of %s in use",
			what, ErrOutOfMemory, humanize.IBytes(uint64(n)), humanize.IBytes(uint64(m.inUse)), humanize.IBytes(uint64(m.limit)))
	}
	m.inUse += n
	m.peak = max(m.peak, m.inUse)
	return nil
}

// Free returns n bytes.
func (m *Memory) Free(n int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.inUse -= n
	if m.inUse < 0 {
		panic("actors: memory freed twice")
	}
}

// Limit is the cap given to NewMemory (≤ 0: none).
func (m *Memory) Limit() int64 { return m.limit }

// InUse is the number of bytes allocated now.
func (m *Memory) InUse() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.inUse
}

// Peak is the most bytes ever allocated at once.
func (m *Memory) Peak() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.peak
}
