package sample

import (
	"errors"
	"testing"
)

// allowSet is a Constraint that allows a fixed set of tokens and records
// what it was given.
type allowSet struct {
	mask     []uint64
	accepted []int32
	closed   bool
}

func newAllowSet(vocab int, ids ...int32) *allowSet {
	a := &allowSet{mask: make([]uint64, (vocab+63)/64)}
	for _, id := range ids {
		a.mask[id/64] |= 1 << (id % 64)
	}
	return a
}

func (a *allowSet) Allowed() ([]uint64, error) { return a.mask, nil }
func (a *allowSet) Accept(id int32) error {
	a.accepted = append(a.accepted, id)
	return nil
}
func (a *allowSet) Close() { a.closed = true }

func TestConstraintRestrictsPicks(t *testing.T) {
	const vocab = 200
	logits := make([]float32, vocab)
	for i := range logits {
		logits[i] = float32(i % 50) // the best tokens are 49, 99, 149, 199
	}
	for _, p := range []Params{{}, Defaults(), {Temp: 1.5, RepeatPenalty: 1.3, PresencePenalty: 0.5}} {
		s := New(p, vocab)
		c := newAllowSet(vocab, 3, 70, 130)
		s.SetConstraint(c)
		if !s.NeedsFullRow() {
			t.Fatal("a constrained sampler must read the whole row")
		}
		s.Accept(5) // a prompt token: not the constraint's
		for range 50 {
			id, err := s.Sample(logits)
			if err != nil {
				t.Fatal(err)
			}
			if id != 3 && id != 70 && id != 130 {
				t.Fatalf("%+v: picked %d, not allowed", p, id)
			}
			if p.Greedy() && id != 130 { // allowed logits 3, 20, 30
				t.Fatalf("greedy picked %d, want 130", id)
			}
			s.Accept(id)
		}
		if len(c.accepted) != 50 || c.accepted[0] == 5 {
			t.Fatalf("constraint saw %d tokens (%v…), want the 50 generated ones", len(c.accepted), c.accepted[:1])
		}
		s.Close()
		if !c.closed {
			t.Fatal("Close did not close the constraint")
		}
	}
	s := New(Params{}, vocab)
	s.SetConstraint(newAllowSet(vocab))
	if _, err := s.Sample(logits); !errors.Is(err, ErrNoAllowedToken) {
		t.Fatalf("empty mask: %v, want ErrNoAllowedToken", err)
	}
	logits[7] = float32(nanf())
	s = New(Params{}, vocab)
	s.SetConstraint(newAllowSet(vocab, 3))
	if _, err := s.Sample(logits); !errors.Is(err, ErrNonFinite) {
		t.Fatalf("NaN logit: %v, want ErrNonFinite", err)
	}
}

func nanf() float64 {
	z := 0.0
	return z / z
}
