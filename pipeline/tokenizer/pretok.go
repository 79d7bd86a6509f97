package tokenizer

import (
	"fmt"
	"unicode"
)

// A splitter cuts one chunk of text (runes) into consecutive pieces and
// appends their lengths, in runes, to out. The lengths sum to len(c).
type splitter func(c []rune, out []int) []int

// A matcher reports the length in runes of the match of one regular
// expression that starts at c[i], or 0 when no match starts there. The
// expression sees c as the whole input: "$" and a lookahead at len(c) behave
// as at the end of the text.
type matcher func(c []rune, i int) int

// scan turns a matcher into a splitter the way llama.cpp's
// unicode_regex_split_stl walks std::regex matches: matches are found left
// to right without overlap, each becomes a piece, and the text between two
// matches (which no match covers) becomes a piece of its own.
func scan(m matcher) splitter {
	return func(c []rune, out []int) []int {
		gap := 0 // start of the text not yet emitted
		for i := 0; i < len(c); {
			n := m(c, i)
			if n == 0 {
				i++
				continue
			}
			if i > gap {
				out = append(out, i-gap)
			}
			out = append(out, n)
			i += n
			gap = i
		}
		if gap < len(c) {
			out = append(out, len(c)-gap)
		}
		return out
	}
}

// preTokenizer is the ordered list of splitters of one pre-tokenizer family.
// Like llama.cpp's unicode_regex_split, each splitter runs on every piece the
// previous one produced, so a later expression never matches across a
// boundary that an earlier one made.
type preTokenizer struct {
	name   string
	splits []splitter
	// ignoreMerges: a word that is already a whole token is emitted as is,
	// without running the merges (llama3-style vocabularies).
	ignoreMerges bool
}

// split returns the lengths in runes of the words of text.
func (p *preTokenizer) split(text []rune) []int {
	offs := []int{len(text)}
	var next []int
	for _, s := range p.splits {
		next = next[:0]
		start := 0
		for _, n := range offs {
			if n > 0 {
				next = s(text[start:start+n], next)
			}
			start += n
		}
		offs, next = next, offs
	}
	return offs
}

