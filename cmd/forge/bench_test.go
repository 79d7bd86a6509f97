package main

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forge-llm/forge/bench/loadbench"
	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/pipeline/synth"
)

// asMainEnv makes the test binary behave as the forge program: `forge
// bench load` re-executes its own binary for every run, and the pty test
// runs `forge run` in a pseudo-terminal; under `go test` that binary is
// this test binary.
const asMainEnv = "FORGE_TEST_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// copyModel copies a bundled model into a temporary directory, so that
// evicting it from the page cache touches nothing shared.
func copyModel(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(testmodels.Path(t, name))
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestBenchLoadJSON runs `forge bench load` (each run a child process)
// with two strategies, both cache modes and a peer, and checks every run's
// milestones are in order, the cache modes did what they say, the peer
// was timed, and the SVG timeline is well-formed with spans for every
// layer.
func TestBenchLoadJSON(t *testing.T) {
	t.Setenv(asMainEnv, "1")
	model := copyModel(t, "stories260K-Q4_K_M.gguf")
	svg := filepath.Join(t.TempDir(), "timeline.svg")
	var stdout, stderr bytes.Buffer
	args := []string{"forge", "bench", "load", "-m", model, "--strategies", "prefetch,host-f32", "--runs", "2",
		"--cache", "both", "--prompt-tokens", "12", "--threads", "2", "--json", "--svg", svg,
		"--peer", "printf 'peer text'; cat {model} > /dev/null"}
	if err := newApp(&stdout, &stderr).Run(args); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	var out struct {
		Runs    []loadbench.Result
		Summary []loadbench.Group
	}
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("%v\n%s", err, stdout.String())
	}
	if len(out.Runs) != 2*2*3 { // caches × runs × (strategies + peer)
		t.Fatalf("%d runs, want 12", len(out.Runs))
	}
	for _, r := range out.Runs {
		if r.Err != "" {
			t.Errorf("%s %s run %d: %s", r.Strategy, r.Cache, r.Run, r.Err)
			continue
		}
		switch r.Cache {
		case "warm":
			if r.CachedBefore < 0.99 {
				t.Errorf("%s warm run %d: %.2f of the file cached", r.Strategy, r.Run, r.CachedBefore)
			}
		case "cold":
			if r.CachedBefore > 0.01 {
				t.Errorf("%s cold run %d: %.2f of the file still cached", r.Strategy, r.Run, r.CachedBefore)
			}
		}
		if r.Strategy == "peer" {
			if !(r.FirstTokenMs > 0 && r.FirstTokenMs <= r.ExitMs && r.PeakRSS > 0) {
				t.Errorf("peer run: %+v", r)
			}
			continue
		}
		// Loading starts inside Open, so on a small model "ready" may
		// come before Open returns: open is ordered after main and
		// before exit only.
		order := []float64{r.MainMs, r.ReadyMs, r.FirstTokenMs, r.ExitMs}
		for i := 1; i < len(order); i++ {
			if !(order[i-1] > 0 && order[i-1] <= order[i]) {
				t.Errorf("%s %s run %d: milestones main, ready, first token, exit out of order: %v", r.Strategy, r.Cache, r.Run, order)
				break
			}
		}
		if !(r.MainMs <= r.OpenMs && r.OpenMs <= r.ExitMs) {
			t.Errorf("%s %s run %d: open at %.1f ms, outside main %.1f – exit %.1f", r.Strategy, r.Cache, r.Run, r.OpenMs, r.MainMs, r.ExitMs)
		}
		if !(r.ReadyMs <= r.ResidentMs && r.ResidentMs <= r.ExitMs) {
			t.Errorf("%s: ready %.2f, resident %.2f, exit %.2f", r.Strategy, r.ReadyMs, r.ResidentMs, r.ExitMs)
		}
		if r.PromptTokens != 12 || r.FileBytes <= 0 || r.ReadBytes != r.FileBytes || r.LoadBps <= 0 {
			t.Errorf("%s: prompt %d, file %d, read %d bytes, load %.0f B/s", r.Strategy, r.PromptTokens, r.FileBytes, r.ReadBytes, r.LoadBps)
		}
		if r.PeakRSS <= 0 || r.PeakRssAnon <= 0 || r.PeakRssAnon > r.PeakRSS || r.DevicePeak <= 0 {
			t.Errorf("%s: peak RSS %d, RssAnon %d, device %d", r.Strategy, r.PeakRSS, r.PeakRssAnon, r.DevicePeak)
		}
		// host-f32 places the weights as F32: more than the file's bytes.
		if r.Strategy == "host-f32" && r.PlacedBytes <= r.FileBytes {
			t.Errorf("host-f32 placed %d bytes of a %d-byte file", r.PlacedBytes, r.FileBytes)
		}
	}
	if len(out.Summary) != 6 {
		t.Errorf("%d summary groups, want 6", len(out.Summary))
	}
	for _, g := range out.Summary {
		if s := g.Stats["first token"]; s.N != 2 || !(s.Min <= s.Median && s.Median <= s.Max) {
			t.Errorf("%s %s first token %+v", g.Strategy, g.Cache, s)
		}
	}

	f, err := os.Open(svg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := xml.NewDecoder(f)
	titles := map[string]bool{}
	inTitle := false
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("SVG: %v", err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			inTitle = tok.Name.Local == "title"
		case xml.CharData:
			if inTitle {
				f := strings.Fields(string(tok))
				titles[f[0]+" "+f[1]+" "+f[2]] = true
			}
		case xml.EndElement:
			inTitle = false
		}
	}
	for _, l := range []string{"-1", "0", "1", "2", "3", "4"} {
		for _, stage := range []string{"read", "convert", "upload"} {
			if !titles["layer "+l+" "+stage] {
				t.Errorf("SVG lacks layer %s's %s span", l, stage)
			}
		}
		if l != "-1" && !titles["layer "+l+" compute"] {
			t.Errorf("SVG lacks layer %s's compute span", l)
		}
	}
}

