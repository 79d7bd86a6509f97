package constrain

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"
)

// ErrRejected is wrapped by Accept for a token the grammar does not allow.
var ErrRejected = errors.New("constrain: token not allowed by the grammar")

var errClosed = errors.New("constrain: matcher closed")

// Matcher follows one sequence through a grammar. Accept a token, then
// Allowed gives the mask for the next one; the mask is computed in the
// background from Accept on, so it overlaps whatever the caller does in
// between (the model's forward step). A Matcher is used by one goroutine
// at a time; Close waits for its background work.
type Matcher struct {
	g      *Grammar
	v      *Vocab
	e      *engine
	cache  *maskCache
	state  int32
	budget int // tokens the sequence may still generate; < 0: unlimited
	done   bool
	// lazy: no trigger seen yet (WithTriggers); tail holds the end of the
	// output, where a trigger may be starting.
	lazy bool
	tail []byte
	// stop makes a background walk give up (Close).
	stop atomic.Bool

	// The background computation: ready is closed when mask and err are
	// set; nil when nothing is in flight.
	ready  chan struct{}
	valid  bool // mask and err are those of the current state
	mask   []uint64
	err    error
	own    []uint64 // this matcher's mask buffer (a cached mask is shared)
	stk    []int32
	keyBuf []byte
}

// NewMatcher starts a sequence at the beginning of the grammar and starts
// computing its first mask. budget is the most tokens the sequence may
// generate (≤ 0: unlimited); tokens that would leave the output impossible
// to complete within it are masked.
func (g *Grammar) NewMatcher(v *Vocab, budget int) *Matcher {
	if budget <= 0 {
		budget = -1
	}
	cache := g.caches.of(v)
	m := &Matcher{g: g, v: v, e: cache.takeEngine(g), cache: cache, budget: budget,
		own: make([]uint64, (v.n+63)/64), stk: make([]int32, v.depth+1)}
	m.state = m.e.start()
	m.lazy = len(g.triggers) > 0
	m.launch()
	return m
}

func (m *Matcher) launch() {
	ready := make(chan struct{})
	m.ready = ready
	go func() {
		defer close(ready)
		t0 := time.Now()
		m.mask, m.err = m.compute()
		stats.compute.Add(int64(time.Since(t0)))
	}()
}

// wait ends the background computation, if any.
func (m *Matcher) wait() {
	if m.ready != nil {
		<-m.ready
		m.ready = nil
		m.valid = true
	}
}

// compute returns the allowed tokens in the current state: the cached
// mask when the budget does not bind, else a fresh walk.
func (m *Matcher) compute() ([]uint64, error) {
	if m.done {
		return nil, fmt.Errorf("constrain: the sequence already ended")
	}
	if m.lazy {
		return m.v.all, nil
	}
	ent := m.e.masks[m.state]
	if ent == nil {
		m.keyBuf = m.e.key(m.state, m.keyBuf)
		ent = m.cache.get(m.keyBuf)
		if ent == nil {
			ent = &maskEntry{mask: make([]uint64, len(m.own))}
			d, ok := m.e.computeMask(m.v, m.state, -1, ent.mask, m.stk, &m.stop, ent)
			if !ok {
				return nil, errClosed
			}
			ent.maxDist = d
			m.cache.put(m.keyBuf, ent)
		}
		if len(m.e.masks) >= maxEngineMasks {
			clear(m.e.masks)
		}
		m.e.masks[m.state] = ent
	}
	if m.budget < 0 || int32(m.budget-2) >= ent.maxDist {
		return ent.mask, nil
	}
	st := m.e.states[m.state]
	if ent.budgetMask(m.own, max(int32(m.budget-2), st.dist-1), st.complete, m.v.eog) {
		return m.own, nil
	}
	if _, ok := m.e.computeMask(m.v, m.state, m.budget, m.own, m.stk, &m.stop, nil); !ok {
		return nil, errClosed
	}
	return m.own, nil
}

