package servebench

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// fake is an OpenAI-compatible server that streams known chunks with
// known delays: first after firstDelay, then one every gap. perChunk
// tokens go in each chunk (their text is " t" each); with usage, the last
// chunk carries usage (completion_tokens = max_tokens).
type fake struct {
	firstDelay, gap time.Duration
	perChunk        int
	usage           bool
	// fail, when set, answers every request with this HTTP status; cut
	// ends every stream after the first chunk without [DONE]; errEvent
	// sends an error object after the first chunk.
	fail     int
	cut      bool
	errEvent bool

	mu      sync.Mutex
	prompts map[string][]string // model → prompts in arrival order
	all     []string
}

type fakeReq struct {
	Model         string `json:"model"`
	Prompt        string `json:"prompt"`
	MaxTokens     int    `json:"max_tokens"`
	Stream        bool   `json:"stream"`
	IgnoreEOS     bool   `json:"ignore_eos"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Temperature *float64 `json:"temperature"`
}

func (f *fake) start(t *testing.T) *httptest.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", f.complete)
	mux.HandleFunc("POST /tokenize", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Content string `json:"content"`
		}
		json.NewDecoder(r.Body).Decode(&req)
		toks := []int{}
		for range strings.Fields(req.Content) { // two tokens a word
			toks = append(toks, 1, 2)
		}
		json.NewEncoder(w).Encode(map[string]any{"tokens": toks})
	})
	s := httptest.NewServer(mux)
	t.Cleanup(s.Close)
	return s
}

func (f *fake) complete(w http.ResponseWriter, r *http.Request) {
	var req fakeReq
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || !req.Stream || !req.IgnoreEOS || !req.StreamOptions.IncludeUsage || req.Temperature == nil || *req.Temperature != 0 {
		http.Error(w, fmt.Sprintf("bad request %+v %v", req, err), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	if f.prompts == nil {
		f.prompts = map[string][]string{}
	}
	f.prompts[req.Model] = append(f.prompts[req.Model], req.Prompt)
	f.all = append(f.all, req.Prompt)
	f.mu.Unlock()
	if f.fail != 0 {
		http.Error(w, `{"error":{"message":"no room"}}`, f.fail)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	send := func(v any) {
		b, _ := json.Marshal(v)
		fmt.Fprintf(w, "data: %s\n\n", b)
		rc.Flush()
	}
	text := func(s string) map[string]any {
		return map[string]any{"choices": []any{map[string]any{"index": 0, "text": s, "finish_reason": nil}}}
	}
	send(text("")) // an empty chunk first: not a token
	fmt.Fprint(w, ": keep-alive comment\n\n")
	time.Sleep(f.firstDelay)
	for sent := 0; sent < req.MaxTokens; sent += f.perChunk {
		if sent > 0 {
			time.Sleep(f.gap)
		}
		send(text(strings.Repeat(" t", min(f.perChunk, req.MaxTokens-sent))))
		if f.cut {
			return
		}
		if f.errEvent {
			send(map[string]any{"error": map[string]string{"message": "model exploded"}})
			return
		}
	}
	last := map[string]any{"choices": []any{map[string]any{"index": 0, "text": "", "finish_reason": "length"}}}
	if f.usage {
		last["usage"] = map[string]int{"prompt_tokens": len(strings.Fields(req.Prompt)), "completion_tokens": req.MaxTokens}
	}
	send(last)
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// leakCheck fails the test if goroutines it started outlive it; as the
// first cleanup registered, it runs after the fake servers close.
func leakCheck(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
}

func testConfig(targets ...Target) Config {
	return Config{
		Targets: targets, Clients: []int{1, 3}, PromptTokens: 10, MaxTokens: 6, RequestsPerClient: 2,
		Prompter: Prompter{Seed: 7, WordsPerToken: 1}, Client: &http.Client{Transport: &http.Transport{}},
		RequestTimeout: time.Minute, Warmup: 1, Log: slog.New(slog.DiscardHandler),
	}
}

func closeIdle(c Config) { c.Client.Transport.(*http.Transport).CloseIdleConnections() }

// A load run over two fakes: one sends two tokens a chunk with usage, the
// other one token a chunk without; every figure follows from what they
// sent, the targets' order rotates, and the delays bound the times from
// below.
func TestLoadRun(t *testing.T) {
	leakCheck(t)
	const first, gap = 15 * time.Millisecond, 2 * time.Millisecond
	a := &fake{firstDelay: first, gap: gap, perChunk: 2, usage: true}
	b := &fake{firstDelay: first, gap: gap, perChunk: 1}
	sa, sb := a.start(t), b.start(t)
	cfg := testConfig(Target{Name: "a", URL: sa.URL, Models: []string{"m"}}, Target{Name: "b", URL: sb.URL})
	defer closeIdle(cfg)
	rep, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Mode != "load" || len(rep.Steps) != 4 || len(rep.Requests) != 2*(1+3)*2 {
		t.Fatalf("mode %s, %d steps, %d requests", rep.Mode, len(rep.Steps), len(rep.Requests))
	}
	// Step k starts with target k%2.
	for i, want := range []string{"a", "b", "b", "a"} {
		if rep.Steps[i].Target != want {
			t.Errorf("step %d is %s, want %s", i, rep.Steps[i].Target, want)
		}
	}
	for _, r := range rep.Requests {
		if r.Err != "" {
			t.Fatalf("%+v", r)
		}
		chunks, from := 3, "usage"
		if r.Target == "b" {
			chunks, from = 6, "chunks"
		}
		if r.Tokens != 6 || r.Chunks != chunks || r.TokensFrom != from || len(r.gaps) != chunks-1 {
			t.Errorf("%s: %d tokens from %s in %d chunks, %d gaps", r.Target, r.Tokens, r.TokensFrom, r.Chunks, len(r.gaps))
		}
		if r.TTFTMs < ms(first) || r.TotalMs < ms(first+time.Duration(chunks-1)*gap) || r.TotalMs < r.TTFTMs {
			t.Errorf("%s: ttft %.2f ms, total %.2f ms under the server's delays", r.Target, r.TTFTMs, r.TotalMs)
		}
		if r.PromptWords != 10 || (r.Target == "a") != (r.PromptTokens == 10) || (r.Target == "a") != (r.Model == "m") {
			t.Errorf("%s: prompt %d words, %d tokens, model %q", r.Target, r.PromptWords, r.PromptTokens, r.Model)
		}
	}
	for _, s := range rep.Steps {
		if s.Requests != 2*s.Clients || s.Errors != 0 || s.Tokens != 6*s.Requests {
			t.Errorf("%+v", s)
		}
		if got := float64(s.Tokens) / (s.WallMs / 1000); math.Abs(s.TokensPerS-got) > 1e-9*got {
			t.Errorf("%s/%d: %.3f tokens/s, tokens over wall is %.3f", s.Target, s.Clients, s.TokensPerS, got)
		}
		chunks := 3
		if s.Target == "b" {
			chunks = 6
		}
		if s.TTFT.N != s.Requests || s.ITL.N != s.Requests*(chunks-1) || s.TTFT.P50 > s.TTFT.P99 || s.TTFT.P99 > s.TTFT.Max || s.TTFT.P50 < ms(first) {
			t.Errorf("%s/%d: ttft %+v itl %+v", s.Target, s.Clients, s.TTFT, s.ITL)
		}
		// A client's requests run one after another inside the step.
		for c := range s.Clients {
			sum := 0.0
			for _, r := range rep.Requests {
				if r.Target == s.Target && r.Clients == s.Clients && r.Client == c {
					sum += r.TotalMs
				}
			}
			if sum > s.WallMs {
				t.Errorf("%s/%d: client %d's requests took %.2f ms in a %.2f ms step", s.Target, s.Clients, c, sum, s.WallMs)
			}
		}
	}
	// Both targets got the same prompts: the warm-up, then 2 + 6 requests.
	if len(a.all) != 9 || len(b.all) != 9 {
		t.Fatalf("%d and %d prompts", len(a.all), len(b.all))
	}
	seen := map[string]int{}
	for _, p := range a.all {
		seen[p]++
	}
	for _, p := range b.all {
		seen[p]--
	}
	for p, n := range seen {
		if n != 0 {
			t.Errorf("prompt %q sent %+d more times to a than to b", p, n)
		}
	}
	if len(seen) != 9 {
		t.Errorf("%d distinct prompts, want 9 (one per request)", len(seen))
	}
	if got := rep.AllFailed(); len(got) != 0 {
		t.Errorf("all failed: %v", got)
	}

	checkJSON(t, rep)
	var tab bytes.Buffer
	if err := WriteTable(&tab, rep); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(tab.String()), "\n")
	if len(lines) != 1+1+4 || !strings.Contains(lines[1], "tok/s") || !strings.Contains(lines[1], "TTFT p50/p99/max ms") {
		t.Errorf("table:\n%s", tab.String())
	}
	checkSVG(t, rep, 2, 4)
}

// checkJSON checks the report's JSON has the documented fields.
func checkJSON(t *testing.T, rep *Report) {
	t.Helper()
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Mode     string
		Requests []map[string]any
		Steps    []map[string]any
	}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if len(m.Requests) != len(rep.Requests) || len(m.Steps) != len(rep.Steps) {
		t.Fatalf("JSON: %d requests, %d steps", len(m.Requests), len(m.Steps))
	}
	for _, k := range []string{"target", "clients", "client", "seq", "kind", "start_ms", "ttft_ms", "total_ms", "tokens", "tokens_from", "chunks", "itl_p50_ms", "prompt_words"} {
		if _, ok := m.Requests[0][k]; !ok {
			t.Errorf("request JSON lacks %q: %v", k, m.Requests[0])
		}
	}
	for _, k := range []string{"target", "clients", "kind", "requests", "errors", "tokens", "wall_ms", "tokens_per_s", "ttft_ms", "itl_ms"} {
		if _, ok := m.Steps[0][k]; !ok {
			t.Errorf("step JSON lacks %q: %v", k, m.Steps[0])
		}
	}
	if q, ok := m.Steps[0]["ttft_ms"].(map[string]any); !ok || q["p50"] == nil || q["p99"] == nil || q["max"] == nil {
		t.Errorf("step ttft_ms: %v", m.Steps[0]["ttft_ms"])
	}
}

// checkSVG parses the chart: a line per target and a point per measured
// step.
func checkSVG(t *testing.T, rep *Report, lines, points int) {
	t.Helper()
	var b bytes.Buffer
	if err := WriteSVG(&b, rep); err != nil {
		t.Fatal(err)
	}
	d := xml.NewDecoder(&b)
	n := map[string]int{}
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("SVG: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			n[se.Name.Local]++
		}
	}
	if n["svg"] != 1 || n["polyline"] != lines || n["circle"] != points {
		t.Errorf("SVG elements %v, want %d lines and %d points", n, lines, points)
	}
}

// Failing peers: an HTTP error, a stream cut short and an error event are
// all counted, with the first error's text, and a target whose every
// request failed is named by AllFailed.
func TestErrors(t *testing.T) {
	leakCheck(t)
	ok := (&fake{perChunk: 1, usage: true}).start(t)
	busy := (&fake{fail: http.StatusServiceUnavailable}).start(t)
	cut := (&fake{perChunk: 1, cut: true}).start(t)
	boom := (&fake{perChunk: 1, errEvent: true}).start(t)
	cfg := testConfig(Target{Name: "ok", URL: ok.URL}, Target{Name: "busy", URL: busy.URL},
		Target{Name: "cut", URL: cut.URL}, Target{Name: "boom", URL: boom.URL})
	cfg.Warmup = 0
	defer closeIdle(cfg)
	rep, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"ok": "", "busy": "HTTP 503: {\"error\":{\"message\":\"no room\"}}", "cut": "stream ended without data: [DONE]", "boom": "error in the stream: {\"message\":\"model exploded\"}"}
	for _, s := range rep.Steps {
		w := want[s.Target]
		if w == "" {
			if s.Errors != 0 {
				t.Errorf("%s: %d errors: %s", s.Target, s.Errors, s.FirstError)
			}
			continue
		}
		if s.Errors != s.Requests || s.Requests != 2*s.Clients || s.FirstError != w {
			t.Errorf("%s/%d: %d of %d failed, first %q, want %q", s.Target, s.Clients, s.Errors, s.Requests, s.FirstError, w)
		}
	}
	for _, r := range rep.Requests {
		if r.Target == "busy" && r.Status != 503 || r.Target == "cut" && (r.Chunks != 1 || r.Tokens != 1) {
			t.Errorf("%+v", r)
		}
	}
	if got := strings.Join(rep.AllFailed(), ","); got != "busy,cut,boom" {
		t.Errorf("all failed: %s", got)
	}
	var tab bytes.Buffer
	if err := WriteTable(&tab, rep); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(tab.String(), "busy, 3 clients (load): 6 errors, the first: HTTP 503") {
		t.Errorf("table:\n%s", tab.String())
	}
	checkSVG(t, rep, 1, 2) // only "ok" has points
}

// --turns: every turn resends the previous prompt and reply with new
// text; the history is shared; the new texts go alone afterwards.
func TestTurns(t *testing.T) {
	leakCheck(t)
	f := &fake{firstDelay: time.Millisecond, perChunk: 1, usage: true}
	s := f.start(t)
	cfg := testConfig(Target{Name: "f", URL: s.URL})
	cfg.Turns, cfg.HistoryTokens, cfg.TurnTokens, cfg.MaxTokens = 3, 40, 5, 2
	cfg.Clients, cfg.Warmup, cfg.RequestsPerClient = []int{2}, 0, 2 // two conversations a client
	defer closeIdle(cfg)
	rep, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Mode != "turns" || len(rep.Requests) != 2*2*3*2 || len(rep.Steps) != 2 || len(rep.Turns) != 3 {
		t.Fatalf("mode %s: %d requests, %d steps, %d turn rows", rep.Mode, len(rep.Requests), len(rep.Steps), len(rep.Turns))
	}
	history := cfg.Prompter.Text("history", 40)
	byClient := map[[2]int][]Record{} // client, conversation
	for _, r := range rep.Requests {
		if r.Err != "" {
			t.Fatal(r.Err)
		}
		if r.Kind == "turn" {
			k := [2]int{r.Client, r.Seq / 3}
			byClient[k] = append(byClient[k], r)
		}
	}
	if len(byClient) != 4 {
		t.Fatalf("%d conversations, want 2 clients × 2", len(byClient))
	}
	// The fake saw, per client, prompts that each extend the one before
	// by the reply (" t t") and 5 new words.
	prompts := f.prompts[""]
	for c, recs := range byClient {
		var prev string
		for i, r := range recs {
			if r.Turn != i+1 || r.Tokens != 2 {
				t.Fatalf("client %d: %+v", c, r)
			}
			var p string
			for _, q := range prompts {
				if strings.Fields(q)[0] == strings.Fields(history)[0] && len(strings.Fields(q)) == r.PromptWords && (prev == "" || strings.HasPrefix(q, prev)) {
					p = q
				}
			}
			if p == "" {
				t.Fatalf("client %d turn %d: no prompt of %d words extending the last", c, r.Turn, r.PromptWords)
			}
			if !strings.HasPrefix(p, history) {
				t.Errorf("turn prompt does not start with the history")
			}
			if i > 0 && !strings.HasPrefix(p, prev+" t t ") {
				t.Errorf("client %d turn %d does not resend the reply", c, r.Turn)
			}
			if want := 40 + 5*(i+1) + 2*i; r.PromptWords != want {
				t.Errorf("client %d turn %d: %d words, want %d", c, r.Turn, r.PromptWords, want)
			}
			prev = p
		}
	}
	// Alone, a turn sends one word of its own, then what it added: turn 1
	// its whole prompt (history and 5 words), later turns the reply before
	// them (2 words) and 5 new.
	alone := 0
	for _, r := range rep.Requests {
		want := 8
		if r.Turn == 1 {
			want = 46
		}
		if r.Kind == "alone" {
			alone++
			if r.PromptWords != want {
				t.Errorf("alone request of turn %d: %d words, want %d", r.Turn, r.PromptWords, want)
			}
		}
	}
	// The leading words differ, so no alone request starts with another's
	// prefix (a prefix cache would skip what it shares).
	leads := map[string]bool{}
	for _, q := range prompts {
		if !strings.HasPrefix(q, history) { // not a turn: an alone request
			leads[strings.Fields(q)[0]] = true
		}
	}
	if len(leads) != alone {
		t.Errorf("%d distinct leading words among %d alone requests", len(leads), alone)
	}
	for i, ts := range rep.Turns {
		if ts.Turn != i+1 || ts.TTFT.N != 4 || ts.AloneTTFT.N != 4 || ts.Ratio <= 0 || ts.WithinBar != (ts.Ratio <= Bar) {
			t.Errorf("%+v", ts)
		}
	}
	checkJSON(t, rep)
	var tab bytes.Buffer
	if err := WriteTable(&tab, rep); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(tab.String(), "turn TTFT p50/max ms") || strings.Count(tab.String(), "\n") != 1+3+1+2+3 { // calibration, steps, blank, turns
		t.Errorf("table:\n%s", tab.String())
	}
}

// --swap alternates the two models: first, warm, then swap and warm.
func TestSwap(t *testing.T) {
	leakCheck(t)
	f := &fake{perChunk: 1, usage: true}
	s := f.start(t)
	cfg := testConfig(Target{Name: "f", URL: s.URL, Models: []string{"x", "y"}})
	cfg.Swap, cfg.RequestsPerClient, cfg.Warmup, cfg.Clients = true, 4, 0, nil
	defer closeIdle(cfg)
	rep, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var kinds, models []string
	for _, r := range rep.Requests {
		kinds, models = append(kinds, r.Kind), append(models, r.Model)
		if r.Tokens != 1 {
			t.Errorf("%+v", r)
		}
	}
	if got := strings.Join(kinds, " "); got != "first warm swap warm swap warm swap warm" {
		t.Errorf("kinds %s", got)
	}
	if got := strings.Join(models, ""); got != "xxyyxxyy" {
		t.Errorf("models %s", got)
	}
	if len(rep.Swaps) != 1 || rep.Swaps[0].Swaps.N != 3 || rep.Swaps[0].Warm.N != 4 || rep.Swaps[0].Requests != 8 {
		t.Errorf("%+v", rep.Swaps)
	}
	checkSVG(t, rep, 1, 3)
	var tab bytes.Buffer
	if err := WriteTable(&tab, rep); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(tab.String(), "swap TTFT p50/max ms") || !strings.Contains(tab.String(), "x ⇄ y") {
		t.Errorf("table:\n%s", tab.String())
	}

	cfg.Targets[0].Models = []string{"x"}
	if _, err := Run(t.Context(), cfg); err == nil {
		t.Error("--swap with one model ran")
	}
}

// --duration: each client sends until the time is up, at least once.
func TestDuration(t *testing.T) {
	leakCheck(t)
	s := (&fake{firstDelay: 5 * time.Millisecond, perChunk: 1}).start(t)
	cfg := testConfig(Target{Name: "f", URL: s.URL})
	cfg.RequestsPerClient, cfg.Duration, cfg.Clients = 0, 30*time.Millisecond, []int{2}
	defer closeIdle(cfg)
	rep, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	st := rep.Steps[0]
	if st.Requests < 2 || st.Errors != 0 || st.WallMs < 30 {
		t.Errorf("%+v", st)
	}
	for _, r := range rep.Requests {
		if r.Seq > 0 && r.StartMs >= 30 {
			t.Errorf("request %d of client %d started at %.1f ms, after the duration", r.Seq, r.Client, r.StartMs)
		}
	}
}

func TestQuantiles(t *testing.T) {
	var xs []float64
	for i := 100; i >= 1; i-- {
		xs = append(xs, float64(i))
	}
	if q := quantiles(xs); q.P50 != 50 || q.P99 != 99 || q.Max != 100 || q.N != 100 {
		t.Errorf("%+v", q)
	}
	if q := quantiles([]float64{3, 1, 2}); q.P50 != 2 || q.P99 != 3 || q.Max != 3 {
		t.Errorf("%+v", q)
	}
	if q := quantiles(nil); q.N != 0 || q.P50 != 0 {
		t.Errorf("%+v", q)
	}
}

func TestPrompter(t *testing.T) {
	p := Prompter{Seed: 3, WordsPerToken: 0.5}
	a, b := p.Text("k", 40), p.Text("k", 40)
	if a != b || len(strings.Fields(a)) != 20 || a == p.Text("j", 40) {
		t.Errorf("%q / %q", a, b)
	}
	if (Prompter{Seed: 4, WordsPerToken: 0.5}).Text("k", 40) == a {
		t.Error("the seed changes nothing")
	}
	seen := map[string]bool{}
	for _, w := range words {
		if seen[w] {
			t.Errorf("word %q twice", w)
		}
		seen[w] = true
	}
}

// Calibrate through a /tokenize endpoint (the fake counts two tokens a
// word).
func TestCalibrate(t *testing.T) {
	leakCheck(t)
	s := (&fake{}).start(t)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	cal, err := Calibrate(1, 100, "fake /tokenize", TokenCounter(t.Context(), &http.Client{Transport: tr}, s.URL))
	if err != nil {
		t.Fatal(err)
	}
	if cal.WordsPerToken != 0.5 || cal.SampleTokens != 200 {
		t.Errorf("%+v", cal)
	}
	if _, err := Calibrate(1, 100, "nothing", TokenCounter(t.Context(), &http.Client{Transport: tr}, s.URL+"/nope")); err == nil {
		t.Error("calibrated against a missing endpoint")
	}
}

// The address comes from forge serve's start-up line, even split across
// writes; the tail keeps the last lines.
func TestTailWriter(t *testing.T) {
	w := &tailWriter{addr: make(chan string, 1)}
	for i := range 40 {
		fmt.Fprintf(w, "line %d\n", i)
	}
	io.WriteString(w, `time=x level=INFO msg="forge serve listen`)
	io.WriteString(w, `ing" addr=127.0.0.1:4321 models=1`+"\n")
	select {
	case a := <-w.addr:
		if a != "127.0.0.1:4321" {
			t.Errorf("addr %q", a)
		}
	default:
		t.Fatal("no address")
	}
	if w.loadError() != "" {
		t.Errorf("load error %q", w.loadError())
	}
	io.WriteString(w, `time=y level=ERROR msg="loading model" model=m err="no such file"`+"\n")
	if !strings.Contains(w.loadError(), "no such file") {
		t.Errorf("load error %q", w.loadError())
	}
	lines := strings.Split(w.tail(), "\n")
	if len(lines) != tailLines || lines[0] != "line 12" {
		t.Errorf("%d lines, first %q", len(lines), lines[0])
	}
}

