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
	"errors"

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
	// Window, when > 0, is sliding-window attention: the token at position
	// p sees only positions p-Window+1 … p (Mistral, Gemma's local layers).
	Window int
	// Softcap, when > 0, caps each scaled score s to Softcap·tanh(s/Softcap)
	// before the softmax (Gemma 2).
	Softcap float32
	// Sinks, when set, holds one logit per query head (F32, Heads values)
	// that joins that head's softmax as one more score with no value
	// (gpt-oss's attention sinks): only backends that are SinkAttenders
	// honour it.
	Sinks *Weight
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

	// GELUMul computes the GeGLU gate of Gemma's feed-forward: dst =
	// gelu(gate) ⊙ up over n values, GELU in its tanh approximation
	// 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
	GELUMul(dst, gate, up Tensor, n int) error

	// Scale computes dst = x·s over n values (Gemma's embedding, scaled by
	// √Embd).
	Scale(dst, x Tensor, s float32, n int) error

	// Softcap caps n values in place: x = c·tanh(x/c), c > 0 (Gemma 2's
	// final logits).
	Softcap(x Tensor, c float32, n int) error
}

// ErrStaleStep is returned (wrapped) by StepCapturer.RunStep when the
// graph can no longer be replayed because the backend moved memory it
// uses (a scratch buffer grew for another model): record the step again.
var ErrStaleStep = errors.New("kernels: recorded step is stale")

// StepGraph is one recorded decode step of a StepCapturer; only the backend
// that made it knows what it holds.
type StepGraph any

// StepCapturer is a Backend that can record the ops of one single-token
// forward step (a decode step) once and replay them for every later token:
// one launch per token instead of hundreds, with no host work between the
// ops. A backend that runs each op as it is called (the CPU) has no use for
// it and does not implement it.
//
// While the step function runs under CaptureStep, the ops that depend on the
// token or its position (Embed of one id, RoPE, Attention) take them from
// the backend's step registers, which RunStep sets before each replay, not
// from their arguments; so the recorded step serves every position. The
// buffers, weights and KV cache the ops name must stay the same for the
// life of the graph.
type StepCapturer interface {
	// CaptureStep sets the registers to token and pos and runs step once
	// (its ops queued and run as usual, so the step's outputs are those of
	// token at pos), then records step's ops a second time into a graph
	// without running them. step must queue the same ops each time and
	// must not read back (Read) or write (Write) host data.
	CaptureStep(token int32, pos int, step func() error) (StepGraph, error)
	// RunStep sets the registers to token and pos and queues the recorded
	// step.
	RunStep(g StepGraph, token int32, pos int) error
	// FreeStep releases a graph (after the work queued on it is done).
	FreeStep(g StepGraph)
}

// Argmaxer is a Backend that reduces rows on the device: the greedy next
// token without copying a row of logits back.
type Argmaxer interface {
	// Argmax waits for queued work and returns the index of the largest
	// value of each of rows rows of cols values (ties: the lowest index).
	Argmax(x Tensor, rows, cols int) ([]int32, error)
}

// Unwrapper is a Backend that wraps another one (to account its memory,
// say) and forwards the ops to it: optional capabilities such as
// StepCapturer are looked for on the backend it wraps.
type Unwrapper interface {
	Unwrap() Backend
}

// As returns be, or the first backend be wraps (through Unwrapper), that
// implements T.
func As[T any](be Backend) (T, bool) {
	for range 16 { // a wrapping chain is short; this bounds a cycle
		if t, ok := be.(T); ok {
			return t, true
		}
		u, ok := be.(Unwrapper)
		if !ok {
			break
		}
		be = u.Unwrap()
		if be == nil {
			break
		}
	}
	var zero T
	return zero, false
}

// ResidualNormer is a Backend that fuses a block's residual add with the
// RMSNorm that always follows it (the pre-norm of the next sub-block):
// one pass over the residual stream instead of two. The model falls back
// to Add then RMSNorm, which must give the same result.
type ResidualNormer interface {
	// AddRMSNorm computes x += r over n rows of w.Cols values, then
	// dst = x / sqrt(mean(x²) + eps) ⊙ w for each row, as Add then RMSNorm.
	AddRMSNorm(dst, x, r Tensor, w *Weight, n int, eps float32) error
}

// NormPairer is a Backend that normalises two sets of rows of one width
// with their own weights in one op (a GPU launch instead of two): Qwen3's
// and Gemma's per-head norms of the queries and the keys. Every row must
// get the bits RMSNorm gives it; the model falls back to two RMSNorms.
type NormPairer interface {
	// RMSNormPair is RMSNorm(dstA, xA, wA, nA, eps) and RMSNorm(dstB, xB,
	// wB, nB, eps), with wA and wB of the same width.
	RMSNormPair(dstA, xA Tensor, wA *Weight, nA int, dstB, xB Tensor, wB *Weight, nB int, eps float32) error
}

