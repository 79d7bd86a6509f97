package constrain

import (
	"math/rand/v2"
	"os"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/pipeline/tokenizer"
)

// realVocab is a bundled vocabulary as the pipeline builds it for
// constrained requests (text tokens only; end-of-generation tokens).
func realVocab(b *testing.B, name string) *Vocab {
	f, err := gguf.Open(testmodels.Path(b, name))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	tok, err := tokenizer.FromFile(f)
	if err != nil {
		b.Fatal(err)
	}
	pieces := make([][]byte, tok.VocabSize())
	var eog []int32
	for id := range int32(tok.VocabSize()) {
		switch tt := tok.TokenType(id); {
		case tok.IsEOG(id):
			eog = append(eog, id)
		case tt == tokenizer.TypeNormal || tt == tokenizer.TypeByte || tt == tokenizer.TypeUserDefined:
			pieces[id] = []byte(tok.Piece(id))
		}
	}
	return NewVocab(pieces, eog)
}

// benchVocab is n token pieces shaped like a learnt vocabulary's: the 256
// bytes, then one to nine characters, mostly letters, half with a leading
// space, some digits, punctuation and non-ASCII letters.
func benchVocab(n int) *Vocab {
	pieces := [][]byte{nil}
	for b := range 256 {
		pieces = append(pieces, []byte{byte(b)})
	}
	rng := rand.New(rand.NewPCG(1, 2))
	letters := []rune("etaoinshrdlucmfwypvbgkjqxzETAOINSHRDLUCM")
	other := []rune(`0123456789{}[]":,.-_/()!?;'éüñç中文日本ä`)
	seen := map[string]bool{}
	for len(pieces) < n {
		var r []rune
		if rng.IntN(2) == 0 {
			r = append(r, ' ')
		}
		for range 1 + rng.IntN(9) {
			if rng.IntN(8) == 0 {
				r = append(r, other[rng.IntN(len(other))])
			} else {
				r = append(r, letters[rng.IntN(len(letters))])
			}
		}
		if s := string(r); !seen[s] {
			seen[s] = true
			pieces = append(pieces, []byte(s))
		}
	}
	return NewVocab(pieces, []int32{0})
}

// BenchmarkMask: one mask of a real 32k (Llama 2) and 50k (GPT-2)
// vocabulary and a synthetic 128k one, in the states a JSON
// Schema's output goes through (the states of a random walk): cold (a
// fresh automaton and no cached masks: each state's first time), warm
// automaton (transitions known, the mask walked again, as under a binding
// budget) and cached (what most steps cost).
func BenchmarkMask(b *testing.B) {
	src, err := os.ReadFile("testdata/schemas/create_user.json")
	if err != nil {
		b.Fatal(err)
	}
	vocabs := []struct {
		name string
		v    *Vocab
	}{
		{"llama-spm-32000", realVocab(b, "tokenizer/ggml-vocab-llama-spm.gguf")},
		{"gpt2-50257", realVocab(b, "tokenizer/ggml-vocab-gpt-2.gguf")},
		{"synthetic-128256", benchVocab(128256)},
	}
	for _, vc := range vocabs {
		v, name := vc.v, vc.name
		g, err := JSONSchema(src)
		if err != nil {
			b.Fatal(err)
		}
		// The states of one walk, each reached by its own prefix.
		rng := rand.New(rand.NewPCG(5, 6))
		out := walk(b, g, v, rng, 200)
		var prefixes []string
		for i := 0; i < len(out); i += max(1, len(out)/40) {
			prefixes = append(prefixes, out[:i])
		}
		stateOf := func(e *engine, p string) int32 {
			s := e.start()
			for i := 0; i < len(p); i++ {
				s = e.next(s, p[i])
			}
			return s
		}
		mask := make([]uint64, (v.n+63)/64)
		stk := make([]int32, v.depth+1)
		b.Run(name+"/cold", func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				e := newEngine(g)
				e.computeMask(v, stateOf(e, prefixes[i%len(prefixes)]), -1, mask, stk, nil, nil)
			}
		})
		b.Run(name+"/warm-walk", func(b *testing.B) {
			e := newEngine(g)
			states := make([]int32, len(prefixes))
			for i, p := range prefixes {
				states[i] = stateOf(e, p)
				e.computeMask(v, states[i], -1, mask, stk, nil, nil)
			}
			for i := 0; b.Loop(); i++ {
				e.computeMask(v, states[i%len(states)], -1, mask, stk, nil, nil)
			}
		})
		b.Run(name+"/cached", func(b *testing.B) {
			m := g.NewMatcher(v, -1)
			defer m.Close()
			for b.Loop() {
				m.valid = false
				if _, err := m.Allowed(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
