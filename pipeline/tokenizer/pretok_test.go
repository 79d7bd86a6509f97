package tokenizer

import (
	"encoding/json"
	"os"
	"slices"
	"testing"
)

// words splits text with the pre-tokenizer of family pre.
func words(t *testing.T, pre, text string) []string {
	t.Helper()
	p, err := newPreTokenizer(pre)
	if err != nil {
		t.Fatal(err)
	}
	runes := []rune(text)
	var out []string
	start := 0
	for _, n := range p.split(runes) {
		if n <= 0 {
			t.Fatalf("%s: empty or negative piece %d in %q", pre, n, text)
		}
		out = append(out, string(runes[start:start+n]))
		start += n
	}
	if start != len(runes) {
		t.Fatalf("%s: pieces cover %d of %d runes of %q", pre, start, len(runes), text)
	}
	return out
}

// TestPreTokenizerGolden compares every family with testdata/pretok_golden.json:
// the same expressions run by Python's `regex` engine (lookahead, Unicode
// classes) over tricky and random strings; see testdata/gen_pretok.py.
func TestPreTokenizerGolden(t *testing.T) {
	raw, err := os.ReadFile("testdata/pretok_golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var golden map[string][]struct {
		Text  string   `json:"text"`
		Words []string `json:"words"`
	}
	if err := json.Unmarshal(raw, &golden); err != nil {
		t.Fatal(err)
	}
	for _, fam := range []string{"default", "gpt-2", "llama-bpe", "qwen2", "starcoder", "falcon", "deepseek-llm",
		"deepseek-coder", "tekken", "gpt-4o", "bloom", "viking"} {
		cases := golden[fam]
		if len(cases) < 300 {
			t.Fatalf("%s: only %d golden cases", fam, len(cases))
		}
		bad := 0
		for _, c := range cases {
			got := words(t, fam, c.Text)
			if !slices.Equal(got, c.Words) {
				bad++
				if bad <= 5 {
					t.Errorf("%s %q:\n got %q\nwant %q", fam, c.Text, got, c.Words)
				}
			}
		}
		if bad > 0 {
			t.Errorf("%s: %d of %d strings split differently", fam, bad, len(cases))
		}
	}
}

// TestPreTokenizerFamilies spells out, per family, what the expressions do
// with the inputs that tell the families apart.
func TestPreTokenizerFamilies(t *testing.T) {
	cases := []struct {
		pre, text string
		want      []string
	}{
		// GPT-2: case-sensitive contractions, a space glued to the next word,
		// \s+(?!\S) leaves the last space of a run to the word after it.
		{"gpt-2", "I'm here, they'LL go", []string{"I", "'m", " here", ",", " they", "'", "LL", " go"}},
		{"gpt-2", "a   b  ", []string{"a", "  ", " b", "  "}},
		{"gpt-2", "x\n\ny\tz", []string{"x", "\n", "\n", "y", "\t", "z"}},
		{"gpt-2", "1234 ..!? Привет", []string{"1234", " ..!?", " Привет"}},
		{"mpt", "a 12", []string{"a", " 12"}},
		// Llama 3: case-insensitive contractions, one prefix rune before
		// letters, digits in groups of 3, newlines kept with punctuation.
		{"llama-bpe", "I'M fine, 'LL 1234567", []string{"I", "'M", " fine", ",", " '", "LL", " ", "123", "456", "7"}},
		{"llama-bpe", "\"quoted\"\n\nnext", []string{"\"quoted", "\"\n\n", "next"}},
		{"llama-bpe", "a \n  \n b", []string{"a", " \n  \n", " b"}},
		{"llama-bpe", "end   ", []string{"end", "   "}},
		{"llama-bpe", "x\t\ty", []string{"x", "\t", "\ty"}},
		{"llama-bpe", "日本語 한국어", []string{"日本語", " 한국어"}},
		// Qwen2: the same with single digits.
		{"qwen2", "v1.25", []string{"v", "1", ".", "2", "5"}},
		// starcoder: single digits first, then GPT-2.
		{"starcoder", "abc 123", []string{"abc", " ", "1", "2", "3"}},
		// falcon: punctuation and symbol runs first, ASCII digits by three.
		{"falcon", "a+=b; 12345", []string{"a", "+=", "b", ";", " ", "123", "45"}},
		{"falcon", "12345", []string{"123", "45"}},
		// default: as falcon without the backtick, plus \p{N}+.
		{"default", "x`y 1234", []string{"x", "`", "y", " ", "123", "4"}},
		// DeepSeek coder: newlines alone, \s?\p{L}+, \s?\p{P}+, CJK, digits.
		// Each expression cuts inside the pieces of the one before, so the
		// CJK class takes "中文" out of " 中文" again.
		{"deepseek-coder", "Hi!\n 42 中文", []string{"Hi", "!", "\n", " ", "4", "2", " ", "中文"}},
		// DeepSeek LLM: its letter class has no CJK; \s+$ keeps trailing space.
		{"deepseek-llm", "ab 中文 12  ", []string{"ab", " ", "中文", " ", "12", "  "}},
	}
	for _, c := range cases {
		if got := words(t, c.pre, c.text); !slices.Equal(got, c.want) {
			t.Errorf("%s %q:\n got %q\nwant %q", c.pre, c.text, got, c.want)
		}
	}
}

func TestPreTokenizerNames(t *testing.T) {
	for _, name := range []string{"default", "llama3", "llama-bpe", "qwen2", "gpt-2", "deepseek-llm",
		"deepseek-coder", "falcon", "starcoder", "refact", "mpt", "olmo", "command-r", "smollm", "stablelm2", "dbrx",
		"tekken", "gpt-4o", "llama4", "bloom", "poro-chat", "viking", "glm4", "exaone4"} {
		if _, err := newPreTokenizer(name); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if p, _ := newPreTokenizer("llama-bpe"); !p.ignoreMerges {
		t.Error("llama-bpe: llama.cpp emits a word that is a whole token without merging")
	}
	if p, _ := newPreTokenizer("qwen2"); p.ignoreMerges {
		t.Error("qwen2 merges every word")
	}
	if _, err := newPreTokenizer("no-such-pre"); err == nil {
		t.Error("an unknown tokenizer.ggml.pre must be reported")
	}
	// New falls back to the default expressions, as llama.cpp does.
	tok := mustNew(t, bpeMeta("no-such-pre", nil))
	if tok.bpe.pre.name != "default" {
		t.Errorf("unknown pre: using %q", tok.bpe.pre.name)
	}
}

func TestRuneClassesSorted(t *testing.T) {
	for name, rc := range map[string]runeClass{"letters": deepseekLetters, "punct": deepseekPunct, "cjk": deepseekCJK} {
		for i, r := range rc {
			if r.lo > r.hi || (i > 0 && r.lo <= rc[i-1].hi) {
				t.Fatalf("%s: range %d %#x-%#x out of order", name, i, r.lo, r.hi)
			}
		}
	}
	for _, c := range []struct {
		r    rune
		in   bool
		what string
	}{{'é', true, "é"}, {'\u212A', true, "Kelvin sign"}, {'\u2125', false, "ounce sign"}, {'中', false, "CJK"}, {'\u1F7D', true, "ώ"}, {'\u1F7E', false, "unassigned"}} {
		if deepseekLetters.contains(c.r) != c.in {
			t.Errorf("deepseekLetters.contains(%s) = %v", c.what, !c.in)
		}
	}
}
