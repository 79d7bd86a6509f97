package gpu

import (
	"testing"

	"github.com/forge-llm/forge/kernels"
)

// TestKVSizesWithoutDevice: the package's KV says what a backend made
// with those options stores (f16; float32 with KVF32) and sizes the
// backend's caches and pools as its methods do, without a device (the
// Engine asks it before the GPU opens). NewKVCache and NewKVPool pick the
// same element size from Options.KVF32 (memory.go, batch.go).
func TestKVSizesWithoutDevice(t *testing.T) {
	for _, c := range []struct {
		opts Options
		want kernels.KVElem
	}{{Options{}, kernels.KVF16}, {Options{KVF32: true}, kernels.KVF32}, {Options{MMQ: "off"}, kernels.KVF16}} {
		b := &Backend{opts: c.opts}
		if got := KV(c.opts); got != c.want {
			t.Errorf("%+v: KV %d, want %d", c.opts, got, c.want)
		}
		if got, want := b.KVCacheBytes(2, 64, 32), 2*int64(c.want)*2*64*32; got != want {
			t.Errorf("%+v: KVCacheBytes %d, want %d", c.opts, got, want)
		}
		if got, want := b.KVPoolBytes(2, 4, 16, 32), 2*int64(c.want)*2*64*32; got != want {
			t.Errorf("%+v: KVPoolBytes %d, want %d", c.opts, got, want)
		}
	}
}
