package cpu

import (
	"fmt"
	"math"

	"github.com/forge-llm/forge/kernels"
)

// gpt-oss's ops (see kernels/oai.go): the attention sinks are read by
// Attention and PagedAttention's general path (attention.go, paged.go);
// the clamped SwiGLU is here.

// AttentionSinks reports that Attention and PagedAttention honour
// Attn.Sinks.
func (b *Backend) AttentionSinks() bool { return true }

// SwiGLUOAI computes dst = g·σ(alpha·g)·(u+1) over n values, g the gate
// clamped above at limit and u the up value clamped to [-limit, limit].
func (b *Backend) SwiGLUOAI(dst, gate, up kernels.Tensor, n int, alpha, limit float32) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !(limit > 0) || math.IsInf(float64(limit), 0) || math.IsNaN(float64(alpha)) || math.IsInf(float64(alpha), 0) {
		return fmt.Errorf("cpu: swiglu oai: alpha %v and limit %v must be finite, limit > 0", alpha, limit)
	}
	for _, c := range []struct {
		what string
		t    kernels.Tensor
	}{{"swiglu oai: dst", dst}, {"swiglu oai: gate", gate}, {"swiglu oai: up", up}} {
		if err := checkTensor(c.what, c.t, n); err != nil {
			return err
		}
	}
	d, g, u := dst.Host[:n], gate.Host[:n], up.Host[:n]
	for i := range d {
		x := min(g[i], limit)
		y := min(max(u[i], -limit), limit)
		d[i] = x / (1 + float32(math.Exp(float64(-alpha*x)))) * (y + 1)
	}
	return nil
}

// sinkLogits is a's per-head sink logits (nil without sinks), checked to
// hold one value per query head.
func sinkLogits(op string, a kernels.Attn) ([]float32, error) {
	if a.Sinks == nil {
		return nil, nil
	}
	s, err := f32Weight(op+": sinks", a.Sinks)
	if err != nil {
		return nil, err
	}
	if len(s) < a.Heads {
		return nil, fmt.Errorf("cpu: %s: sinks %q hold %d values for %d heads", op, a.Sinks.Name, len(s), a.Heads)
	}
	return s[:a.Heads], nil
}

var (
	_ kernels.SinkAttender = (*Backend)(nil)
	_ kernels.SwiGLUOAIer  = (*Backend)(nil)
)