// A cancelled run stops between steps and says so.
func TestCancel(t *testing.T) {
	leakCheck(t)
	s := (&fake{perChunk: 1}).start(t)
	cfg := testConfig(Target{Name: "f", URL: s.URL})
	defer closeIdle(cfg)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := Run(ctx, cfg); err == nil {
		t.Error("a cancelled run succeeded")
	}
}

// WaitLoading waits out a server's 503 from /health (llama-server while
// it loads), and gives up only when its context ends.
func TestWaitLoading(t *testing.T) {
	leakCheck(t)
	var mu sync.Mutex
	calls := 0
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls <= 3 || r.URL.Path == "/forever/health" {
			http.Error(w, `{"error":{"message":"Loading model"}}`, http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte(`{"status":"ok"}`))
	}))
	t.Cleanup(s.Close)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	if err := WaitLoading(t.Context(), hc, s.URL); err != nil || calls != 4 {
		t.Errorf("%v after %d calls", err, calls)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if err := WaitLoading(ctx, hc, s.URL+"/forever"); err == nil {
		t.Error("a server loading for ever was waited out")
	}
}

type connKey struct{}

// A server that drops a kept-alive connection when the next request
// arrives on it (as llama-server's HTTP library may): the request is sent
// again on a fresh connection, so it is measured, not an error.
func TestClosedKeepAlive(t *testing.T) {
	leakCheck(t)
	f := &fake{perChunk: 1, usage: true}
	var mu sync.Mutex
	drops := 0
	s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := r.Context().Value(connKey{}).(*int)
		mu.Lock()
		*n++
		drop := *n > 1
		if drop {
			drops++
		}
		mu.Unlock()
		if drop {
			c, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				c.Close()
			}
			return
		}
		f.complete(w, r)
	}))
	s.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
		return context.WithValue(ctx, connKey{}, new(int))
	}
	s.Start()
	t.Cleanup(s.Close)
	cfg := testConfig(Target{Name: "f", URL: s.URL})
	cfg.Clients, cfg.RequestsPerClient, cfg.Warmup = []int{1}, 3, 0
	defer closeIdle(cfg)
	rep, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if st := rep.Steps[0]; st.Errors != 0 || st.Requests != 3 || drops != 2 {
		t.Errorf("%d dropped connections: %+v", drops, st)
	}
}

