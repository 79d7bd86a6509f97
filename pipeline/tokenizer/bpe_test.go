package tokenizer

import (
	"slices"
	"testing"

	"github.com/forge-llm/forge/gguf"
)

// bpeMeta builds a byte-level vocabulary: token b (0..255) is byte b's
// rune, then one token per merge result, then extra.
func bpeMeta(pre string, merges []string, extra ...string) *gguf.TokenizerMeta {
	m := &gguf.TokenizerMeta{Model: "gpt2", Pre: pre, BOS: -1, EOS: -1, UNK: -1, PAD: -1, SEP: -1, EOT: -1, Merges: merges}
	for b := range 256 {
		m.Tokens = append(m.Tokens, string(byteRune[b]))
	}
	for _, mg := range merges {
		a, b, _ := cutSpace(mg)
		m.Tokens = append(m.Tokens, a+b)
	}
	m.Tokens = append(m.Tokens, extra...)
	return m
}

func cutSpace(s string) (string, string, bool) {
	for i := 1; i < len(s); i++ {
		if s[i] == ' ' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

func TestByteRuneTable(t *testing.T) {
	seen := map[rune]bool{}
	for b := range 256 {
		r := byteRune[b]
		if seen[r] || runeByte[r] != int16(b) {
			t.Fatalf("byte %#x ↔ rune %U is not a bijection", b, r)
		}
		seen[r] = true
	}
	if byteRune[' '] != 'Ġ' || byteRune['\n'] != 'Ċ' || byteRune['a'] != 'a' || byteRune[0xAD] != 'Ń' {
		t.Errorf("GPT-2 table: ' '→%q '\\n'→%q 0xAD→%q", byteRune[' '], byteRune['\n'], byteRune[0xAD])
	}
}

func TestBPEMergeRanks(t *testing.T) {
	cases := []struct {
		merges []string
		want   []string
	}{
		{[]string{"a b", "b c"}, []string{"ab", "c"}}, // lower rank first
		{[]string{"b c", "a b"}, []string{"a", "bc"}},
		{[]string{"a b", "ab c"}, []string{"abc"}}, // merges chain
	}
	for _, c := range cases {
		tok := mustNew(t, bpeMeta("gpt-2", c.merges))
		if got := encodePieces(t, tok, "abc", EncodeOptions{}); !slices.Equal(got, c.want) {
			t.Errorf("merges %q: got %q want %q", c.merges, got, c.want)
		}
	}
	// Equal pairs: the leftmost merges first ("aaa" → "aa" "a").
	tok := mustNew(t, bpeMeta("gpt-2", []string{"a a"}))
	if got := encodePieces(t, tok, "aaa", EncodeOptions{}); !slices.Equal(got, []string{"aa", "a"}) {
		t.Errorf("aaa: got %q", got)
	}
}

func TestBPEWordsAndBytes(t *testing.T) {
	tok := mustNew(t, bpeMeta("gpt-2", []string{"Ġ a", "Ġa b", "Ã ©"}))
	// Words never merge across the pre-tokenizer's boundaries; the space
	// is the byte-level 'Ġ'; "é" is the two runes of its bytes C3 A9.
	got := encodePieces(t, tok, "ab ab é", EncodeOptions{})
	if want := []string{"a", "b", "Ġab", "Ġ", "Ã©"}; !slices.Equal(got, want) {
		t.Errorf("got %q want %q", got, want)
	}
	ids, _ := tok.Encode("ab ab é\n\t😀", EncodeOptions{})
	if d := tok.Decode(ids); d != "ab ab é\n\t😀" {
		t.Errorf("Decode = %q", d)
	}
	// Invalid UTF-8 becomes U+FFFD first, as in llama.cpp.
	ids, _ = tok.Encode("a\xff", EncodeOptions{})
	if d := tok.Decode(ids); d != "a\uFFFD" {
		t.Errorf("invalid UTF-8: Decode = %q", d)
	}
}

func TestBPEMergeResultNotAToken(t *testing.T) {
	// The merge "x y" makes "xy", which is not in the vocabulary: llama.cpp
	// then emits the single-byte tokens of its text.
	m := bpeMeta("gpt-2", nil)
	m.Merges = []string{"x y"}
	tok := mustNew(t, m)
	if got := encodePieces(t, tok, "xy", EncodeOptions{}); !slices.Equal(got, []string{"x", "y"}) {
		t.Errorf("got %q", got)
	}
}

func TestBPEIgnoreMerges(t *testing.T) {
	// "abc" is a token but no merge reaches it. Llama 3 style vocabularies
	// take a word that is a whole token as is; GPT-2 style ones merge.
	for pre, want := range map[string][]string{"llama-bpe": {"abc"}, "gpt-2": {"a", "b", "c"}} {
		tok := mustNew(t, bpeMeta(pre, nil, "abc"))
		if got := encodePieces(t, tok, "abc", EncodeOptions{}); !slices.Equal(got, want) {
			t.Errorf("%s: got %q want %q", pre, got, want)
		}
	}
}

func TestBPESpecialTokens(t *testing.T) {
	m := bpeMeta("gpt-2", nil, "<|endoftext|>", "<tool>")
	n := int32(len(m.Tokens))
	m.TokenTypes = make([]int32, n)
	for i := range m.TokenTypes {
		m.TokenTypes[i] = TypeNormal
	}
	m.TokenTypes[n-1] = TypeUserDefined
	m.EOS, m.BOS = n-2, n-2
	tok := mustNew(t, m)
	if !tok.IsEOG(n-2) || tok.TokenType(n-2) != TypeControl {
		t.Error("<|endoftext|> is an end-of-generation control token")
	}
	if got := encodePieces(t, tok, "a<|endoftext|>", EncodeOptions{ParseSpecial: true}); !slices.Equal(got, []string{"a", "<|endoftext|>"}) {
		t.Errorf("ParseSpecial: got %q", got)
	}
	if got := encodePieces(t, tok, "a<|endoftext|>", EncodeOptions{}); len(got) != 14 {
		t.Errorf("raw: got %q, want the 14 bytes as text", got)
	}
	if got := encodePieces(t, tok, "a<tool>b", EncodeOptions{}); !slices.Equal(got, []string{"a", "<tool>", "b"}) {
		t.Errorf("user-defined: got %q", got)
	}
	if got := encodePieces(t, tok, "a", EncodeOptions{AddBOS: true, AddEOS: true}); !slices.Equal(got, []string{"<|endoftext|>", "a", "<|endoftext|>"}) {
		t.Errorf("BOS/EOS: got %q", got)
	}
}
