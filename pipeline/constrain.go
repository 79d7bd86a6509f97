package pipeline

import (
	"fmt"
	"sync"

	"github.com/forge-llm/forge/pipeline/constrain"
	"github.com/forge-llm/forge/pipeline/sample"
	"github.com/forge-llm/forge/pipeline/tokenizer"
)

// constrainVocab is a model's vocabulary for constrained decoding, built
// on the first constrained request (a 128k vocabulary's trie takes tens of
// milliseconds).
type constrainVocab struct {
	once sync.Once
	v    *constrain.Vocab
}

// vocab returns the constrain.Vocab of tok for a model of n token ids:
// each token's bytes as the output stream shows them, control and unused
// tokens none (never allowed), end-of-generation tokens allowed only when
// the output is complete.
func (c *constrainVocab) vocab(tok *tokenizer.Tokenizer, n int) *constrain.Vocab {
	c.once.Do(func() {
		pieces := make([][]byte, n)
		var eog []int32
		for id := range min(n, tok.VocabSize()) {
			switch {
			case tok.IsEOG(int32(id)):
				eog = append(eog, int32(id))
			case tok.TokenType(int32(id)) == tokenizer.TypeNormal || tok.TokenType(int32(id)) == tokenizer.TypeByte || tok.TokenType(int32(id)) == tokenizer.TypeUserDefined:
				pieces[id] = []byte(tok.Piece(int32(id)))
			}
		}
		c.v = constrain.NewVocab(pieces, eog)
	})
	return c.v
}

// constrainSampler attaches o.Grammar's matcher to smp for a sequence
// that may generate at most budget tokens (≤ 0: no bound). It fails
// without a tokenizer (the grammar is over text) and when o asks to ignore
// end-of-generation tokens (a complete output could never end).
func (m *Model) constrainSampler(smp *sample.Sampler, o GenerateOptions, tok *tokenizer.Tokenizer, budget int) error {
	if o.Constraint != nil {
		if o.Grammar != nil {
			return fmt.Errorf("pipeline: a request takes a grammar or another constraint, not both")
		}
		smp.SetConstraint(o.Constraint)
		return nil
	}
	if o.Grammar == nil {
		return nil
	}
	if tok == nil {
		return fmt.Errorf("pipeline: constrained output needs the model's tokenizer")
	}
	if o.IgnoreEOG {
		return fmt.Errorf("pipeline: constrained output cannot ignore end-of-generation tokens")
	}
	if o.MaxTokens > 0 && (budget <= 0 || o.MaxTokens < budget) {
		budget = o.MaxTokens
	}
	smp.SetConstraint(o.Grammar.NewMatcher(m.cvocab.vocab(tok, m.cfg.Vocab), budget))
	return nil
}
