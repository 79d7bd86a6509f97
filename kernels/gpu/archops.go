package gpu

import (
	"fmt"
	"math"

	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/rocm"
)

// The ops that architectures beyond Llama and Qwen2 need; their kernels are
// in cu/archops.cu.

// GELUMul computes dst = gelu(gate) ⊙ up over n values (GELU's tanh form).
func (b *Backend) GELUMul(dst, gate, up kernels.Tensor, n int) error {
	return b.elementwise("gelu·mul", "gelu_mul", dst, []kernels.Tensor{gate, up}, n)
}

// Scale computes dst = x·s over n values.
func (b *Backend) Scale(dst, x kernels.Tensor, s float32, n int) error {
	if err := checkTensor("scale: dst", dst, n); err != nil {
		return err
	}
	if err := checkTensor("scale: x", x, n); err != nil {
		return err
	}
	if n <= 0 {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.do(func(c *rocm.Ctx) error {
		var a rocm.Args
		a.Ptr(dptr(dst)).Ptr(dptr(x)).F32(s).I32(int32(n))
		return b.launch(c, "scale_f32", grid1(n), rocm.D1(256), &a)
	})
}

// Softcap computes x = c·tanh(x/c) over n values in place.
func (b *Backend) Softcap(x kernels.Tensor, cp float32, n int) error {
	if !(cp > 0) || math.IsInf(float64(cp), 1) {
		return fmt.Errorf("gpu: softcap: cap %v must be a finite number > 0", cp)
	}
	if err := checkTensor("softcap: x", x, n); err != nil {
		return err
	}
	if n <= 0 {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.do(func(c *rocm.Ctx) error {
		var a rocm.Args
		a.Ptr(dptr(x)).F32(cp).I32(int32(n))
		return b.launch(c, "softcap_f32", grid1(n), rocm.D1(256), &a)
	})
}

// attnExt queues attention with a sliding window and/or a score soft-cap,
// and any attention sinks, after Attention stored the new keys and values:
// one block per (head, token), reading the position from the step
// register in a recorded decode step. sp is the sinks' address (sinkPtr,
// 0 for none). Called with b.mu held, inside b.do.
func (b *Backend) attnExt(c *rocm.Ctx, sfx string, out, q kernels.Tensor, kp, vp, sp rocm.DevPtr, pos0, n int, at kernels.Attn) error {
	var a rocm.Args
	a.Ptr(dptr(out)).Ptr(dptr(q)).Ptr(kp).Ptr(vp).I32(int32(at.Heads)).I32(int32(at.KVHeads)).I32(int32(at.HeadDim)).
		I32(int32(pos0)).F32(at.Scale).I32(int32(at.Window)).F32(at.Softcap).Ptr(b.stepPos()).Ptr(sp)
	l := planAttnExt(sfx, at.Heads, n)
	return b.launch(c, l.Kernel, l.Grid, l.Block, &a)
}
