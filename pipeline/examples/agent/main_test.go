package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/pipeline/synth"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestAgent answers two prompts on stories260K and reports the load.
func TestAgent(t *testing.T) {
	var out, errw bytes.Buffer
	in := strings.NewReader("Once upon a time\nThe cat\n")
	err := run(context.Background(), []string{"-model", testmodels.Path(t, "stories260K-F32.gguf"), "-n", "16"}, in, &out, &errw)
	if err != nil {
		t.Fatalf("%v\nstderr:\n%s", err, errw.String())
	}
	lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
	if len(lines) != 2 || lines[0] == "" || lines[1] == "" {
		t.Fatalf("want two answers, got %q", out.String())
	}
	// llama.cpp's greedy continuation of "Once upon a time" starts so.
	if !strings.HasPrefix(lines[0], ", there was a little girl") {
		t.Errorf("first answer %q", lines[0])
	}
	for _, want := range []string{`"event":"model_ready"`, `"event":"all_resident"`, `"event":"first_token"`, `"event":"answer"`} {
		if !strings.Contains(errw.String(), want) {
			t.Errorf("stderr lacks %s:\n%s", want, errw.String())
		}
	}
}

// TestAgentLazyMixture: with -strategy lazy on a mixture of experts, whose
// unrouted experts never load, the agent answers and exits instead of
// waiting for a residency that never comes.
func TestAgentLazyMixture(t *testing.T) {
	f, err := gguf.Open(testmodels.Path(t, "stories260K-F32.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	voc, err := f.Tokenizer()
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "moe.gguf")
	if err := synth.WriteFile(context.Background(), path, synth.Options{Shape: synth.Presets["tiny-qwen3moe"], Vocab: voc, Seed: 4}); err != nil {
		t.Fatal(err)
	}
	// A safety net, not a timing: without the fix the run waits forever.
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var out, errw bytes.Buffer
	err = run(ctx, []string{"-model", path, "-strategy", "lazy", "-n", "4"}, strings.NewReader("Once upon a time\n"), &out, &errw)
	if err != nil {
		t.Fatalf("%v\nstderr:\n%s", err, errw.String())
	}
	if !strings.Contains(errw.String(), `"event":"answer"`) {
		t.Errorf("no answer:\n%s", errw.String())
	}
	if strings.Contains(errw.String(), `"event":"all_resident"`) {
		t.Errorf("a lazy mixture reported all resident:\n%s", errw.String())
	}
}
