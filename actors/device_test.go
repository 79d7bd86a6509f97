package actors

import (
	"bytes"
	"context"
	"errors"
	"os"
	"slices"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/rocm"
)

// TestUnregistered: the gaps of a page range that earlier registrations do
// not cover (the driver refuses overlapping registrations).
func TestUnregistered(t *testing.T) {
	reg := func(lo, hi uintptr) *rocm.Registered { return &rocm.Registered{Ptr: lo, Size: int(hi - lo)} }
	regs := []*rocm.Registered{reg(10, 20), reg(30, 40), reg(40, 50)}
	for _, c := range []struct {
		lo, hi uintptr
		want   [][2]uintptr
	}{
		{0, 10, [][2]uintptr{{0, 10}}},
		{0, 15, [][2]uintptr{{0, 10}}},
		{12, 18, nil},
		{15, 35, [][2]uintptr{{20, 30}}},
		{5, 60, [][2]uintptr{{5, 10}, {20, 30}, {50, 60}}},
		{50, 60, [][2]uintptr{{50, 60}}},
		{45, 55, [][2]uintptr{{50, 55}}},
	} {
		if got := unregistered(regs, c.lo, c.hi); !slices.Equal(got, c.want) {
			t.Errorf("[%d, %d): got %v, want %v", c.lo, c.hi, got, c.want)
		}
	}
	if got := unregistered(nil, 4096, 8192); !slices.Equal(got, [][2]uintptr{{4096, 8192}}) {
		t.Errorf("no registrations: got %v", got)
	}
}

// gpuWorker returns a worker on GPU 0, or skips (fails with
// FORGE_REQUIRE_GPU=1) without one.
func gpuWorker(t *testing.T) *rocm.Worker {
	t.Helper()
	rt, err := rocm.OpenAny()
	var w *rocm.Worker
	if err == nil {
		w, err = rt.NewWorker(0)
	}
	if err != nil {
		if os.Getenv("FORGE_REQUIRE_GPU") == "1" {
			t.Fatalf("no GPU, and FORGE_REQUIRE_GPU=1: %v", err)
		}
		t.Skipf("no GPU (set FORGE_REQUIRE_GPU=1 to make this a failure): %v", err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

// TestDeviceUploaderRoundTrip uploads every tensor of a real file in odd
// chunks (neighbouring chunks share pages) through the registered mapping
// and through the staging ring, waits on the unit fences and reads the
// arena back: the device holds the file's bytes, and Release leaves no
// driver object behind.
func TestDeviceUploaderRoundTrip(t *testing.T) {
	w := gpuWorker(t)
	for _, staging := range []bool{false, true} {
		f, err := gguf.Open(testmodels.Path(t, "stories260K-Q4_0.gguf"))
		if err != nil {
			t.Fatal(err)
		}
		p, err := NewPlan(f, 5)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Convert(Conversion{}); err != nil {
			t.Fatal(err)
		}
		live := rocm.Live()
		mem := NewMemory(0)
		d := &DeviceUploader{W: w, Mem: mem, Staging: staging, RingBuffers: 3, RingBytes: 1 << 12}
		if err := d.Reserve(p); err != nil {
			t.Fatal(err)
		}
		for _, u := range p.Units {
			for _, tn := range u.Tensors {
				if tn.src, err = f.TensorData(tn.Info); err != nil {
					t.Fatal(err)
				}
				const chunk = 3000 // not a page multiple
				for off := int64(0); off < tn.OutBytes; off += chunk {
					end := min(off+chunk, tn.OutBytes)
					if err := d.Upload(tn, off, tn.src[off:end]); err != nil {
						t.Fatalf("staging %v: %v", staging, err)
					}
				}
			}
			fence, err := d.Flush(u)
			if err != nil {
				t.Fatal(err)
			}
			if fence.Event() == 0 {
				t.Errorf("%s: fence has no event", u.Name())
			}
			if err := fence.Wait(context.Background()); err != nil {
				t.Fatalf("staging %v: %s: %v", staging, u.Name(), err)
			}
			if !fence.Done() {
				t.Errorf("%s: fence not done after Wait", u.Name())
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
				t.Errorf("staging %v: %s: device bytes differ from the file", staging, name)
			}
		}
		if mem.InUse() == 0 {
			t.Errorf("arena not accounted")
		}
		t.Logf("staging %v: %d registrations for %d tensors", staging, len(d.regs), len(p.ByName))
		d.Release()
		d.Release() // twice is harmless
		if mem.InUse() != 0 {
			t.Errorf("%d bytes accounted after Release", mem.InUse())
		}
		if after := rocm.Live(); after != live {
			t.Errorf("driver objects after Release %+v, before %+v", after, live)
		}
		f.Close()
	}
}

// TestDeviceUploaderOutOfMemory: an arena past the Memory limit fails
// Reserve with ErrOutOfMemory, and Release after it is safe.
func TestDeviceUploaderOutOfMemory(t *testing.T) {
	w := gpuWorker(t)
	f, err := gguf.Open(testmodels.Path(t, "stories260K-Q4_0.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p, err := NewPlan(f, 5)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Convert(Conversion{}); err != nil {
		t.Fatal(err)
	}
	live := rocm.Live()
	d := &DeviceUploader{W: w, Mem: NewMemory(1 << 10)}
	if err := d.Reserve(p); err == nil || !errors.Is(err, ErrOutOfMemory) {
		t.Errorf("Reserve: %v, want out of memory", err)
	}
	d.Release()
	if after := rocm.Live(); after != live {
		t.Errorf("driver objects after Release %+v, before %+v", after, live)
	}
}
