package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf/testmodels"
)

// expectedText is llama.cpp's greedy continuation of "Once upon a time"
// by stories260K-Q4_K_M.
func expectedText(t *testing.T) string {
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
	return exp.Models["stories260K-Q4_K_M.gguf"].Text
}

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
		for _, s := range []string{"load: ready ", "first token ", "prompt 5 tok", "decode 63 tok", "tok/s", "stop max_tokens"} {
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

// normalize replaces what changes from run to run in the progress output
// (times, rates, memory) with placeholders, so the rest can be compared
// with a golden file.
func normalize(s string) string {
	for _, r := range []struct{ re, with string }{
		{`"([a-z_]*(?:_ms|_tok_s|peak_rss_bytes|peak_device_bytes))":[0-9.e+-]+`, `"$1":N`},
		{`[0-9.]+ [kMGT]?B/s`, `R`},
		{`peak RSS [0-9.]+ [KMGT]iB`, `peak RSS M`},
		{`device peak [0-9.]+ [KMGT]?i?B`, `device peak M`},
		{`[0-9.]+ tok/s`, `N tok/s`},
		{`([0-9]+h)?([0-9]+m)?[0-9.]+(ns|µs|ms|s)\b`, `T`},
		{`"model":"[^"]*"`, `"model":"M"`},
	} {
		s = regexp.MustCompile(r.re).ReplaceAllString(s, r.with)
	}
	return s
}

// golden compares got with testdata/name, rewriting it under -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	p := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(p, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("%s differs (go test -update rewrites it)\n got:\n%s\nwant:\n%s", name, got, want)
	}
}

var update = flag.Bool("update", false, "rewrite the golden files")

// runProgress runs `forge run` greedily on stories260K with a progress mode
// and returns stdout and stderr. Eager loading and one reader make the
// order of the load's events the same on every run.
func runProgress(t *testing.T, mode string, extra ...string) (string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	args := append([]string{"forge", "run", "-m", testmodels.Path(t, "stories260K-Q4_K_M.gguf"),
		"-p", "Once upon a time", "-n", "8", "--temp", "0", "--threads", "2",
		"--strategy", "eager", "--readers", "1", "--progress", mode}, extra...)
	if err := newApp(&stdout, &stderr).Run(args); err != nil {
		t.Fatal(err)
	}
	return stdout.String(), stderr.String()
}

// TestRunPlainGolden: the plain progress lines and statistics line.
func TestRunPlainGolden(t *testing.T) {
	stdout, stderr := runProgress(t, "plain")
	if want := expectedText(t); len(stdout) < 10 || !strings.HasPrefix(want, strings.TrimSuffix(stdout, "\n")) {
		t.Errorf("stdout %q is not a prefix of %q", stdout, want)
	}
	golden(t, "run-plain.golden", normalize(stderr))
}

// TestRunJSONGolden: every stderr line is a JSON object with "event" and
// "at_ms"; the first is "open", the last "stats"; the rest (sorted, since
// the converter pool may finish tensors in any order) match the golden
// file.
func TestRunJSONGolden(t *testing.T) {
	_, stderr := runProgress(t, "json")
	lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
	kinds := map[string]int{}
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		k, _ := m["event"].(string)
		if _, ok := m["at_ms"]; !ok && k != "stats" {
			t.Errorf("line %q lacks at_ms", l)
		}
		kinds[k]++
	}
	if first, last := lines[0], lines[len(lines)-1]; !strings.Contains(first, `"event":"open"`) || !strings.Contains(last, `"event":"stats"`) {
		t.Errorf("first %q, last %q", first, last)
	}
	if kinds["token"] != 8 || kinds["first_token"] != 1 || kinds["model_ready"] != 1 || kinds["all_resident"] != 1 || kinds["layer_ready"] != 5 {
		t.Errorf("event counts %v", kinds)
	}
	mid := lines[1 : len(lines)-1]
	for i := range mid {
		mid[i] = normalize(mid[i])
	}
	sort.Strings(mid)
	golden(t, "run-json.golden", normalize(lines[0])+"\n"+strings.Join(mid, "\n")+"\n"+normalize(lines[len(lines)-1])+"\n")
}

// TestRunDevice: gpu is understood but not available yet; auto runs on
// the CPU.
func TestRunDevice(t *testing.T) {
	var stdout, stderr bytes.Buffer
	m := testmodels.Path(t, "stories260K-Q4_0.gguf")
	err := newApp(&stdout, &stderr).Run([]string{"forge", "run", "-m", m, "-p", "x", "--device", "gpu:0", "--progress", "plain"})
	if err == nil || !strings.Contains(err.Error(), "no GPU backend") {
		t.Errorf("--device gpu:0: %v", err)
	}
	for _, bad := range [][]string{{"--strategy", "fast"}, {"--progress", "fancy"}} {
		args := append([]string{"forge", "run", "-m", m, "-p", "x"}, bad...)
		if err := newApp(&stdout, &stderr).Run(args); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
	if _, stderr := runProgress(t, "plain", "--device", "auto"); !strings.Contains(stderr, "stop max_tokens") {
		t.Errorf("auto: %q", stderr)
	}
}
