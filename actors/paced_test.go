package actors

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/forge-llm/forge/gguf"
)

// pacedHost is a HostUploader whose uploads leave its queue only when the
// test says (release), as chunks leave a GPU's staging queue: it records
// the units' chunks in upload order and the most chunks held at once.
type pacedHost struct {
	*HostUploader
	mu        sync.Mutex
	held      []func()
	heldBytes []int
	order     []string
	most      int // chunks held at once
	bytes     int // bytes held now
	mostBytes int // at once
	more      chan struct{}
}

func (p *pacedHost) UploadThen(t *Tensor, off int64, data []byte, done func()) error {
	if err := p.HostUploader.Upload(t, off, data); err != nil {
		return err
	}
	p.mu.Lock()
	p.held = append(p.held, done)
	p.heldBytes = append(p.heldBytes, len(data))
	p.order = append(p.order, t.unit.Name())
	p.most = max(p.most, len(p.held))
	p.bytes += len(data)
	p.mostBytes = max(p.mostBytes, p.bytes)
	p.mu.Unlock()
	select {
	case p.more <- struct{}{}:
	default: // the test polls uploaded() too
	}
	return nil
}

// release lets the oldest held chunk go; false when none is held.
func (p *pacedHost) release() bool {
	p.mu.Lock()
	if len(p.held) == 0 {
		p.mu.Unlock()
		return false
	}
	done := p.held[0]
	p.held = p.held[1:]
	p.bytes -= p.heldBytes[0]
	p.heldBytes = p.heldBytes[1:]
	p.mu.Unlock()
	done()
	return true
}

func (p *pacedHost) uploaded() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.order...)
}

// startPaced starts a load of the test mixture with cfg through a
// pacedHost uploader; the load is closed when the test ends.
func startPaced(t *testing.T, cfg Config) (*System, *pacedHost) {
	t.Helper()
	f, err := gguf.Open(writeMixture(t))
	if err != nil {
		t.Fatal(err)
	}
	up := &pacedHost{HostUploader: &HostUploader{}, more: make(chan struct{}, 1<<10)}
	cfg.File, cfg.Uploader = f, up
	s, err := Start(context.Background(), cfg)
	if err != nil {
		f.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, up
}

// TestPacedUploaderBoundsQueueAndDemandOvertakes: with an uploader that
// queues (PacedUploader), the loader keeps at most MaxInflight chunks
// between its queue and the uploader's, so experts a request demands
// (DemandExperts, here the last expert of the last block while the load
// is still on block 0) come next, before everything the load order had
// ahead of them, without waiting for room (they have MaxInflight of their
// own); and the load still ends with every unit resident.
func TestPacedUploaderBoundsQueueAndDemandOvertakes(t *testing.T) {
	const inflight = 2
	s, up := startPaced(t, Config{Layers: 2, Readers: 1, ChunkBytes: 100, MaxInflight: inflight})
	wait := func(n int) {
		t.Helper()
		start := time.Now()
		for len(up.uploaded()) < n {
			select {
			case <-up.more:
			case <-time.After(time.Millisecond):
			}
			if time.Since(start) > 10*time.Second {
				t.Fatalf("%d chunks uploaded, waiting for %d: the loader stalled", len(up.uploaded()), n)
			}
		}
	}
	// Let the globals and the blocks through, up to the first experts.
	for {
		wait(inflight)
		got := up.uploaded()
		if got[len(got)-1] == "layer 0 expert 0" {
			break
		}
		up.release()
		wait(len(got) + 1)
	}
	before := len(up.uploaded())
	up.mu.Lock()
	mostBefore := up.most
	up.mu.Unlock()
	s.DemandExperts(1, []int{3})
	up.release()
	wait(before + 1)
	if got := up.uploaded()[before]; got != "layer 1 expert 3" {
		t.Errorf("after the demand the next chunk uploaded is of %s, want layer 1 expert 3", got)
	}
	// Drain: everything lands.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if done, _ := s.Resident().State(); done != Pending {
			break
		}
		if !up.release() {
			if time.Now().After(deadline) {
				t.Fatal("the load never became resident")
			}
			time.Sleep(time.Millisecond)
		}
	}
	if err := s.Resident().Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The load's order keeps MaxInflight chunks in flight; a demanded
	// unit's chunks have as many again of their own.
	if mostBefore != inflight || up.most > 2*inflight {
		t.Errorf("%d chunks held by the uploader at once before the demand, %d after; MaxInflight %d", mostBefore, up.most, inflight)
	}
}

// TestPacedUploaderBoundsBytes: with InflightBytes the loader bounds the
// bytes in flight, not the chunks: small chunks (here rows of ≤ 128 bytes
// against a bound of 1000) go several more at once than MaxInflight would
// let them, and the bytes held never pass the bound by more than the last
// chunk admitted.
func TestPacedUploaderBoundsBytes(t *testing.T) {
	const bound = 1000
	s, up := startPaced(t, Config{Layers: 2, Readers: 1, ChunkBytes: 100, MaxInflight: 2, InflightBytes: bound})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if st, _ := s.Resident().State(); st != Pending {
			break
		}
		up.mu.Lock()
		full := up.bytes >= bound-128 // as much as may go: let one out
		up.mu.Unlock()
		if !full || !up.release() {
			if time.Now().After(deadline) {
				t.Fatal("the load never became resident")
			}
			time.Sleep(time.Millisecond)
		}
	}
	if err := s.Resident().Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if up.most <= 2 || up.mostBytes >= bound+128 {
		t.Errorf("%d chunks, %d bytes held at once: want more than MaxInflight's 2 chunks, under %d bytes and a chunk", up.most, up.mostBytes, bound)
	}
}
