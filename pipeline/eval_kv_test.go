package pipeline

import (
	"testing"

	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/cpu"
)

// kvF32Backend is a CPU backend that also makes caches "in float32 on
// request", counting the requests, as the GPU's NewKVCacheF32 does.
type kvF32Backend struct {
	*cpu.Backend
	asked *int
}

func (b kvF32Backend) NewKVCacheF32(layers, ctx, kvDim int) (*kernels.KVCache, error) {
	*b.asked++
	return b.Backend.NewKVCache(layers, ctx, kvDim)
}

func (b kvF32Backend) Unwrap() kernels.Backend { return b.Backend }

// TestEvalBackendKVF32: an evaluation with EvalOptions.KVF32 makes its KV
// caches through NewKVCacheF32 where the backend has it, charged as
// float32 through the accounting's sizer, and finds the backend's other
// capabilities behind it; without the option, or on a backend without the
// method, the backend is used as it is.
func TestEvalBackendKVF32(t *testing.T) {
	cb := cpu.New(1)
	defer cb.Close()
	asked := 0
	be := kvF32Backend{Backend: cb, asked: &asked}
	if got := evalBackend(be, EvalOptions{Ctx: 8}); got != kernels.Backend(be) {
		t.Fatalf("without KVF32 the backend is wrapped: %T", got)
	}
	if got := evalBackend(cb, EvalOptions{Ctx: 8, KVF32: true}); got != kernels.Backend(cb) {
		t.Fatalf("a backend without NewKVCacheF32 is wrapped: %T", got)
	}
	eb := evalBackend(be, EvalOptions{Ctx: 8, KVF32: true})
	kc, err := eb.NewKVCache(2, 16, 32)
	if err != nil {
		t.Fatal(err)
	}
	eb.FreeKVCache(kc)
	if asked != 1 {
		t.Fatalf("NewKVCacheF32 asked %d times for one cache, want 1", asked)
	}
	if got, want := cacheBytes(eb, 2, 16, 32), kvBytes(2, 16, 32); got != want {
		t.Errorf("a float32 cache is charged %d bytes, want %d", got, want)
	}
	if _, ok := kernels.As[*cpu.Backend](eb); !ok {
		t.Error("the wrapped backend is not found behind the float32 caches")
	}
}
