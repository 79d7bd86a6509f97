package generate

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/pipeline/model"
	"github.com/forge-llm/forge/pipeline/sample"
	"github.com/forge-llm/forge/pipeline/tokenizer"
)

func open(t *testing.T, name string, o model.Options) (*model.Model, *tokenizer.Tokenizer) {
	t.Helper()
	f, err := gguf.Open(testmodels.Path(t, name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	cfg, err := model.ConfigFromFile(f)
	if err != nil {
		t.Fatal(err)
	}
	w, err := model.NewFileWeights(f, cfg)
	if err != nil {
		t.Fatal(err)
	}
	be := cpu.New(2)
	t.Cleanup(be.Close)
	m, err := model.New(be, cfg, w, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	tok, err := tokenizer.FromFile(f)
	if err != nil {
		t.Fatal(err)
	}
	return m, tok
}

// TestStoriesText: from the text "Once upon a time" (BOS added), greedy
// generation of 64 tokens gives llama.cpp's prompt ids, generated ids and
// streamed text for each of the seven decisive stories260K files.
func TestStoriesText(t *testing.T) {
	b, err := os.ReadFile(testmodels.Path(t, "stories260K-expected.json"))
	if err != nil {
		t.Fatal(err)
	}
	var exp struct {
		Prompt string `json:"prompt"`
		Models map[string]struct {
			PromptIDs    []int32 `json:"prompt_ids"`
			GeneratedIDs []int32 `json:"generated_ids"`
			Text         string  `json:"generated_text"`
		} `json:"models"`
	}
	if err := json.Unmarshal(b, &exp); err != nil {
		t.Fatal(err)
	}
	for _, typ := range []string{"F32", "F16", "BF16", "Q8_0", "Q5_0", "Q4_0", "Q4_K_M"} {
		name := "stories260K-" + typ + ".gguf"
		t.Run(typ, func(t *testing.T) {
			e := exp.Models[name]
			m, tok := open(t, name, model.Options{})
			prompt, err := tok.Encode(exp.Prompt, tokenizer.EncodeOptions{AddBOS: true})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(prompt, e.PromptIDs) {
				t.Fatalf("prompt ids %v, want %v", prompt, e.PromptIDs)
			}
			var text strings.Builder
			stream := tok.NewStream()
			ids, st, err := Run(context.Background(), m, prompt, Options{
				MaxTokens: 64, IsEOG: tok.IsEOG,
				OnToken: func(id int32) error { text.WriteString(stream.Add(id)); return nil },
			})
			if err != nil {
				t.Fatal(err)
			}
			text.WriteString(stream.Flush())
			if !slices.Equal(ids, e.GeneratedIDs) {
				t.Fatalf("ids\n got %v\nwant %v", ids, e.GeneratedIDs)
			}
			if text.String() != e.Text {
				t.Fatalf("text\n got %q\nwant %q", text.String(), e.Text)
			}
			if st.Generated != 64 || st.DecodeSteps != 63 || st.Stop != StopMaxTokens || st.PromptTokens != 5 {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

// TestStops: generation stops at an end-of-generation token (not returned)
// and at the end of the context.
func TestStops(t *testing.T) {
	ctx := context.Background()
	m, _ := open(t, "stories260K-F32.gguf", model.Options{})
	prompt := []int32{1, 403, 407, 261, 378}
	// Greedy's 4th token (261, " a") declared end-of-generation.
	ids, st, err := Run(ctx, m, prompt, Options{MaxTokens: 64, IsEOG: func(id int32) bool { return id == 261 }})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids, []int32{432, 383, 286}) || st.Stop != StopEOG {
		t.Errorf("stopped with %v (%s), want [432 383 286] (eog)", ids, st.Stop)
	}

	m, _ = open(t, "stories260K-F32.gguf", model.Options{Ctx: 12})
	ids, st, err = Run(ctx, m, prompt, Options{})
	if err != nil {
		t.Fatal(err)
	}
	// 5 prompt positions, then 7 fed-back tokens fill the 12 positions; the
	// logits of the last one give an 8th token.
	if len(ids) != 8 || st.Stop != StopContext {
		t.Errorf("generated %d tokens (%s), want 8 (context_full)", len(ids), st.Stop)
	}
	if _, _, err := Run(ctx, m, make([]int32, 13), Options{}); err == nil {
		t.Error("a prompt longer than the context was accepted")
	}
}

// TestSeeded: sampling with a seed repeats exactly; another seed differs.
func TestSeeded(t *testing.T) {
	ctx := context.Background()
	m, _ := open(t, "stories260K-Q8_0.gguf", model.Options{})
	prompt := []int32{1, 403, 407, 261, 378}
	gen := func(seed uint64) []int32 {
		p := sample.Defaults()
		p.Temp, p.Seed = 1.5, seed
		ids, _, err := Run(ctx, m, prompt, Options{MaxTokens: 40, Sampler: sample.New(p, m.Cfg.Vocab)})
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	a, b, c := gen(7), gen(7), gen(8)
	if !slices.Equal(a, b) {
		t.Errorf("seed 7 twice:\n%v\n%v", a, b)
	}
	if slices.Equal(a, c) {
		t.Errorf("seeds 7 and 8 gave the same 40 tokens %v", a)
	}
}
