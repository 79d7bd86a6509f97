// Package cpu is the pure-Go CPU implementation of kernels.Backend, the
// default device when no GPU is present.
//
// Every op runs when it is called, split over rows on a small pool of worker
// goroutines (one per thread asked for; the calling goroutine is worker 0).
// Weights stay in their GGUF block form: MatMul quantizes the activation row
// once (to Q8_0, Q8_1 or Q8_K, as llama.cpp does) and takes integer dot
// products with the weight blocks, so nothing is dequantized per token. On
// amd64 with AVX-512 VNNI the hot loops run in assembly (dot_amd64.s): the
// dot products (one row; four weight rows for Q8_0 decode; four and eight
// tokens per weight row for batches and prompts), the activation
// quantizers, attention's runs of cache rows and the exponentials of SiLU
// and softmax. The plain-Go kernels (dot_go.go, quant.go, mathutil.go) are
// the reference twins and the fallback (-tags purego, other
// architectures); the tests hold each fast path to its twin, bit for bit
// where the arithmetic is the same.
//
// Numerics follow llama.cpp's CPU backend where that decides greedy output:
// the same activation quantization (x86 rounding), activations rounded to
// f16/bf16 for F16/BF16 weights, an F32 KV cache, RMSNorm summed in float64.
//
// It is a kernels.Batcher (paged.go): a paged F32 KV pool read through block
// tables, with the arithmetic of the contiguous cache, and a MatMul whose
// rows do not depend on the other rows of the call (the four-token kernels
// finish each token as the one-token kernels do).
package cpu

import (
	"fmt"
	"runtime"
	"sync"

	"github.com/forge-llm/forge/kernels"
)

// Backend runs the ops on the CPU. Its methods may be called from any
// goroutine; ops are serialized by a mutex, as on a single GPU stream.
type Backend struct {
	mu      sync.Mutex
	threads int
	pool    *pool
	closed  bool

	act     actBuf          // quantized activations of the current MatMul
	scratch []workerScratch // per-worker buffers, indexed by worker

	// Tasks of the parallel ops, kept here so that starting a loop passes a
	// pointer to an existing struct and allocates nothing.
	mm    matmulTask
	mms   [maxMulti]matmulTask // MatMuls' products
	multi multiTask
	qt    quantTask
	att   attnTask
	norm  normTask
	silu  siluTask
	patt  pagedTask

	layout    kernels.Layout // the layout of RoPEAt and PagedAttention (SetLayout's copy)
	hasLayout bool
}

// workerScratch holds the buffers one worker reuses across ops.
type workerScratch struct {
	row    []float32   // small per-op vectors (RoPE angles)
	scores []float32   // attention scores of one head, up to ctx
	out2   [2]float32  // results of a two-token dot product
	out4   [4]float32  // results of a four-token dot product
	out8   [8]float32  // results of an eight-token dot product
	out16  [16]float32 // results of a four-row, four-token tile
	gsc    [16]float32 // a tile kernel's scratch (its product scales)
}

// New returns a CPU backend that runs on threads worker goroutines
// (threads ≤ 0 means runtime.GOMAXPROCS(0)). Call Close when done to stop
// the workers.
func New(threads int) *Backend {
	if threads <= 0 {
		threads = runtime.GOMAXPROCS(0)
	}
	b := &Backend{threads: threads, pool: newPool(threads)}
	b.scratch = make([]workerScratch, threads)
	return b
}

// Close stops the worker goroutines. The backend must not be used after.
func (b *Backend) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed {
		b.pool.close()
		b.closed = true
	}
}

// Threads reports the number of workers.
func (b *Backend) Threads() int { return b.threads }

// Name implements kernels.Backend.
func (b *Backend) Name() string { return "cpu" }

// Alloc returns a zeroed host buffer of n float32.
func (b *Backend) Alloc(n int) (kernels.Tensor, error) {
	if n < 0 {
		return kernels.Tensor{}, fmt.Errorf("cpu: alloc: negative length %d", n)
	}
	return kernels.Tensor{Len: n, Host: make([]float32, n)}, nil
}

// Free releases t; the garbage collector owns host memory, so this only
// exists to satisfy the contract.
func (b *Backend) Free(t kernels.Tensor) {}

// Write copies src into dst[off:].
func (b *Backend) Write(dst kernels.Tensor, off int, src []float32) error {
	if err := checkTensor("write: dst", dst, off+len(src)); err != nil {
		return err
	}
	if off < 0 {
		return fmt.Errorf("cpu: write: negative offset %d", off)
	}
	copy(dst.Host[off:], src)
	return nil
}

// Read copies src[off : off+len(dst)] into dst. Ops run synchronously, so
// there is nothing to wait for.
func (b *Backend) Read(dst []float32, src kernels.Tensor, off int) error {
	if err := checkTensor("read: src", src, off+len(dst)); err != nil {
		return err
	}
	if off < 0 {
		return fmt.Errorf("cpu: read: negative offset %d", off)
	}
	copy(dst, src.Host[off:off+len(dst)])
	return nil
}

// kvStore is the CPU storage of a KVCache: per layer, keys and values as
// [ctx][kvDim] float32. The cache stays F32 so that attention matches
// llama.cpp's CPU runs (made with an F32 cache) to float32 rounding.
type kvStore struct {
	k, v [][]float32
}

// NewKVCache allocates an F32 cache for layers × ctx positions of kvDim
// values each, for keys and for values.
func (b *Backend) NewKVCache(layers, ctx, kvDim int) (*kernels.KVCache, error) {
	if layers <= 0 || ctx <= 0 || kvDim <= 0 {
		return nil, fmt.Errorf("cpu: kv cache: bad shape layers=%d ctx=%d kvDim=%d", layers, ctx, kvDim)
	}
	s := &kvStore{k: make([][]float32, layers), v: make([][]float32, layers)}
	for l := range layers {
		s.k[l] = make([]float32, ctx*kvDim)
		s.v[l] = make([]float32, ctx*kvDim)
	}
	return &kernels.KVCache{Layers: layers, Ctx: ctx, KVDim: kvDim, Impl: s}, nil
}

// FreeKVCache drops the cache's storage.
func (b *Backend) FreeKVCache(c *kernels.KVCache) {
	if c != nil {
		c.Impl = nil
	}
}

// checkTensor verifies that t is a host tensor holding at least n values.
func checkTensor(what string, t kernels.Tensor, n int) error {
	if t.Host == nil && t.Len > 0 {
		return fmt.Errorf("cpu: %s: tensor has no host storage (device tensor?)", what)
	}
	if len(t.Host) != t.Len {
		return fmt.Errorf("cpu: %s: tensor length %d but %d host values", what, t.Len, len(t.Host))
	}
	if n > t.Len {
		return fmt.Errorf("cpu: %s: needs %d values, tensor has %d", what, n, t.Len)
	}
	return nil
}

var _ kernels.Backend = (*Backend)(nil)
