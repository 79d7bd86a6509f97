package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// `forge serve --expert-profiles DIR` reaches the models it opens: a
// mixture's completions, run by the batching scheduler (on by default on
// the CPU), are recorded in DIR's profile when serve ends and unloads it.
func TestServeExpertProfilesFlag(t *testing.T) {
	leakCheck(t)
	path := chatModelShape(t, "tiny-qwen3moe", 3)
	dir := filepath.Join(t.TempDir(), "profiles")
	var stdout, stderr syncBuffer
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- newApp(&stdout, &stderr).RunContext(ctx, []string{"forge", "serve", "--addr", "127.0.0.1:0", "--threads", "1",
			"-m", "moe=" + path, "--expert-profiles", dir})
	}()
	var addr string
	for addr == "" {
		select {
		case err := <-done:
			t.Fatalf("serve exited: %v\n%s", err, stderr.String())
		case <-time.After(5 * time.Millisecond):
		}
		s := stderr.String()
		if i := strings.Index(s, "addr="); i >= 0 {
			if rest := s[i+len("addr="):]; strings.ContainsAny(rest, " \n") {
				addr = rest[:strings.IndexAny(rest, " \n")]
			}
		}
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	ts := &testServer{url: "http://" + addr, client: &http.Client{Transport: tr}}
	var out struct {
		Choices []struct{ Text string } `json:"choices"`
	}
	if c := ts.postJSON(t, "/v1/completions", map[string]any{"model": "moe", "prompt": "Once upon a time", "max_tokens": 4, "seed": 1}, &out); c != 200 || len(out.Choices) != 1 {
		t.Fatalf("completion: status %d, %+v", c, out)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("serve returned %v", err)
	}
	tr.CloseIdleConnections()

	profs, err := filepath.Glob(filepath.Join(dir, "experts-*.json"))
	if err != nil || len(profs) != 1 {
		t.Fatalf("profiles in %s: %v %v\n%s", dir, profs, err, stderr.String())
	}
	b, err := os.ReadFile(profs[0])
	if err != nil {
		t.Fatal(err)
	}
	var prof struct{ Uses [][]int64 }
	if err := json.Unmarshal(b, &prof); err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, l := range prof.Uses {
		for _, k := range l {
			total += k
		}
	}
	if total == 0 {
		t.Fatalf("profile %s records no routing: %s", profs[0], b)
	}
}
