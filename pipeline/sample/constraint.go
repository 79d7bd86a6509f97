package sample

// Constraint restricts which tokens a sequence may generate next: the hook
// constrained decoding (a JSON schema, a grammar, a tool call's arguments)
// plugs into. A Sampler with Params.Constraint set asks it before every
// pick and tells it every generated token; a constraint is stateful, one
// per sequence.
type Constraint interface {
	// Allow marks in allow ([vocab], all false on entry) the tokens that
	// may come next. Marking none ends the sequence's choices: Sample
	// fails with ErrNoLogits.
	Allow(allow []bool)
	// Accept advances the constraint past a generated token.
	Accept(id int32)
}

// constrain drops the candidates the constraint does not allow.
func (s *Sampler) constrain(c []candidate) []candidate {
	if len(s.allow) != len(c) {
		s.allow = make([]bool, len(c))
	} else {
		clear(s.allow)
	}
	s.p.Constraint.Allow(s.allow)
	kept := c[:0]
	for _, x := range c {
		if s.allow[x.id] {
			kept = append(kept, x)
		}
	}
	return kept
}
