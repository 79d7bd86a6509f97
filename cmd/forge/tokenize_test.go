package main

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf/testmodels"
)

// runTokenizeCLI runs `forge tokenize` in process with stdin.
func runTokenizeCLI(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	app := newApp(&stdout, &stderr)
	app.Reader = strings.NewReader(stdin)
	err := app.Run(append([]string{"forge", "tokenize"}, args...))
	return stdout.String(), err
}

func TestTokenizeCommand(t *testing.T) {
	stories := testmodels.Path(t, "stories260K-F32.gguf")
	cases := []struct {
		stdin string
		args  []string
		want  string
	}{
		// llama.cpp's prompt ids for stories260K (stories260K-expected.json).
		{"Once upon a time", []string{"-m", stories, "--bos"}, "1 403 407 261 378\n"},
		{"Once upon a time", []string{"-m", stories}, "403 407 261 378\n"},
		{"Once upon a time", []string{"-m", stories, "--bos", "--eos"}, "1 403 407 261 378 2\n"},
		// Control-token text is text unless --parse-special.
		{"<s>Once", []string{"-m", stories, "--parse-special"}, "1 403\n"},
		{"", []string{"-m", stories}, "\n"},
		{"ignored", []string{"-m", stories, "-p", "Once"}, "403\n"},
		{"Once", []string{"-m", stories, "--pieces"}, "403\n403\t\" Once\"\n"},
	}
	for _, c := range cases {
		got, err := runTokenizeCLI(t, c.stdin, c.args...)
		if err != nil {
			t.Fatalf("%q %v: %v", c.stdin, c.args, err)
		}
		if got != c.want {
			t.Errorf("%q %v: got %q want %q", c.stdin, c.args, got, c.want)
		}
	}
	raw, err := runTokenizeCLI(t, "<s>Once", "-m", stories)
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(raw, "1 ") {
		t.Errorf("<s> parsed as BOS without --parse-special: %q", raw)
	}
}

// TestTokenizeCommandVectors pipes llama.cpp's test strings through the
// command and compares with its expected ids: every fourth string and the
// long mixed one at the end (the package test checks all of them; each run
// here builds the tokenizer again, which is slow under -race).
func TestTokenizeCommandVectors(t *testing.T) {
	for _, vocab := range []string{"ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf"} {
		model := testmodels.Path(t, "tokenizer/"+vocab)
		inp, err := os.ReadFile(model + ".inp")
		if err != nil {
			t.Fatal(err)
		}
		outp, err := os.ReadFile(model + ".out")
		if err != nil {
			t.Fatal(err)
		}
		texts := strings.Split(strings.TrimSuffix(string(inp), "\n__ggml_vocab_test__\n"), "\n__ggml_vocab_test__\n")
		want := strings.Split(strings.TrimSuffix(string(outp), "\n"), "\n")
		if len(texts) != len(want) {
			t.Fatalf("%s: %d strings, %d id lines", vocab, len(texts), len(want))
		}
		for i, text := range texts {
			if i%4 != 0 && i != len(texts)-1 {
				continue
			}
			got, err := runTokenizeCLI(t, text, "-m", model)
			if err != nil {
				t.Fatal(err)
			}
			if strings.TrimSuffix(got, "\n") != strings.TrimSpace(want[i]) {
				t.Errorf("%s %q: got %q want %q", vocab, text, got, want[i])
			}
		}
	}
}

func TestTokenizeCommandErrors(t *testing.T) {
	if _, err := runTokenizeCLI(t, "x"); err == nil {
		t.Error("missing -m accepted")
	}
	if _, err := runTokenizeCLI(t, "x", "-m", "/no/such/file.gguf"); err == nil {
		t.Error("missing file accepted")
	}
}
