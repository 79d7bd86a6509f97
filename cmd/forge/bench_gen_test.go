package main

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf/testmodels"
)

// fakeLlamaBench writes a script that answers like `llama-bench -o json`:
// one record for the -p and one for the -n it was given, after checking it
// got -m, -r and -o json, and -t 1 (forge's --threads) once.
func fakeLlamaBench(t *testing.T) string {
	t.Helper()
	script := `#!/bin/sh
p=; n=; r=; o=; m=; t=
while [ $# -gt 0 ]; do
  case "$1" in
    -p) p=$2; shift ;; -n) n=$2; shift ;; -r) r=$2; shift ;; -o) o=$2; shift ;; -m) m=$2; shift ;; -t) t=$t$2; shift ;;
  esac
  shift
done
[ "$o" = json ] && [ -f "$m" ] && [ "$r" = 2 ] && [ "$t" = 1 ] || { echo "bad args" >&2; exit 3; }
cat <<JSON
[
  {"build_commit": "fake", "model_type": "llama ?B Q4_0", "model_size": 262656, "model_n_params": 292800, "backends": "CPU",
   "n_prompt": $p, "n_gen": 0, "avg_ts": 12345.5, "stddev_ts": 10.25, "samples_ts": [12335.25, 12355.75]},
  {"build_commit": "fake", "model_type": "llama ?B Q4_0", "model_size": 262656, "model_n_params": 292800, "backends": "CPU",
   "n_prompt": 0, "n_gen": $n, "avg_ts": 2345.5, "stddev_ts": 5.5, "samples_ts": [2340, 2351]}
]
JSON
`
	p := filepath.Join(t.TempDir(), "llama-bench")
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// forge bench gen on the CPU with two bundled models and a fake
// llama-bench: a pp and a tg row per model for forge, with r samples each,
// mean and stddev matching the samples, and the peer's rows parsed from its
// JSON with the same -p/-n/-r passed through.
func TestBenchGenJSON(t *testing.T) {
	leakCheck(t)
	m1 := testmodels.Path(t, "stories260K-Q4_0.gguf")
	m2 := testmodels.Path(t, "stories260K-Q8_0.gguf")
	peer := fakeLlamaBench(t)
	var stdout, stderr bytes.Buffer
	err := newApp(&stdout, &stderr).RunContext(t.Context(), []string{"forge", "bench", "gen", "-m", m1, "-m", m2,
		"-p", "16", "-n", "8", "-r", "2", "--device", "cpu", "-t", "1", "--peer", peer + " -ngl 99", "--json"})
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	var rows []genRow
	if err := json.Unmarshal(stdout.Bytes(), &rows); err != nil {
		t.Fatalf("%v\n%s", err, stdout.String())
	}
	if len(rows) != 8 {
		t.Fatalf("%d rows, want 8 (2 models × pp, tg × forge, peer):\n%s", len(rows), stdout.String())
	}
	for i, r := range rows[:4] {
		wantModel := filepath.Base([]string{m1, m1, m2, m2}[i])
		wantTest := []string{"pp16", "tg8"}[i%2]
		if r.Runtime != "forge" || r.Model != wantModel || r.Test != wantTest || r.Backend != "cpu" || r.SizeBytes <= 0 || r.Params <= 0 {
			t.Errorf("row %d: %+v, want forge %s %s on cpu", i, r, wantModel, wantTest)
		}
		if len(r.Samples) != 2 || r.Samples[0] <= 0 || r.Samples[1] <= 0 {
			t.Errorf("row %d: samples %v, want 2 positive", i, r.Samples)
		}
		mean, sd := meanStddev(r.Samples)
		if r.AvgTS != mean || r.StdevTS != sd {
			t.Errorf("row %d: %v ± %v, samples give %v ± %v", i, r.AvgTS, r.StdevTS, mean, sd)
		}
		if r.BandwidthFraction != 0 {
			t.Errorf("row %d: a copy-bandwidth fraction on the CPU", i)
		}
	}
	for i, r := range rows[4:] {
		wantTest := []string{"pp16", "tg8"}[i%2]
		if r.Runtime != "llama-bench" || r.Test != wantTest || r.Backend != "CPU" || r.SizeBytes != 262656 || len(r.Samples) != 2 {
			t.Errorf("peer row %d: %+v, want llama-bench %s", i, r, wantTest)
		}
	}
	if rows[4].AvgTS != 12345.5 || rows[5].StdevTS != 5.5 {
		t.Errorf("peer figures %v, %v", rows[4].AvgTS, rows[5].StdevTS)
	}
}

func TestBenchGenTable(t *testing.T) {
	leakCheck(t)
	m := testmodels.Path(t, "stories260K-Q4_0.gguf")
	var stdout, stderr bytes.Buffer
	err := newApp(&stdout, &stderr).RunContext(t.Context(), []string{"forge", "bench", "gen", "-m", m,
		"-p", "0", "-n", "4", "-r", "1", "--device", "cpu", "-t", "1"})
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "| runtime ") || !strings.Contains(lines[1], "---:") ||
		!strings.Contains(lines[2], "| tg4 ") || !strings.Contains(lines[2], " ± 0.00 ") {
		t.Fatalf("table:\n%s", stdout.String())
	}
}

