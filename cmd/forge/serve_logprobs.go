package main

import (
	"encoding/json"
	"net/http"
	"slices"
	"sync"

	"github.com/forge-llm/forge/pipeline"
	"github.com/forge-llm/forge/pipeline/sample"
	"github.com/forge-llm/forge/pipeline/tokenizer"
)

// maxCompletionLogprobs is OpenAI's bound on a completion's logprobs.
const maxCompletionLogprobs = 5

// parseLogprobs reads OpenAI's logprobs fields: on chat, "logprobs" is a
// bool and "top_logprobs" (0 to 20) needs it; on completions,
// "logprobs" is the number of alternatives (0 to 5). It returns whether
// logprobs are wanted and how many alternatives.
func parseLogprobs(req completionRequest, chatReq bool) (bool, int, error) {
	raw := req.Logprobs
	null := len(raw) == 0 || string(raw) == "null"
	if chatReq {
		var on bool
		if !null {
			if err := json.Unmarshal(raw, &on); err != nil {
				return false, 0, &sample.FieldError{Field: "logprobs", Value: string(raw), Reason: "must be a boolean on chat completions"}
			}
		}
		top := 0
		if req.TopLogprobs != nil {
			top = *req.TopLogprobs
			if top < 0 || top > 20 {
				return false, 0, &sample.FieldError{Field: "top_logprobs", Value: top, Reason: "must be in [0, 20]"}
			}
			if top > 0 && !on {
				return false, 0, &sample.FieldError{Field: "top_logprobs", Value: top, Reason: "needs logprobs: true"}
			}
		}
		return on, top, nil
	}
	if req.TopLogprobs != nil {
		return false, 0, badRequest("top_logprobs is a chat completions field (completions take logprobs: N)")
	}
	if null {
		return false, 0, nil
	}
	var n int
	if err := json.Unmarshal(raw, &n); err != nil || n < 0 || n > maxCompletionLogprobs {
		return false, 0, &sample.FieldError{Field: "logprobs", Value: string(raw), Reason: "must be an integer in [0, 5] on completions"}
	}
	return true, n, nil
}

// logprobCollector gathers a generation's picks from the sampler, which
// calls it on the model's executor.
type logprobCollector struct {
	mu  sync.Mutex
	lps []sample.Logprob
}

func (c *logprobCollector) add(lp sample.Logprob) {
	c.mu.Lock()
	c.lps = append(c.lps, lp)
	c.mu.Unlock()
}

// forTokens is the picks of the returned tokens: the sampler also saw
// the end-of-generation token that is not returned.
func (c *logprobCollector) forTokens(ids []int32) []sample.Logprob {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for n < len(ids) && n < len(c.lps) && c.lps[n].ID == ids[n] {
		n++
	}
	return c.lps[:n]
}

// bytesOf is a piece's bytes, as OpenAI gives them beside the text.
func bytesOf(p string) []int {
	b := make([]int, len(p))
	for i := range len(p) {
		b[i] = int(p[i])
	}
	return b
}

// chatLogprobs is a chat choice's "logprobs": {"content": [...]}.
func chatLogprobs(tok *tokenizer.Tokenizer, lps []sample.Logprob) map[string]any {
	type alt struct {
		Token   string  `json:"token"`
		Logprob float32 `json:"logprob"`
		Bytes   []int   `json:"bytes"`
	}
	type entry struct {
		alt
		Top []alt `json:"top_logprobs"`
	}
	content := make([]entry, len(lps))
	for i, lp := range lps {
		p := tok.Piece(lp.ID)
		e := entry{alt: alt{Token: p, Logprob: lp.Logprob, Bytes: bytesOf(p)}, Top: []alt{}}
		for _, t := range lp.Top {
			tp := tok.Piece(t.ID)
			e.Top = append(e.Top, alt{Token: tp, Logprob: t.Logprob, Bytes: bytesOf(tp)})
		}
		content[i] = e
	}
	return map[string]any{"content": content}
}

// completionLogprobs is a completion choice's "logprobs" in the legacy
// shape: tokens, token_logprobs, top_logprobs (token → logprob) and
// text_offset (each token's byte offset in the text, the first at base).
func completionLogprobs(tok *tokenizer.Tokenizer, lps []sample.Logprob, base int) map[string]any {
	tokens := make([]string, len(lps))
	lp := make([]float32, len(lps))
	top := make([]map[string]float32, len(lps))
	off := make([]int, len(lps))
	at := base
	for i, l := range lps {
		tokens[i], lp[i], off[i] = tok.Piece(l.ID), l.Logprob, at
		at += len(tokens[i])
		top[i] = map[string]float32{}
		for _, t := range l.Top {
			top[i][tok.Piece(t.ID)] = t.Logprob
		}
	}
	return map[string]any{"tokens": tokens, "token_logprobs": lp, "top_logprobs": top, "text_offset": off}
}

// addLogprobs puts each choice's logprobs in; the tokenizer is the
// model's (still loaded: the request just ran on it).
func (s *server) addLogprobs(r *http.Request, model string, chatReq bool, choices []any, results []pipeline.EngineResult, cols []*logprobCollector) error {
	tok, release, err := s.tokenizer(r, model)
	if err != nil {
		return err
	}
	defer release()
	for i, c := range choices {
		lps := cols[i].forTokens(results[i].Tokens)
		if chatReq {
			c.(map[string]any)["logprobs"] = chatLogprobs(tok, lps)
		} else {
			c.(map[string]any)["logprobs"] = completionLogprobs(tok, lps, 0)
		}
	}
	return nil
}

// streamLogprobs gives each streamed chunk the picks the sampler made
// since the previous chunk: a chunk's text and its tokens come from the
// same stretch of generation, though text held back while it may begin a
// stop string arrives a chunk later than its token's logprob. The last
// chunk takes the rest, without the end-of-generation pick that is not a
// returned token.
type streamLogprobs struct {
	col  *logprobCollector
	tok  *tokenizer.Tokenizer
	chat bool
	sent int
	off  int // bytes of the pieces sent: the next text_offset
}

// next is the "logprobs" of the next chunk: the picks not yet sent (with
// final, only those of the returned tokens).
func (sl *streamLogprobs) next(final bool, tokens []int32) any {
	var lps []sample.Logprob
	if final {
		lps = sl.col.forTokens(tokens)
	} else {
		sl.col.mu.Lock()
		lps = slices.Clone(sl.col.lps)
		sl.col.mu.Unlock()
	}
	if sl.sent >= len(lps) {
		lps = nil
	} else {
		lps = lps[sl.sent:]
	}
	sl.sent += len(lps)
	if sl.chat {
		return chatLogprobs(sl.tok, lps)
	}
	base := sl.off
	for _, l := range lps {
		sl.off += len(sl.tok.Piece(l.ID))
	}
	return completionLogprobs(sl.tok, lps, base)
}
