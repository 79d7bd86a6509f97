package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf/testmodels"
)

// TestPerplexityCommand: forge perplexity prints llama-perplexity's lines
// (the running estimate per chunk on stderr, the final estimate on
// stdout) with the figure committed for stories260K-F32 (its estimate
// equals llama.cpp's to the 4 decimals printed), and --json one object.
func TestPerplexityCommand(t *testing.T) {
	model := testmodels.Path(t, "stories260K-F32.gguf")
	story := testmodels.Path(t, "story.txt")
	var stdout, stderr bytes.Buffer
	err := newApp(&stdout, &stderr).Run(forgeArgs([]string{"forge", "perplexity", model, "-f", story, "-c", "128", "--device", "cpu", "-t", "2"}))
	if err != nil {
		t.Fatal(err, stderr.String())
	}
	if got, want := stdout.String(), "Final estimate: PPL = 4.5510 +/- 0.16303\n"; got != want {
		t.Errorf("stdout %q, want %q", got, want)
	}
	for _, s := range []string{"[1]3.58", ",[41]4.5510,\n", "5289 tokens, 41 chunks of 128, 2583 scored"} {
		if !strings.Contains(stderr.String(), s) {
			t.Errorf("stderr lacks %q:\n%s", s, stderr.String())
		}
	}
	if ppl, ok := perplexityLine(stdout.String()); !ok || ppl != 4.551 {
		t.Errorf("perplexityLine: %v %v", ppl, ok)
	}

	stdout.Reset()
	stderr.Reset()
	err = newApp(&stdout, &stderr).Run(forgeArgs([]string{"forge", "perplexity", "-m", model, "-f", story, "--ctx-size", "128", "-b", "32", "--json", "--device", "cpu", "-t", "2"}))
	if err != nil {
		t.Fatal(err, stderr.String())
	}
	var r perplexityResult
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		t.Fatalf("%v: %q", err, stdout.String())
	}
	if r.Ctx != 128 || r.Chunks != 41 || r.Tokens != 5289 || r.Scored != 41*63 || len(r.Running) != 41 || r.Running[40] != r.PPL {
		t.Errorf("json %+v", r)
	}
	if s := strings.TrimSpace(stdout.String()); strings.Count(s, "\n") != 0 {
		t.Errorf("--json wrote more than one line: %q", s)
	}
}

// TestPerplexityUsage: a missing text, a bad context, two models are
// usage errors (exit status 2); a text too short is an error that says so.
func TestPerplexityUsage(t *testing.T) {
	model := testmodels.Path(t, "stories260K-F32.gguf")
	story := testmodels.Path(t, "story.txt")
	for _, args := range [][]string{
		{"perplexity", model},
		{"perplexity", model, "-f", story, "-c", "2"},
		{"perplexity", model, "-f", story, "-c", "-1"},
		{"perplexity", model, model, "-f", story},
	} {
		var stdout, stderr bytes.Buffer
		err := newApp(&stdout, &stderr).Run(forgeArgs(append([]string{"forge"}, args...)))
		if code := exitCode(err); code != 2 {
			t.Errorf("%q: exit %d (%v), want 2", args, code, err)
		}
	}
	var stdout, stderr bytes.Buffer
	app := newApp(&stdout, &stderr)
	app.Reader = strings.NewReader("Once upon a time there was a cat.")
	err := app.Run([]string{"forge", "perplexity", "-m", model, "-f", "-", "-c", "64", "--device", "cpu"})
	if err == nil || !strings.Contains(err.Error(), "needs at least 128") {
		t.Errorf("short text from stdin: %v", err)
	}
}