func TestBenchGenErrors(t *testing.T) {
	m := testmodels.Path(t, "stories260K-Q4_0.gguf")
	failing := filepath.Join(t.TempDir(), "fails")
	if err := os.WriteFile(failing, []byte("#!/bin/sh\necho broken >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	notJSON := filepath.Join(t.TempDir(), "text")
	if err := os.WriteFile(notJSON, []byte("#!/bin/sh\necho '| model | t/s |'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-p", "0", "-n", "0"}, "nothing to measure"},
		{[]string{"-r", "0"}, "--r 0"},
		{[]string{"--device", "tpu"}, "tpu"},
		{[]string{"-m", "/nonexistent.gguf"}, "nonexistent"},
		{[]string{"-p", "4", "-n", "2", "-r", "1", "--device", "cpu", "--peer", failing}, "broken"},
		{[]string{"-p", "4", "-n", "2", "-r", "1", "--device", "cpu", "--peer", notJSON}, "-o json"},
	} {
		var stdout, stderr bytes.Buffer
		err := newApp(&stdout, &stderr).RunContext(t.Context(), append([]string{"forge", "bench", "gen", "-m", m}, c.args...))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want one containing %q", c.args, err, c.want)
		}
	}
}

func TestMeanStddev(t *testing.T) {
	mean, sd := meanStddev([]float64{2, 4, 4, 4, 5, 5, 7, 9})
	if mean != 5 || math.Abs(sd-2.138089935299395) > 1e-12 {
		t.Errorf("got %v ± %v, want 5 ± 2.1381 (sample stddev)", mean, sd)
	}
	if mean, sd := meanStddev([]float64{3}); mean != 3 || sd != 0 {
		t.Errorf("one sample: %v ± %v", mean, sd)
	}
	if got := backendName("/m.gguf (llama, 5 layers, cuda:0, prefetch)"); got != "cuda:0" {
		t.Errorf("backendName = %q", got)
	}
}

// A peer command line that sets its own -t keeps it: forge's --threads is
// not appended a second time (the fake refuses two -t).
func TestBenchGenPeerOwnThreads(t *testing.T) {
	leakCheck(t)
	m := testmodels.Path(t, "stories260K-Q4_0.gguf")
	var stdout, stderr bytes.Buffer
	err := newApp(&stdout, &stderr).RunContext(t.Context(), []string{"forge", "bench", "gen", "-m", m,
		"-p", "8", "-n", "4", "-r", "2", "--device", "cpu", "-t", "2", "--peer", fakeLlamaBench(t) + " -t 1"})
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	if !strings.Contains(stdout.String(), "| llama-bench ") {
		t.Fatalf("no peer rows:\n%s", stdout.String())
	}
}
