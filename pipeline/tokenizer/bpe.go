package tokenizer

import (
	"context"
	"log/slog"
	"strings"
	"unicode/utf8"
)

// GPT-2's byte↔unicode table: every byte is shown as a printable rune so
// that vocabulary and merges are text. Printable Latin-1 bytes ('!'..'~',
// '¡'..'¬', '®'..'ÿ') stand for themselves; the other 68 bytes, in order,
// become U+0100, U+0101, … (so ' ' is 'Ġ' U+0120 and '\n' is 'Ċ' U+010A).
var byteRune, runeByte = func() (br [256]rune, rb [0x144]int16) {
	for i := range rb {
		rb[i] = -1
	}
	next := rune(0x100)
	for b := range 256 {
		r := rune(b)
		if !(b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE && b <= 0xFF) {
			r = next
			next++
		}
		br[b] = r
		rb[r] = int16(b)
	}
	return br, rb
}()

// bpeMerge is one merge rule: its rank (line number in
// tokenizer.ggml.merges, lower merges first) and the interned id of the
// merged text.
type bpeMerge struct {
	rank, result int32
}

// bpeModel is byte-level BPE as llama.cpp's llm_tokenizer_bpe: pre-tokenize
// into words, map every byte of a word to its rune, then repeatedly merge
// the adjacent pair with the lowest merge rank (leftmost among equals).
//
// Strings are interned to int32 ids so that a merge is a map lookup on two
// ints: an id below the vocabulary size is that token, ids above it name
// texts that appear only in merge rules.
type bpeModel struct {
	t      *Tokenizer
	pre    *preTokenizer
	extra  map[string]int32 // interned texts that are not tokens
	merges map[uint64]bpeMerge
	// byteSym is the interned id of each byte's rune, -1 when no token or
	// merge mentions it.
	byteSym [256]int32
}

func newBPE(t *Tokenizer, merges []string, pre string) (*bpeModel, error) {
	p, err := newPreTokenizer(pre)
	if err != nil {
		// llama.cpp goes on with the default expressions; so do we, loudly.
		slog.Warn("tokenizer: unknown pre-tokenizer, using the default one; ids may differ from the model's", "pre", pre)
		p, _ = newPreTokenizer("default")
	}
	m := &bpeModel{t: t, pre: p, extra: map[string]int32{}, merges: make(map[uint64]bpeMerge, len(merges))}
	for i, s := range merges {
		// "a b", split at the first space after the first byte, as llama.cpp.
		k := strings.IndexByte(s[min(1, len(s)):], ' ')
		if k < 0 {
			continue // malformed; llama.cpp keeps it as a pair of empty texts that never matches
		}
		k += min(1, len(s))
		a, b := m.intern(s[:k]), m.intern(s[k+1:])
		key := pairKey(a, b)
		if _, dup := m.merges[key]; !dup { // the first rule of a pair wins
			m.merges[key] = bpeMerge{rank: int32(i), result: m.intern(s[:k] + s[k+1:])}
		}
	}
	for b := range 256 {
		m.byteSym[b] = m.lookup(string(byteRune[b]))
	}
	return m, nil
}

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

func (m *bpeModel) lookup(s string) int32 {
	if id, ok := m.t.ids[s]; ok {
		return id
	}
	if id, ok := m.extra[s]; ok {
		return id
	}
	return -1
}

func (m *bpeModel) intern(s string) int32 {
	if id := m.lookup(s); id >= 0 {
		return id
	}
	id := int32(len(m.t.tokens) + len(m.extra))
	m.extra[s] = id
	return id
}

// bpeBigram is a candidate merge of adjacent symbols left and right; size
// (bytes of the merged text) detects a candidate made stale by another merge.
type bpeBigram struct {
	left, right int32
	rank        int32
	result      int32
	size        int32
}

type bpeSession struct {
	m     *bpeModel
	word  string
	syms  []symbol
	ids   []int32 // interned id of each symbol's text
	queue bpeQueue
	enc   []byte
}

func (m *bpeModel) encode(ctx context.Context, frags []fragment, out []int32) ([]int32, error) {
	s := &bpeSession{m: m}
	for _, f := range frags {
		if f.tok >= 0 {
			out = append(out, f.tok)
			continue
		}
		// Like llama.cpp, work on code points: an invalid byte becomes
		// U+FFFD before pre-tokenization.
		runes := []rune(f.text)
		text := f.text
		if !utf8.ValidString(text) {
			text = string(runes)
		}
		start, bstart := 0, 0
		for i, n := range m.pre.split(runes) {
			if i%checkEvery == checkEvery-1 {
				if err := ctx.Err(); err != nil {
					return nil, err
				}
			}
			blen := 0
			for _, r := range runes[start : start+n] {
				blen += utf8.RuneLen(r)
			}
			out = s.tokenizeWord(text[bstart:bstart+blen], out)
			start += n
			bstart += blen
		}
	}
	return out, nil
}

// encoded returns the byte-level text of raw bytes (each byte as its
// rune), in a buffer reused by the next call.
func (s *bpeSession) encoded(raw string) []byte {
	s.enc = s.enc[:0]
	for i := 0; i < len(raw); i++ {
		s.enc = utf8.AppendRune(s.enc, byteRune[raw[i]])
	}
	return s.enc
}

func (s *bpeSession) tokenizeWord(word string, out []int32) []int32 {
	m := s.m
	if m.pre.ignoreMerges {
		if id, ok := m.t.ids[string(s.encoded(word))]; ok {
			return append(out, id)
		}
	}
	s.word = word
	s.syms, s.ids = s.syms[:0], s.ids[:0]
	s.queue = s.queue[:0]
	for i := 0; i < len(word); i++ {
		s.syms = append(s.syms, symbol{start: i, n: 1, prev: i - 1, next: i + 1})
		s.ids = append(s.ids, m.byteSym[word[i]])
	}
	if len(s.syms) == 0 {
		return out
	}
	s.syms[len(s.syms)-1].next = -1
	for i := 1; i < len(s.syms); i++ {
		s.tryBigram(i-1, i)
	}
	for len(s.queue) > 0 {
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
		s.ids[bg.left] = bg.result
		s.tryBigram(l.prev, int(bg.left))
		s.tryBigram(int(bg.left), l.next)
	}
	nv := int32(len(m.t.tokens))
	for i := 0; i != -1; i = s.syms[i].next {
		if id := s.ids[i]; id >= 0 && id < nv {
			out = append(out, id)
			continue
		}
		// Not a token: llama.cpp emits the tokens of the single bytes of
		// the byte-level text that exist, and drops the rest.
		sym := s.syms[i]
		enc := s.encoded(s.word[sym.start : sym.start+sym.n])
		for j := 0; j < len(enc); j++ {
			if id, ok := m.t.ids[string(enc[j:j+1])]; ok {
				out = append(out, id)
			}
		}
	}
	return out
}

func (s *bpeSession) tryBigram(left, right int) {
	if left < 0 || right < 0 {
		return
	}
	a, b := s.ids[left], s.ids[right]
	if a < 0 || b < 0 {
		return
	}
	mg, ok := s.m.merges[pairKey(a, b)]
	if !ok {
		return
	}
	s.queue.push(bpeBigram{left: int32(left), right: int32(right), rank: mg.rank, result: mg.result, size: int32(s.syms[left].n + s.syms[right].n)})
}
