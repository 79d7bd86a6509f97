package gpu

import (
	"fmt"
	"log/slog"

	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/rocm"
)

// peerState is what a Backend keeps for the copies of a model split over
// devices (pipeline/model's split): the event its stream records when a
// peer copies out of it, and the peers whose memory its context was
// opened to.
type peerState struct {
	ev     rocm.Event
	opened map[*Backend]bool // EnablePeer asked (true: a direct link)
}

// CopyPeer implements model.PeerCopier: it queues on b's stream a copy of
// s, a tensor of src (another GPU Backend of the same driver: another
// device, or another context of the same one), into dst, after the work
// queued on src so far. The first copy from a peer opens b's context to
// it where the driver allows a direct link (cuCtxEnablePeerAccess); else
// the driver stages the copy through pinned host memory. src's stream
// then waits for the copy, so that src's next writes into s (the next
// step) cannot overtake it; neither stream blocks the host. It reports false
// for a src that is not such a Backend (the caller copies through the
// host).
func (b *Backend) CopyPeer(dst kernels.Tensor, src kernels.Backend, s kernels.Tensor) (bool, error) {
	sb, ok := kernels.As[*Backend](src)
	if !ok || sb == b || sb.w.Runtime() != b.w.Runtime() {
		return false, nil
	}
	if s.Len != dst.Len {
		return false, fmt.Errorf("gpu: peer copy of %d values into %d", s.Len, dst.Len)
	}
	if err := checkTensor("peer copy source", s, s.Len); err != nil {
		return false, err
	}
	if err := checkTensor("peer copy destination", dst, dst.Len); err != nil {
		return false, err
	}
	if dst.Len == 0 {
		return true, nil
	}
	ev, err := sb.markPeer()
	if err != nil {
		return false, err
	}
	from := sb.w.Peer()
	done, err := b.copyPeer(dst, sb, s, ev, from)
	if err != nil {
		return false, err
	}
	// src's later work (the next step's writes into s) waits for the copy.
	if err := sb.waitPeer(done); err != nil {
		return false, err
	}
	return true, nil
}

// copyPeer queues the copy on b's stream behind ev and records b's peer
// event after it.
func (b *Backend) copyPeer(dst kernels.Tensor, sb *Backend, s kernels.Tensor, ev rocm.Event, from rocm.Peer) (rocm.Event, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, fmt.Errorf("gpu: peer copy into a closed backend")
	}
	if b.step.capturing {
		return 0, fmt.Errorf("gpu: peer copy while capturing a decode step")
	}
	err := b.do(func(c *rocm.Ctx) error {
		if _, asked := b.peer.opened[sb]; !asked {
			direct, err := c.EnablePeer(from)
			if err != nil {
				slog.Debug("gpu: no direct link to a peer; copies go through the host", "from", sb.name, "to", b.name, "err", err)
			}
			if b.peer.opened == nil {
				b.peer.opened = map[*Backend]bool{}
			}
			b.peer.opened[sb] = direct
			slog.Debug("gpu: peer copies", "from", sb.name, "to", b.name, "direct", direct)
		}
		if err := c.WaitEvent(b.stream, ev); err != nil {
			return fmt.Errorf("gpu: peer copy: waiting for %s: %w", sb.name, err)
		}
		if err := c.CopyPeerAsync(rocm.DevPtr(dst.Dev), rocm.DevPtr(s.Dev), from, 4*dst.Len, b.stream); err != nil {
			return fmt.Errorf("gpu: peer copy from %s: %w", sb.name, err)
		}
		return b.recordPeer(c)
	})
	return b.peer.ev, err
}

// waitPeer makes b's stream wait for ev (a peer's copy out of b).
func (b *Backend) waitPeer(ev rocm.Event) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return fmt.Errorf("gpu: peer copy from a closed backend")
	}
	return b.do(func(c *rocm.Ctx) error {
		if err := c.WaitEvent(b.stream, ev); err != nil {
			return fmt.Errorf("gpu: waiting for a peer's copy: %w", err)
		}
		return nil
	})
}

// recordPeer records b's peer event on its stream, making it the first
// time (on the worker, under b.mu).
func (b *Backend) recordPeer(c *rocm.Ctx) error {
	if b.peer.ev == 0 {
		ev, err := c.NewEvent(false)
		if err != nil {
			return err
		}
		b.peer.ev = ev
	}
	return c.Record(b.peer.ev, b.stream)
}

// markPeer records b's peer event after the work queued on its stream.
func (b *Backend) markPeer() (rocm.Event, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, fmt.Errorf("gpu: peer copy from a closed backend")
	}
	if b.step.capturing {
		return 0, fmt.Errorf("gpu: peer copy from a backend capturing a decode step")
	}
	if err := b.do(b.recordPeer); err != nil {
		return 0, fmt.Errorf("gpu: peer copy: marking %s: %w", b.name, err)
	}
	return b.peer.ev, nil
}

// releasePeer destroys the peer event (on the worker, under b.mu).
func (b *Backend) releasePeer(c *rocm.Ctx) error {
	var err error
	if b.peer.ev != 0 {
		err = c.DestroyEvent(b.peer.ev)
	}
	b.peer = peerState{}
	return err
}
