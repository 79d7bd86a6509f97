package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/pipeline"
)

// promLine is a sample line of the text exposition format: a metric name,
// optional labels, a value.
var promLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\["\\n])*",?)*\})? ([-+]?(?:[0-9.eE+-]+|Inf|NaN))$`)

// parseProm checks a Prometheus text exposition: every line is a comment
// or a sample, each family's HELP and TYPE come before its samples, and
// a family's samples are together. It returns the samples by their
// name{labels}.
func parseProm(t *testing.T, text string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	typed := map[string]bool{}
	helped := map[string]bool{}
	done := map[string]bool{} // families whose samples are over
	cur := ""
	for i, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		if f, ok := strings.CutPrefix(line, "# HELP "); ok {
			name, _, _ := strings.Cut(f, " ")
			helped[name] = true
			continue
		}
		if f, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name, typ, _ := strings.Cut(f, " ")
			if typ != "counter" && typ != "gauge" {
				t.Fatalf("line %d: type %q", i+1, typ)
			}
			if !helped[name] {
				t.Fatalf("line %d: TYPE of %s before its HELP", i+1, name)
			}
			typed[name] = true
			continue
		}
		if strings.HasPrefix(line, "#") {
			continue
		}
		m := promLine.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("line %d is neither a comment nor a sample: %q", i+1, line)
		}
		name := m[1]
		if !typed[name] {
			t.Fatalf("line %d: sample of %s before its HELP and TYPE", i+1, name)
		}
		if name != cur {
			if done[name] {
				t.Fatalf("line %d: samples of %s are not together", i+1, name)
			}
			done[cur], cur = true, name
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			t.Fatalf("line %d: value %q: %v", i+1, m[3], err)
		}
		key := name + m[2]
		if _, dup := out[key]; dup {
			t.Fatalf("line %d: %s twice", i+1, key)
		}
		out[key] = v
	}
	return out
}

func (ts *testServer) metrics(t *testing.T) map[string]float64 {
	t.Helper()
	resp, err := ts.client.Get(ts.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain; version=0.0.4") {
		t.Fatalf("GET /metrics: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	return parseProm(t, string(b))
}

// TestMetrics: /metrics parses as Prometheus text and its counters move
// with requests: by route and status, prompt and generated tokens; the
// gauges show each model's memory, load time and, for the batching
// model, its KV pool.
func TestMetrics(t *testing.T) {
	plain := testmodels.Path(t, "stories260K-Q8_0.gguf")
	ts := startServer(t, serveConfig{models: []modelArg{{id: "plain", name: plain}, {id: "single", name: testmodels.Path(t, "stories260K-F32.gguf")}},
		engine: pipeline.EngineOptions{KeepAlive: new(time.Duration(-1))}})
	// The load time is known once every weight is resident (the model's
	// AllResident event), which may come after serve starts listening.
	for deadline := time.Now().Add(30 * time.Second); ; {
		var st struct{ Models []pipeline.ModelStatus }
		ts.getJSON(t, "/forge/status", &st)
		resident := 0
		for _, m := range st.Models {
			if m.State == pipeline.StateResident {
				resident++
			}
		}
		if resident == len(st.Models) && resident == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the models never became resident: %+v", st.Models)
		}
		time.Sleep(5 * time.Millisecond)
	}
	before := ts.metrics(t)
	for _, k := range []string{`forge_memory_bytes`, `forge_model_memory_bytes{model="plain"}`, `forge_model_load_seconds{model="plain"}`,
		`forge_model_requests_active{model="plain"}`} {
		if _, ok := before[k]; !ok {
			t.Errorf("no %s in the first scrape", k)
		}
	}
	if before[`forge_memory_bytes`] <= 0 || before[`forge_model_memory_bytes{model="plain"}`] <= 0 || before[`forge_model_load_seconds{model="plain"}`] <= 0 {
		t.Errorf("memory %v, model memory %v, load seconds %v: want positive", before[`forge_memory_bytes`], before[`forge_model_memory_bytes{model="plain"}`], before[`forge_model_load_seconds{model="plain"}`])
	}
	if before[`forge_model_memory_bytes{model="plain"}`]+before[`forge_model_memory_bytes{model="single"}`] > before[`forge_memory_bytes`] {
		t.Errorf("models hold more than the total: %v", before)
	}

	var res struct {
		Usage usage `json:"usage"`
	}
	if c := ts.postJSON(t, "/v1/completions", map[string]any{"model": "plain", "prompt": "Once upon a time", "max_tokens": 7, "ignore_eos": true, "seed": 1}, &res); c != 200 {
		t.Fatalf("completion: %d", c)
	}
	if c := ts.postJSON(t, "/v1/completions", map[string]any{"model": "nope", "prompt": "x"}, nil); c != 404 {
		t.Fatalf("unknown model: %d", c)
	}
	after := ts.metrics(t)
	if d := after[`forge_http_requests_total{route="/v1/completions",code="200"}`] - before[`forge_http_requests_total{route="/v1/completions",code="200"}`]; d != 1 {
		t.Errorf("completions 200 moved by %v, want 1", d)
	}
	if d := after[`forge_http_requests_total{route="/v1/completions",code="404"}`]; d != 1 {
		t.Errorf("completions 404: %v, want 1", d)
	}
	if d := after[`forge_http_requests_total{route="/metrics",code="200"}`]; d != 1 {
		t.Errorf("metrics 200: %v, want 1 (the first scrape)", d)
	}
	if got := after[`forge_generated_tokens_total{model="plain"}`]; got != 7 || res.Usage.CompletionTokens != 7 {
		t.Errorf("generated tokens %v, usage %d, want 7", got, res.Usage.CompletionTokens)
	}
	if got := after[`forge_prompt_tokens_total{model="plain"}`]; got != float64(res.Usage.PromptTokens) || got == 0 {
		t.Errorf("prompt tokens %v, usage says %d", got, res.Usage.PromptTokens)
	}
	// The batching scheduler starts with a model's first request: its
	// pool shows then, and only for the model that ran one.
	if _, ok := before[`forge_kv_blocks{model="plain",state="free"}`]; ok {
		t.Errorf("KV pool before any request: %v", before)
	}
	held, free := after[`forge_kv_blocks{model="plain",state="held"}`], after[`forge_kv_blocks{model="plain",state="free"}`]
	if free <= 0 || held != 0 || after[`forge_batch_requests_running{model="plain"}`] != 0 || after[`forge_batch_requests_queued{model="plain"}`] != 0 {
		t.Errorf("after the request: kv held %v free %v, running %v, queued %v", held, free, after[`forge_batch_requests_running{model="plain"}`], after[`forge_batch_requests_queued{model="plain"}`])
	}
	if _, ok := after[`forge_kv_blocks{model="single",state="free"}`]; ok {
		t.Errorf("a KV pool for the model that ran nothing")
	}
	for k := range after {
		if strings.Contains(k, `model="nope"`) {
			t.Errorf("a series for the unknown model: %s", k)
		}
	}
	if after[`forge_http_requests_in_flight`] != 1 {
		t.Errorf("in flight during a scrape: %v, want 1 (itself)", after[`forge_http_requests_in_flight`])
	}
	// Probing paths adds to one "other" series, not one per path.
	for i := range 3 {
		resp, err := ts.client.Get(fmt.Sprintf("%s/probe/%d", ts.url, i))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if got := ts.metrics(t)[`forge_http_requests_total{route="other",code="404"}`]; got != 3 {
		t.Errorf("other 404: %v, want 3", got)
	}
}

// TestAccessLog: one info line per request with method, path, status,
// bytes, duration and the model; never the body or the API key, refused
// requests included.
func TestAccessLog(t *testing.T) {
	plain := testmodels.Path(t, "stories260K-Q8_0.gguf")
	var buf syncBuffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	cfg := serveConfig{models: []modelArg{{id: "plain", name: plain}}, apiKey: "sekrit-key", grace: 5 * time.Second}
	cfg.engine.Open.Threads = 1
	go func() { errc <- serve(ctx, ln, cfg, log) }()
	url := "http://" + ln.Addr().String()
	send := func(path, key, body string) int {
		req, _ := http.NewRequest("POST", url+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if c := send("/v1/completions", "sekrit-key", `{"prompt":"SECRET-PROMPT","max_tokens":3}`); c != 200 {
		t.Fatalf("completion: %d", c)
	}
	if c := send("/tokenize", "wrong-key", `{"content":"SECRET-PROMPT"}`); c != 401 {
		t.Fatalf("wrong key: %d", c)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	http.DefaultClient.CloseIdleConnections()
	out := buf.String()
	for _, bad := range []string{"SECRET-PROMPT", "sekrit-key", "wrong-key"} {
		if strings.Contains(out, bad) {
			t.Errorf("the log holds %q:\n%s", bad, out)
		}
	}
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		if m["msg"] == "request" {
			lines = append(lines, m)
		}
	}
	if len(lines) != 2 {
		t.Fatalf("%d access lines, want 2:\n%s", len(lines), out)
	}
	want := []struct {
		path   string
		status float64
		model  any
	}{{"/v1/completions", 200, "plain"}, {"/tokenize", 401, nil}}
	for i, w := range want {
		l := lines[i]
		if l["level"] != "INFO" || l["method"] != "POST" || l["path"] != w.path || l["status"] != w.status || l["model"] != w.model {
			t.Errorf("line %d = %v, want POST %s %v model %v", i, l, w.path, w.status, w.model)
		}
		if b, ok := l["bytes"].(float64); !ok || b <= 0 {
			t.Errorf("line %d: bytes %v", i, l["bytes"])
		}
		if _, ok := l["duration"].(float64); !ok {
			t.Errorf("line %d: duration %v", i, l["duration"])
		}
	}
}
