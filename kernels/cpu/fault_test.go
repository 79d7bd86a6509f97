package cpu

import (
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/edsrzf/mmap-go"
	"go.uber.org/goleak"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/conformance"
)

// mappedCopy writes b to a file, maps it and returns the mapping with the
// file's path; the mapping is unmapped at the end of the test.
func mappedCopy(t *testing.T, b []byte) ([]byte, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "weights.bin")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := mmap.Map(f, mmap.RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Unmap() })
	return m, path
}

// TestMatMulOnTruncatedMapping: weights are views of the model file's
// mapping. Once the file is truncated, reading them raises SIGBUS; the op
// must return an error wrapping *gguf.FaultError (naming the weight)
// instead of killing the process, whichever worker hit the fault, and the
// backend must keep working and stop its workers on Close.
func TestMatMulOnTruncatedMapping(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	rng := rand.New(rand.NewPCG(5, 6))
	const rows, cols = 512, 1024 // 288 KiB of Q8_0: many pages, many chunks
	heap := conformance.RandomWeight(rng, "blk.0.ffn_up.weight", gguf.TypeQ8_0, rows, cols)
	m, path := mappedCopy(t, heap.Host)
	w := *heap
	w.Host = m
	x := kernels.Tensor{Len: 4 * cols, Host: conformance.RandomVector(rng, 4*cols, 1)}
	want := kernels.Tensor{Len: 4 * rows, Host: make([]float32, 4*rows)}

	b := New(4)
	for _, n := range []int{1, 4} { // the decode and the prompt kernels
		if err := b.MatMul(want, &w, x, n); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, 4} {
		dst := kernels.Tensor{Len: n * rows, Host: make([]float32, n*rows)}
		err := b.MatMul(dst, &w, x, n)
		var fe *gguf.FaultError
		if !errors.Is(err, gguf.ErrMappingFault) || !errors.As(err, &fe) || fe.Addr == 0 ||
			!strings.Contains(err.Error(), `"blk.0.ffn_up.weight"`) {
			t.Fatalf("MatMul n=%d on a truncated mapping: %v", n, err)
		}
	}
	// The vector ops that read a weight straight from the mapping.
	f32 := conformance.RandomWeight(rng, "blk.0.attn_norm.weight", gguf.TypeF32, 1, cols)
	fm, fpath := mappedCopy(t, f32.Host)
	nw := *f32
	nw.Host = fm
	if err := os.Truncate(fpath, 0); err != nil {
		t.Fatal(err)
	}
	v := kernels.Tensor{Len: cols, Host: conformance.RandomVector(rng, cols, 1)}
	if err := b.RMSNorm(v, v, &nw, 1, 1e-5); !errors.Is(err, gguf.ErrMappingFault) || !strings.Contains(err.Error(), "rmsnorm") {
		t.Errorf("RMSNorm on a truncated mapping: %v", err)
	}
	if err := b.AddBias(v, &nw, 1); !errors.Is(err, gguf.ErrMappingFault) {
		t.Errorf("AddBias on a truncated mapping: %v", err)
	}
	tw := w
	if err := b.Embed(kernels.Tensor{Len: cols, Host: make([]float32, cols)}, &tw, []int32{rows - 1}); !errors.Is(err, gguf.ErrMappingFault) {
		t.Errorf("Embed on a truncated mapping: %v", err)
	}
	if debug.SetPanicOnFault(false) {
		t.Error("an op left SetPanicOnFault on for its caller")
	}

	// Still usable: the same product from the heap copy matches.
	got := kernels.Tensor{Len: 4 * rows, Host: make([]float32, 4*rows)}
	if err := b.MatMul(got, heap, x, 4); err != nil {
		t.Fatal(err)
	}
	for i := range got.Host {
		if got.Host[i] != want.Host[i] {
			t.Fatalf("value %d after the faults: %g, want %g", i, got.Host[i], want.Host[i])
		}
	}
	b.Close()
	goleak.VerifyNone(t, opt)
}

// faultTask faults on the workers chosen by bad, after making sure that
// the caller and a helper both take part: every item waits until each side
// has started one (the items held meanwhile are at most one per worker, so
// items are left for the late side), so the fault is certain to happen.
type faultTask struct {
	bad    func(w int) bool
	mem    []byte // a mapping whose file is gone
	caller atomic.Bool
	helper atomic.Bool
	done   atomic.Int64
	sink   atomic.Uint32 // keeps the faulting read
}

func (t *faultTask) run(w, lo, hi int) {
	if w == 0 {
		t.caller.Store(true)
	} else {
		t.helper.Store(true)
	}
	for !t.caller.Load() || !t.helper.Load() {
		runtime.Gosched()
	}
	if t.bad(w) {
		t.sink.Add(uint32(*(*byte)(unsafe.Pointer(unsafe.SliceData(t.mem[len(t.mem)/2:])))))
	}
	t.done.Add(int64(hi - lo))
}

// TestPoolFaults: a fault on a helper comes back as parallel's error; a
// fault on the caller panics out of parallel only once every helper has
// left the loop. Either way the next loop runs every item.
func TestPoolFaults(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	m, path := mappedCopy(t, make([]byte, 1<<16))
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	p := newPool(3)
	const total = 1000

	ft := &faultTask{bad: func(w int) bool { return w != 0 }, mem: m}
	err := p.parallel(ft, total, 1)
	var fe *gguf.FaultError
	if !errors.As(err, &fe) || fe.Addr != uintptr(unsafe.Pointer(&m[len(m)/2])) {
		t.Fatalf("helper fault: parallel returned %v", err)
	}
	if ft.done.Load() >= total {
		t.Errorf("the loop ran all %d items after a fault; the rest should be dropped", total)
	}

	ft = &faultTask{bad: func(w int) bool { return w == 0 }, mem: m}
	perr := gguf.CatchFault(func() { err = p.parallel(ft, total, 1) })
	if !errors.As(perr, &fe) {
		t.Fatalf("caller fault: %v (parallel returned %v)", perr, err)
	}
	if n := p.pending.Load(); n != 0 || p.t != nil {
		t.Fatalf("parallel unwound with %d helpers still in the loop", n)
	}

	ok := &faultTask{bad: func(int) bool { return false }}
	if err := p.parallel(ok, total, 1); err != nil || ok.done.Load() != total {
		t.Fatalf("loop after the faults: %v, %d of %d items", err, ok.done.Load(), total)
	}
	p.close()
	goleak.VerifyNone(t, opt)
}
