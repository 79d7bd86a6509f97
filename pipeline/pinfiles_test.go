package pipeline

import (
	"os"
	"slices"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/forge-llm/forge/actors"
	"github.com/forge-llm/forge/gguf/testmodels"
)

// TestEnginePinsServedFiles (the bookkeeping of EngineOptions.PinFiles,
// with registrations counted on the CPU): a model's file is pinned once it
// is resident, if it fits in PinFiles beside the files pinned already; an
// eviction keeps the pin and the model's next load reads the same mapping;
// an unload lets it go, every range unregistered once no load reads it;
// Close lets every pin go and closes the files.
func TestEnginePinsServedFiles(t *testing.T) {
	a := testmodels.Path(t, "stories260K-Q4_0.gguf")
	b := testmodels.Path(t, "stories260K-Q8_0.gguf")
	size := func(p string) int64 {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		return st.Size()
	}
	sa, sb := size(a), size(b)
	o := Options{Batching: Batching{On: true}}
	ea, _, err := estimate(a, o)
	if err != nil {
		t.Fatal(err)
	}
	eb, _, _ := estimate(b, o)

	var mu sync.Mutex
	live := map[uintptr]bool{} // registered ranges
	reg := func(r []byte) (func() error, error) {
		mu.Lock()
		defer mu.Unlock()
		p := &r[0]
		at := uintptrOf(p)
		if live[at] {
			t.Errorf("range %#x registered twice", at)
		}
		live[at] = true
		return func() error {
			mu.Lock()
			defer mu.Unlock()
			if !live[at] {
				t.Errorf("range %#x unregistered twice", at)
			}
			delete(live, at)
			return nil
		}, nil
	}
	ranges := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(live)
	}
	const piece = 4 * 4096
	pieces := func(n int64) int { return int((n + piece - 1) / piece) }

	// Room for one model, and for one file only.
	e := newTestEngine(t, EngineOptions{Budget: max(ea, eb) + min(ea, eb)/2, KeepAlive: new(time.Duration(-1)), PinFiles: max(sa, sb) + 1})
	e.newPin = func(data []byte, onFree func()) (*actors.PinnedFile, error) {
		return actors.NewPinnedFileFunc(data, piece, reg, onFree)
	}
	pinOf := func(p string) *filePin {
		t.Helper()
		// Pinned as the event follower marks the entry resident, in the
		// same hold (StatusOf may say resident earlier: it also reads the
		// futures, which resolve before the follower sees the event).
		for {
			e.mu.Lock()
			ent, _ := e.lookupLocked(p)
			if ent.state == StateResident {
				pin := ent.pin
				e.mu.Unlock()
				return pin
			}
			e.mu.Unlock()
			time.Sleep(time.Millisecond)
		}
	}
	complete := func(p *filePin) {
		for !p.pf.Complete() {
			time.Sleep(time.Millisecond)
		}
	}
	gen := func(p string) []int32 {
		t.Helper()
		res, err := e.Generate(t.Context(), EngineRequest{Model: p, Prompt: "Once upon a time", MaxTokens: 6, IgnoreEOG: true})
		if err != nil {
			t.Fatal(err)
		}
		return res.Tokens
	}
	fileOf := func(p string) *fileRef {
		t.Helper()
		l, err := e.Acquire(t.Context(), p)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release()
		return l.Model().fref
	}

	first := gen(a)
	pa := pinOf(a)
	if pa == nil || e.PinnedBytes() != sa {
		t.Fatalf("a resident: pin %v, %d bytes pinned, want a's %d", pa, e.PinnedBytes(), sa)
	}
	complete(pa)
	if n := ranges(); n != pieces(sa) {
		t.Errorf("a pinned: %d ranges registered, want %d", n, pieces(sa))
	}

	gen(b) // evicts a
	if st, _ := e.StatusOf(a); st.State != StateEvicted {
		t.Fatalf("a is %s after b's load, want evicted", st.State)
	}
	if pb := pinOf(b); pb != nil {
		t.Error("b was pinned past PinFiles")
	}
	e.closing.Wait()
	if e.PinnedBytes() != sa || ranges() != pieces(sa) {
		t.Errorf("a evicted: %d bytes pinned, %d ranges; want a's pin kept (%d, %d)", e.PinnedBytes(), ranges(), sa, pieces(sa))
	}

	if got := gen(a); !slices.Equal(got, first) { // evicts b, reads a's pinned mapping
		t.Errorf("a again: %v, the first time %v", got, first)
	}
	if pinOf(a) != pa || fileOf(a) != pa.ref {
		t.Error("a's second load did not use its pinned file")
	}

	if err := e.Unload(a); err != nil {
		t.Fatal(err)
	}
	e.pinWG.Wait()
	if e.PinnedBytes() != 0 || ranges() != 0 {
		t.Errorf("a unloaded: %d bytes pinned, %d ranges registered", e.PinnedBytes(), ranges())
	}
	if pa.ref.retain() {
		t.Error("a's file is still open after its pin and its model went")
	}

	gen(b) // room now
	pb := pinOf(b)
	if pb == nil || e.PinnedBytes() != sb {
		t.Fatalf("b alone: pin %v, %d bytes pinned, want %d", pb, e.PinnedBytes(), sb)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if ranges() != 0 || pb.ref.retain() {
		t.Errorf("after Close: %d ranges registered, or b's file still open", ranges())
	}
}

func uintptrOf(p *byte) uintptr { return uintptr(unsafe.Pointer(p)) }
