package tokenizer

import (
	"encoding/json"
	"os"
	"slices"
	"testing"

	"github.com/forge-llm/forge/gguf/testmodels"
)

// TestStories260K checks the prompt against llama.cpp's prompt ids for every
// file in stories260K-expected.json, and decodes llama.cpp's generated ids
// back to its generated text, at once and token by token.
func TestStories260K(t *testing.T) {
	raw, err := os.ReadFile(testmodels.Path(t, "stories260K-expected.json"))
	if err != nil {
		t.Fatal(err)
	}
	var exp struct {
		Prompt string `json:"prompt"`
		AddBOS bool   `json:"add_bos"`
		Models map[string]struct {
			PromptIDs     []int32 `json:"prompt_ids"`
			GeneratedIDs  []int32 `json:"generated_ids"`
			GeneratedText string  `json:"generated_text"`
		} `json:"models"`
	}
	if err := json.Unmarshal(raw, &exp); err != nil {
		t.Fatal(err)
	}
	if len(exp.Models) == 0 {
		t.Fatal("no models in stories260K-expected.json")
	}
	for name, m := range exp.Models {
		tok := load(t, name)
		got, err := tok.Encode(exp.Prompt, EncodeOptions{AddBOS: exp.AddBOS})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, m.PromptIDs) {
			t.Errorf("%s: Encode(%q) = %v, llama.cpp %v", name, exp.Prompt, got, m.PromptIDs)
		}
		if name == "stories260K-F32.gguf" && !slices.Equal(got, []int32{1, 403, 407, 261, 378}) {
			t.Errorf("%s: prompt ids %v", name, got)
		}
		if !tok.ShouldAddBOS() || tok.BOS() != 1 || tok.EOS() != 2 || !tok.IsEOG(2) || tok.IsEOG(1) {
			t.Errorf("%s: special tokens: addBOS %v BOS %d EOS %d", name, tok.ShouldAddBOS(), tok.BOS(), tok.EOS())
		}
		// Generated text continues the prompt, so its first space stays:
		// use the stream, not Decode (which strips the prefix space).
		s := tok.NewStream()
		var text string
		for _, id := range m.GeneratedIDs {
			text += s.Add(id)
		}
		text += s.Flush()
		if text != m.GeneratedText {
			t.Errorf("%s: streamed %q, llama.cpp printed %q", name, text, m.GeneratedText)
		}
		all := append(slices.Clone(m.PromptIDs), m.GeneratedIDs...)
		if d := tok.Decode(all); d != exp.Prompt+m.GeneratedText {
			t.Errorf("%s: Decode = %q", name, d)
		}
	}
}
