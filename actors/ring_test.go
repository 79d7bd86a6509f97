package actors

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/rocm"
)

// fakeRings makes rings without a GPU for RingPool's bookkeeping.
type fakeRings struct {
	mu            sync.Mutex
	pinned, freed int
	fail          error
}

func (f *fakeRings) pool(mem *Memory, maxIdle int) *RingPool {
	return &RingPool{Mem: mem, MaxIdle: maxIdle,
		pin: func(n, size int, ready func(int, []byte, rocm.Event), quit <-chan struct{}) (*StagingRing, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.fail != nil {
				return nil, f.fail
			}
			f.pinned++
			r := &StagingRing{Buffers: n, BufBytes: size, bufs: make([][]byte, n), events: make([]rocm.Event, n)}
			for i := range n {
				r.bufs[i], r.events[i] = make([]byte, size), rocm.Event(f.pinned*100+i)
				if ready != nil {
					ready(i, r.bufs[i], r.events[i])
				}
			}
			return r, nil
		},
		unpin: func(*StagingRing) error {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.freed++
			return nil
		},
	}
}

// TestRingPool: a ring given back is lent again (every buffer handed to
// the borrower) instead of pinned anew; borrowers at the same time get a
// ring each; rings past MaxIdle, of another shape, or given back after
// Close are freed; the accountant counts every ring the pool holds, and
// nothing once it is closed.
func TestRingPool(t *testing.T) {
	f := &fakeRings{}
	mem := NewMemory(0)
	p := f.pool(mem, 1)
	var got []int
	ready := func(i int, _ []byte, _ rocm.Event) { got = append(got, i) }

	a, reused, err := p.get(4, 1024, ready, nil)
	if err != nil || reused || f.pinned != 1 || len(got) != 4 {
		t.Fatalf("first get: reused %v, err %v, pinned %d, buffers handed %v", reused, err, f.pinned, got)
	}
	if mem.InUse() != 4096 || p.Lent() != 1 {
		t.Errorf("one ring lent: accounted %d, lent %d", mem.InUse(), p.Lent())
	}
	p.put(a)
	got = nil
	b, reused, err := p.get(4, 1024, ready, nil)
	if err != nil || !reused || b != a || f.pinned != 1 || len(got) != 4 {
		t.Fatalf("second get: same ring %v, reused %v, err %v, pinned %d, buffers handed %v", b == a, reused, err, f.pinned, got)
	}
	// A second borrower while b is out gets a ring of its own.
	c, reused, err := p.get(4, 1024, nil, nil)
	if err != nil || reused || c == b || f.pinned != 2 || mem.InUse() != 8192 {
		t.Fatalf("concurrent get: reused %v, err %v, pinned %d, accounted %d", reused, err, f.pinned, mem.InUse())
	}
	p.put(b)
	p.put(c) // past MaxIdle: freed
	if p.Idle() != 1 || f.freed != 1 || mem.InUse() != 4096 || p.Lent() != 0 {
		t.Errorf("both back: idle %d, freed %d, accounted %d, lent %d", p.Idle(), f.freed, mem.InUse(), p.Lent())
	}
	// Another shape is pinned, not lent the idle ring.
	d, reused, err := p.get(2, 1024, nil, nil)
	if err != nil || reused || f.pinned != 3 {
		t.Fatalf("other shape: reused %v, err %v, pinned %d", reused, err, f.pinned)
	}
	p.drop(d) // a failed release: never lent again
	if f.freed != 2 || p.Idle() != 1 {
		t.Errorf("dropped: freed %d, idle %d", f.freed, p.Idle())
	}
	// A failed pin lends nothing and counts nothing.
	f.fail = errors.New("no pinned memory")
	if _, _, err := p.get(8, 1024, nil, nil); !errors.Is(err, f.fail) || p.Lent() != 0 {
		t.Errorf("failed pin: err %v, lent %d", err, p.Lent())
	}
	f.fail = nil
	e, _, err := p.get(4, 1024, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	if _, _, err := p.get(4, 1024, nil, nil); !errors.Is(err, errPoolClosed) {
		t.Errorf("get after Close: %v", err)
	}
	p.put(e) // given back after Close: freed
	if f.freed != f.pinned || mem.InUse() != 0 || p.Idle() != 0 {
		t.Errorf("closed: pinned %d, freed %d, accounted %d, idle %d", f.pinned, f.freed, mem.InUse(), p.Idle())
	}
}

// TestDeviceUploaderSharedContext: uploaders one after another on one
// context, as a server's models are, borrow the staging ring from a
// RingPool (the second one reuses the first's), allocate the arena in
// stream order where the library can, and Release frees without
// synchronising the context, after the model's compute stream: every
// upload still lands, and once the pool is closed no driver object is
// left.
func TestDeviceUploaderSharedContext(t *testing.T) {
	w := gpuWorker(t)
	live := rocm.Live()
	var compute rocm.Stream
	if err := w.Do(context.Background(), func(c *rocm.Ctx) (err error) { compute, err = c.NewStream(); return err }); err != nil {
		t.Fatal(err)
	}
	pool := &RingPool{W: w, Mem: NewMemory(0)}
	for run := range 2 {
		f, err := gguf.Open(testmodels.Path(t, "stories260K-Q4_0.gguf"))
		if err != nil {
			t.Fatal(err)
		}
		p, err := NewPlan(f, 5)
		if err == nil {
			err = p.Convert(Conversion{})
		}
		if err != nil {
			t.Fatal(err)
		}
		mem := NewMemory(0)
		d := &DeviceUploader{W: w, Mem: mem, Ahead: true, RingBuffers: 3, RingBytes: 1 << 12, Stagers: 3,
			Rings: pool, Compute: func() rocm.Stream { return compute }}
		if err := d.Reserve(p); err != nil {
			t.Fatal(err)
		}
		for _, u := range p.Units {
			for _, tn := range u.Tensors {
				if tn.src, err = f.TensorData(tn.Info); err != nil {
					t.Fatal(err)
				}
				if err := d.Upload(tn, 0, tn.src); err != nil {
					t.Fatal(err)
				}
			}
			fence, err := d.Flush(u)
			if err != nil {
				t.Fatal(err)
			}
			// The compute stream waits for the unit, as the executor's does.
			ev := fence.Event()
			if err := w.Do(context.Background(), func(c *rocm.Ctx) error { return c.WaitEvent(compute, rocm.Event(ev)) }); err != nil {
				t.Fatal(err)
			}
			if err := fence.Wait(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		for name, tn := range p.ByName {
			wt, ok := d.Weight(name)
			if !ok || wt.Dev == 0 {
				t.Fatalf("%s: no device weight", name)
			}
			got := make([]byte, tn.OutBytes)
			if err := w.Do(context.Background(), func(c *rocm.Ctx) error { return c.CopyDtoH(got, rocm.DevPtr(wt.Dev)) }); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, tn.src) {
				t.Errorf("run %d: %s: device bytes differ from the file", run, name)
			}
		}
		st := d.Stats()
		var async bool
		_ = w.Do(context.Background(), func(c *rocm.Ctx) error { async = c.HasAsyncAlloc(); return nil })
		t.Logf("run %d: ring reused %v, arena in stream order %v (library has it: %v), ring ready %v after Reserve",
			run, st.RingReused, st.ArenaAsync, async, st.RingReady)
		if st.RingReused != (run == 1) {
			t.Errorf("run %d: ring reused %v", run, st.RingReused)
		}
		d.Release()
		if mem.InUse() != 0 || pool.Lent() != 0 || pool.Idle() != 1 {
			t.Errorf("run %d after Release: %d bytes accounted, %d rings lent, %d idle", run, mem.InUse(), pool.Lent(), pool.Idle())
		}
		f.Close()
	}
	pool.Close()
	if err := w.Do(context.Background(), func(c *rocm.Ctx) error {
		if err := c.SyncStream(compute); err != nil {
			return err
		}
		return c.DestroyStream(compute)
	}); err != nil {
		t.Fatal(err)
	}
	if pool.Mem.InUse() != 0 {
		t.Errorf("pool still accounts %d bytes", pool.Mem.InUse())
	}
	if after := rocm.Live(); after != live {
		t.Errorf("driver objects after Release %+v, before %+v", after, live)
	}
}
