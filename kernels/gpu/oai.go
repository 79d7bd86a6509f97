package gpu

import (
	"fmt"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/rocm"
)

// gpt-oss's ops (kernels/oai.go) on the GPU: the attention sinks, which
// the attention kernels take as an optional per-head logit pointer, and
// the clamped SwiGLU (oai.cu).

// AttentionSinks reports that Attention honours Attn.Sinks (attn_ext,
// archops.cu).
func (b *Backend) AttentionSinks() bool { return true }

// sinkPtr is the device address of at's sink logits (one F32 per query
// head), 0 without sinks. Call with b.mu held.
func (b *Backend) sinkPtr(op string, at kernels.Attn) (rocm.DevPtr, error) {
	if at.Sinks == nil {
		return 0, nil
	}
	if at.Sinks.Type != gguf.TypeF32 || at.Sinks.Cols*at.Sinks.Rows < at.Heads {
		return 0, fmt.Errorf("gpu: %s: sinks %q must be F32 with one value per head (%d), have %s %d×%d",
			op, at.Sinks.Name, at.Heads, at.Sinks.Type, at.Sinks.Rows, at.Sinks.Cols)
	}
	p, err := b.weightPtr(at.Sinks)
	if err != nil {
		return 0, fmt.Errorf("gpu: %s: sinks: %w", op, err)
	}
	return p, nil
}

var _ kernels.SinkAttender = (*Backend)(nil)
