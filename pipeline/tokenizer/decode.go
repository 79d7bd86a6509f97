package tokenizer

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// decodeToken gives the bytes of one token as llama.cpp's token_to_piece
// with special=true: control, unknown and user-defined tokens are their
// text, a SentencePiece piece has "▁" turned back into spaces, a byte token
// "<0xNN>" is that byte, a byte-level BPE token is mapped back rune by rune
// to its bytes, and unused or undefined tokens are empty. (llama.cpp prints
// nothing for a byte-typed token of a BPE vocabulary; we print its byte.)
func (t *Tokenizer) decodeToken(id int32) []byte {
	text := t.tokens[id]
	switch ty := t.types[id]; ty {
	case TypeControl, TypeUnknown, TypeUserDefined:
		return []byte(text)
	case TypeNormal, TypeByte:
		if b, ok := byteToken(text); ok && ty == TypeByte {
			return []byte{b}
		}
		if t.spm != nil {
			return []byte(strings.ReplaceAll(text, "▁", " "))
		}
		return bytesOfByteLevel(text)
	}
	return nil
}

// byteToken parses the text of a byte token, "<0xNN>".
func byteToken(text string) (byte, bool) {
	if len(text) == 6 && strings.HasPrefix(text, "<0x") && text[5] == '>' {
		if v, err := strconv.ParseUint(text[3:5], 16, 8); err == nil {
			return byte(v), true
		}
	}
	return 0, false
}

// bytesOfByteLevel maps byte-level BPE text back to bytes. A rune outside
// the table (only in a malformed vocabulary) is kept as its UTF-8 bytes;
// llama.cpp writes an "[UNK_BYTE_…]" marker there instead.
func bytesOfByteLevel(text string) []byte {
	out := make([]byte, 0, len(text))
	for _, r := range text {
		if r >= 0 && int(r) < len(runeByte) && runeByte[r] >= 0 {
			out = append(out, byte(runeByte[r]))
			continue
		}
		out = utf8.AppendRune(out, r)
	}
	return out
}

// isHidden reports whether id prints as nothing in decoded text: control
// and unknown tokens (BOS, EOS, "<unk>", chat markers) and unused ones.
func (t *Tokenizer) isHidden(id int32) bool {
	switch t.types[id] {
	case TypeControl, TypeUnknown, TypeUnused, TypeUndefined:
		return true
	}
	return false
}

// Piece is the text of one token as bytes in a string (which may be an
// incomplete UTF-8 sequence for byte tokens), with special tokens shown as
// their text: what `forge tokenize --pieces` prints.
func (t *Tokenizer) Piece(id int32) string {
	if id < 0 || int(id) >= len(t.pieces) {
		return ""
	}
	return string(t.pieces[id])
}

// Decode turns ids back into text, as llama.cpp's llama_detokenize with
// remove_special: control and unknown tokens print nothing, and when the
// vocabulary adds a space prefix, the space in front of the first printed
// token is removed again, so that Decode(Encode(s)) == s. Bytes that do not
// form valid UTF-8 are kept as they are.
func (t *Tokenizer) Decode(ids []int32) string {
	var b []byte
	strip := t.addSpacePrefix
	for _, id := range ids {
		if id < 0 || int(id) >= len(t.pieces) || t.isHidden(id) {
			continue
		}
		p := t.pieces[id]
		if strip && len(p) > 0 && p[0] == ' ' {
			p = p[1:]
		}
		strip = false
		b = append(b, p...)
	}
	return string(b)
}

// Stream detokenizes one token at a time for printing as tokens are
// generated. Add returns only complete UTF-8 characters: the bytes of a
// character split over several byte tokens are held until the last one
// arrives. Bytes that can never become valid UTF-8 come out as U+FFFD, so
// the output is always valid UTF-8.
type Stream struct {
	t       *Tokenizer
	pending []byte
}

// NewStream starts a stream. Unlike Decode, it keeps the leading space of
// the first token: generated text continues the prompt.
func (t *Tokenizer) NewStream() *Stream { return &Stream{t: t} }

// Add appends the token id and returns the text that is now complete.
func (s *Stream) Add(id int32) string {
	if id >= 0 && int(id) < len(s.t.pieces) && !s.t.isHidden(id) {
		s.pending = append(s.pending, s.t.pieces[id]...)
	}
	return s.take(false)
}

// Flush returns what is still held back, an unfinished character as U+FFFD,
// and empties the stream.
func (s *Stream) Flush() string { return s.take(true) }

// take returns the longest prefix of pending that is complete, with invalid
// bytes replaced by U+FFFD; at the end (final) an incomplete tail is invalid
// too.
func (s *Stream) take(final bool) string {
	p := s.pending
	var out []byte
	i := 0
	for i < len(p) {
		if p[i] < utf8.RuneSelf {
			out = append(out, p[i])
			i++
			continue
		}
		if !final && !utf8.FullRune(p[i:]) {
			break // may still be completed by the next token
		}
		r, n := utf8.DecodeRune(p[i:])
		if r == utf8.RuneError && n <= 1 {
			out = append(out, "\uFFFD"...)
			i++
			continue
		}
		out = append(out, p[i:i+n]...)
		i += n
	}
	s.pending = append(s.pending[:0], p[i:]...)
	return string(out)
}
