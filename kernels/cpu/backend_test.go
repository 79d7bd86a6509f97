package cpu

import (
	"math/rand/v2"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/conformance"
)

// TestCloseStopsWorkers: Close ends every worker goroutine, and a closed
// backend still runs ops (on the calling goroutine) instead of hanging.
func TestCloseStopsWorkers(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	b := New(4)
	rng := rand.New(rand.NewPCG(1, 2))
	w := conformance.RandomWeight(rng, "w", gguf.TypeQ8_0, 64, 256)
	x := kernels.Tensor{Len: 256, Host: conformance.RandomVector(rng, 256, 1)}
	before := kernels.Tensor{Len: 64, Host: make([]float32, 64)}
	if err := b.MatMul(before, w, x, 1); err != nil {
		t.Fatal(err)
	}
	b.Close()
	goleak.VerifyNone(t, opt)
	after := kernels.Tensor{Len: 64, Host: make([]float32, 64)}
	if err := b.MatMul(after, w, x, 1); err != nil {
		t.Fatal(err)
	}
	for i := range after.Host {
		if after.Host[i] != before.Host[i] {
			t.Fatalf("row %d: %g after Close, %g before", i, after.Host[i], before.Host[i])
		}
	}
}

// TestConcurrentUse: ops called from several goroutines at once are
// serialized and give the same results as sequential calls (run with
// -race to check the synchronisation).
func TestConcurrentUse(t *testing.T) {
	b := New(2)
	defer b.Close()
	rng := rand.New(rand.NewPCG(3, 4))
	w := conformance.RandomWeight(rng, "w", gguf.TypeQ4_K, 96, 512)
	xs := make([]kernels.Tensor, 4)
	want := make([][]float32, 4)
	for i := range xs {
		n := i + 1
		xs[i] = kernels.Tensor{Len: n * 512, Host: conformance.RandomVector(rng, n*512, 1)}
		d := kernels.Tensor{Len: n * 96, Host: make([]float32, n*96)}
		if err := b.MatMul(d, w, xs[i], n); err != nil {
			t.Fatal(err)
		}
		want[i] = d.Host
	}
	var wg sync.WaitGroup
	for i := range xs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := i + 1
			for range 20 {
				d := kernels.Tensor{Len: n * 96, Host: make([]float32, n*96)}
				if err := b.MatMul(d, w, xs[i], n); err != nil {
					t.Error(err)
					return
				}
				for k := range d.Host {
					if d.Host[k] != want[i][k] {
						t.Errorf("goroutine %d: output %d = %g, want %g", i, k, d.Host[k], want[i][k])
						return
					}
				}
			}
		}()
	}
	wg.Wait()
}
