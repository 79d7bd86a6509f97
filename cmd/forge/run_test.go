package main

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf/testmodels"
)

// TestRunGreedy: `forge run` with --temp 0 prints llama.cpp's greedy text
// on stdout (then a newline) and the statistics line on stderr.
func TestRunGreedy(t *testing.T) {
	b, err := os.ReadFile(testmodels.Path(t, "stories260K-expected.json"))
	if err != nil {
		t.Fatal(err)
	}
	var exp struct {
		Models map[string]struct {
			Text string `json:"generated_text"`
		} `json:"models"`
	}
	if err := json.Unmarshal(b, &exp); err != nil {
		t.Fatal(err)
	}
	for _, echo := range []bool{false, true} {
		var stdout, stderr bytes.Buffer
		args := []string{"forge", "run", "-m", testmodels.Path(t, "stories260K-Q4_K_M.gguf"),
			"-p", "Once upon a time", "-n", "64", "--temp", "0", "--threads", "2"}
		want := exp.Models["stories260K-Q4_K_M.gguf"].Text + "\n"
		if echo {
			args = append(args, "--echo")
			want = "Once upon a time" + want
		}
		if err := newApp(&stdout, &stderr).Run(args); err != nil {
			t.Fatal(err)
		}
		if stdout.String() != want {
			t.Errorf("stdout\n got %q\nwant %q", stdout.String(), want)
		}
		for _, s := range []string{"load ", "first token ", "prompt 5 tok", "decode 63 tok", "tok/s", "stop max_tokens"} {
			if !strings.Contains(stderr.String(), s) {
				t.Errorf("stderr %q lacks %q", stderr.String(), s)
			}
		}
	}
}

func TestRunErrors(t *testing.T) {
	var stdout, stderr bytes.Buffer
	m := testmodels.Path(t, "stories260K-Q4_0.gguf")
	if err := newApp(&stdout, &stderr).Run([]string{"forge", "run", "-m", m, "-p", "x", "--device", "rocm:7"}); err == nil {
		t.Error("unknown device accepted")
	}
	if err := newApp(&stdout, &stderr).Run([]string{"forge", "run", "-m", "/nonexistent.gguf", "-p", "x"}); err == nil {
		t.Error("missing model file accepted")
	}
}