// TestBenchLoadTable: the default output is a table per model with a row
// per strategy and cache mode and min/median/max cells.
func TestBenchLoadTable(t *testing.T) {
	t.Setenv(asMainEnv, "1")
	model := copyModel(t, "stories260K-Q8_0.gguf")
	var stdout, stderr bytes.Buffer
	args := []string{"forge", "bench", "load", "-m", model, "--strategies", "eager,lazy", "--runs", "1", "--cache", "warm", "--prompt-tokens", "4"}
	if err := newApp(&stdout, &stderr).Run(args); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], model+" (min/median/max") {
		t.Fatalf("table:\n%s", stdout.String())
	}
	for _, col := range []string{"strategy", "prompt", "bound ms", "open ms", "ready ms", "resident ms", "first token ms", "load GB/s", "link GB/s", "peak RSS MiB", "RssAnon MiB", "device MiB"} {
		if !strings.Contains(lines[1], col) {
			t.Errorf("header lacks %q: %s", col, lines[1])
		}
	}
	for i, s := range []string{"eager", "lazy"} {
		f := strings.Fields(lines[2+i])
		if f[0] != s || f[1] != "warm" || f[2] != "4" || f[3] != "1" || strings.Count(f[4], "/") != 2 || f[len(f)-1] != "–" {
			t.Errorf("row %q", lines[2+i])
		}
	}
}

