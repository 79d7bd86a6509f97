package progress

import (
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/eventstream"
)

// Bus carries progress events from the actors to subscribers over the
// actor system's EventStream. Publish runs the subscribers' handlers on the
// publisher's goroutine, so a handler only appends to its subscription's
// queue: a slow or absent reader never slows the pipeline.
//
// The bus keeps the load's events (everything but requests') so that a
// subscriber that arrives late — after Open returned, when reading may
// already be done — still sees the whole load, in order, before the live
// events.
type Bus struct {
	start time.Time
	es    *eventstream.EventStream

	mu      sync.Mutex // orders Publish and Subscribe
	subs    map[*Subscription]struct{}
	history []Event // load events so far
	closed  bool
}

// isLoad reports whether e is about the load rather than a request.
func isLoad(e Event) bool {
	switch e := e.(type) {
	case TensorRead, TensorConverted, TensorUploaded, LayerReady, ExpertReady, ModelReady, AllResident:
		return true
	case Error:
		return e.Req == 0
	}
	return false
}

// NewBus returns a bus whose event times count from start.
func NewBus(es *eventstream.EventStream, start time.Time) *Bus {
	return &Bus{start: start, es: es, subs: map[*Subscription]struct{}{}}
}

// Since is the monotonic time since the bus's start, the At of events.
func (b *Bus) Since() time.Duration { return time.Since(b.start) }

// Start is the time events count from.
func (b *Bus) Start() time.Time { return b.start }

// Publish sends e to every subscriber. The handlers only queue, so
// holding the lock across them costs little and keeps every subscriber's
// order the publish order.
func (b *Bus) Publish(e Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	if isLoad(e) {
		b.history = append(b.history, e)
	}
	b.es.Publish(e)
}

// Subscribe returns a subscription that receives the load's events so far,
// then every event published from now on, in order. Read its C until it is
// closed, or call Close.
func (b *Bus) Subscribe() *Subscription {
	s := &Subscription{bus: b, wake: make(chan struct{}, 1), stop: make(chan struct{}), exited: make(chan struct{})}
	c := make(chan Event)
	s.c, s.C = c, c
	b.mu.Lock()
	s.q = append(s.q, b.history...)
	s.held = len(s.q)
	if b.closed {
		s.ended = true
	} else {
		b.subs[s] = struct{}{}
		s.sub = b.es.Subscribe(func(evt any) {
			if e, ok := evt.(Event); ok {
				s.push(e)
			}
		})
	}
	b.mu.Unlock()
	go s.forward()
	return s
}

// Close ends every subscription's input: each delivers what it has queued,
// then closes its channel.
func (b *Bus) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	b.closed = true
	for s := range b.subs {
		b.es.Unsubscribe(s.sub)
		s.end()
	}
	b.subs = nil
}

func (b *Bus) remove(s *Subscription) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.subs[s]; ok {
		b.es.Unsubscribe(s.sub)
		delete(b.subs, s)
	}
}

// MaxQueued bounds the events a subscription holds for its reader (the
// load's history included): past it, new events are dropped and counted
// (Dropped), so an abandoned subscription costs at most this much memory
// while the pipeline still never waits for its reader.
const MaxQueued = 1 << 20

// Subscription is one subscriber's ordered stream of events. Events queue
// between the publisher and C, up to MaxQueued, so the pipeline never waits
// for the reader.
type Subscription struct {
	// C delivers the events; it is closed after the bus closes (and the
	// queue is drained) or after Close.
	C <-chan Event

	bus    *Bus
	sub    *eventstream.Subscription
	c      chan Event
	wake   chan struct{}
	stop   chan struct{}
	exited chan struct{}
	once   sync.Once

	mu      sync.Mutex
	q       []Event
	held    int // events queued or taken by forward, not yet delivered
	ended   bool
	dropped int64
}

// Dropped is the number of events not delivered because the reader let
// MaxQueued of them pile up.
func (s *Subscription) Dropped() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dropped
}

func (s *Subscription) push(e Event) {
	s.mu.Lock()
	switch {
	case s.ended:
	case s.held >= MaxQueued:
		s.dropped++
	default:
		s.q = append(s.q, e)
		s.held++
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *Subscription) end() {
	s.mu.Lock()
	s.ended = true
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// forward moves queued events to C until the input ends and the queue is
// empty, or the subscriber closes.
func (s *Subscription) forward() {
	defer close(s.exited)
	defer close(s.c)
	for {
		s.mu.Lock()
		q, ended := s.q, s.ended
		s.q = nil
		s.mu.Unlock()
		for _, e := range q {
			select {
			case s.c <- e:
				s.mu.Lock()
				s.held--
				s.mu.Unlock()
			case <-s.stop:
				return
			}
		}
		if len(q) > 0 {
			continue
		}
		if ended {
			return
		}
		select {
		case <-s.wake:
		case <-s.stop:
			return
		}
	}
}

// Close stops delivery (queued events are dropped) and closes C.
func (s *Subscription) Close() {
	s.once.Do(func() {
		s.bus.remove(s)
		close(s.stop)
	})
	<-s.exited
}
