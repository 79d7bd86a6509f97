package gpu

import "github.com/forge-llm/forge/kernels"

// KV is how a backend made with opts stores keys and values: f16, or
// float32 with Options.KVF32. It needs no device, so a model's memory can
// be planned before the GPU opens (pipeline's Engine estimate); the
// backend's KVCacheBytes and KVPoolBytes answer by it.
func KV(opts Options) kernels.KVElem {
	if opts.KVF32 {
		return kernels.KVF32
	}
	return kernels.KVF16
}

var _ kernels.KVSizer = (*Backend)(nil)

// KVCacheBytes is what NewKVCache allocates for this shape on the device,
// so that the engine's budget counts the cache as it is, not as F32.
func (b *Backend) KVCacheBytes(layers, ctx, kvDim int) int64 {
	return KV(b.opts).KVCacheBytes(layers, ctx, kvDim)
}

// KVPoolBytes is what NewKVPool allocates for this shape (the batching
// engine's pool), likewise.
func (b *Backend) KVPoolBytes(layers, blocks, blockSize, kvDim int) int64 {
	return KV(b.opts).KVPoolBytes(layers, blocks, blockSize, kvDim)
}