// TestCompleteLlamaNative reads llama-server's own streaming /completion:
// content events timed like chunks, the stop event's token counts as the
// usage, and a stream cut before the stop event is an error.
func TestCompleteLlamaNative(t *testing.T) {
	cut := false
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Prompt   string `json:"prompt"`
			NPredict int    `json:"n_predict"`
			Stream   bool   `json:"stream"`
		}
		if r.URL.Path != "/completion" || json.NewDecoder(r.Body).Decode(&body) != nil || !body.Stream || body.NPredict != 3 {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		for _, piece := range []string{"a", "b", "c"} {
			fmt.Fprintf(w, "data: {\"content\":%q,\"stop\":false}\n\n", piece)
			w.(http.Flusher).Flush()
		}
		if !cut {
			fmt.Fprint(w, "data: {\"content\":\"\",\"stop\":true,\"tokens_predicted\":3,\"tokens_evaluated\":7}\n\n")
		}
	}))
	defer srv.Close()
	o := completeLlama(context.Background(), srv.Client(), srv.URL, request{prompt: "x y z", maxTokens: 3})
	if o.err != nil || o.text != "abc" || o.chunks != 3 || len(o.gaps) != 2 || o.ttft <= 0 {
		t.Fatalf("outcome %+v", o)
	}
	if o.usage == nil || o.usage.CompletionTokens != 3 || o.usage.PromptTokens != 7 {
		t.Errorf("usage %+v, want 3 predicted of 7 evaluated", o.usage)
	}
	cut = true
	if o := completeLlama(context.Background(), srv.Client(), srv.URL, request{prompt: "x", maxTokens: 3}); o.err == nil {
		t.Error("a stream without its stop event is not an error")
	}
}
