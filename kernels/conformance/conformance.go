// Package conformance checks a kernels.Backend op by op against a float64
// reference on fresh random inputs. Every backend runs the same suite: the
// CPU backend in CI (kernels/conformance's own test), a GPU backend on the
// test machine (its test calls Run with its constructor).
//
// Errors are measured as relative norms, never exact equality:
//
//	err = ‖y − ref‖₂ / ‖ref‖₂
//
// and each op has a bound. MatMul's bound depends on the weight type,
// because a backend may round or quantize the activations the way llama.cpp
// does (to f16/bf16 for F16/BF16 weights, to 8-bit blocks for quantized
// ones); the reference multiplies the exact decoded weights by the exact
// activations.
//
// A backend that is a kernels.Batcher (continuous batching) is also held
// to exact equalities (batch.go): RoPEAt gives the bits RoPE gives at the
// same position, PagedAttention over a shuffled block table the bits
// Attention gives over a contiguous cache, and MatMul every row's bits of
// the row computed alone, for up to kernels.MaxBatchRows rows.
package conformance

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
)

// WeightLoader is implemented by backends that read weights from their own
// memory (GPU backends): LoadWeight makes w usable by the backend's ops
// (setting w.Dev), FreeWeight releases it. The suite builds weights on the
// host and calls LoadWeight when the backend has it; the CPU backend reads
// w.Host directly and does not implement it.
type WeightLoader interface {
	LoadWeight(w *kernels.Weight) error
	FreeWeight(w *kernels.Weight)
}

// MatMulBound is the largest relative error MatMul may show for a weight
// type. F32 allows float32 summation; F16/BF16 allow activations rounded to
// the weight's precision; the quantized types allow 8-bit activation blocks
// (Q8_0/Q8_1 per 32 values, Q8_K per 256), whose rounding error is about
// 0.3–0.7 % of a dot product of random data.
func MatMulBound(t gguf.Type) float64 {
	switch t {
	case gguf.TypeF32:
		return 1e-5
	case gguf.TypeF16:
		return 1e-3
	case gguf.TypeBF16:
		return 8e-3
	default:
		return 2e-2
	}
}

// Options tune a run.
type Options struct {
	// Seed for the random inputs; 0 picks a fresh one (logged, so a
	// failure can be replayed).
	Seed uint64
	// PagedMatchesAttention also requires PagedAttention to give exactly
	// Attention's bits for the same sequence (the CPU backend promises it;
	// the contract does not).
	PagedMatchesAttention bool
}

// Run runs every check as subtests of t. newBackend is called once per
// subtest; the backend it returns is used only by that subtest.
func Run(t *testing.T, newBackend func(t *testing.T) kernels.Backend) {
	RunWith(t, newBackend, Options{})
}

// RunWith is Run with options.
func RunWith(t *testing.T, newBackend func(t *testing.T) kernels.Backend, o Options) {
	seed := o.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("conformance seed %d", seed)
	s := &suite{newBackend: newBackend, seed: seed, o: o}
	t.Run("Buffers", s.buffers)
	t.Run("Add", s.add)
	t.Run("SiLUMul", s.siluMul)
	t.Run("GELUMul", s.geluMul)
	t.Run("Scale", s.scale)
	t.Run("Softcap", s.softcap)
	t.Run("AddBias", s.addBias)
	t.Run("RMSNorm", s.rmsNorm)
	t.Run("AddRMSNorm", s.addRMSNorm)
	t.Run("RoPE", s.rope)
	t.Run("Attention", s.attention)
	t.Run("AttentionSinks", s.attentionSinks)
	t.Run("SwiGLUOAI", s.swigluOAI)
	t.Run("Embed", s.embed)
	t.Run("MatMul", s.matMul)
	t.Run("MatMulPrompt", s.matMulPrompt)
	t.Run("Errors", s.errors)
	t.Run("RoPEAt", s.ropeAt)
	t.Run("PagedAttention", s.pagedAttention)
	t.Run("PagedAttentionAlone", s.pagedAttentionAlone)
	if o.PagedMatchesAttention {
		t.Run("PagedAttentionExact", s.pagedAttentionExact)
	}
	t.Run("PagedErrors", s.pagedErrors)
	t.Run("MatMulRows", s.matMulRows)
}

type suite struct {
	newBackend func(t *testing.T) kernels.Backend
	o          Options
	seed       uint64
	n          uint64
}

// rng returns a generator seeded from the run's seed and the subtest name,
// so every subtest gets its own stream whatever runs before it.
func (s *suite) rng(t *testing.T) *rand.Rand {
	var h uint64 = 14695981039346656037
	for _, c := range []byte(t.Name()) {
		h = (h ^ uint64(c)) * 1099511628211
	}
	return rand.New(rand.NewPCG(s.seed, h))
}

// upload allocates a backend tensor holding v.
func upload(t *testing.T, b kernels.Backend, v []float32) kernels.Tensor {
	t.Helper()
	x, err := b.Alloc(len(v))
	if err != nil {
		t.Fatalf("alloc %d: %v", len(v), err)
	}
	t.Cleanup(func() { b.Free(x) })
	if err := b.Write(x, 0, v); err != nil {
		t.Fatalf("write %d: %v", len(v), err)
	}
	return x
}

// download reads a whole tensor back.
func download(t *testing.T, b kernels.Backend, x kernels.Tensor) []float32 {
	t.Helper()
	out := make([]float32, x.Len)
	if err := b.Read(out, x, 0); err != nil {
		t.Fatalf("read %d: %v", x.Len, err)
	}
	return out
}

// alloc allocates a zeroed backend tensor of n values, freed at cleanup.
func alloc(t *testing.T, b kernels.Backend, n int) kernels.Tensor {
	t.Helper()
	x, err := b.Alloc(n)
	if err != nil {
		t.Fatalf("alloc %d: %v", n, err)
	}
	t.Cleanup(func() { b.Free(x) })
	return x
}

// load makes w usable by b.
func load(t *testing.T, b kernels.Backend, w *kernels.Weight) {
	t.Helper()
	if l, ok := b.(WeightLoader); ok {
		if err := l.LoadWeight(w); err != nil {
			t.Fatalf("load weight %s: %v", w.Name, err)
		}
		t.Cleanup(func() { l.FreeWeight(w) })
	}
}

// relErr returns ‖got − want‖₂ / ‖want‖₂ and the index of the element with
// the largest absolute difference. A non-finite value counts as infinite
// error.
func relErr(got []float32, want []float64) (float64, int) {
	var num, den, worst float64
	wi := 0
	for i, w := range want {
		g := float64(got[i])
		if math.IsNaN(g) || math.IsInf(g, 0) {
			return math.Inf(1), i
		}
		d := g - w
		num += d * d
		den += w * w
		if math.Abs(d) > worst {
			worst, wi = math.Abs(d), i
		}
	}
	if den == 0 {
		if num == 0 {
			return 0, wi
		}
		return math.Inf(1), wi
	}
	return math.Sqrt(num / den), wi
}

// check fails t when got differs from want by more than bound.
func check(t *testing.T, what string, got []float32, want []float64, bound float64) float64 {
	t.Helper()
	if len(got) < len(want) {
		t.Fatalf("%s: got %d values, want %d", what, len(got), len(want))
	}
	e, i := relErr(got[:len(want)], want)
	if !(e <= bound) {
		t.Errorf("%s: relative error %.3g > %.3g (worst element %d: got %g want %g)", what, e, bound, i, got[i], want[i])
	}
	return e
}

func f64(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

func name(format string, args ...any) string { return fmt.Sprintf(format, args...) }