// Allowed returns the tokens that may come next as a bitset (bit id%64 of
// word id/64), waiting for the background computation. The slice is
// read-only and valid until the next Accept.
func (m *Matcher) Allowed() ([]uint64, error) {
	if m.ready == nil && !m.valid {
		m.launch()
	}
	if m.ready != nil {
		t0 := time.Now()
		m.wait()
		stats.blocked.Add(int64(time.Since(t0)))
	}
	stats.masks.Add(1)
	return m.mask, m.err
}

// Accept advances past token id and starts computing the next mask. An
// end-of-generation token ends the sequence; it is allowed only when the
// output is complete. A token the grammar rejects is an error wrapping
// ErrRejected and leaves the state unchanged.
func (m *Matcher) Accept(id int32) error {
	m.wait()
	if m.done {
		return fmt.Errorf("constrain: token %d after the end: %w", id, ErrRejected)
	}
	if m.lazy {
		return m.acceptLazy(id)
	}
	if slices.Contains(m.v.eog, id) {
		if !m.e.states[m.state].complete {
			return fmt.Errorf("constrain: end of generation before the output is complete: %w", ErrRejected)
		}
		m.done = true
		return nil
	}
	p, ok := m.v.piece(id)
	if !ok {
		return fmt.Errorf("constrain: token %d has no text: %w", id, ErrRejected)
	}
	s := m.state
	for _, b := range p {
		if s = m.e.next(s, b); s < 0 {
			return fmt.Errorf("constrain: token %d (%q): %w", id, p, ErrRejected)
		}
	}
	m.state = s
	if m.budget > 0 {
		m.budget--
	}
	m.valid = false
	if m.budget != 0 { // a spent budget ends the sequence: no mask is read
		m.launch()
	}
	return nil
}

// Complete reports whether the output so far is a whole sentence of the
// grammar (an end-of-generation token would be allowed).
func (m *Matcher) Complete() bool {
	m.wait()
	return m.e != nil && m.e.states[m.state].complete
}

// Close waits for the background computation; the Matcher is not used
// after.
func (m *Matcher) Close() {
	m.stop.Store(true)
	m.wait()
	m.done = true
	if m.e != nil {
		m.cache.putEngine(m.e)
		m.e = nil
	}
}

// piece returns the bytes of token id.
func (v *Vocab) piece(id int32) ([]byte, bool) {
	if id < 0 || int(id) >= len(v.pieces) || len(v.pieces[id]) == 0 {
		return nil, false
	}
	return v.pieces[id], true
}

// Accepts reports whether s is a complete sentence of g (for tests and
// for checking output after the fact).
func (g *Grammar) Accepts(s string) bool {
	e := newEngine(g)
	st := e.start()
	for i := 0; i < len(s); i++ {
		if st = e.next(st, s[i]); st < 0 {
			return false
		}
	}
	return e.states[st].complete
}

// acceptLazy takes a token before any trigger: the end of generation ends
// the sequence; otherwise the output's tail is searched for a trigger, and
// from the earliest one found the grammar takes over with the bytes from
// there.
func (m *Matcher) acceptLazy(id int32) error {
	if m.budget > 0 {
		m.budget--
	}
	if slices.Contains(m.v.eog, id) {
		m.done = true
		return nil
	}
	p, _ := m.v.piece(id)
	m.tail = append(m.tail, p...)
	at := -1
	for _, t := range m.g.triggers {
		if i := bytes.Index(m.tail, []byte(t)); i >= 0 && (at < 0 || i < at) {
			at = i
		}
	}
	if at < 0 {
		// Keep only what could still be the start of a trigger.
		keep := 0
		for _, t := range m.g.triggers {
			keep = max(keep, len(t)-1)
		}
		if len(m.tail) > keep {
			m.tail = append(m.tail[:0], m.tail[len(m.tail)-keep:]...)
		}
		m.valid = false
		if m.budget != 0 {
			m.launch()
		}
		return nil
	}
	s := m.state
	for _, b := range m.tail[at:] {
		if s = m.e.next(s, b); s < 0 {
			return fmt.Errorf("constrain: the text after trigger %q: %w", m.tail[at:], ErrRejected)
		}
	}
	m.state, m.lazy, m.tail = s, false, nil
	m.valid = false
	if m.budget != 0 {
		m.launch()
	}
	return nil
}
