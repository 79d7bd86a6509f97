package main

import (
	"encoding/json"
	"encoding/xml"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forge-llm/forge/bench/servebench"
	"github.com/forge-llm/forge/gguf/testmodels"
)

// benchServeOut is `forge bench serve --json`'s output.
type benchServeOut struct {
	Report       servebench.Report `json:"report"`
	PromptTokens int               `json:"prompt_tokens"`
	MaxTokens    int               `json:"max_tokens"`
	Clients      []int             `json:"clients"`
}

// runBenchServe runs the command as the forge program (it starts forge
// serve by re-executing this test binary) and returns stdout and the error.
func runBenchServe(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	t.Setenv(asMainEnv, "1")
	var stdout, stderr syncBuffer
	err := newApp(&stdout, &stderr).RunContext(t.Context(), append([]string{"forge", "bench", "serve"}, args...))
	return stdout.String(), stderr.String(), err
}

func decodeBenchServe(t *testing.T, stdout, stderr string) benchServeOut {
	t.Helper()
	var out benchServeOut
	if err := json.Unmarshal([]byte(stdout), &out); err != nil {
		t.Fatalf("%v\n%s\n%s", err, stdout, stderr)
	}
	return out
}

// `forge bench serve` against a real forge serve on the tiny model: it
// starts the server, calibrates prompts with the model's tokenizer, runs
// 1 and 2 clients with every answer max-tokens long (usage counted), draws
// the chart and stops the server.
func TestBenchServeForge(t *testing.T) {
	leakCheck(t)
	model := testmodels.Path(t, "stories260K-Q4_0.gguf")
	svg := filepath.Join(t.TempDir(), "serve.svg")
	stdout, stderr, err := runBenchServe(t, "-m", model, "--clients", "1,2", "--max-tokens", "5", "--prompt-tokens", "12",
		"--requests-per-client", "2", "--threads", "1", "--device", "cpu", "--json", "--svg", svg)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	out := decodeBenchServe(t, stdout, stderr)
	rep := out.Report
	if rep.Mode != "load" || len(rep.Targets) != 1 || rep.Targets[0].Name != "forge" || rep.Targets[0].Models[0] != "stories260K-Q4_0" {
		t.Fatalf("%+v", rep.Targets)
	}
	if !strings.Contains(rep.Calibration.Source, "local tokenizer") || rep.Calibration.SampleTokens <= rep.Calibration.SampleWords {
		t.Errorf("calibration %+v (the 512-token vocabulary splits words)", rep.Calibration)
	}
	if len(rep.Steps) != 2 || len(rep.Requests) != 2*1+2*2 {
		t.Fatalf("%d steps, %d requests", len(rep.Steps), len(rep.Requests))
	}
	for _, r := range rep.Requests {
		if r.Err != "" || r.Tokens != 5 || r.TokensFrom != "usage" || r.Chunks == 0 || r.TTFTMs <= 0 || r.TotalMs < r.TTFTMs {
			t.Errorf("%+v", r)
		}
		// Calibrated: the server counts about 12 tokens (and BOS).
		if r.PromptTokens < 8 || r.PromptTokens > 16 {
			t.Errorf("prompt of %d words is %d tokens, want about 12", r.PromptWords, r.PromptTokens)
		}
	}
	for i, s := range rep.Steps {
		if s.Clients != []int{1, 2}[i] || s.Requests != 2*s.Clients || s.Errors != 0 || s.Tokens != 5*s.Requests || s.TokensPerS <= 0 || s.TTFT.N != s.Requests {
			t.Errorf("%+v", s)
		}
	}
	b, err := os.ReadFile(svg)
	if err != nil {
		t.Fatal(err)
	}
	if err := xml.Unmarshal(b, new(struct{})); err != nil || strings.Count(string(b), "<circle") != 2 {
		t.Errorf("SVG: %v\n%s", err, b)
	}
}

