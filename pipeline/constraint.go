package pipeline

import (
	"fmt"

	"github.com/forge-llm/forge/pipeline/sample"
	"github.com/forge-llm/forge/pipeline/tokenizer"
)

// Constraint restricts a request's tokens (see sample.Constraint).
type Constraint = sample.Constraint

// ConstraintFactory makes a request's constraint once its model's
// tokenizer is known. This is where constrained decoding plugs in: a JSON
// schema or grammar compiled to a token automaton, or, for a request with
// tools, the tool-call format of the model with the arguments held to the
// function's parameters schema (EngineOptions.ToolConstraint). It is
// called once per request, before the request is queued, with the request
// as it runs: r.Template is the template its prompt was rendered with (nil
// for a completion), whose Family gives the call format (chat.ToolCallText
// writes it; the schema is r.Tools[i].Function.Parameters, the tools
// offered depend on r.ToolChoice). An error refuses the request.
type ConstraintFactory func(tok *tokenizer.Tokenizer, r *EngineRequest) (Constraint, error)

// ForceText is a ConstraintFactory whose output is exactly text (encoded
// with special tokens parsed, as a template's text is), then an
// end-of-generation token. It serves tests and demonstrations that need a
// model to answer something known (a tool call, from a tiny model that
// would never write one), and prefilled answers.
func ForceText(text string) ConstraintFactory {
	return func(tok *tokenizer.Tokenizer, _ *EngineRequest) (Constraint, error) {
		ids, err := tok.Encode(text, tokenizer.EncodeOptions{ParseSpecial: true})
		if err != nil {
			return nil, fmt.Errorf("pipeline: forced text: %w", err)
		}
		if tok.EOS() < 0 {
			return nil, fmt.Errorf("pipeline: forced text: the vocabulary has no end-of-sequence token")
		}
		return &forced{ids: ids, eos: tok.EOS(), mask: make([]uint64, (tok.VocabSize()+63)/64)}, nil
	}
}

// forced allows the next token of ids, then EOS.
type forced struct {
	ids  []int32
	eos  int32
	n    int
	mask []uint64 // the one allowed token's bit (sample.Constraint's bitset)
}

func (f *forced) Allowed() ([]uint64, error) {
	next := f.eos
	if f.n < len(f.ids) {
		next = f.ids[f.n]
	}
	clear(f.mask)
	if int(next)/64 < len(f.mask) {
		f.mask[next/64] |= 1 << (next % 64)
	}
	return f.mask, nil
}

func (f *forced) Accept(int32) error { f.n++; return nil }

func (f *forced) Close() {}
