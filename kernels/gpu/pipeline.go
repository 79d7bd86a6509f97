package gpu

import (
	"fmt"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/rocm"
)

// WaitEvent makes the compute stream wait, on the device, for event (a
// layer's copy event recorded on the uploader's copy stream): kernels
// queued after it start once those copies have landed, and the host does
// not block. The load pipeline calls it per layer.
func (b *Backend) WaitEvent(event uintptr) error {
	if event == 0 {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.do(func(c *rocm.Ctx) error {
		if err := c.WaitEvent(b.stream, rocm.Event(event)); err != nil {
			return fmt.Errorf("gpu: stream wait on event %#x: %w", event, err)
		}
		return nil
	})
}

// Reads reports whether the kernels consume t's blocks as they are; the
// load pipeline converts the other types before upload.
func (b *Backend) Reads(t gguf.Type) bool { return Supported(t) }
