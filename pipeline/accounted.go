package pipeline

import (
	"github.com/forge-llm/forge/actors"
	"github.com/forge-llm/forge/kernels"
)

// accounted charges a backend's activation buffers and KV cache to a
// Memory, so one accountant sees everything a model holds on its device
// and a limit fails these allocations like the device would.
type accounted struct {
	kernels.Backend
	mem *actors.Memory
}

func (a accounted) Alloc(n int) (kernels.Tensor, error) {
	if err := a.mem.Alloc(int64(n)*4, "activation buffer"); err != nil {
		return kernels.Tensor{}, err
	}
	t, err := a.Backend.Alloc(n)
	if err != nil {
		a.mem.Free(int64(n) * 4)
	}
	return t, err
}

func (a accounted) Free(t kernels.Tensor) {
	a.Backend.Free(t)
	a.mem.Free(int64(t.Len) * 4)
}

// kvBytes is what a KV cache of float32 keys and values takes.
func kvBytes(layers, ctx, kvDim int) int64 { return kernels.KVF32.KVCacheBytes(layers, ctx, kvDim) }

// cacheBytes is what be's KV cache of this shape is charged: what the
// backend reports (kernels.KVSizer; a GPU stores f16), F32 for one that
// reports nothing.
func cacheBytes(be kernels.Backend, layers, ctx, kvDim int) int64 {
	return planOf(be).kv.KVCacheBytes(layers, ctx, kvDim)
}

func (a accounted) NewKVCache(layers, ctx, kvDim int) (*kernels.KVCache, error) {
	n := cacheBytes(a.Backend, layers, ctx, kvDim)
	if err := a.mem.Alloc(n, "KV cache"); err != nil {
		return nil, err
	}
	c, err := a.Backend.NewKVCache(layers, ctx, kvDim)
	if err != nil {
		a.mem.Free(n)
	}
	return c, err
}

func (a accounted) FreeKVCache(c *kernels.KVCache) {
	a.Backend.FreeKVCache(c)
	a.mem.Free(cacheBytes(a.Backend, c.Layers, c.Ctx, c.KVDim))
}

// Unwrap lets the model find the backend's optional capabilities (a
// recorded decode step, an argmax on the device) behind the accounting.
func (a accounted) Unwrap() kernels.Backend { return a.Backend }
