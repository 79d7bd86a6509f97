package tokenizer

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/gguf/testmodels"
)

// load opens a bundled GGUF file and builds its tokenizer.
func load(tb testing.TB, name string) *Tokenizer {
	tb.Helper()
	f, err := gguf.Open(testmodels.Path(tb, name))
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	tok, err := FromFile(f)
	if err != nil {
		tb.Fatal(err)
	}
	return tok
}

// vectors reads llama.cpp's test strings and expected ids (see
// gguf/testdata/tokenizer/README.md).
func vectors(tb testing.TB, vocab string) (texts []string, want [][]int32) {
	tb.Helper()
	inp, err := os.ReadFile(testmodels.Path(tb, "tokenizer/"+vocab+".inp"))
	if err != nil {
		tb.Fatal(err)
	}
	outp, err := os.ReadFile(testmodels.Path(tb, "tokenizer/"+vocab+".out"))
	if err != nil {
		tb.Fatal(err)
	}
	texts = strings.Split(string(inp), "\n__ggml_vocab_test__\n")
	if texts[len(texts)-1] == "" {
		texts = texts[:len(texts)-1] // the file ends with a separator
	}
	lines := strings.Split(strings.TrimSuffix(string(outp), "\n"), "\n")
	if len(lines) != len(texts) {
		tb.Fatalf("%s: %d test strings but %d lines of ids", vocab, len(texts), len(lines))
	}
	for i, l := range lines {
		var ids []int32
		for _, f := range strings.Fields(l) {
			v, err := strconv.ParseInt(f, 10, 32)
			if err != nil {
				tb.Fatalf("%s.out line %d: %v", vocab, i+1, err)
			}
			ids = append(ids, int32(v))
		}
		want = append(want, ids)
	}
	return texts, want
}

func TestLlamaCppVectors(t *testing.T) {
	for _, vocab := range []string{"ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf"} {
		t.Run(vocab, func(t *testing.T) {
			tok := load(t, "tokenizer/"+vocab)
			texts, want := vectors(t, vocab)
			pass := 0
			for i, text := range texts {
				got, err := tok.Encode(text, EncodeOptions{})
				if err != nil {
					t.Fatalf("%q: %v", text, err)
				}
				if !slices.Equal(got, want[i]) {
					t.Errorf("string %d %q:\n got %v\nwant %v", i, text, got, want[i])
					continue
				}
				pass++
				// Round trip: decoding gives the text back.
				if back := tok.Decode(got); back != text {
					t.Errorf("string %d: Decode(Encode(%q)) = %q", i, text, back)
				}
			}
			t.Logf("%s: %d/%d strings match llama.cpp", vocab, pass, len(texts))
		})
	}
}
