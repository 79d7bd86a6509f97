package pipeline

import (
	"context"
	"slices"
	"strings"
	"sync"

	"github.com/forge-llm/forge/pipeline/tokenizer"
)

// Continuations: a conversation's next turn resends the history and the
// reply the server generated, as text. Tokenized again, the reply's text
// need not give the ids it was generated as (a byte-level vocabulary
// without merges gives several tokens for each generated one; a BPE can
// split differently at a boundary), and the prefix cache, which matches
// ids, then misses from the reply on: the server computes again what it
// had just computed. So a batching model remembers the text and ids of
// its latest requests (prompt and reply), and a text prompt that starts
// with one of those texts keeps its ids and tokenizes only the rest.
//
// The ids then differ from a fresh tokenization of the whole prompt (they
// decode to the same text), and which ids a prompt gets depends on the
// requests before it: a --deterministic server keeps none (as it shares
// no prefix blocks either).

// maxContinuations is how many finished requests a model remembers.
const maxContinuations = 64

// minContinuation is the fewest ids a remembered request must have: a
// shorter one (less than two 16-position blocks) saves little.
const minContinuation = 32

// continuation is one finished request: the text of its prompt and reply
// and their ids.
type continuation struct {
	text string
	ids  []int32
}

// continuations is a model's remembered requests, most recent last.
type continuations struct {
	mu      sync.Mutex
	entries []continuation
}

// add remembers a finished request's prompt and reply.
func (c *continuations) add(text string, ids []int32) {
	if len(ids) < minContinuation || text == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries = slices.DeleteFunc(c.entries, func(e continuation) bool { return e.text == text })
	if len(c.entries) == maxContinuations {
		c.entries = slices.Delete(c.entries, 0, 1)
	}
	c.entries = append(c.entries, continuation{text: text, ids: ids})
}

// longest returns the remembered request with the longest text that
// begins prompt.
func (c *continuations) longest(prompt string) (continuation, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	best, ok := continuation{}, false
	for _, e := range c.entries {
		if len(e.text) > len(best.text) && strings.HasPrefix(prompt, e.text) {
			best, ok = e, true
		}
	}
	return best, ok
}

// encode returns the ids of prompt where it begins with a remembered
// request's text: that request's ids, then the rest of the text tokenized
// as a continuation (no dummy-prefix space in front of it); else nil. The
// remembered text is the request's prompt and its reply as the client
// received it (replyText), so the ids stand for the prompt's text as a
// fresh tokenization does, cut differently. The rest is tokenized under
// ctx (a long one stops when the request is cancelled: then nil, and the
// caller's own tokenizing reports ctx's error).
func (c *continuations) encode(ctx context.Context, tok *tokenizer.Tokenizer, prompt string) []int32 {
	e, ok := c.longest(prompt)
	if !ok {
		return nil
	}
	ids := slices.Clip(e.ids)
	if rest := prompt[len(e.text):]; rest != "" {
		more, err := tok.EncodeContext(ctx, rest, tokenizer.EncodeOptions{Continue: true})
		if err != nil {
			return nil
		}
		ids = append(ids, more...)
	}
	return ids
}

// replyText is the text a reply's ids add after the prompt's ids: what a
// client streaming the reply received.
func replyText(tok *tokenizer.Tokenizer, prompt, reply []int32) (string, bool) {
	all := tok.Decode(append(slices.Clip(prompt), reply...))
	return strings.CutPrefix(all, tok.Decode(prompt))
}

// continuing reports whether m keeps continuations: a batching model
// whose scheduler runs (the requests it remembers ran batched, and a
// prompt's ids go to the scheduler's prefix cache), not deterministic,
// with a vocabulary that does not end every prompt with EOS.
func (m *Model) continuing(tok *tokenizer.Tokenizer) bool {
	if !m.opts.Batching.On || m.opts.Batching.Deterministic || tok == nil || tok.ShouldAddEOS() {
		return false
	}
	b := &m.batch
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sched != nil
}

// continued returns prompt's ids from a remembered request it continues,
// or nil.
func (m *Model) continued(ctx context.Context, tok *tokenizer.Tokenizer, prompt string) []int32 {
	if !m.continuing(tok) {
		return nil
	}
	return m.conts.encode(ctx, tok, prompt)
}

// remember keeps a finished request's text prompt and reply, where the
// reply's text is what its ids decode to after the prompt's (no stop
// string cut it, no tool call was taken out of it).
func (m *Model) remember(tok *tokenizer.Tokenizer, prompt string, ids, reply []int32, text string) {
	if !m.continuing(tok) {
		return
	}
	if got, ok := replyText(tok, ids, reply); ok && got == text {
		m.conts.add(prompt+text, append(slices.Clip(ids), reply...))
	}
}
