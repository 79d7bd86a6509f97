package tokenizer

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf"
)

// spmVocab builds a small SentencePiece vocabulary: <unk> <s> </s>, the 256
// byte tokens, then the given pieces with their scores and types.
type piece struct {
	text  string
	score float32
	typ   int32
}

func spmMeta(addSpacePrefix bool, pieces ...piece) *gguf.TokenizerMeta {
	m := &gguf.TokenizerMeta{Model: "llama", Pre: "default", BOS: 1, EOS: 2, UNK: 0, PAD: -1, SEP: -1, EOT: -1,
		AddBOS: true, AddSpacePrefix: addSpacePrefix}
	add := func(s string, score float32, typ int32) {
		m.Tokens = append(m.Tokens, s)
		m.Scores = append(m.Scores, score)
		m.TokenTypes = append(m.TokenTypes, typ)
	}
	add("<unk>", 0, TypeUnknown)
	add("<s>", 0, TypeControl)
	add("</s>", 0, TypeControl)
	for b := range 256 {
		add(fmt.Sprintf("<0x%02X>", b), 0, TypeByte)
	}
	for _, p := range pieces {
		typ := p.typ
		if typ == 0 {
			typ = TypeNormal
		}
		add(p.text, p.score, typ)
	}
	return m
}

// encodePieces encodes and returns the token texts, easier to read than ids.
func encodePieces(t *testing.T, tok *Tokenizer, text string, opts EncodeOptions) []string {
	t.Helper()
	ids, err := tok.Encode(text, opts)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, id := range ids {
		out = append(out, tok.Token(id))
	}
	return out
}

