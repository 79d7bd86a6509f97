package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/forge-llm/forge/actors"
	"github.com/forge-llm/forge/kernels"
)

// lazyUploader is the Uploader of a model whose device is still opening:
// Reserve waits for the GPU context (or the CPU), then makes the device's
// own Uploader and hands everything to it. A device that fails to open
// fails Reserve, which fails every future with its error.
type lazyUploader struct {
	dev  *device
	ctx  context.Context // the load
	make func(cpu bool) actors.Uploader

	// after holds Reserve (the arena's allocation and the ring's
	// borrowing) until each channel is closed: the uploaders of the
	// models an Engine evicted for this one, released (Engine.open).
	// released is closed once this uploader's own Release has returned
	// (nil: not watched).
	after    []<-chan struct{}
	released chan struct{}
	relOnce  sync.Once

	mu sync.Mutex
	up actors.Uploader
}

func (l *lazyUploader) inner() actors.Uploader {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.up
}

// Reserve implements actors.Uploader.
func (l *lazyUploader) Reserve(p *actors.Plan) error {
	select {
	case <-l.dev.ctxReady:
	case <-l.dev.abort:
		return actors.ErrClosed
	case <-l.ctx.Done():
		return fmt.Errorf("load cancelled while the device opened: %w", context.Cause(l.ctx))
	}
	if l.dev.ctxErr != nil {
		return l.dev.ctxErr
	}
	for _, ch := range l.after {
		select {
		case <-ch:
		case <-l.dev.abort:
			return actors.ErrClosed
		case <-l.ctx.Done():
			return fmt.Errorf("load cancelled while an evicted model freed its device memory: %w", context.Cause(l.ctx))
		}
	}
	if !l.dev.cpu {
		slog.Debug("pipeline: reserving device memory", "after context", time.Since(l.dev.ctxAt))
	}
	up := l.make(l.dev.cpu)
	l.mu.Lock()
	l.up = up
	l.mu.Unlock()
	return up.Reserve(p)
}

var errNotReserved = errors.New("pipeline: uploader used before Reserve")

// failed is the backend's error once it is known to have failed after the
// context was made: the remaining units fail with it.
func (l *lazyUploader) failed() error {
	select {
	case <-l.dev.done:
		return l.dev.err
	default:
		return nil
	}
}

// Dest implements actors.Uploader.
func (l *lazyUploader) Dest(t *actors.Tensor, off, n int64) ([]byte, error) {
	up := l.inner()
	if up == nil {
		return nil, errNotReserved
	}
	return up.Dest(t, off, n)
}

// Upload implements actors.Uploader.
func (l *lazyUploader) Upload(t *actors.Tensor, off int64, data []byte) error {
	return l.UploadThen(t, off, data, nil)
}

// UploadThen implements actors.PacedUploader: the device's uploader paces
// the chunk where it can (a GPU's staging queue), else done (if any) is
// called once the upload returns.
func (l *lazyUploader) UploadThen(t *actors.Tensor, off int64, data []byte, done func()) error {
	up := l.inner()
	if up == nil {
		return errNotReserved
	}
	if err := l.failed(); err != nil {
		return err
	}
	if p, ok := up.(actors.PacedUploader); ok {
		return p.UploadThen(t, off, data, done)
	}
	if err := up.Upload(t, off, data); err != nil {
		return err
	}
	if done != nil {
		done()
	}
	return nil
}

// Flush implements actors.Uploader.
func (l *lazyUploader) Flush(u *actors.Unit) (actors.Fence, error) {
	up := l.inner()
	if up == nil {
		return nil, errNotReserved
	}
	if err := l.failed(); err != nil {
		return nil, err
	}
	return up.Flush(u)
}

// Weight implements actors.Uploader.
func (l *lazyUploader) Weight(name string) (*kernels.Weight, bool) {
	up := l.inner()
	if up == nil {
		return nil, false
	}
	return up.Weight(name)
}

// Release implements actors.Uploader.
func (l *lazyUploader) Release() {
	if up := l.inner(); up != nil {
		up.Release()
	}
	if l.released != nil {
		l.relOnce.Do(func() { close(l.released) })
	}
}