// QKVPreparer is a Backend that makes one token's attention inputs ready in
// one op (a GPU launch instead of three): the per-head norms of the queries
// and keys where a model has them (Qwen3, Gemma), RoPE, and the store of
// the key and value in the cache; AttentionStoredQ8 then attends without
// storing again. Every value must get the bits that RMSNormPair (or the
// two RMSNorms), RoPE over the queries and keys, and AttentionQ8's store
// give it: the model falls back to those ops.
type QKVPreparer interface {
	// PrepareQKV normalises each HeadDim-wide head of q (a.Heads) with qw
	// and of k (a.KVHeads) with kw, each where set, in place; rotates q
	// and k at position pos with r; and stores k and v in row pos of
	// layer's cache: one token.
	PrepareQKV(q, k, v Tensor, qw, kw *Weight, eps float32, c *KVCache, layer, pos int, r Rope, a Attn) error
	// AttentionStoredQ8 is Q8Ops.AttentionQ8 for the one token at pos
	// whose key and value PrepareQKV stored (oq may be empty).
	AttentionStoredQ8(out, q Tensor, c *KVCache, layer, pos int, a Attn, oq Q8) (Q8, error)
}

// QKVAttender is a QKVPreparer that also does the preparation inside the
// attention, for a token whose queries and keys have no head norms: one
// op (one GPU launch instead of two) with the bits of PrepareQKV (without
// norms) then AttentionStoredQ8, in out, oq and the cache. It reports
// false, having done nothing, where it has no such op (the model then
// takes those two).
type QKVAttender interface {
	AttendQKVQ8(out, q, k, v Tensor, c *KVCache, layer, pos int, r Rope, a Attn, oq Q8) (Q8, bool, error)
}

// SharedInputMatMuler is a Backend that multiplies one input by several
// weights at once (a block's Q, K and V; its gate and up projections): one
// pass that a GPU can launch as one kernel. The model falls back to one
// MatMul per weight, which must give the same result.
type SharedInputMatMuler interface {
	// MatMuls computes dsts[i] = x · ws[i]ᵀ for every i, as
	// MatMul(dsts[i], ws[i], x, n) does.
	MatMuls(dsts []Tensor, ws []*Weight, x Tensor, n int) error
}

// KVPool is a paged KV cache shared by every sequence of one model (the
// serving engine's continuous batching): Blocks blocks of BlockSize
// positions, each position holding one key row and one value row of KVDim
// values for every layer. A sequence's positions live in the blocks its
// block table lists, in order: position p is slot p%BlockSize of block
// table[p/BlockSize]. Which blocks belong to whom is the caller's business
// (pipeline/batch); the backend only stores and reads them. Its storage
// belongs to the backend that made it.
type KVPool struct {
	Layers, Blocks, BlockSize, KVDim int
	Impl                             any
}

// Layout describes the rows of one batched step: the sequence each row
// belongs to and its position there. The rows of one sequence are
// contiguous and in increasing position order; the positions of a sequence
// before its first row in the step must already be in the pool.
type Layout struct {
	Pos    []int32   // [n] position of row i in its sequence
	Seq    []int32   // [n] sequence of row i: an index into Tables
	Tables [][]int32 // per sequence: its block table (block ids in the pool)
}

// MaxBatchRows is the most rows a Batcher's MatMul promises to compute
// row-invariantly (see Batcher).
const MaxBatchRows = 64

// Batcher is a Backend that runs one forward step over the rows of several
// sequences, each with its own KV in a shared pool: continuous batching.
//
// Batch invariance: a row's results must not depend on the other rows of a
// step. Every op of a Batcher is row-wise except PagedAttention, which reads
// only the row's own sequence; and MatMul with 1 ≤ n ≤ MaxBatchRows must
// give each row exactly (bit for bit) what MatMul with n = 1 gives for that
// row alone. A fixed seed then gives the same text alone or under load.
// PagedAttention may choose its kernel by the layout's kind, a decode step
// (every sequence one row) or not, since the model never mixes the two in
// one op (model/batch.go groups them apart): a row must get the bits it
// gets alone in a layout of the same kind.
type Batcher interface {
	// NewKVPool allocates a pool of blocks×blockSize positions for layers
	// layers of kvDim-wide key and value rows; FreeKVPool releases it.
	NewKVPool(layers, blocks, blockSize, kvDim int) (*KVPool, error)
	FreeKVPool(p *KVPool)
	// SetLayout makes l the layout of the RoPEAt and PagedAttention ops
	// queued after it, until the next SetLayout. The caller may reuse l's
	// slices once SetLayout returns (a GPU backend copies them to the
	// device in queue order).
	SetLayout(l *Layout) error
	// RoPEAt rotates n rows like RoPE, row i at position Layout.Pos[i].
	//   x [n][heads][headDim]
	RoPEAt(x Tensor, n, heads, headDim int, r Rope) error
	// PagedAttention stores row i's key and value in the pool at position
	// Pos[i] of sequence Seq[i] (through that sequence's block table), then
	// computes causal grouped-query attention: row i attends to positions
	// 0…Pos[i] of its own sequence.
	//   q, out [n][a.Heads][a.HeadDim]; k, v [n][a.KVHeads][a.HeadDim]
	PagedAttention(out, q, k, v Tensor, p *KVPool, layer, n int, a Attn) error
}

// PromptMatMuler is a Backend with a second matrix product for the pieces
// of a prompt in a batched step. MatMul must keep every row of up to
// MaxBatchRows bit-identical to a one-row product, which on a GPU means
// the multi-row matrix–vector kernels; a prompt piece needs no such
// promise (it is cut from its own sequence's positions, the same alone or
// among others) and is faster through a GEMM. MatMulPrompt computes what
// MatMul computes, choosing its kernel by n alone. A backend without it
// (the CPU) multiplies prompt pieces with MatMul.
type PromptMatMuler interface {
	MatMulPrompt(dst Tensor, w *Weight, x Tensor, n int) error
}
