package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// `forge serve --expert-profiles DIR` reaches the models it opens: a
// mixture's completions, run by the batching scheduler (on by default on
// the CPU), are recorded in DIR's profile when serve ends and unloads it.
func TestServeExpertProfilesFlag(t *testing.T) {
	leakCheck(t)
	path := chatModelShape(t, "tiny-qwen3moe", 3)
	dir := filepath.Join(t.TempDir(), "profiles")
	ts, _, stop := runServeCommand(t, "-m", "moe="+path, "--expert-profiles", dir)
	var out struct {
		Choices []struct{ Text string } `json:"choices"`
	}
	if c := ts.postJSON(t, "/v1/completions", map[string]any{"model": "moe", "prompt": "Once upon a time", "max_tokens": 4, "seed": 1}, &out); c != 200 || len(out.Choices) != 1 {
		t.Fatalf("completion: status %d, %+v", c, out)
	}
	if err := stop(); err != nil {
		t.Fatalf("serve returned %v", err)
	}

	uses := onlyProfile(t, dir)
	var total int64
	for _, l := range uses {
		for _, k := range l {
			total += k
		}
	}
	if total == 0 {
		t.Fatalf("the profile in %s records no routing", dir)
	}
}

// onlyProfile reads the one expert usage profile dir holds: its uses per
// block and expert.
func onlyProfile(t *testing.T, dir string) [][]int64 {
	t.Helper()
	profs, err := filepath.Glob(filepath.Join(dir, "experts-*.json"))
	if err != nil || len(profs) != 1 {
		t.Fatalf("profiles in %s: %v %v", dir, profs, err)
	}
	b, err := os.ReadFile(profs[0])
	if err != nil {
		t.Fatal(err)
	}
	var prof struct{ Uses [][]int64 }
	if err := json.Unmarshal(b, &prof); err != nil || len(prof.Uses) == 0 {
		t.Fatalf("profile %s: %v: %s", profs[0], err, b)
	}
	return prof.Uses
}
