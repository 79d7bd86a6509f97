package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf/testmodels"
)

// TestList: forge list shows the models of an Ollama store and a Hugging
// Face cache under names forge resolves, with size and quantization.
func TestList(t *testing.T) {
	odir, hdir := t.TempDir(), t.TempDir()
	t.Setenv("OLLAMA_MODELS", odir)
	t.Setenv("HF_HUB_CACHE", hdir)
	q8, err := os.ReadFile(testmodels.Path(t, "stories260K-Q8_0.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	q4, err := os.ReadFile(testmodels.Path(t, "stories260K-Q4_0.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	put := func(path string, b []byte) {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	put(filepath.Join(odir, "blobs", "sha256-abc1"), q8)
	put(filepath.Join(odir, "manifests", "registry.ollama.ai", "library", "stories", "260k"),
		[]byte(`{"layers":[{"mediaType":"application/vnd.ollama.image.model","digest":"sha256:abc1","size":1}]}`))
	put(filepath.Join(hdir, "models--karpathy--stories", "refs", "main"), []byte("r1"))
	put(filepath.Join(hdir, "models--karpathy--stories", "snapshots", "r1", "stories260K-Q4_0.gguf"), q4)

	var stdout, stderr bytes.Buffer
	if err := newApp(&stdout, &stderr).Run([]string{"forge", "list"}); err != nil {
		t.Fatal(err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "NAME") {
		t.Fatalf("forge list:\n%s", stdout.String())
	}
	for i, want := range [][]string{{"stories:260k", "Q8_0", "293K", "llama", "ollama"}, {"karpathy/stories", "Q4_0", "llama", "hf"}} {
		for _, w := range want {
			if !strings.Contains(lines[i+1], w) {
				t.Errorf("row %q lacks %q", lines[i+1], w)
			}
		}
	}
	stdout.Reset()
	if err := newApp(&stdout, &stderr).Run([]string{"forge", "list", "--json"}); err != nil {
		t.Fatal(err)
	}
	var rows []listedModel
	if err := json.Unmarshal(stdout.Bytes(), &rows); err != nil || len(rows) != 2 {
		t.Fatalf("--json: %v %q", err, stdout.String())
	}
	if rows[0].Size != int64(len(q8)) || rows[1].Quant != "Q4_0" || rows[1].Store != "hf" {
		t.Errorf("--json rows %+v", rows)
	}
	// Each name runs.
	for _, r := range rows {
		stdout.Reset()
		if err := newApp(&stdout, &stderr).Run(forgeArgs([]string{"forge", "run", r.Name, "-p", "Once", "-n", "2", "--device", "cpu", "--progress", "plain"})); err != nil {
			t.Errorf("forge run %s: %v", r.Name, err)
		}
	}
}

// TestPS: forge ps asks a running server what it has loaded.
func TestPS(t *testing.T) {
	ts := startServer(t, serveConfig{models: []modelArg{{id: "stories", name: testmodels.Path(t, "stories260K-Q8_0.gguf")}, {id: "other", name: testmodels.Path(t, "stories260K-F32.gguf")}}})
	var out completionOut
	if c := ts.postJSON(t, "/v1/completions", map[string]any{"model": "stories", "prompt": "Once", "max_tokens": 2}, &out); c != 200 {
		t.Fatalf("completion: %d", c)
	}
	var stdout, stderr bytes.Buffer
	if err := newApp(&stdout, &stderr).Run(forgeArgs([]string{"forge", "ps", "--url", ts.url})); err != nil {
		t.Fatal(err, stderr.String())
	}
	got := stdout.String()
	if !strings.HasPrefix(got, "ID") || !strings.Contains(got, "stories") || !strings.Contains(got, "total memory") {
		t.Errorf("forge ps:\n%s", got)
	}
	stdout.Reset()
	if err := newApp(&stdout, &stderr).Run(forgeArgs([]string{"forge", "ps", "-a", "--url", ts.url})); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout.String(), "other") {
		t.Errorf("forge ps -a:\n%s", stdout.String())
	}
	stdout.Reset()
	if err := newApp(&stdout, &stderr).Run(forgeArgs([]string{"forge", "ps", "--json", "--url", ts.url})); err != nil {
		t.Fatal(err)
	}
	var st serverStatus
	if err := json.Unmarshal(stdout.Bytes(), &st); err != nil || len(st.Models) != 2 {
		t.Errorf("--json: %v %q", err, stdout.String())
	}
	if err := newApp(&stdout, &stderr).Run([]string{"forge", "ps", "--url", "ftp://x"}); exitCode(err) != 2 {
		t.Errorf("bad url: %v", err)
	}
	if err := newApp(&stdout, &stderr).Run([]string{"forge", "ps", "--url", "http://127.0.0.1:1"}); err == nil || !strings.Contains(err.Error(), "is forge serve running") {
		t.Errorf("no server: %v", err)
	}
}
