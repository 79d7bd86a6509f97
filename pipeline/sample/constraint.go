package sample

import (
	"errors"
	"fmt"
	mbits "math/bits"
)

// ErrNoAllowedToken is returned (wrapped) by Sample when a constraint
// allows no token at all.
var ErrNoAllowedToken = errors.New("no token satisfies the constraint")

// Constraint restricts which tokens Sample may pick: constrained decoding
// (package constrain's Matcher implements it). Sample picks only among the
// tokens Allowed reports, with the same method (greedy or the sampling
// chain) over the rest; every generated token is passed to Accept (tokens
// accepted before the first Sample are the prompt and are not).
type Constraint interface {
	// Allowed returns the allowed tokens as a bitset (bit id%64 of word
	// id/64), waiting if the constraint is still computing it.
	Allowed() ([]uint64, error)
	// Accept advances past a generated token and may start computing the
	// next set in the background.
	Accept(id int32) error
	// Close ends background work; the constraint is not used after.
	Close()
}

// SetConstraint makes the sampler pick only tokens c allows (nil: none).
// The sampler then always needs the whole row of logits (see
// NeedsFullRow). Close closes it.
func (s *Sampler) SetConstraint(c Constraint) { s.con = c }

// NeedsFullRow reports whether Sample needs the whole row of logits for
// a pick: its parameters do (Params.FullRow) or a constraint does.
func (s *Sampler) NeedsFullRow() bool { return s.p.FullRow() || s.con != nil }

// Close releases the constraint's background work, if any. A sampler is
// closed by whoever made it once its sequence ends.
func (s *Sampler) Close() {
	if s.con != nil {
		s.con.Close()
	}
}

// allowedCandidates keeps the candidates the constraint allows (c holds
// every token in id order, so c[id] is token id; the kept ones stay in id
// order).
func (s *Sampler) allowedCandidates(c []candidate) ([]candidate, error) {
	if s.conErr != nil {
		return nil, s.conErr
	}
	mask, err := s.con.Allowed()
	if err != nil {
		return nil, fmt.Errorf("sample: constraint: %w", err)
	}
	k := 0
	for w, bits := range mask {
		for bits != 0 {
			id := w*64 + mbits.TrailingZeros64(bits)
			bits &= bits - 1
			if id >= len(c) {
				break
			}
			c[k] = c[id]
			k++
		}
	}
	if k == 0 {
		return nil, fmt.Errorf("sample: %w", ErrNoAllowedToken)
	}
	return c[:k], nil
}

// maskedCandidates fills the sampler's scratch with the allowed tokens of
// logits, in id order.
func (s *Sampler) maskedCandidates(logits []float32) ([]candidate, error) {
	if s.conErr != nil {
		return nil, s.conErr
	}
	mask, err := s.con.Allowed()
	if err != nil {
		return nil, fmt.Errorf("sample: constraint: %w", err)
	}
	c := s.cand[:0]
	for w, bits := range mask {
		for bits != 0 {
			id := w*64 + mbits.TrailingZeros64(bits)
			bits &= bits - 1
			if id >= len(logits) {
				break
			}
			c = append(c, candidate{id: int32(id), logit: logits[id]})
		}
	}
	if len(c) == 0 {
		return nil, fmt.Errorf("sample: %w", ErrNoAllowedToken)
	}
	return c, nil
}
