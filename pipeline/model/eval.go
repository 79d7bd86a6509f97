package model

import (
	"context"
	"fmt"
)

// ForwardAll evaluates tokens at positions pos0… in one step, on a model
// made with AllLogits, and returns every token's logits ([n][Vocab]) and,
// with hidden, every token's final hidden state after the output norm
// ([n][Embd]): what perplexity scores and what an embedding pools, the
// same vector llama.cpp takes as a token's embedding. At most Batch
// tokens: a longer text is evaluated piece by piece by the caller, each
// piece at the position where the last one ended.
//
// It reuses the step of Forward unchanged: with every row kept through the
// last block, the output head's input (the normed rows) is left in the
// scratch, and is read back before the next step overwrites it. The
// returned slices are the caller's.
func (m *Model) ForwardAll(ctx context.Context, tokens []int32, pos0 int, hidden bool) (logits, states []float32, err error) {
	n := len(tokens)
	switch {
	case !m.allLogits:
		return nil, nil, fmt.Errorf("model: ForwardAll needs a model made with AllLogits")
	case m.bat != nil:
		return nil, nil, fmt.Errorf("model: ForwardAll on a batched model")
	case n == 0:
		return nil, nil, fmt.Errorf("model: forward of no tokens")
	case n > m.batch:
		return nil, nil, fmt.Errorf("model: %d tokens in one step exceed the batch of %d", n, m.batch)
	case pos0 < 0 || pos0+n > m.ctx:
		return nil, nil, fmt.Errorf("model: positions [%d, %d) outside the %d-position context", pos0, pos0+n, m.ctx)
	}
	if err := m.step(ctx, tokens, pos0, n); err != nil {
		return nil, nil, err
	}
	c := m.Cfg
	logits = make([]float32, n*c.Vocab)
	if err := m.be.Read(logits, m.s.logits, 0); err != nil {
		return nil, nil, fmt.Errorf("model: reading logits: %w", err)
	}
	if hidden {
		states = make([]float32, n*c.Embd)
		if err := m.be.Read(states, m.s.rows(0, n, c).xb, 0); err != nil {
			return nil, nil, fmt.Errorf("model: reading hidden states: %w", err)
		}
	}
	return logits, states, nil
}
