package gpu

// KVCacheBytes is what NewKVCache allocates for this shape on the device
// (f16 keys and values, f32 with Options.KVF32), so that the engine's
// budget counts the cache as it is, not as F32.
func (b *Backend) KVCacheBytes(layers, ctx, kvDim int) int64 {
	es := int64(2)
	if b.opts.KVF32 {
		es = 4
	}
	return int64(layers) * 2 * int64(ctx) * int64(kvDim) * es
}

// KVPoolBytes is what NewKVPool allocates for this shape (the batching
// engine's pool), likewise.
func (b *Backend) KVPoolBytes(layers, blocks, blockSize, kvDim int) int64 {
	return b.KVCacheBytes(layers, blocks*blockSize, kvDim)
}
