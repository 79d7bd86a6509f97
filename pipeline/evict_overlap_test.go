package pipeline

import (
	"context"
	"errors"
	"testing"

	"github.com/forge-llm/forge/actors"
)

// recordUploader is an Uploader that records Reserve and Release.
type recordUploader struct {
	actors.HostUploader
	reserved, released bool
}

func (r *recordUploader) Reserve(p *actors.Plan) error { r.reserved = true; return nil }
func (r *recordUploader) Release()                     { r.released = true }

// TestLazyUploaderWaitsForEvicted: a load's reservation waits for the
// uploaders of the models evicted for it (Engine.open's gate): with one
// still held, Reserve makes no uploader and ends with the load's
// cancellation; once released, it goes on. Release closes the uploader's
// own released channel, once, after its inner Release.
func TestLazyUploaderWaitsForEvicted(t *testing.T) {
	dev := &device{abort: make(chan struct{}), ctxReady: make(chan struct{}), done: make(chan struct{}), cpu: true}
	close(dev.ctxReady)
	victim := make(chan struct{})
	var made *recordUploader
	mk := func(bool) actors.Uploader { made = &recordUploader{}; return made }

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	held := &lazyUploader{dev: dev, ctx: ctx, make: mk, after: []<-chan struct{}{victim}}
	if err := held.Reserve(&actors.Plan{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Reserve with the victim's uploader held: %v, want the load's cancellation", err)
	}
	if made != nil {
		t.Fatal("Reserve made an uploader before the victim's was released")
	}

	close(victim)
	l := &lazyUploader{dev: dev, ctx: context.Background(), make: mk, after: []<-chan struct{}{victim}, released: make(chan struct{})}
	if err := l.Reserve(&actors.Plan{}); err != nil {
		t.Fatal(err)
	}
	if made == nil || !made.reserved {
		t.Fatal("Reserve after the victim's release did not reserve")
	}
	select {
	case <-l.released:
		t.Fatal("released closed before Release")
	default:
	}
	l.Release()
	l.Release() // twice: closes once
	if !made.released {
		t.Fatal("Release did not release the inner uploader")
	}
	select {
	case <-l.released:
	default:
		t.Fatal("released still open after Release")
	}
}
