package kernels

// KVSizer is a backend that reports what its keys and values take on its
// device: the bytes NewKVCache and NewKVPool (Batcher) allocate for a
// shape. Memory budgets count a cache by it — pipeline's accounting while
// a model holds one, the Engine's estimate before the model opens — so
// that nothing outside a backend guesses how it stores a cache (a GPU's
// f16 is half the CPU's float32, and a guess from a device's name was
// wrong for "auto"). A backend without it is counted as KVF32.
type KVSizer interface {
	KVCacheBytes(layers, ctx, kvDim int) int64
	KVPoolBytes(layers, blocks, blockSize, kvDim int) int64
}

// KVElem is the KVSizer of a store of keys and values laid out the way
// both backends lay them out (per layer, a key row and a value row of
// kvDim elements per position) in elements of that many bytes. A backend
// package names its own (cpu.KV, gpu.KV), so that its sizes are known
// before a backend is made: the Engine plans a model's memory before it
// opens the device.
type KVElem int

// The element sizes the backends store.
const (
	KVF16 KVElem = 2 // the GPU's default
	KVF32 KVElem = 4 // the CPU's, and the GPU's with gpu.Options.KVF32
)

// KVCacheBytes is what a cache of layers × ctx positions of kvDim-wide
// keys and values takes.
func (e KVElem) KVCacheBytes(layers, ctx, kvDim int) int64 {
	return 2 * int64(e) * int64(layers) * int64(ctx) * int64(kvDim)
}

// KVPoolBytes is what a pool of blocks × blockSize positions takes: a
// cache of that many positions.
func (e KVElem) KVPoolBytes(layers, blocks, blockSize, kvDim int) int64 {
	return e.KVCacheBytes(layers, blocks*blockSize, kvDim)
}
