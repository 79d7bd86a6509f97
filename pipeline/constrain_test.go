package pipeline

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/pipeline/constrain"
	"github.com/forge-llm/forge/pipeline/sample"
	"github.com/forge-llm/forge/pipeline/synth"
)

// randomModel writes a small Llama with random weights (its logits are
// noise: unconstrained, it writes garbage) and stories260K's vocabulary:
// SentencePiece pieces with a leading space, byte tokens for everything
// else (so multi-byte characters arrive byte by byte).
func randomModel(t testing.TB) string {
	return randomModelWith(t, "stories260K-F32.gguf")
}

// randomModelWith is randomModel with the vocabulary of a bundled file.
func randomModelWith(t testing.TB, vocabFile string) string {
	t.Helper()
	f, err := gguf.Open(testmodels.Path(t, vocabFile))
	if err != nil {
		t.Fatal(err)
	}
	voc, err := f.Tokenizer()
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	shape := synth.Presets["tiny"]
	shape.Ctx, shape.Vocab = 512, len(voc.Tokens)
	path := filepath.Join(t.TempDir(), "random.gguf")
	if err := synth.WriteFile(context.Background(), path, synth.Options{Shape: shape, Vocab: voc, Seed: 11, Name: "random"}); err != nil {
		t.Fatal(err)
	}
	return path
}

type testSchema struct {
	name string
	src  []byte
	g    *constrain.Grammar
	val  *jsonschema.Schema
}

func loadTestSchemas(t testing.TB) []testSchema {
	t.Helper()
	// Next to this file, wherever the test binary runs (the GPU machine
	// runs it from a tree laid out like the module's import path, as
	// gguf/testmodels expects).
	_, here, _, _ := runtime.Caller(0)
	files, err := filepath.Glob(filepath.Join(filepath.Dir(here), "constrain", "testdata", "schemas", "*.json"))
	if err != nil || len(files) < 50 {
		t.Fatalf("want at least 50 schemas, found %d (%v)", len(files), err)
	}
	var out []testSchema
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimSuffix(filepath.Base(f), ".json")
		g, err := constrain.JSONSchema(src)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		doc, err := jsonschema.UnmarshalJSON(strings.NewReader(string(src)))
		if err != nil {
			t.Fatal(err)
		}
		c := jsonschema.NewCompiler()
		c.AssertFormat()
		if err := c.AddResource(name+".json", doc); err != nil {
			t.Fatal(err)
		}
		val, err := c.Compile(name + ".json")
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, testSchema{name, src, g, val})
	}
	return out
}

func checkJSON(t *testing.T, s testSchema, text string) {
	t.Helper()
	if err := validateJSON(s, text); err != nil {
		t.Error(err)
	}
}

// validateJSON parses text and validates it against s.
func validateJSON(s testSchema, text string) error {
	var v any
	if err := json.Unmarshal([]byte(text), &v); err != nil {
		return fmt.Errorf("%s: output %q does not parse: %w", s.name, text, err)
	}
	inst, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		return err
	}
	if err := s.val.Validate(inst); err != nil {
		return fmt.Errorf("%s: output %q does not validate: %w", s.name, text, err)
	}
	return nil
}

// TestConstrainedSchemasBatched: every schema of the suite, all requests
// at once through the batching engine (16 sequences a step, each with its
// own schema and automaton), on a model of random weights: every output
// parses and validates, whether sampled or greedy.
func TestConstrainedSchemasBatched(t *testing.T) {
	path := randomModel(t)
	schemas := loadTestSchemas(t)
	e := newTestEngine(t, EngineOptions{Open: Options{Batching: Batching{Seqs: 16}}})
	var wg sync.WaitGroup
	for i, s := range schemas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := seeded(uint64(i))
			if i%4 == 3 {
				p = sample.Params{} // greedy
			}
			res, err := e.Generate(context.Background(), EngineRequest{Model: path, Prompt: "Answer in JSON:", MaxTokens: 300, Sampling: p, Grammar: s.g})
			if err != nil {
				t.Errorf("%s: %v", s.name, err)
				return
			}
			if res.Stop != "eog" {
				t.Errorf("%s: stop %q, want eog (a complete output): %q", s.name, res.Stop, res.Text)
			}
			checkJSON(t, s, res.Text)
		}()
	}
	wg.Wait()
	if st := e.Loaded(); len(st) != 1 {
		t.Fatalf("%d models loaded", len(st))
	}
}

// TestConstrainedSingleSequence: the single-sequence executor (forge run's
// path) with a schema, any JSON object, and a GBNF grammar, greedy and
// sampled, on random weights.
func TestConstrainedSingleSequence(t *testing.T) {
	path := randomModel(t)
	ctx := context.Background()
	m, err := Open(ctx, path, Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	schemas := loadTestSchemas(t)
	for i, s := range schemas[:12] {
		p := seeded(uint64(i))
		if i%2 == 1 {
			p = sample.Params{}
		}
		res, err := m.Generate(ctx, "JSON:", GenerateOptions{MaxTokens: 250, Sampling: p, Grammar: s.g})
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if res.Stop != "eog" {
			t.Errorf("%s: stop %q, want eog", s.name, res.Stop)
		}
		checkJSON(t, s, res.Text)
	}
	res, err := m.Generate(ctx, "JSON:", GenerateOptions{MaxTokens: 200, Sampling: seeded(5), Grammar: constrain.JSONObject()})
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := json.Unmarshal([]byte(res.Text), &obj); err != nil {
		t.Errorf("json_object output %q: %v", res.Text, err)
	}
	arith, err := constrain.ParseGBNF(`root ::= expr "="
expr ::= term (("+" | "-") term)*
term ::= num | "(" expr ")"
num ::= [1-9] [0-9]{0,2}`)
	if err != nil {
		t.Fatal(err)
	}
	for seed := range uint64(4) {
		res, err := m.Generate(ctx, "Sum:", GenerateOptions{MaxTokens: 60, Sampling: seeded(seed), Grammar: arith})
		if err != nil {
			t.Fatal(err)
		}
		if !arith.Accepts(res.Text) || res.Stop != "eog" {
			t.Errorf("arithmetic output %q (stop %s) is not a sentence of the grammar", res.Text, res.Stop)
		}
	}
	// Ignoring end-of-generation tokens cannot end a constrained output.
	if _, err := m.Generate(ctx, "x", GenerateOptions{MaxTokens: 5, IgnoreEOG: true, Grammar: arith}); err == nil {
		t.Error("IgnoreEOG with a grammar: no error")
	}
}

// TestConstrainedBPEVocabulary: GPT-2's byte-level BPE vocabulary (50257
// tokens, pieces spelled in its byte alphabet, multi-byte characters
// split across tokens) on random weights: schemas batched, every output
// valid.
func TestConstrainedBPEVocabulary(t *testing.T) {
	path := randomModelWith(t, "tokenizer/ggml-vocab-gpt-2.gguf")
	schemas := loadTestSchemas(t)
	e := newTestEngine(t, EngineOptions{Open: Options{Batching: Batching{Seqs: 16}}})
	var wg sync.WaitGroup
	for i, s := range schemas {
		if i%6 != 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := e.Generate(context.Background(), EngineRequest{Model: path, Prompt: "JSON:", MaxTokens: 200, Sampling: seeded(uint64(i)), Grammar: s.g})
			if err != nil {
				t.Errorf("%s: %v", s.name, err)
				return
			}
			if res.Stop != "eog" {
				t.Errorf("%s: stop %q: %q", s.name, res.Stop, res.Text)
			}
			checkJSON(t, s, res.Text)
		}()
	}
	wg.Wait()
}
