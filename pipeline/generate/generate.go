// Package generate is the text generation loop: evaluate the prompt (in
// batches), then sample and feed back one token at a time until an
// end-of-generation token, the token limit or the end of the context.
package generate

import (
	"context"
	"fmt"
	"time"

	"github.com/forge-llm/forge/pipeline/model"
	"github.com/forge-llm/forge/pipeline/sample"
)

// Options control one generation.
type Options struct {
	MaxTokens int             // most tokens to generate; ≤ 0: until EOG or a full context
	Sampler   *sample.Sampler // nil: greedy
	// IsEOG reports end-of-generation tokens (EOS, EOT, …); such a token
	// ends the generation and is not returned. nil: never stop on a token.
	IsEOG func(id int32) bool
	// OnToken receives each generated token as soon as it is sampled; an
	// error from it stops the generation and is returned.
	OnToken func(id int32) error
}

// Stop reasons.
const (
	StopEOG       = "eog"
	StopMaxTokens = "max_tokens"
	StopContext   = "context_full"
)

// Stats are the timings of one generation.
type Stats struct {
	PromptTokens int
	PromptTime   time.Duration // evaluating the prompt, up to its logits
	FirstToken   time.Duration // from the start to the first sampled token
	Generated    int           // tokens returned
	DecodeSteps  int           // single-token forward steps
	DecodeTime   time.Duration // time spent in those steps and their sampling
	Stop         string        // why generation ended
}

// PromptRate is prompt tokens per second.
func (s Stats) PromptRate() float64 { return rate(s.PromptTokens, s.PromptTime) }

// DecodeRate is decoded tokens per second (forward step and sampling).
func (s Stats) DecodeRate() float64 { return rate(s.DecodeSteps, s.DecodeTime) }

func rate(n int, d time.Duration) float64 {
	if n == 0 || d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

// Run generates a continuation of prompt, which starts at position 0 of
// m's KV cache. It returns the generated ids (without a final EOG token).
func Run(ctx context.Context, m *model.Model, prompt []int32, o Options) ([]int32, Stats, error) {
	var st Stats
	st.PromptTokens = len(prompt)
	if len(prompt) == 0 {
		return nil, st, fmt.Errorf("generate: empty prompt")
	}
	if len(prompt) > m.Ctx() {
		return nil, st, fmt.Errorf("generate: prompt of %d tokens does not fit the %d-position context", len(prompt), m.Ctx())
	}
	smp := o.Sampler
	if smp == nil {
		smp = sample.New(sample.Params{}, m.Cfg.Vocab)
	}
	for _, id := range prompt {
		smp.Accept(id)
	}
	out := make([]int32, 0, max(o.MaxTokens, 0))
	// A greedy pick with no penalty needs only the argmax, which the
	// model takes on the device where it can (no row of logits copied).
	p := smp.Params()
	greedy := p.Greedy() && !smp.NeedsFullRow()
	var logits []float32
	var next int32
	eval := func(tokens []int32, pos int) error {
		var err error
		if greedy {
			next, err = m.Greedy(ctx, tokens, pos)
		} else {
			logits, err = m.Forward(ctx, tokens, pos)
		}
		return err
	}

	// failed names why a step failed: a cancelled request is reported as
	// interrupted, not as whatever wait the cancellation happened to cut
	// short (a layer wait, say, though every layer was resident).
	failed := func(what string, err error) error {
		if cerr := ctx.Err(); cerr != nil {
			return fmt.Errorf("generate: interrupted at %s after %d tokens: %w", what, st.Generated, cerr)
		}
		return fmt.Errorf("generate: %s: %w", what, err)
	}

	start := time.Now()
	// The prompt's row of logits is always read, even when greedy, so a
	// model whose weights or hyper-parameters overflow fails here with
	// sample.ErrNonFinite instead of emitting argmaxes of NaN.
	var err error
	if logits, err = m.Forward(ctx, prompt, 0); err != nil {
		return nil, st, failed("prompt", err)
	}
	st.PromptTime = time.Since(start)
	if v := m.Cfg.Vocab; len(logits) > v { // AllLogits: the last token's row
		logits = logits[len(logits)-v:]
	}
	if next, err = smp.Sample(logits); err != nil {
		return nil, st, failed("prompt", err)
	}

	var tok [1]int32 // the fed-back token; an array so decoding allocates nothing
	pos := len(prompt)
	var decodeStart time.Time
	for {
		id := next
		if !greedy && st.Generated > 0 {
			var err error
			if id, err = smp.Sample(logits); err != nil {
				return out, st, failed(fmt.Sprintf("position %d", pos), err)
			}
		}
		if st.Generated == 0 {
			st.FirstToken = time.Since(start)
		} else {
			st.DecodeTime += time.Since(decodeStart)
		}
		if o.IsEOG != nil && o.IsEOG(id) {
			st.Stop = StopEOG
			break
		}
		smp.Accept(id)
		out = append(out, id)
		st.Generated++
		if o.OnToken != nil {
			if err := o.OnToken(id); err != nil {
				return out, st, err
			}
		}
		if o.MaxTokens > 0 && st.Generated >= o.MaxTokens {
			st.Stop = StopMaxTokens
			break
		}
		if pos >= m.Ctx() {
			st.Stop = StopContext
			break
		}
		decodeStart = time.Now()
		tok[0] = id
		if err := eval(tok[:], pos); err != nil {
			return out, st, failed(fmt.Sprintf("position %d", pos), err)
		}
		pos++
		st.DecodeSteps++
	}
	return out, st, nil
}
