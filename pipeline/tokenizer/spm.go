package tokenizer

import (
	"context"
	"fmt"
	"strings"
)

// spmModel is SentencePiece's BPE-by-score as llama.cpp implements it
// (llm_tokenizer_spm): start from single UTF-8 characters and repeatedly
// merge the adjacent pair whose concatenation is the vocabulary token of
// highest score (leftmost first among equal scores), until no adjacent pair
// forms a token. A final piece that is not a token is written as byte
// tokens "<0xNN>".
type spmModel struct {
	t         *Tokenizer
	byteToken [256]int32 // "<0xNN>" token of each byte, or the byte's own text, or UNK
	// wordsIndependent: no token has "▁" right after another character, so
	// no merge can cross the start of a word ("x▁" is never a token) and
	// each word can be merged on its own, with the same result as merging
	// the whole text at once, but with a small queue instead of one the
	// size of the text.
	wordsIndependent bool
}

func newSPM(t *Tokenizer) *spmModel {
	m := &spmModel{t: t}
	for b := range 256 {
		id, ok := t.ids[fmt.Sprintf("<0x%02X>", b)]
		if !ok {
			// llama.cpp falls back to a token that is the byte itself.
			id, ok = t.ids[string([]byte{byte(b)})]
		}
		if !ok {
			id = t.unk
		}
		m.byteToken[b] = id
	}
	m.wordsIndependent = true
	for _, s := range t.tokens {
		prev := '▁'
		for _, r := range s {
			if r == '▁' && prev != '▁' {
				m.wordsIndependent = false
			}
			prev = r
		}
	}
	return m
}

// wordStarts calls fn with consecutive parts of text cut before every "▁"
// that follows another character. It steps through the text by characters
// exactly as the merge does (utf8Len), so that with invalid UTF-8, where a
// character can swallow the bytes of a "▁", the parts still start at the
// same characters.
func wordStarts(text string, fn func(string)) {
	start, prev := 0, 0 // start of the part, of the previous character
	for i := 0; i < len(text); {
		n := min(utf8Len(text[i]), len(text)-i)
		if i > 0 && text[i:i+n] == "▁" && text[prev:i] != "▁" {
			fn(text[start:i])
			start = i
		}
		prev = i
		i += n
	}
	fn(text[start:])
}

// utf8Len is the length of a UTF-8 sequence from its first byte alone, as
// llama.cpp's unicode_len_utf8: a stray continuation byte counts as one
// character, and a truncated sequence is cut at the end of the text.
func utf8Len(b byte) int {
	switch {
	case b < 0xC0:
		return 1
	case b < 0xE0:
		return 2
	case b < 0xF0:
		return 3
	}
	return 4
}

// symbol is a piece of the text being merged, in a doubly linked list over
// the text: text[start:start+n]. n == 0 marks a symbol merged into its left
// neighbour.
type symbol struct {
	start, n   int
	prev, next int
}

// spmBigram is a candidate merge of symbols left and right (adjacent when it
// was queued) into a token of the given score; size is the byte length of
// the merged text, to detect a candidate made stale by another merge.
type spmBigram struct {
	left, right int32
	score       float32
	size        int32
}

func (m *spmModel) encode(ctx context.Context, frags []fragment, out []int32, cont bool) ([]int32, error) {
	// A space goes in front of the text (unless it continues earlier
	// text) and after every special token (SentencePiece's
	// add_dummy_prefix), then spaces become "▁".
	prevSpecial := !cont
	var sb strings.Builder
	s := &spmSession{m: m, ctx: ctx}
	words := 0
	for _, f := range frags {
		if s.err != nil {
			return nil, s.err
		}
		if f.tok >= 0 {
			out = append(out, f.tok)
			prevSpecial = true
			continue
		}
		sb.Reset()
		if m.t.addSpacePrefix && prevSpecial {
			sb.WriteString("▁")
		}
		sb.WriteString(strings.ReplaceAll(f.text, " ", "▁"))
		if m.wordsIndependent {
			wordStarts(sb.String(), func(w string) {
				if words++; words%checkEvery == 0 && s.err == nil {
					s.err = ctx.Err()
				}
				if s.err == nil {
					out = s.tokenize(w, out)
				}
			})
		} else {
			out = s.tokenize(sb.String(), out)
		}
		prevSpecial = false
	}
	if s.err != nil {
		return nil, s.err
	}
	return out, nil
}

type spmSession struct {
	m     *spmModel
	ctx   context.Context
	err   error // ctx's error, once seen
	text  string
	syms  []symbol
	queue spmQueue
}

func (s *spmSession) tokenize(text string, out []int32) []int32 {
	s.text = text
	s.syms = s.syms[:0]
	s.queue = s.queue[:0]
	for off := 0; off < len(text); {
		n := min(utf8Len(text[off]), len(text)-off)
		s.syms = append(s.syms, symbol{start: off, n: n, prev: len(s.syms) - 1, next: len(s.syms) + 1})
		off += n
	}
	if len(s.syms) == 0 {
		return out
	}
	s.syms[len(s.syms)-1].next = -1
	for i := 1; i < len(s.syms); i++ {
		s.tryBigram(i-1, i)
	}
	for n := 1; len(s.queue) > 0; n++ {
		// A text whose words cannot be merged one by one is merged
		// whole: look at the context now and then here too.
		if n%(16*checkEvery) == 0 {
			if s.err = s.ctx.Err(); s.err != nil {
				return out
			}
		}
		bg := s.queue.pop()
		l, r := &s.syms[bg.left], &s.syms[bg.right]
		if l.n == 0 || r.n == 0 || l.n+r.n != int(bg.size) {
			continue // stale: one side was merged since
		}
		l.n += r.n
		r.n = 0
		l.next = r.next
		if r.next >= 0 {
			s.syms[r.next].prev = int(bg.left)
		}
		s.tryBigram(l.prev, int(bg.left))
		s.tryBigram(int(bg.left), l.next)
	}
	ids := s.m.t.ids
	for i := 0; i != -1; i = s.syms[i].next {
		sym := s.syms[i]
		piece := s.text[sym.start : sym.start+sym.n]
		if id, ok := ids[piece]; ok {
			out = append(out, id)
			continue
		}
		// Every merged symbol is a token, so only a single character that
		// is not in the vocabulary gets here: write its bytes.
		for j := 0; j < len(piece); j++ {
			out = append(out, s.m.byteToken[piece[j]])
		}
	}
	return out
}

func (s *spmSession) tryBigram(left, right int) {
	if left < 0 || right < 0 {
		return
	}
	l, r := s.syms[left], s.syms[right]
	id, ok := s.m.t.ids[s.text[l.start:r.start+r.n]]
	if !ok {
		return
	}
	s.queue.push(spmBigram{left: int32(left), right: int32(right), score: s.m.t.scores[id], size: int32(l.n + r.n)})
}