func mustNew(t *testing.T, m *gguf.TokenizerMeta) *Tokenizer {
	t.Helper()
	tok, err := New(m)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestSPMMergeOrder(t *testing.T) {
	base := []piece{{"a", -1, 0}, {"b", -1, 0}, {"c", -1, 0}, {"▁", -1, 0}}
	cases := []struct {
		ab, bc float32
		want   []string
	}{
		{-2, -3, []string{"▁", "ab", "c"}}, // "ab" scores higher: merged first
		{-3, -2, []string{"▁", "a", "bc"}}, // "bc" scores higher
		{-2, -2, []string{"▁", "ab", "c"}}, // a tie goes to the leftmost pair
	}
	for _, c := range cases {
		tok := mustNew(t, spmMeta(true, append(slices.Clone(base), piece{"ab", c.ab, 0}, piece{"bc", c.bc, 0})...))
		if got := encodePieces(t, tok, "abc", EncodeOptions{}); !slices.Equal(got, c.want) {
			t.Errorf("ab %v bc %v: got %q want %q", c.ab, c.bc, got, c.want)
		}
	}
}

func TestSPMChainOfMerges(t *testing.T) {
	// Merges happen only through pairs that are tokens: "▁hello" is reached
	// via ll, he, hell, hello, ▁hello; "lo" loses to "ll" on score and is
	// then stale.
	tok := mustNew(t, spmMeta(true,
		piece{"▁", -1, 0}, piece{"h", -1, 0}, piece{"e", -1, 0}, piece{"l", -1, 0}, piece{"o", -1, 0},
		piece{"ll", -2, 0}, piece{"lo", -2.5, 0}, piece{"he", -3, 0}, piece{"hell", -4, 0},
		piece{"hello", -5, 0}, piece{"▁hello", -6, 0}))
	if got := encodePieces(t, tok, "hello hello", EncodeOptions{}); !slices.Equal(got, []string{"▁hello", "▁hello"}) {
		t.Errorf("got %q", got)
	}
	// A continuation (the rest of a text whose start kept its ids) gets
	// no dummy prefix either: " hello" after earlier text is one "▁hello",
	// "hello" right after it no "▁" at all.
	if got := encodePieces(t, tok, " hello", EncodeOptions{Continue: true}); !slices.Equal(got, []string{"▁hello"}) {
		t.Errorf("continue: got %q", got)
	}
	if got := encodePieces(t, tok, "hello", EncodeOptions{Continue: true}); !slices.Equal(got, []string{"hello"}) {
		t.Errorf("continue, no space: got %q", got)
	}
	// Without the space prefix the first word has no "▁".
	tok.addSpacePrefix = false
	if got := encodePieces(t, tok, "hello", EncodeOptions{}); !slices.Equal(got, []string{"hello"}) {
		t.Errorf("no space prefix: got %q", got)
	}
}

func TestSPMByteFallback(t *testing.T) {
	tok := mustNew(t, spmMeta(true, piece{"▁", -1, 0}, piece{"h", -1, 0}))
	// 'é' (C3 A9) and '😀' (F0 9F 98 80) are not pieces: their bytes are.
	got := encodePieces(t, tok, "hé😀", EncodeOptions{})
	want := []string{"▁", "h", "<0xC3>", "<0xA9>", "<0xF0>", "<0x9F>", "<0x98>", "<0x80>"}
	if !slices.Equal(got, want) {
		t.Errorf("got %q want %q", got, want)
	}
	ids, _ := tok.Encode("hé😀", EncodeOptions{})
	if d := tok.Decode(ids); d != "hé😀" {
		t.Errorf("Decode = %q", d)
	}
	// Invalid UTF-8 goes through the byte tokens unchanged.
	ids, _ = tok.Encode("h\xff\xe2", EncodeOptions{})
	if d := tok.Decode(ids); d != "h\xff\xe2" {
		t.Errorf("invalid UTF-8: Decode = %q", d)
	}
}

func TestSPMSpecialTokens(t *testing.T) {
	tok := mustNew(t, spmMeta(true,
		piece{"▁", -1, 0}, piece{"h", -1, 0}, piece{"i", -1, 0}, piece{"hi", -2, 0}, piece{"▁hi", -3, 0},
		piece{"<", -1, 0}, piece{">", -1, 0}, piece{"/", -1, 0}, piece{"s", -1, 0},
		piece{"<|u|>", 0, TypeUserDefined}))
	// Control tokens are text unless ParseSpecial; a space prefix follows
	// every special token.
	got := encodePieces(t, tok, "<s>hi</s>", EncodeOptions{ParseSpecial: true})
	if want := []string{"<s>", "▁hi", "</s>"}; !slices.Equal(got, want) {
		t.Errorf("ParseSpecial: got %q want %q", got, want)
	}
	got = encodePieces(t, tok, "<s>hi", EncodeOptions{})
	if want := []string{"▁", "<", "s", ">", "hi"}; !slices.Equal(got, want) {
		t.Errorf("raw: got %q want %q", got, want)
	}
	// User-defined tokens are always cut out.
	got = encodePieces(t, tok, "hi<|u|>hi", EncodeOptions{})
	if want := []string{"▁hi", "<|u|>", "▁hi"}; !slices.Equal(got, want) {
		t.Errorf("user-defined: got %q want %q", got, want)
	}
	// BOS and EOS on request only.
	got = encodePieces(t, tok, "hi", EncodeOptions{AddBOS: true, AddEOS: true})
	if want := []string{"<s>", "▁hi", "</s>"}; !slices.Equal(got, want) {
		t.Errorf("BOS/EOS: got %q want %q", got, want)
	}
	if ids, _ := tok.Encode("", EncodeOptions{}); len(ids) != 0 {
		t.Errorf("empty text gave %v", ids)
	}
	if ids, _ := tok.Encode("", EncodeOptions{AddBOS: true}); !slices.Equal(ids, []int32{1}) {
		t.Errorf("empty text with BOS gave %v", ids)
	}
	// Decode hides control tokens and keeps user-defined ones.
	ids, _ := tok.Encode("<s>hi<|u|>hi</s>", EncodeOptions{ParseSpecial: true})
	if d := tok.Decode(ids); d != "hi<|u|> hi" {
		t.Errorf("Decode = %q", d)
	}
	if p := tok.Piece(1); p != "<s>" {
		t.Errorf("Piece(<s>) = %q", p)
	}
}

func TestLongestSpecialFirst(t *testing.T) {
	tok := mustNew(t, spmMeta(false, piece{"x", -1, 0},
		piece{"<|a|>", 0, TypeControl}, piece{"<|a|><|a|>", 0, TypeControl}))
	got := encodePieces(t, tok, "<|a|><|a|>x<|a|>", EncodeOptions{ParseSpecial: true})
	if want := []string{"<|a|><|a|>", "x", "<|a|>"}; !slices.Equal(got, want) {
		t.Errorf("got %q want %q", got, want)
	}
}

func TestEOGByText(t *testing.T) {
	m := spmMeta(true, piece{"<|im_end|>", 0, TypeUserDefined})
	tok := mustNew(t, m)
	id := int32(len(m.Tokens) - 1)
	if !tok.IsEOG(id) || tok.TokenType(id) != TypeControl {
		t.Errorf("<|im_end|>: IsEOG %v type %d; llama.cpp makes it an end-of-generation control token", tok.IsEOG(id), tok.TokenType(id))
	}
	// As a control token it is parsed only on request.
	if got := encodePieces(t, tok, "<|im_end|>", EncodeOptions{}); slices.Contains(got, "<|im_end|>") {
		t.Errorf("parsed without ParseSpecial: %q", got)
	}
}

func TestSpecialByText(t *testing.T) {
	m := bpeMeta("gpt-2", nil, "<｜end▁of▁sentence｜>", "<|fim_pad|>", "<|fim_prefix|>", "<|channel|>")
	n := int32(len(m.Tokens))
	tok := mustNew(t, m)
	eos, pad, pre, ch := n-4, n-3, n-2, n-1
	if !tok.IsEOG(eos) || tok.TokenType(eos) != TypeControl {
		t.Error("DeepSeek's end of sentence is the EOT token when the file names none")
	}
	if !tok.IsEOG(pad) || tok.TokenType(pad) != TypeControl {
		t.Error("<|fim_pad|> ends generation")
	}
	if tok.IsEOG(pre) || tok.TokenType(pre) != TypeControl {
		t.Error("<|fim_prefix|> is a control token that does not end generation")
	}
	if tok.TokenType(ch) != TypeUserDefined || tok.Piece(ch) != "<|channel|>" {
		t.Error("gpt-oss's <|channel|> is always printed")
	}
	// gpt-oss: "<|end|>" ends a message, not the generation, when
	// "<|return|>" and "<|call|>" exist.
	m = bpeMeta("gpt-2", nil, "<|return|>", "<|call|>", "<|end|>")
	n = int32(len(m.Tokens))
	tok = mustNew(t, m)
	if !tok.IsEOG(n-3) || !tok.IsEOG(n-2) || tok.IsEOG(n-1) || tok.TokenType(n-1) != TypeUserDefined {
		t.Errorf("harmony: EOG %v %v %v", tok.IsEOG(n-3), tok.IsEOG(n-2), tok.IsEOG(n-1))
	}
	m = bpeMeta("gpt-2", nil, "<|end|>")
	tok = mustNew(t, m)
	if !tok.IsEOG(int32(len(m.Tokens) - 1)) {
		t.Error("<|end|> alone ends generation (Phi-3)")
	}
}

func TestNewErrors(t *testing.T) {
	if _, err := New(&gguf.TokenizerMeta{Model: "llama"}); err == nil {
		t.Error("empty vocabulary accepted")
	}
	m := spmMeta(true)
	m.Model = "bert"
	if _, err := New(m); err == nil {
		t.Error("unsupported model accepted")
	}
	m = spmMeta(true)
	m.Scores = m.Scores[:3]
	if _, err := New(m); err == nil {
		t.Error("short scores accepted")
	}
	m = spmMeta(true)
	m.BOS = -1
	tok := mustNew(t, m)
	if _, err := tok.Encode("x", EncodeOptions{AddBOS: true}); err == nil {
		t.Error("BOS added without a BOS token")
	}
}

// TestSPMWordsIndependent: merging word by word (the fast path, taken when
// no token has "▁" after another character) gives exactly the ids of
// merging the whole text at once, as llama.cpp does.
func TestSPMWordsIndependent(t *testing.T) {
	tok := load(t, "tokenizer/ggml-vocab-llama-spm.gguf")
	if !tok.spm.wordsIndependent {
		t.Fatal("the Llama vocabulary has no token with an inner '▁'; the fast path should be on")
	}
	whole := *tok
	spm := *tok.spm
	spm.wordsIndependent = false
	whole.spm = &spm
	texts, _ := vectors(t, "ggml-vocab-llama-spm.gguf")
	texts = append(texts, "a  b   c    d", "  leading", "trailing  ", "x▁y ▁▁z", strings.Repeat("word ", 200),
		"a\xf0 b", "\xe2 x", "x\xe2\x96 y", "\x96 z\xff")
	for _, s := range texts {
		a, _ := tok.Encode(s, EncodeOptions{})
		b, _ := whole.Encode(s, EncodeOptions{})
		if !slices.Equal(a, b) {
			t.Errorf("%q: by word %v, whole %v", s, a, b)
		}
	}
	// A vocabulary with "a▁b" must merge across words.
	m := mustNew(t, spmMeta(false, piece{"a", -1, 0}, piece{"b", -1, 0}, piece{"▁", -1, 0},
		piece{"a▁", -2, 0}, piece{"a▁b", -3, 0}))
	if m.spm.wordsIndependent {
		t.Fatal("\"a▁\" crosses a word start")
	}
	if got := encodePieces(t, m, "a b", EncodeOptions{}); !slices.Equal(got, []string{"a▁b"}) {
		t.Errorf("got %q", got)
	}
}
