package tokenizer

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// streamAll feeds ids one by one, checking that every chunk is valid UTF-8,
// and returns the chunks.
func streamAll(t *testing.T, tok *Tokenizer, ids []int32) []string {
	t.Helper()
	s := tok.NewStream()
	var chunks []string
	for _, id := range ids {
		c := s.Add(id)
		if !utf8.ValidString(c) {
			t.Fatalf("Add(%d) = %q is not valid UTF-8", id, c)
		}
		chunks = append(chunks, c)
	}
	c := s.Flush()
	if !utf8.ValidString(c) {
		t.Fatalf("Flush = %q is not valid UTF-8", c)
	}
	return append(chunks, c)
}

// TestStreamSplitCharacters streams text whose characters are spread over
// several tokens: SentencePiece byte tokens (<0xF0><0x9F><0x98><0x80>) and
// byte-level BPE tokens that end inside a character.
func TestStreamSplitCharacters(t *testing.T) {
	text := "Привет 😀🦙 日本語 ăâîșț ∑x²"
	for _, name := range []string{"tokenizer/ggml-vocab-llama-spm.gguf", "tokenizer/ggml-vocab-gpt-2.gguf"} {
		tok := load(t, name)
		ids, err := tok.Encode(text, EncodeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		split := 0 // tokens whose bytes are not a whole number of characters
		for _, id := range ids {
			if !utf8.ValidString(tok.Piece(id)) {
				split++
			}
		}
		if split < 4 {
			t.Fatalf("%s: only %d tokens end inside a character; the test needs more", name, split)
		}
		chunks := streamAll(t, tok, ids)
		got := strings.Join(chunks, "")
		if tok.Model() == "llama" {
			got = strings.TrimPrefix(got, " ") // the space prefix
		}
		if got != text {
			t.Errorf("%s: streamed %q want %q", name, got, text)
		}
		if d := tok.Decode(ids); d != text {
			t.Errorf("%s: Decode %q", name, d)
		}
	}
}

func TestStreamByteTokens(t *testing.T) {
	tok := mustNew(t, spmMeta(false, piece{"a", -1, 0}))
	b := func(x byte) int32 { return int32(3 + int(x)) } // the "<0xNN>" token of x
	a := int32(3 + 256)
	s := tok.NewStream()
	steps := []struct {
		id   int32
		want string
	}{
		{b(0xE6), ""}, {b(0x97), ""}, {b(0xA5), "日"}, // held until complete
		{a, "a"},
		{b(0xF0), ""}, {b(0x9F), ""}, {b(0x98), ""}, {b(0x80), "😀"},
		{b(0xFF), "\uFFFD"},           // can never start a character
		{b(0xC3), ""}, {a, "\uFFFDa"}, // a lead byte cut off by "a"
		{1, ""}, // <s> prints nothing
		{b(0xE2), ""}, {b(0x82), ""},
	}
	for i, st := range steps {
		if got := s.Add(st.id); got != st.want {
			t.Errorf("step %d: Add(%d) = %q want %q", i, st.id, got, st.want)
		}
	}
	if got := s.Flush(); got != "\uFFFD\uFFFD" {
		t.Errorf("Flush of an unfinished character = %q", got)
	}
	if got := s.Flush(); got != "" {
		t.Errorf("second Flush = %q", got)
	}
}

func TestPieceAndToken(t *testing.T) {
	tok := load(t, "tokenizer/ggml-vocab-llama-spm.gguf")
	ids, _ := tok.Encode("Hello", EncodeOptions{})
	if len(ids) != 1 || tok.Token(ids[0]) != "▁Hello" || tok.Piece(ids[0]) != " Hello" {
		t.Errorf("Hello: ids %v token %q piece %q", ids, tok.Token(ids[0]), tok.Piece(ids[0]))
	}
	if p := tok.Piece(3 + 0x41); p != "A" { // <0x41>
		t.Errorf("Piece(<0x41>) = %q", p)
	}
	if tok.Piece(-1) != "" || tok.Piece(int32(tok.VocabSize())) != "" || tok.Token(-5) != "" {
		t.Error("out-of-range ids must give empty strings")
	}
	g := load(t, "tokenizer/ggml-vocab-gpt-2.gguf")
	ids, _ = g.Encode(" world\n", EncodeOptions{})
	if g.Token(ids[0]) != "Ġworld" || g.Piece(ids[0]) != " world" || g.Piece(ids[1]) != "\n" {
		t.Errorf("gpt-2: tokens %q %q pieces %q %q", g.Token(ids[0]), g.Token(ids[1]), g.Piece(ids[0]), g.Piece(ids[1]))
	}
	if g.VocabSize() != 50257 || !g.IsEOG(50256) || g.EOS() != 50256 {
		t.Errorf("gpt-2: size %d EOS %d", g.VocabSize(), g.EOS())
	}
}
