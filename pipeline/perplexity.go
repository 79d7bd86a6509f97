package pipeline

import (
	"context"
	"fmt"
	"math"

	"github.com/forge-llm/forge/pipeline/model"
	"github.com/forge-llm/forge/pipeline/tokenizer"
)

// PerplexityOptions control Model.Perplexity.
type PerplexityOptions struct {
	// Ctx is the window: the text is cut into chunks of Ctx tokens (0:
	// the model's context length, at most model.DefaultMaxCtx).
	Ctx int
	// Batch is the most tokens per forward step (0: Ctx, at most
	// model.DefaultBatch). It changes the speed, not the estimate.
	Batch int
	// OnChunk, when set, receives the running estimate after each chunk
	// (chunk counts from 1), as llama-perplexity prints it.
	OnChunk func(chunk, chunks int, ppl float64)
}

// PerplexityResult is a finished estimate.
type PerplexityResult struct {
	PPL    float64 // exp(mean negative log-likelihood)
	StdErr float64 // its standard error, as llama-perplexity estimates it
	Ctx    int     // the window
	Chunks int     // windows evaluated
	Tokens int     // tokens of the text, BOS included
	Scored int     // tokens whose likelihood was counted
}

// Perplexity estimates the model's perplexity on text the way llama.cpp's
// llama-perplexity does, so that its numbers compare with the ones users
// know:
//
//   - the text is tokenized once, with BOS when the vocabulary asks;
//   - it is cut into floor(tokens/Ctx) chunks of Ctx tokens (the tail is
//     dropped) and each chunk is evaluated from position 0 with an empty
//     cache, its first token replaced by BOS when the vocabulary adds one;
//   - only the second half of each window is scored: the logits at
//     positions Ctx/2 … Ctx-2 predict the tokens after them, so every
//     scored token has at least Ctx/2 tokens of context;
//   - the estimate is exp of the mean negative log-likelihood over every
//     scored token so far (log-softmax with the maximum subtracted, sums
//     in float64).
//
// On a GPU the windows' keys and values are kept in float32, as the CPU
// keeps them (and as llama-perplexity's exact reference, -ctk f32 -ctv
// f32, does), so that both backends compute the same estimate.
//
// The text must have at least 2·Ctx tokens, as llama-perplexity demands.
func (m *Model) Perplexity(ctx context.Context, text string, o PerplexityOptions) (PerplexityResult, error) {
	n := o.Ctx
	if n <= 0 {
		n = ctxPositions(m.cfg, Options{})
	}
	if n < 4 {
		return PerplexityResult{}, fmt.Errorf("pipeline: perplexity: a context of %d tokens is too short (at least 4)", n)
	}
	batch := o.Batch
	if batch <= 0 {
		batch = min(n, model.DefaultBatch)
	}
	tok, err := m.Tokenizer(ctx)
	if err != nil {
		return PerplexityResult{}, err
	}
	if tok.ShouldAddEOS() {
		// llama-perplexity refuses these too: every chunk would end
		// in an EOS the text does not have.
		return PerplexityResult{}, fmt.Errorf("pipeline: perplexity: the vocabulary adds EOS to every text")
	}
	addBOS := tok.ShouldAddBOS() && tok.BOS() >= 0
	ids, err := tok.EncodeContext(ctx, text, tokenizer.EncodeOptions{AddBOS: addBOS})
	if err != nil {
		return PerplexityResult{}, fmt.Errorf("pipeline: perplexity: tokenizing the text: %w", err)
	}
	if len(ids) < 2*n {
		return PerplexityResult{}, fmt.Errorf("pipeline: perplexity: the text has %d tokens; a context of %d needs at least %d", len(ids), n, 2*n)
	}
	chunks := len(ids) / n
	first := n / 2
	res := PerplexityResult{Ctx: n, Chunks: chunks, Tokens: len(ids)}
	var nll, nll2 float64
	window := make([]int32, n)
	err = m.Evaluate(ctx, EvalOptions{Ctx: n, Batch: batch, KVF32: true}, func(ev *Evaluator) error {
		v := ev.Vocab()
		for c := range chunks {
			start := c * n
			copy(window, ids[start:start+n])
			if addBOS {
				window[0] = tok.BOS()
			}
			err := ev.Window(ctx, window, false, func(at int, logits, _ []float32) error {
				for r := range len(logits) / v {
					pos := at + r
					if pos < first || pos > n-2 {
						continue
					}
					lp := logSoftmaxAt(logits[r*v:(r+1)*v], ids[start+pos+1])
					nll -= lp
					nll2 += lp * lp
					res.Scored++
				}
				return nil
			})
			if err != nil {
				return fmt.Errorf("chunk %d: %w", c+1, err)
			}
			if o.OnChunk != nil {
				o.OnChunk(c+1, chunks, math.Exp(nll/float64(res.Scored)))
			}
		}
		return nil
	})
	if err != nil {
		return PerplexityResult{}, fmt.Errorf("pipeline: perplexity: %w", err)
	}
	mean := nll / float64(res.Scored)
	res.PPL = math.Exp(mean)
	if v := nll2/float64(res.Scored) - mean*mean; v > 0 && res.Scored > 1 {
		res.StdErr = math.Sqrt(v/float64(res.Scored-1)) * res.PPL
	}
	return res, nil
}

// logSoftmaxAt is log p(tok) under the softmax of logits, computed as
// llama-perplexity does: the maximum subtracted, the sum of exponentials
// in float64.
func logSoftmaxAt(logits []float32, tok int32) float64 {
	mx := logits[0]
	for _, x := range logits[1:] {
		mx = max(mx, x)
	}
	var sum float64
	for _, x := range logits {
		sum += float64(float32(math.Exp(float64(x - mx))))
	}
	return float64(logits[tok]-mx) - math.Log(sum)
}
