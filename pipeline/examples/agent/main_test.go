package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/forge-llm/forge/gguf/testmodels"
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
