package servebench

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"strings"
)

// words are short, common English words that Llama's SentencePiece and
// GPT-2's BPE vocabularies hold as one token each when a space precedes
// them (TestWordsAreOneToken), so a prompt of n of them is n tokens on the
// model families people serve. A tiny vocabulary (stories260K's 512
// tokens) splits them; Calibrate measures the ratio where a tokenizer is
// at hand.
var words = uniq(strings.Fields(`
the of and to in is was for on with as at by from that this it he she they we you
his her their our your its one two three four five six seven ten first last next
new old good great small big long short high low early late young same other many
more most some all each every few own right left open close time day year week
night morning world life hand part place case point home water room mother father
family child friend group country state city school story house car book game line
end side head face eye door road river tree sun moon star sea wind rain fire light
work play run walk talk look see know think make take give find tell ask call keep
start turn show move live hold bring write read sit stand lose pay meet lead set
learn change follow stop create speak grow offer watch send build stay fall cut reach
kill remain pass sell decide pull carry break hope plan help try leave feel put mean
become begin seem want need like love hear say went came made said told found gave
took saw knew thought left felt kept began brought heard stood led met paid sent
built grew fell ran wrote read held spoke small quick slow warm cold dark bright
green blue red black white brown happy sad strong free full real sure clear ready
`))

// uniq drops repeated words, keeping the first of each.
func uniq(ws []string) []string {
	seen := map[string]bool{}
	out := ws[:0]
	for _, w := range ws {
		if !seen[w] {
			seen[w] = true
			out = append(out, w)
		}
	}
	return out
}

// Prompter makes the benchmark's prompts: the same seed and key give the
// same text, so every target receives byte-identical prompts.
type Prompter struct {
	Seed uint64
	// WordsPerToken turns a token count into a word count; Calibrate
	// measures it, 1 is the assumption without a tokenizer.
	WordsPerToken float64
}

// Words is n words drawn for key, space-separated, with no leading or
// trailing space.
func (p Prompter) Words(key string, n int) string {
	h := fnv.New64a()
	h.Write([]byte(key))
	r := rand.New(rand.NewPCG(p.Seed, h.Sum64()))
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[r.IntN(len(words))])
	}
	return b.String()
}

// Text is about tokens tokens of text for key.
func (p Prompter) Text(key string, tokens int) string {
	return p.Words(key, p.wordsFor(tokens))
}

func (p Prompter) wordsFor(tokens int) int {
	wpt := p.WordsPerToken
	if wpt <= 0 || math.IsNaN(wpt) {
		wpt = 1
	}
	return max(1, int(math.Round(float64(tokens)*wpt)))
}

// Calibration says how prompt lengths were matched to token counts.
type Calibration struct {
	// Source is what counted the tokens: "local tokenizer of FILE",
	// "TARGET /tokenize", or "none" (about one token a word assumed).
	Source        string  `json:"source"`
	WordsPerToken float64 `json:"words_per_token"`
	SampleWords   int     `json:"sample_words,omitempty"`
	SampleTokens  int     `json:"sample_tokens,omitempty"`
}

// Calibrate measures words per token on a sample of sampleWords words
// with count (a tokenizer without BOS), so that prompts of --prompt-tokens
// tokens come out close on the model at hand.
func Calibrate(seed uint64, sampleWords int, source string, count func(string) (int, error)) (Calibration, error) {
	if sampleWords <= 0 {
		sampleWords = 512
	}
	text := Prompter{Seed: seed}.Words("calibration", sampleWords)
	n, err := count(text)
	if err != nil {
		return Calibration{}, fmt.Errorf("servebench: calibrating with %s: %w", source, err)
	}
	if n <= 0 {
		return Calibration{}, fmt.Errorf("servebench: calibrating with %s: %d tokens for %d words", source, n, sampleWords)
	}
	return Calibration{Source: source, WordsPerToken: float64(sampleWords) / float64(n), SampleWords: sampleWords, SampleTokens: n}, nil
}
