package cpu

import (
	"fmt"
	"math"

	"github.com/forge-llm/forge/kernels"
)

// The ops that architectures beyond Llama and Qwen2 need (Gemma's GeGLU,
// its embedding scale, Gemma 2's logit soft-cap). They are cheap next to
// the products around them and run on the calling goroutine.

// geluTanh is GELU in its tanh approximation, as ggml computes it:
// 0.5·x·(1 + tanh z), z = √(2/π)·(x + 0.044715·x³), in the equal form
// x / (1 + e^(−2z)), which does not cancel in the negative tail (below
// x ≈ −8, 1 + tanh z is 0 even in float64).
func geluTanh(x float32) float32 {
	const k = 0.7978845608028654 // √(2/π)
	v := float64(x)
	return float32(v / (1 + math.Exp(-2*k*v*(1+0.044715*v*v))))
}

// GELUMul computes dst = gelu(gate) ⊙ up over n values.
func (b *Backend) GELUMul(dst, gate, up kernels.Tensor, n int) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range []struct {
		what string
		t    kernels.Tensor
	}{{"gelu mul: dst", dst}, {"gelu mul: gate", gate}, {"gelu mul: up", up}} {
		if err := checkTensor(c.what, c.t, n); err != nil {
			return err
		}
	}
	d, g, u := dst.Host[:n], gate.Host[:n], up.Host[:n]
	for i := range d {
		d[i] = geluTanh(g[i]) * u[i]
	}
	return nil
}

// Scale computes dst = x·s over n values.
func (b *Backend) Scale(dst, x kernels.Tensor, s float32, n int) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := checkTensor("scale: dst", dst, n); err != nil {
		return err
	}
	if err := checkTensor("scale: x", x, n); err != nil {
		return err
	}
	d, v := dst.Host[:n], x.Host[:n]
	for i := range d {
		d[i] = v[i] * s
	}
	return nil
}

// Softcap computes x = c·tanh(x/c) over n values in place.
func (b *Backend) Softcap(x kernels.Tensor, c float32, n int) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !(c > 0) || math.IsInf(float64(c), 1) {
		return fmt.Errorf("cpu: softcap: cap %v must be a finite number > 0", c)
	}
	if err := checkTensor("softcap: x", x, n); err != nil {
		return err
	}
	for i, v := range x.Host[:n] {
		x.Host[i] = c * float32(math.Tanh(float64(v/c)))
	}
	return nil
}