func TestBenchLoadErrors(t *testing.T) {
	m := testmodels.Path(t, "stories260K-Q4_0.gguf")
	for _, bad := range [][]string{
		{"--strategies", "fast"},
		{"--cache", "lukewarm"},
		{"--device", "tpu"},
	} {
		var stdout, stderr bytes.Buffer
		if err := newApp(&stdout, &stderr).Run(append([]string{"forge", "bench", "load", "-m", m}, bad...)); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
	// A profile folder that is a file is refused before any run, naming the flag.
	var stdout, stderr bytes.Buffer
	err := newApp(&stdout, &stderr).Run([]string{"forge", "bench", "load", "-m", m, "--strategies", "prefetch", "--expert-profiles", m})
	if err == nil || !strings.Contains(err.Error(), "--expert-profiles "+m+": not a directory") {
		t.Errorf("--expert-profiles naming a file: %v, want it refused naming the flag", err)
	}
}

// TestBenchLoadPromptSweep runs `forge bench load --prompt-tokens 3,9`:
// every strategy runs at each length, the peer once, and the summary has
// a group per length; --fresh-kernel-cache runs each child with a kernel
// cache folder of its own (on the CPU there is nothing to compile, so
// this checks the plumbing only).
func TestBenchLoadPromptSweep(t *testing.T) {
	t.Setenv(asMainEnv, "1")
	model := copyModel(t, "stories260K-Q8_0.gguf")
	var stdout, stderr bytes.Buffer
	args := []string{"forge", "bench", "load", "-m", model, "--strategies", "eager", "--runs", "1", "--cache", "warm",
		"--prompt-tokens", "3,9", "--fresh-kernel-cache", "--threads", "2", "--json", "--peer", "printf x"}
	if err := newApp(&stdout, &stderr).Run(args); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	var out struct {
		Runs    []loadbench.Result
		Summary []loadbench.Group
	}
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("%v\n%s", err, stdout.String())
	}
	var got []string
	for _, r := range out.Runs {
		if r.Err != "" {
			t.Errorf("%s prompt %d: %s", r.Strategy, r.PromptTokens, r.Err)
		}
		got = append(got, fmt.Sprintf("%s/%d", r.Strategy, r.PromptTokens))
	}
	if want := "eager/3 peer/0 eager/9"; strings.Join(got, " ") != want {
		t.Errorf("runs %q, want %q", strings.Join(got, " "), want)
	}
	var groups []string
	for _, g := range out.Summary {
		groups = append(groups, fmt.Sprintf("%s/%d", g.Strategy, g.Prompt))
	}
	if want := "eager/3 peer/0 eager/9"; strings.Join(groups, " ") != want {
		t.Errorf("groups %q, want %q", strings.Join(groups, " "), want)
	}
	if err := newApp(&stdout, &stderr).Run([]string{"forge", "bench", "load", "-m", model, "--prompt-tokens", "3,x"}); err == nil || !strings.Contains(err.Error(), "--prompt-tokens") {
		t.Errorf("--prompt-tokens 3,x: %v, want a usage error naming the flag", err)
	}
}

// TestBenchLoadExpertProfiles runs `forge bench load --expert-profiles DIR`
// twice over a mixture: every run's child opens the model with the
// profiles, so one profile of the file ends up in DIR holding both runs'
// routing (each run's prompt routes the same tokens through block 0:
// twice one run's count), and the second run, which loaded by it, still
// reaches its first token.
func TestBenchLoadExpertProfiles(t *testing.T) {
	t.Setenv(asMainEnv, "1")
	path := chatModelShape(t, "tiny-qwen3moe", 3)
	dir := filepath.Join(t.TempDir(), "profiles")
	var stdout, stderr bytes.Buffer
	args := []string{"forge", "bench", "load", "-m", path, "--strategies", "prefetch", "--runs", "2", "--cache", "warm",
		"--prompt-tokens", "5", "--device", "cpu", "--threads", "2", "--json", "--expert-profiles", dir}
	if err := newApp(&stdout, &stderr).Run(args); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	var out struct{ Runs []loadbench.Result }
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("%v\n%s", err, stdout.String())
	}
	if len(out.Runs) != 2 {
		t.Fatalf("%d runs, want 2", len(out.Runs))
	}
	for i, r := range out.Runs {
		if r.Err != "" || r.FirstTokenMs <= 0 {
			t.Fatalf("run %d: first token %v ms, error %q", i, r.FirstTokenMs, r.Err)
		}
	}
	var block0 int64
	for _, k := range onlyProfile(t, dir)[0] {
		block0 += k
	}
	if k := int64(synth.Presets["tiny-qwen3moe"].ExpertsUsed); block0 != 2*5*k {
		t.Errorf("block 0's experts routed %d tokens in the profile, want 2 runs × 5 prompt tokens × %d experts", block0, k)
	}
}
