// Package kernels holds the compute ops of the forward pass. Backend is the
// contract: the model code in pipeline/model is written once against it, and
// the CPU implementation (kernels/cpu) and the GPU implementation (one kernel
// source for CUDA and HIP) both satisfy it. One conformance suite
// (kernels/conformance) checks every op of every backend against a float64
// reference.
//
// The contract is shaped by the GPU: ops only enqueue work and never hand data
// back to the host, except Read, which waits for everything queued before it.
// A CPU backend simply runs each op when it is called.
package kernels

import (
	"github.com/forge-llm/forge/gguf"
)

// Tensor is a flat buffer of float32 activations owned by a backend. Shapes
// are not stored: every op says in its comment what it reads and writes, as
// [rows][cols] in row-major order. A Tensor is a small value; View makes a
// sub-range of one without copying.
type Tensor struct {
	Len  int       // number of float32 elements
	Host []float32 // storage on the CPU backend (len(Host) == Len); nil on a GPU
	Dev  uintptr   // device address of element 0 on a GPU backend; 0 on the CPU
}

// View returns elements [off, off+n) of t.
func (t Tensor) View(off, n int) Tensor {
	if off < 0 || n < 0 || off+n > t.Len {
		panic("kernels: view out of range")
	}
	v := Tensor{Len: n}
	if t.Host != nil {
		v.Host = t.Host[off : off+n]
	}
	if t.Dev != 0 {
		v.Dev = t.Dev + uintptr(off)*4
	}
	return v
}

// Weight is one model tensor in its GGUF block form. Rows × Cols is its shape
// as a matrix (Cols = ggml's ne0, the row length; Rows = ne1·ne2·ne3); a
// vector (norm weights, biases) has Rows = 1.
type Weight struct {
	Name string
	Type gguf.Type
	Cols int
	Rows int
	// Host holds the GGUF bytes on the host (a view into the mapped file or a
	// converted copy). The CPU backend reads it; a GPU backend may keep it nil
	// once the bytes are on the device.
	Host []byte
	// Dev is the device address of the blocks on a GPU backend, 0 otherwise.
	Dev uintptr
}

// Rope describes rotary position embedding for one model.
type Rope struct {
	Dim   int     // rotated dimensions per head (≤ head dim); the rest pass through
	Base  float32 // frequency base θ (10000 for Llama 2, 500000 for Llama 3)
	Scale float32 // position scale: positions are multiplied by it (1/factor for linear scaling; 1 = none)
	NeoX  bool    // NeoX style rotates pairs (i, i+Dim/2) instead of (2i, 2i+1)
	// Freqs optionally divides each pair's frequency (Llama 3.1's rope_freqs
	// tensor, Dim/2 F32 values); nil for none.
	Freqs *Weight
}

// Attn describes grouped-query attention for one model.
type Attn struct {
	Heads   int     // query heads
	KVHeads int     // key/value heads; Heads is a multiple of it
	HeadDim int     // dimensions per head
	Scale   float32 // score scale, normally 1/sqrt(HeadDim)
}

// KVCache holds the keys and values of every layer for up to Ctx positions,
// each position a row of KVDim = KVHeads·HeadDim values. Its storage belongs
// to the backend that made it.
type KVCache struct {
	Layers, Ctx, KVDim int
	Impl               any
}

// Backend is the set of ops the model code runs on. All ops are enqueued in
// call order; an error from an op means the op could not be queued (bad
// shapes, unsupported type) or a previous op failed.
type Backend interface {
	// Name identifies the backend in logs and reports ("cpu", "cuda:0").
	Name() string

	// Alloc returns a zeroed buffer of n float32; Free releases it.
	Alloc(n int) (Tensor, error)
	Free(t Tensor)
	// NewKVCache allocates the cache for a model; FreeKVCache releases it.
	NewKVCache(layers, ctx, kvDim int) (*KVCache, error)
	FreeKVCache(c *KVCache)

	// Write copies src into dst[off:]; Read waits for all queued work and
	// copies src[off : off+len(dst)] into dst.
	Write(dst Tensor, off int, src []float32) error
	Read(dst []float32, src Tensor, off int) error

	// Embed looks up rows of an embedding table stored in any block type.
	//   dst [len(ids)][table.Cols] = table[ids[i]]
	Embed(dst Tensor, table *Weight, ids []int32) error

	// MatMul multiplies n activation rows by a weight matrix held in its
	// block form (n = 1 is the decode matrix–vector product).
	//   x [n][w.Cols], dst [n][w.Rows]: dst[i][r] = Σ_c w[r][c]·x[i][c]
	MatMul(dst Tensor, w *Weight, x Tensor, n int) error

	// RMSNorm normalises each of n rows and scales by w (F32, w.Cols values).
	//   x, dst [n][w.Cols]: dst[i] = x[i] / sqrt(mean(x[i]²) + eps) ⊙ w
	RMSNorm(dst, x Tensor, w *Weight, n int, eps float32) error

	// AddBias adds a bias vector (F32, b.Cols values) to each of n rows in place.
	//   x [n][b.Cols]
	AddBias(x Tensor, b *Weight, n int) error

	// RoPE rotates n tokens of heads×headDim values in place; token i is at
	// position pos0+i.
	//   x [n][heads][headDim]
	RoPE(x Tensor, n, heads, headDim, pos0 int, r Rope) error

	// Attention stores the n new keys and values of one layer in the cache at
	// positions pos0…pos0+n-1, then computes causal grouped-query attention:
	// token i attends to positions 0…pos0+i.
	//   q, out [n][a.Heads][a.HeadDim]; k, v [n][a.KVHeads][a.HeadDim]
	Attention(out, q, k, v Tensor, c *KVCache, layer, pos0, n int, a Attn) error

	// SiLUMul computes the SwiGLU gate: dst = silu(gate) ⊙ up over n values,
	// where silu(x) = x / (1 + e^-x).
	SiLUMul(dst, gate, up Tensor, n int) error

	// Add computes dst = a + b over n values (the residual connection).
	Add(dst, a, b Tensor, n int) error
}
