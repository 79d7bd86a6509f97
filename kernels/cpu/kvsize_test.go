package cpu

import (
	"testing"

	"github.com/forge-llm/forge/kernels"
)

// TestKVSizesAreTheAllocations: what the CPU backend reports a cache and a
// pool take (KVCacheBytes, KVPoolBytes, the package's KV) is what
// NewKVCache and NewKVPool allocate, so the engine's budget counts them as
// they are.
func TestKVSizesAreTheAllocations(t *testing.T) {
	b := New(1)
	defer b.Close()
	const layers, ctx, kvDim, blocks, blockSize = 3, 40, 24, 5, 16
	c, err := b.NewKVCache(layers, ctx, kvDim)
	if err != nil {
		t.Fatal(err)
	}
	defer b.FreeKVCache(c)
	s := c.Impl.(*kvStore)
	if got, want := b.KVCacheBytes(layers, ctx, kvDim), floatBytes(s.k, s.v); got != want {
		t.Errorf("KVCacheBytes %d, allocated %d", got, want)
	}
	p, err := b.NewKVPool(layers, blocks, blockSize, kvDim)
	if err != nil {
		t.Fatal(err)
	}
	defer b.FreeKVPool(p)
	ps := p.Impl.(*poolStore)
	if got, want := b.KVPoolBytes(layers, blocks, blockSize, kvDim), floatBytes(ps.k, ps.v); got != want {
		t.Errorf("KVPoolBytes %d, allocated %d", got, want)
	}
	if KV != kernels.KVF32 || KV.KVCacheBytes(layers, ctx, kvDim) != b.KVCacheBytes(layers, ctx, kvDim) {
		t.Errorf("package KV %d does not size the backend's caches", KV)
	}
}

func floatBytes(k, v [][]float32) int64 {
	var n int64
	for l := range k {
		n += 4 * int64(len(k[l])+len(v[l]))
	}
	return n
}
