package gpu

import (
	"fmt"
	"math"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/rocm"
)

// gpt-oss's ops (kernels/oai.go) on the GPU: the attention sinks, which
// the attention kernels take as an optional per-head logit pointer, and
// the clamped SwiGLU (oai.cu). The MXFP4 experts need nothing here: every
// product path reads MXFP4 (quants.h's TMXFP4).

// AttentionSinks reports that Attention (attn_decode and attn_prompt,
// attn.cu; attn_ext, archops.cu, with a window) and PagedAttention
// (attn_paged_merge, attn.cu, after attn_paged or attn_paged_fine; the
// prompt pieces' prefill.cu) honour Attn.Sinks.
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

// SwiGLUOAI computes dst = g·σ(alpha·g)·(u+1) over n values, g the gate
// clamped above at limit and u the up value clamped to [-limit, limit]
// (swiglu_oai, oai.cu).
func (b *Backend) SwiGLUOAI(dst, gate, up kernels.Tensor, n int, alpha, limit float32) error {
	if !(limit > 0) || math.IsInf(float64(limit), 0) || math.IsNaN(float64(alpha)) || math.IsInf(float64(alpha), 0) {
		return fmt.Errorf("gpu: swiglu oai: alpha %v and limit %v must be finite, limit > 0", alpha, limit)
	}
	for _, c := range []struct {
		what string
		t    kernels.Tensor
	}{{"swiglu oai: dst", dst}, {"swiglu oai: gate", gate}, {"swiglu oai: up", up}} {
		if err := checkTensor(c.what, c.t, n); err != nil {
			return err
		}
	}
	if n <= 0 {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.do(func(c *rocm.Ctx) error {
		var a rocm.Args
		a.Ptr(dptr(dst)).Ptr(dptr(gate)).Ptr(dptr(up)).I32(int32(n)).F32(alpha).F32(limit)
		return b.launch(c, "swiglu_oai", grid1(n), rocm.D1(256), &a)
	})
}

var (
	_ kernels.SinkAttender = (*Backend)(nil)
	_ kernels.SwiGLUOAIer  = (*Backend)(nil)
)
