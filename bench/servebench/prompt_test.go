package servebench

import (
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/pipeline/tokenizer"
)

// Every word of the list is one token after a space on Llama's
// SentencePiece vocabulary and on GPT-2's BPE (llama.cpp's test
// vocabularies), so without calibration a prompt of n words is n tokens
// on the families people serve.
func TestWordsAreOneToken(t *testing.T) {
	for _, v := range []string{"ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf"} {
		f, err := gguf.Open(testmodels.Path(t, "tokenizer/"+v))
		if err != nil {
			t.Fatal(err)
		}
		tok, err := tokenizer.FromFile(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		var multi []string
		for _, w := range words {
			// Between two other words, as in a prompt.
			ids, err := tok.Encode("the "+w+" the", tokenizer.EncodeOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(ids) != 3 {
				multi = append(multi, w)
			}
		}
		if len(multi) > 0 {
			t.Errorf("%s: %d words are not one token: %s", v, len(multi), strings.Join(multi, " "))
		}
		text := Prompter{Seed: 1}.Text("k", 300)
		ids, err := tok.Encode(text, tokenizer.EncodeOptions{})
		if err != nil || len(ids) != 300 {
			t.Errorf("%s: 300 words are %d tokens (%v)", v, len(ids), err)
		}
	}
}
