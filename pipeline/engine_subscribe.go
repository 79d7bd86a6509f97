package pipeline

import (
	"context"
	"fmt"
)

// Subscribe streams a model's events (its load so far, then every event;
// see Model.Subscribe), loading the model if it is not loaded. Unlike a
// Model's subscription, this one belongs to the Engine: it is closed when
// ctx is done or the Engine closes (events not yet read are then dropped),
// so an abandoned subscription neither outlives the Engine nor grows past
// MaxQueuedEvents. The subscription does not keep the model loaded; when
// the model unloads, C closes after its last events.
func (e *Engine) Subscribe(ctx context.Context, model string) (*Subscription, error) {
	lease, err := e.Acquire(ctx, model)
	if err != nil {
		return nil, err
	}
	sub := lease.Model().Subscribe()
	lease.Release()
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		sub.Close()
		return nil, fmt.Errorf("%w: subscribing to %q", ErrEngineClosed, model)
	}
	if e.subs == nil {
		e.subs = map[*Subscription]struct{}{}
	}
	e.subs[sub] = struct{}{}
	e.mu.Unlock()
	context.AfterFunc(ctx, func() { e.unsubscribe(sub) })
	return sub, nil
}

// unsubscribe closes an Engine subscription.
func (e *Engine) unsubscribe(sub *Subscription) {
	e.mu.Lock()
	_, ok := e.subs[sub]
	delete(e.subs, sub)
	e.mu.Unlock()
	if ok {
		sub.Close()
	}
}