// A running server (--url) and a peer that refuses every request: the
// table shows both, the peer's errors are counted with their text, and
// the command fails naming the peer.
func TestBenchServeURLAndFailingPeer(t *testing.T) {
	leakCheck(t)
	ts := startServer(t, serveConfig{models: []modelArg{{id: "tiny", name: testmodels.Path(t, "stories260K-Q4_0.gguf")}}})
	peer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"error":{"message":"peer is down"}}`, http.StatusBadGateway)
	}))
	defer peer.Close()
	stdout, stderr, err := runBenchServe(t, "--url", "mine="+ts.url, "-m", "tiny", "--peer-url", "down="+peer.URL,
		"--clients", "1,2", "--max-tokens", "3", "--requests-per-client", "1", "--warmup", "0")
	if err == nil || !strings.Contains(err.Error(), "every request failed on down") {
		t.Fatalf("err %v\n%s\n%s", err, stdout, stderr)
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	// prompts line (calibrated through forge serve's /tokenize), header,
	// 4 rows, then a line per failed step
	if len(lines) != 1+1+4+2 || !strings.HasPrefix(lines[0], "prompts: ") || !strings.Contains(lines[0], "measured with mine /tokenize") {
		t.Fatalf("table:\n%s", stdout)
	}
	rows := map[string]int{}
	for _, l := range lines[2:6] {
		f := strings.Fields(l)
		rows[f[0]]++
		if f[0] == "mine" && f[3] != "0" || f[0] == "down" && f[3] != f[2] {
			t.Errorf("row %q: errors", l)
		}
	}
	if rows["mine"] != 2 || rows["down"] != 2 {
		t.Errorf("rows %v\n%s", rows, stdout)
	}
	if !strings.Contains(stdout, "down, 2 clients (load): 2 errors, the first: HTTP 502: {\"error\":{\"message\":\"peer is down\"}}") {
		t.Errorf("no first error line:\n%s", stdout)
	}
}

// --turns on the tiny model: each client holds a two-turn conversation;
// every turn and every lone new text is answered in full, and turn 2's
// prompt holds turn 1's prompt and reply.
func TestBenchServeTurns(t *testing.T) {
	leakCheck(t)
	model := testmodels.Path(t, "stories260K-Q4_0.gguf")
	stdout, stderr, err := runBenchServe(t, "-m", "tiny="+model, "--clients", "1,2", "--turns", "2", "--history-tokens", "40",
		"--turn-tokens", "8", "--max-tokens", "4", "--requests-per-client", "1", "--threads", "1", "--device", "cpu", "--json")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	rep := decodeBenchServe(t, stdout, stderr).Report
	if rep.Mode != "turns" || len(rep.Steps) != 4 || len(rep.Turns) != 2*2 || len(rep.Requests) != (1+2)*2*2 {
		t.Fatalf("%d steps, %d turn rows, %d requests", len(rep.Steps), len(rep.Turns), len(rep.Requests))
	}
	prompt := map[[3]int]int{} // clients, client, turn → prompt tokens
	for _, r := range rep.Requests {
		if r.Err != "" || r.Tokens != 4 {
			t.Fatalf("%+v", r)
		}
		if r.Kind == "turn" {
			prompt[[3]int{r.Clients, r.Client, r.Turn}] = r.PromptTokens
		}
	}
	for k, p1 := range prompt {
		if k[2] != 1 {
			continue
		}
		// Turn 2 adds the 4-token reply and ~8 new tokens.
		if p2 := prompt[[3]int{k[0], k[1], 2}]; p2 < p1+4+4 {
			t.Errorf("clients %d client %d: turn 1 %d tokens, turn 2 %d", k[0], k[1], p1, p2)
		}
	}
	for _, ts := range rep.Turns {
		if ts.TTFT.N != ts.Clients || ts.AloneTTFT.N != ts.Clients || ts.Ratio <= 0 {
			t.Errorf("%+v", ts)
		}
	}
}

// --swap on two tiny models with a budget for one: the requests alternate
// and every swap is answered.
func TestBenchServeSwap(t *testing.T) {
	leakCheck(t)
	a := testmodels.Path(t, "stories260K-Q8_0.gguf")
	b := testmodels.Path(t, "stories260K-Q4_0.gguf")
	stdout, stderr, err := runBenchServe(t, "-m", "a="+a, "-m", "b="+b, "--swap", "--budget", "2000000",
		"--requests-per-client", "3", "--threads", "1", "--device", "cpu", "--svg", filepath.Join(t.TempDir(), "swap.svg"))
	if err != nil {
		t.Fatalf("%v\n%s\n%s", err, stdout, stderr)
	}
	if !strings.Contains(stdout, "a ⇄ b") || !strings.Contains(stdout, "swap TTFT p50/max ms") {
		t.Fatalf("table:\n%s", stdout)
	}
	var row []string
	for _, l := range strings.Split(stdout, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == "forge" {
			row = f
		}
	}
	// forge a ⇄ b requests errors swaps …
	if len(row) < 7 || row[4] != "6" || row[5] != "0" || row[6] != "2" {
		t.Errorf("row %q\n%s", row, stdout)
	}

	stdout, stderr, err = runBenchServe(t, "-m", "a="+a, "-m", "b="+b, "--swap", "--budget", "2000000",
		"--requests-per-client", "2", "--threads", "1", "--device", "cpu", "--json", "--warmup", "0")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	rep := decodeBenchServe(t, stdout, stderr).Report
	var got []string
	for _, r := range rep.Requests {
		got = append(got, r.Kind+":"+r.Model)
		if r.Err != "" || r.Tokens != 1 {
			t.Errorf("%+v", r)
		}
	}
	if strings.Join(got, " ") != "first:a warm:a swap:b warm:b" {
		t.Errorf("requests %v", got)
	}
}

func TestBenchServeErrors(t *testing.T) {
	model := testmodels.Path(t, "stories260K-Q4_0.gguf")
	oneModel := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"object":"list","data":[{"id":"only"}]}`))
	}))
	defer oneModel.Close()
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "give -m MODEL"},
		{[]string{"-m", model, "--clients", "1,x"}, `"x" is not a positive count`},
		{[]string{"-m", model, "--clients", "0"}, `"0" is not a positive count`},
		{[]string{"-m", model, "--swap"}, "--swap needs two -m models, 1 given"},
		{[]string{"-m", model, "--duration", "1s", "--requests-per-client", "2"}, "exclude each other"},
		{[]string{"-m", model, "--max-tokens", "0"}, "--max-tokens 0: must be positive"},
		{[]string{"-m", model, "--turns", "2", "--requests-per-client", "0"}, "--requests-per-client 0: must be positive"},
		{[]string{"-m", model, "--peer-api", "grpc"}, `--peer-api "grpc": want openai or llama`},
		{[]string{"--url", "localhost:8080"}, "--url: \"localhost:8080\" is not an http(s) URL"},
		{[]string{"-m", model, "--peer-url", "x=ftp://h"}, "--peer-url: \"ftp://h\" is not an http(s) URL"},
		{[]string{"-m", model, "--device", "tpu"}, "tpu"},
		{[]string{"-m", "a=" + model, "-m", "b=" + model, "--swap", "--turns", "2"}, "--swap and --turns are separate runs"},
		{[]string{"-m", "a=" + model, "-m", "b=" + model, "--swap", "--budget", "2000000", "--threads", "1", "--peer-url", "one=" + oneModel.URL},
			"--peer-url one: --swap needs two models and its /v1/models lists fewer"},
		{[]string{"-m", filepath.Join(t.TempDir(), "missing.gguf")}, "exited before listening"},
	} {
		_, _, err := runBenchServe(t, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.args, err, c.want)
		}
	}
}

func TestNamedURL(t *testing.T) {
	for _, c := range []struct{ in, name, url string }{
		{"http://127.0.0.1:8080", "127.0.0.1:8080", "http://127.0.0.1:8080"},
		{"llama=http://h:1/v1/", "llama", "http://h:1"},
		{"http://h:2/x?a=b", "h:2", "http://h:2/x?a=b"},
	} {
		name, u, err := namedURL(c.in)
		if err != nil || name != c.name || u != c.url {
			t.Errorf("%q: %q %q %v", c.in, name, u, err)
		}
	}
}
