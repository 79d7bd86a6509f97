// Package archtest is what the architecture tests of pipeline/model and
// pipeline share: gguf/testdata/arch-expected.json (llama.cpp's greedy
// tokens for each architecture's tiny preset) and the recipe that writes
// the tiny files again, byte for byte, from what it records.
package archtest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/pipeline/synth"
)

// Presets are the tiny presets checked against llama.cpp, one (or more)
// per architecture or variant.
var Presets = []string{"tiny-qwen3", "tiny-llama3.1", "tiny-mistral", "tiny-phi3", "tiny-gemma2", "tiny-gemma3", "tiny-qwen3moe", "tiny-mixtral", "tiny-gpt-oss"}

// Tokens is how many greedy tokens are compared.
const Tokens = 16

// DecisiveMargin is the smallest top-1 minus top-2 logit gap at which a
// greedy choice counts as decided: under it, rounding may flip the choice
// either way (the rule of synth-kq-expected.json).
const DecisiveMargin = 0.05

// File is the name of the expected tokens in gguf/testdata.
const File = "arch-expected.json"

// Expected is gguf/testdata/arch-expected.json.
type Expected struct {
	About    string           `json:"about"`
	LlamaCpp string           `json:"llama_cpp"`
	Command  string           `json:"command"`
	Cases    map[string]*Case `json:"cases"`
}

// Case is one preset's file and llama.cpp's output on it.
type Case struct {
	Seed           uint64    `json:"seed"`
	Std            float64   `json:"std"`
	EmbedStd       float64   `json:"embed_std,omitempty"`
	NormMean       float64   `json:"norm_mean,omitempty"`
	Mix            string    `json:"mix"`
	PromptIDs      []int32   `json:"prompt_ids"`
	GeneratedIDs   []int32   `json:"generated_ids"`
	Top2Margins    []float64 `json:"top2_margins"`
	DecisivePrefix int       `json:"decisive_prefix"`
}

// Prompt is "Once upon a time" in stories260K's vocabulary, with BOS.
var Prompt = []int32{1, 403, 407, 261, 378}

// Read reads the expected tokens.
func Read(tb testing.TB) *Expected {
	tb.Helper()
	b, err := os.ReadFile(testmodels.Path(tb, File))
	if err != nil {
		tb.Fatal(err)
	}
	var e Expected
	if err := json.Unmarshal(b, &e); err != nil {
		tb.Fatalf("%s: %v", File, err)
	}
	return &e
}

// Case returns preset's case, failing the test if the file has none or if
// it decides fewer than Tokens steps.
func (e *Expected) Case(tb testing.TB, preset string) *Case {
	tb.Helper()
	c, ok := e.Cases[preset]
	if !ok {
		tb.Fatalf("%s has no case for %s", File, preset)
	}
	if c.DecisivePrefix < Tokens || len(c.GeneratedIDs) < Tokens {
		tb.Fatalf("%s: the expected output decides only %d of %d tokens", preset, c.DecisivePrefix, Tokens)
	}
	return c
}

// WriteFile writes preset's file into dir as the expected tokens were made
// from: stories260K's tokenizer (see below), the case's seed, standard
// deviations, norm mean and mix. The bytes depend on nothing else.
func WriteFile(tb testing.TB, dir, preset string, c *Case) string {
	tb.Helper()
	s, ok := synth.Presets[preset]
	if !ok {
		tb.Fatalf("no preset %q", preset)
	}
	voc, err := synth.VocabFromFile(testmodels.Path(tb, "stories260K-F32.gguf"))
	if err != nil {
		tb.Fatal(err)
	}
	// The byte tokens <0x80>…<0xFF> become plain tokens (their text is
	// their name): llama-server reports the probabilities of a byte that
	// starts a UTF-8 character only together with the tokens that complete
	// it, and the test wants one step per token.
	voc.TokenTypes = slices.Clone(voc.TokenTypes)
	for i, tok := range voc.Tokens {
		if voc.TokenTypes[i] == 6 && len(tok) == 6 && tok >= "<0x80>" {
			voc.TokenTypes[i] = 1
		}
	}
	mix, err := synth.ParseMix(c.Mix)
	if err != nil {
		tb.Fatal(err)
	}
	path := filepath.Join(dir, fmt.Sprintf("%s-%s-seed%d.gguf", preset, c.Mix, c.Seed))
	// general.name stays "synthetic": llama.cpp (build 11669) fails to load
	// the vocabulary of a phi3 file named after its preset.
	o := synth.Options{Shape: s, Mix: mix, Seed: c.Seed, Std: c.Std, EmbedStd: c.EmbedStd, NormMean: c.NormMean, Vocab: voc}
	if err := synth.WriteFile(context.Background(), path, o); err != nil {
		tb.Fatal(err)
	}
	return path
}