// newPreTokenizer selects the pre-tokenizer for a tokenizer.ggml.pre value,
// with the same groups of names as llama.cpp's llama_vocab::load. An
// unknown name is an error here; New then uses "default", as llama.cpp does.
func newPreTokenizer(pre string) (*preTokenizer, error) {
	p := &preTokenizer{name: pre}
	switch pre {
	case "", "default":
		p.splits = []splitter{
			scan(classPlus(isDefaultPunct)), // [\p{P}\$\+<=>\^~\|]+
			scan(matchGPT2),                 // 's|'t|…|\s+(?!\S)
			scan(classPlus(isNumber)),       // \p{N}+
			scan(matchThreeASCIIDigits),     // [0-9][0-9][0-9]
		}
	case "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2":
		p.splits = []splitter{scan(matchLlama3)}
		p.ignoreMerges = true
	case "dbrx", "smaug-bpe", "chatglm-bpe", "glm4":
		p.splits = []splitter{scan(matchLlama3)}
	case "qwen2", "deepseek-r1-qwen", "kormo", "megrez", "stablelm2", "hunyuan", "grok-2":
		p.splits = []splitter{scan(matchQwen2)}
	case "gpt-2", "phi-2", "mpt", "olmo", "jais", "jina-es", "jina-de", "gigachat",
		"jina-v1-en", "jina-v2-es", "jina-v2-de", "jina-v2-code", "roberta-bpe", "trillion",
		"a.x-4.0", "mellum", "modern-bert", "granite-docling", "exaone4":
		p.splits = []splitter{scan(matchGPT2)}
	case "starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b":
		p.splits = []splitter{
			scan(classOne(isNumber)), // \p{N}
			scan(matchGPT2),
		}
	case "falcon":
		p.splits = []splitter{
			scan(classPlus(isFalconPunct)), // [\p{P}\$\+<=>\^~\|`]+
			scan(matchGPT2),
			scan(matchThreeASCIIDigits), // [0-9][0-9][0-9]
		}
	case "tekken":
		p.splits = []splitter{scan(matchTekken)}
		p.ignoreMerges = true
	case "gpt-4o", "llama4", "minimax-m2":
		p.splits = []splitter{scan(matchGPT4o)}
	case "bloom", "poro-chat", "gpt3-finnish":
		p.splits = []splitter{scan(matchBloom)}
	case "viking":
		p.splits = []splitter{scan(matchBloom), scan(classOne(isNumber))} // then \p{N}
	case "deepseek-llm":
		p.splits = []splitter{
			scan(classOne(isCRLF)),                       // [\r\n]
			scan(spaceOptPlus(deepseekLetters.contains)), // \s?[A-Za-zµÀ-Ö…]+
			scan(spaceOptPlus(deepseekPunct.contains)),   // \s?[!-/:-~！-／：-～‘-‟　-。]+
			splitTrailingSpace,                           // \s+$
			scan(classPlus(deepseekCJK.contains)),        // [一-龥ࠀ-一가-퟿]+
			scan(classPlus(isNumber)),                    // \p{N}+
		}
	case "deepseek-coder":
		p.splits = []splitter{
			scan(classOne(isCRLF)),                // [\r\n]
			scan(spaceOptPlus(isLetter)),          // \s?\p{L}+
			scan(spaceOptPlus(isPunct)),           // \s?\p{P}+
			scan(classPlus(deepseekCJK.contains)), // [一-龥ࠀ-一가-퟿]+
			scan(classOne(isNumber)),              // \p{N}
		}
	default:
		return nil, fmt.Errorf("tokenizer: unsupported pre-tokenizer %q (tokenizer.ggml.pre)", pre)
	}
	return p, nil
}

// Character classes. \s is Unicode White_Space (what llama.cpp's tables and
// Go's unicode.IsSpace both use), \p{L}, \p{N}, \p{P} the general categories.

const (
	fSpace = 1 << iota
	fLetter
	fNumber
	fPunct
)

// asciiFlags caches the classes of the ASCII runes, by far the most common.
var asciiFlags = func() (t [128]uint8) {
	for r := rune(0); r < 128; r++ {
		t[r] = slowFlags(r)
	}
	return t
}()

func slowFlags(r rune) uint8 {
	var f uint8
	if unicode.IsSpace(r) {
		f |= fSpace
	}
	if unicode.IsLetter(r) {
		f |= fLetter
	}
	if unicode.IsNumber(r) {
		f |= fNumber
	}
	if unicode.IsPunct(r) {
		f |= fPunct
	}
	return f
}

func flags(r rune) uint8 {
	if r >= 0 && r < 128 {
		return asciiFlags[r]
	}
	return slowFlags(r)
}

func isSpace(r rune) bool  { return flags(r)&fSpace != 0 }
func isLetter(r rune) bool { return flags(r)&fLetter != 0 }
func isNumber(r rune) bool { return flags(r)&fNumber != 0 }
func isPunct(r rune) bool  { return flags(r)&fPunct != 0 }
func isCRLF(r rune) bool   { return r == '\r' || r == '\n' }

// isOther is [^\s\p{L}\p{N}].
func isOther(r rune) bool { return flags(r)&(fSpace|fLetter|fNumber) == 0 }

// isDefaultPunct is [\p{P}\$\+<=>\^~\|].
func isDefaultPunct(r rune) bool {
	switch r {
	case '$', '+', '<', '=', '>', '^', '~', '|':
		return true
	}
	return isPunct(r)
}

// isFalconPunct is [\p{P}\$\+<=>\^~\|`].
func isFalconPunct(r rune) bool { return r == '`' || isDefaultPunct(r) }
