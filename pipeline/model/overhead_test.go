package model

import (
	"context"
	"testing"

	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/kernels"
)

// nopBackend accepts every op and does nothing: it measures what the model
// code itself costs per step (op calls, views, the layer loop).
type nopBackend struct{ hostBackend }

func (nopBackend) Embed(kernels.Tensor, *kernels.Weight, []int32) error              { return nil }
func (nopBackend) MatMul(kernels.Tensor, *kernels.Weight, kernels.Tensor, int) error { return nil }
func (nopBackend) RMSNorm(kernels.Tensor, kernels.Tensor, *kernels.Weight, int, float32) error {
	return nil
}
func (nopBackend) AddBias(kernels.Tensor, *kernels.Weight, int) error                { return nil }
func (nopBackend) RoPE(kernels.Tensor, int, int, int, int, kernels.Rope) error       { return nil }
func (nopBackend) GELUMul(kernels.Tensor, kernels.Tensor, kernels.Tensor, int) error { return nil }
func (nopBackend) Scale(kernels.Tensor, kernels.Tensor, float32, int) error          { return nil }
func (nopBackend) Softcap(kernels.Tensor, float32, int) error                        { return nil }
func (nopBackend) SiLUMul(kernels.Tensor, kernels.Tensor, kernels.Tensor, int) error { return nil }
func (nopBackend) Add(kernels.Tensor, kernels.Tensor, kernels.Tensor, int) error     { return nil }
func (nopBackend) Read([]float32, kernels.Tensor, int) error                         { return nil }
func (nopBackend) Attention(_, _, _, _ kernels.Tensor, _ *kernels.KVCache, _, _, _ int, _ kernels.Attn) error {
	return nil
}

// BenchmarkModelOverhead is the model code's own cost of one decode step
// of stories260K (5 layers, 16 ops each), with every op a no-op.
func BenchmarkModelOverhead(b *testing.B) {
	m, _ := openModel(b, testmodels.Path(b, "stories260K-F32.gguf"), nopBackend{}, Options{Ctx: 128})
	ctx := context.Background()
	var tok [1]int32
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if _, err := m.Forward(ctx, tok[:], i%128); err != nil {
			b.Fatal(err)
		}
	}
}
