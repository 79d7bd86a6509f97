package cpu

import "github.com/forge-llm/forge/kernels"

// KV is how the CPU backend stores keys and values: float32, in the cache
// (NewKVCache) and the pool (NewKVPool) alike. It is a constant of the
// package so that a model's memory can be planned before a backend is
// made (pipeline's Engine estimate).
const KV = kernels.KVF32

var _ kernels.KVSizer = (*Backend)(nil)

// KVCacheBytes is what NewKVCache allocates for this shape, for the
// engine's memory accounting.
func (b *Backend) KVCacheBytes(layers, ctx, kvDim int) int64 {
	return KV.KVCacheBytes(layers, ctx, kvDim)
}

// KVPoolBytes is what NewKVPool allocates for this shape, likewise.
func (b *Backend) KVPoolBytes(layers, blocks, blockSize, kvDim int) int64 {
	return KV.KVPoolBytes(layers, blocks, blockSize, kvDim)
}
