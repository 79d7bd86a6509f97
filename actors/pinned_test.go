package actors

import (
	"errors"
	"runtime"
	"sync"
	"testing"
	"unsafe"
)

// fakeRegistry counts registrations the way the driver would see them:
// every range registered once, no overlap, every undo exactly once.
type fakeRegistry struct {
	mu     sync.Mutex
	live   map[uintptr]int // start → length
	total  int
	failAt int           // the registration number that fails (0: none)
	gate   chan struct{} // if not nil, each registration waits for a value
}

func (r *fakeRegistry) reg(t *testing.T) func([]byte) (func() error, error) {
	return func(b []byte) (func() error, error) {
		if r.gate != nil {
			<-r.gate
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		r.total++
		if r.total == r.failAt {
			return nil, errors.New("registration refused")
		}
		lo := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
		for at, n := range r.live {
			if lo < at+uintptr(n) && at < lo+uintptr(len(b)) {
				t.Errorf("range [%#x, +%d) overlaps the registered [%#x, +%d)", lo, len(b), at, n)
			}
		}
		r.live[lo] = len(b)
		var once bool
		return func() error {
			r.mu.Lock()
			defer r.mu.Unlock()
			if once {
				t.Errorf("range %#x unregistered twice", lo)
			}
			once = true
			delete(r.live, lo)
			return nil
		}, nil
	}
}

func (r *fakeRegistry) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.live)
}

// TestPinnedFileBookkeeping: a served file is registered in ranges from
// its start; a chunk is handed out only where every byte under it is
// registered (split at the ranges); a dropped file is unregistered only
// once the last uploader's hold is released, exactly once per range, and
// then OnFree runs; a hold asked for after Drop is refused.
func TestPinnedFileBookkeeping(t *testing.T) {
	const page, piece = osPage, 4 * osPage
	mem := anonMemory(10*piece + 3*page) // 11 ranges, the last one short
	if mem == nil {
		t.Skip("no anonymous mappings on this system")
	}
	defer func() { _ = freeAnonMemory(mem) }()
	data := mem[:len(mem)-100] // a file's length is not a multiple of the page
	fr := &fakeRegistry{live: map[uintptr]int{}, gate: make(chan struct{})}
	freed := make(chan struct{})
	p, err := NewPinnedFileFunc(data, piece, fr.reg(t), func() { close(freed) })
	if err != nil {
		t.Fatal(err)
	}
	if !p.Acquire() {
		t.Fatal("Acquire refused before Drop")
	}
	if got := p.covering(data[:10]); got != nil {
		t.Errorf("nothing registered yet: covering gave %d ranges", len(got))
	}
	// Three ranges registered.
	for range 3 {
		fr.gate <- struct{}{}
	}
	for p.n.Load() < 3 { // the registering goroutine stores n after each range
		runtime.Gosched()
	}
	if got := p.covering(data[piece-10 : piece+10]); len(got) != 2 || got[0].hi != got[1].lo ||
		got[0].lo != uintptr(unsafe.Pointer(&mem[0])) || got[1].hi-got[1].lo != piece {
		t.Errorf("a chunk across the first two ranges: %+v", got)
	}
	if got := p.covering(data[3*piece-5 : 3*piece+5]); got != nil {
		t.Errorf("a chunk reaching the unregistered fourth range was handed out: %d ranges", len(got))
	}
	other := anonMemory(page)
	defer func() { _ = freeAnonMemory(other) }()
	if got := p.covering(other[:10]); got != nil {
		t.Errorf("memory outside the file was handed out")
	}
	// The rest.
	close(fr.gate)
	for !p.Complete() {
		runtime.Gosched()
	}
	if fr.count() != 11 || p.Bytes() != p.Size() || p.Size() != int64(len(mem)) {
		t.Errorf("complete: %d ranges registered, %d of %d bytes (mapping %d)", fr.count(), p.Bytes(), p.Size(), len(mem))
	}
	last := p.covering(data[len(data)-7:])
	if len(last) != 1 || last[0].hi != uintptr(unsafe.Pointer(&mem[0]))+uintptr(len(mem)) {
		t.Errorf("the last, short range: %+v", last)
	}
	if !p.Acquire() { // a second uploader
		t.Fatal("second Acquire refused")
	}
	p.Drop()
	p.Drop()
	if p.Acquire() {
		t.Error("Acquire granted after Drop")
	}
	p.Release()
	select {
	case <-freed:
		t.Fatal("unregistered while an uploader still holds the file")
	default:
	}
	if fr.count() != 11 {
		t.Errorf("%d ranges registered while held, want 11", fr.count())
	}
	p.Release()
	<-p.Done()
	<-freed
	if n := fr.count(); n != 0 {
		t.Errorf("%d ranges still registered after Drop and the last Release", n)
	}
	if p.covering(data[:10]) != nil || p.Bytes() != 0 {
		t.Error("ranges handed out after they were unregistered")
	}
}

// TestPinnedFileDropEarly: a file dropped while registering stops, undoes
// what it registered and frees; one whose registration fails keeps the
// ranges before the failure and frees them at Drop.
func TestPinnedFileDropEarly(t *testing.T) {
	const piece = 2 * osPage
	mem := anonMemory(8 * piece)
	if mem == nil {
		t.Skip("no anonymous mappings on this system")
	}
	defer func() { _ = freeAnonMemory(mem) }()

	fr := &fakeRegistry{live: map[uintptr]int{}, gate: make(chan struct{})}
	p, err := NewPinnedFileFunc(mem, piece, fr.reg(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	fr.gate <- struct{}{}
	fr.gate <- struct{}{}
	p.Drop()
	close(fr.gate) // a registration in flight completes, no other starts
	<-p.Done()
	if n := fr.count(); n != 0 || fr.total > 3 {
		t.Errorf("dropped while registering: %d still registered, %d registered in all (want ≤ 3)", n, fr.total)
	}

	fr = &fakeRegistry{live: map[uintptr]int{}, failAt: 4}
	p, err = NewPinnedFileFunc(mem, piece, fr.reg(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	for p.n.Load() < 3 {
		runtime.Gosched()
	}
	if !p.Acquire() {
		t.Fatal("Acquire refused")
	}
	if p.covering(mem[:3*piece]) == nil || p.covering(mem[3*piece:3*piece+1]) != nil || p.Complete() {
		t.Error("after a failed registration: want the first three ranges only")
	}
	p.Release()
	p.Drop()
	<-p.Done()
	if n := fr.count(); n != 0 {
		t.Errorf("%d still registered after Drop", n)
	}

	if _, err := NewPinnedFileFunc(mem[1:], piece, fr.reg(t), nil); err == nil {
		t.Error("an unaligned mapping was accepted")
	}
}
