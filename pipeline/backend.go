package pipeline

import (
	"fmt"

	"github.com/forge-llm/forge/actors"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/cpu"
)

// openBackend opens the device asked for. The returned close is nil for a
// backend the caller owns.
func openBackend(o Options) (kernels.Backend, func(), error) {
	if o.Backend != nil {
		return o.Backend, nil, nil
	}
	switch o.Device {
	case "", "auto", "cpu":
		b := cpu.New(o.Threads)
		return b, b.Close, nil
	}
	return nil, nil, fmt.Errorf("pipeline: device %q is not available (have: auto, cpu)", o.Device)
}

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
func kvBytes(layers, ctx, kvDim int) int64 { return 2 * 4 * int64(layers) * int64(ctx) * int64(kvDim) }

func (a accounted) NewKVCache(layers, ctx, kvDim int) (*kernels.KVCache, error) {
	n := kvBytes(layers, ctx, kvDim)
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
	a.mem.Free(kvBytes(c.Layers, c.Ctx, c.KVDim))
}
