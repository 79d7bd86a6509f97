package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// signalWatch cancels a command's context on SIGINT or SIGTERM and
// remembers which signal came, so the command can finish its output (the
// partial text, the statistics) and then exit 128+n as shells expect.
// After the first signal the default handling is restored: a second
// Ctrl-C kills a command that does not stop.
type signalWatch struct {
	ch   chan os.Signal
	stop chan struct{}
	wg   sync.WaitGroup

	mu  sync.Mutex
	got os.Signal
}

// watchSignals returns a context that is cancelled by SIGINT or SIGTERM
// and the watch; call Stop when the command ends.
func watchSignals(parent context.Context) (context.Context, *signalWatch) {
	ctx, cancel := context.WithCancelCause(parent)
	w := &signalWatch{ch: make(chan os.Signal, 1), stop: make(chan struct{})}
	signal.Notify(w.ch, os.Interrupt, syscall.SIGTERM)
	w.wg.Go(func() {
		defer cancel(nil)
		select {
		case s := <-w.ch:
			signal.Stop(w.ch)
			w.mu.Lock()
			w.got = s
			w.mu.Unlock()
			cancel(fmt.Errorf("interrupted by %v: %w", s, context.Canceled)) // the cause, for whoever asks
		case <-w.stop:
		}
	})
	return ctx, w
}

// Stop ends the watch and waits for its goroutine.
func (w *signalWatch) Stop() {
	signal.Stop(w.ch)
	close(w.stop)
	w.wg.Wait()
}

// Signal is the signal that interrupted the command, nil if none.
func (w *signalWatch) Signal() os.Signal {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.got
}

// Err turns a command's result into the exit of an interrupted command
// once a signal came: status 128+n, whatever error the cancellation
// caused (the text and statistics are already out).
func (w *signalWatch) Err(err error) error {
	s, ok := w.Signal().(syscall.Signal)
	if !ok {
		return err
	}
	return &exitError{code: 128 + int(s), err: fmt.Errorf("interrupted by %s", unix.SignalName(s))}
}
