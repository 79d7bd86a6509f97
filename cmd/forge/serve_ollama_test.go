package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/forge-llm/forge/gguf/testmodels"
)

// ollamaFinal is the last line of /api/generate and /api/chat.
type ollamaFinal struct {
	Model              *string `json:"model"`
	CreatedAt          *string `json:"created_at"`
	Response           *string `json:"response"`
	Message            *struct{ Role, Content string }
	Done               *bool   `json:"done"`
	DoneReason         *string `json:"done_reason"`
	PromptEvalCount    *int    `json:"prompt_eval_count"`
	EvalCount          *int    `json:"eval_count"`
	TotalDuration      *int64  `json:"total_duration"`
	LoadDuration       *int64  `json:"load_duration"`
	PromptEvalDuration *int64  `json:"prompt_eval_duration"`
	EvalDuration       *int64  `json:"eval_duration"`
	Error              *string `json:"error"`
}

// check asserts the final line's fields, each present and of its type.
func (f ollamaFinal) check(t *testing.T, what, model string, chatReq bool, reasons ...string) {
	t.Helper()
	if f.Model == nil || *f.Model != model {
		t.Errorf("%s: model %v, want %q", what, f.Model, model)
	}
	if f.CreatedAt == nil {
		t.Errorf("%s: no created_at", what)
	} else if _, err := time.Parse(time.RFC3339Nano, *f.CreatedAt); err != nil {
		t.Errorf("%s: created_at: %v", what, err)
	}
	if chatReq && (f.Message == nil || f.Message.Role != "assistant") || !chatReq && f.Response == nil {
		t.Errorf("%s: no response/message: %+v", what, f)
	}
	if f.Done == nil || !*f.Done {
		t.Errorf("%s: done %v, want true", what, f.Done)
	}
	if f.DoneReason == nil || !strings.Contains(strings.Join(reasons, ","), *f.DoneReason) || *f.DoneReason == "" {
		t.Errorf("%s: done_reason %v, want one of %v", what, f.DoneReason, reasons)
	}
	if f.PromptEvalCount == nil || *f.PromptEvalCount <= 0 || f.EvalCount == nil || *f.EvalCount <= 0 {
		t.Errorf("%s: counts %v %v", what, f.PromptEvalCount, f.EvalCount)
	}
	for name, d := range map[string]*int64{"total_duration": f.TotalDuration, "load_duration": f.LoadDuration, "prompt_eval_duration": f.PromptEvalDuration, "eval_duration": f.EvalDuration} {
		if d == nil || *d < 0 {
			t.Errorf("%s: %s %v", what, name, d)
		}
	}
	if f.TotalDuration != nil && f.LoadDuration != nil && f.PromptEvalDuration != nil && f.EvalDuration != nil &&
		*f.LoadDuration+*f.PromptEvalDuration+*f.EvalDuration > *f.TotalDuration {
		t.Errorf("%s: durations %d+%d+%d over the total %d", what, *f.LoadDuration, *f.PromptEvalDuration, *f.EvalDuration, *f.TotalDuration)
	}
}

// ollamaStream posts a streaming request and returns the text pieces and
// the final line, checking every line is NDJSON of Ollama's shape.
func ollamaStream(t *testing.T, ts *testServer, path string, body map[string]any, chatReq bool) ([]string, ollamaFinal) {
	t.Helper()
	resp, err := ts.post(t.Context(), path, body)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("%s: %d %s", path, resp.StatusCode, b)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/x-ndjson" {
		t.Errorf("%s: content type %q", path, ct)
	}
	var pieces []string
	var final ollamaFinal
	sc := bufio.NewScanner(resp.Body)
	n := 0
	for sc.Scan() {
		n++
		var f ollamaFinal
		if err := json.Unmarshal(sc.Bytes(), &f); err != nil {
			t.Fatalf("line %d %q: %v", n, sc.Text(), err)
		}
		if f.Error != nil {
			t.Fatalf("stream error: %s", *f.Error)
		}
		if f.Done == nil || f.Model == nil || f.CreatedAt == nil {
			t.Fatalf("line %d %q: missing done, model or created_at", n, sc.Text())
		}
		if *f.Done {
			final = f
			if sc.Scan() {
				t.Errorf("a line after done: %q", sc.Text())
			}
			break
		}
		switch {
		case chatReq && f.Message != nil && f.Message.Role == "assistant":
			pieces = append(pieces, f.Message.Content)
		case !chatReq && f.Response != nil:
			pieces = append(pieces, *f.Response)
		default:
			t.Fatalf("line %d %q: no text", n, sc.Text())
		}
	}
	if final.Done == nil {
		t.Fatalf("%s: stream ended without a done line", path)
	}
	return pieces, final
}

// An Ollama client's flow against the bundled stories260K: version,
// tags, show, ps, generate (streaming and not), chat streaming, with
// every field of Ollama's answers checked.
func TestServeOllamaFlow(t *testing.T) {
	leakCheck(t)
	path := testmodels.Path(t, "stories260K-Q8_0.gguf")
	ts := startServer(t, serveConfig{models: []modelArg{{id: "stories", name: path}}})

	var v struct{ Version string }
	if st := ts.getJSON(t, "/api/version", &v); st != 200 || !regexp.MustCompile(`^\d+\.\d+\.\d+$`).MatchString(v.Version) {
		t.Errorf("version: %d %q", st, v.Version)
	}

	var tags struct {
		Models []struct {
			Name       *string `json:"name"`
			Model      *string `json:"model"`
			Digest     *string `json:"digest"`
			ModifiedAt *string `json:"modified_at"`
			Size       *int64  `json:"size"`
			Details    struct {
				Format            *string `json:"format"`
				Family            *string `json:"family"`
				ParameterSize     *string `json:"parameter_size"`
				QuantizationLevel *string `json:"quantization_level"`
			}
		}
	}
	if st := ts.getJSON(t, "/api/tags", &tags); st != 200 || len(tags.Models) != 1 {
		t.Fatalf("tags: %d %+v", st, tags)
	}
	m := tags.Models[0]
	switch {
	case m.Name == nil || *m.Name != "stories" || m.Model == nil || *m.Model != "stories":
		t.Errorf("tags: name %v model %v", m.Name, m.Model)
	case m.Size == nil || *m.Size <= 0:
		t.Errorf("tags: size %v", m.Size)
	case m.Digest == nil || !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(*m.Digest):
		t.Errorf("tags: digest %v", m.Digest)
	case m.ModifiedAt == nil:
		t.Errorf("tags: no modified_at")
	case m.Details.Format == nil || *m.Details.Format != "gguf" || m.Details.Family == nil || *m.Details.Family != "llama":
		t.Errorf("tags: details %+v", m.Details)
	case m.Details.ParameterSize == nil || !strings.HasSuffix(*m.Details.ParameterSize, "K"):
		t.Errorf("tags: parameter_size %v (stories260K)", m.Details.ParameterSize)
	case m.Details.QuantizationLevel == nil || *m.Details.QuantizationLevel != "Q8_0":
		t.Errorf("tags: quantization_level %v", m.Details.QuantizationLevel)
	}
	if m.ModifiedAt != nil {
		if _, err := time.Parse(time.RFC3339Nano, *m.ModifiedAt); err != nil {
			t.Errorf("tags: modified_at: %v", err)
		}
	}

	for _, body := range []map[string]any{{"model": "stories"}, {"name": "stories"}} {
		var show struct {
			Details   map[string]any
			ModelInfo map[string]any `json:"model_info"`
			Template  *string
		}
		if st := ts.postJSON(t, "/api/show", body, &show); st != 200 {
			t.Fatalf("show %v: %d", body, st)
		}
		if show.Details["format"] != "gguf" || show.ModelInfo["general.architecture"] != "llama" || show.ModelInfo["llama.block_count"] == nil || show.Template == nil {
			t.Errorf("show %v: %+v", body, show)
		}
	}
	var nf struct{ Error string }
	if st := ts.postJSON(t, "/api/show", map[string]any{"model": "nope"}, &nf); st != 404 || !strings.Contains(nf.Error, "nope") {
		t.Errorf("show of an unknown model: %d %+v", st, nf)
	}

	var ps struct {
		Models []struct {
			Name      string
			Size      int64
			SizeVRAM  *int64  `json:"size_vram"`
			ExpiresAt *string `json:"expires_at"`
		}
	}
	if st := ts.getJSON(t, "/api/ps", &ps); st != 200 || len(ps.Models) != 1 || ps.Models[0].Name != "stories" || ps.Models[0].Size <= 0 || ps.Models[0].SizeVRAM == nil || *ps.Models[0].SizeVRAM != 0 {
		t.Errorf("ps: %d %+v", st, ps)
	}

	// Generate, not streaming: one object; num_predict 9 is reached.
	gen := map[string]any{"model": "stories", "prompt": "Once upon a time", "raw": true, "stream": false,
		"options": map[string]any{"temperature": 0.8, "top_k": 40, "top_p": 0.9, "min_p": 0.05, "repeat_penalty": 1.1, "seed": 7, "num_predict": 9}}
	var one ollamaFinal
	if st := ts.postJSON(t, "/api/generate", gen, &one); st != 200 {
		t.Fatalf("generate: %d %+v", st, one.Error)
	}
	one.check(t, "generate", "stories", false, "stop", "length")
	wantPrompt := ts.tokenCount(t, "stories", "Once upon a time", true)
	if *one.PromptEvalCount != wantPrompt {
		t.Errorf("prompt_eval_count %d, want %d", *one.PromptEvalCount, wantPrompt)
	}
	// Seed 7 runs to num_predict (fixed seed: the same tokens each run).
	if *one.DoneReason != "length" || *one.EvalCount != 9 {
		t.Errorf("eval_count %d with done_reason %s, num_predict 9", *one.EvalCount, *one.DoneReason)
	}
	if got := ts.tokenCount(t, "stories", *one.Response, false); got < *one.EvalCount-2 || got > *one.EvalCount+2 {
		t.Errorf("response %q is %d tokens, eval_count %d", *one.Response, got, *one.EvalCount)
	}

	// The same request streamed gives the same text and counts.
	gen["stream"] = true
	pieces, final := ollamaStream(t, ts, "/api/generate", gen, false)
	final.check(t, "generate stream", "stories", false, "stop", "length")
	if strings.Join(pieces, "") != *one.Response || *final.EvalCount != *one.EvalCount || *final.PromptEvalCount != wantPrompt || *final.DoneReason != *one.DoneReason {
		t.Errorf("streamed %q (%d tokens, %s), not streamed %q (%d, %s)", strings.Join(pieces, ""), *final.EvalCount, *final.DoneReason, *one.Response, *one.EvalCount, *one.DoneReason)
	}
	if len(pieces) == 0 {
		t.Error("generate stream: no text lines")
	}

	// A stop string ends it with done_reason "stop".
	stopAt := strings.Fields(*one.Response)
	if len(stopAt) < 2 {
		t.Fatalf("response %q: too short to pick a stop string", *one.Response)
	}
	{
		gen["stream"] = false
		gen["options"].(map[string]any)["stop"] = []string{stopAt[1]}
		var s ollamaFinal
		if st := ts.postJSON(t, "/api/generate", gen, &s); st != 200 || *s.DoneReason != "stop" || strings.Contains(*s.Response, stopAt[1]) {
			t.Errorf("generate with stop %q: %d %+v %q", stopAt[1], st, s.DoneReason, *s.Response)
		}
	}

	// Chat, streaming (the default): the ChatML fallback template.
	chatBody := map[string]any{"model": "stories", "messages": []map[string]string{{"role": "user", "content": "Tell me a story"}},
		"options": map[string]any{"seed": 3, "num_predict": 6, "temperature": 0}}
	cp, cf := ollamaStream(t, ts, "/api/chat", chatBody, true)
	cf.check(t, "chat stream", "stories", true, "stop", "length")
	if want := ts.tokenCount(t, "stories", "<|im_start|>user\nTell me a story<|im_end|>\n<|im_start|>assistant\n", true); *cf.PromptEvalCount != want {
		t.Errorf("chat prompt_eval_count %d, want %d (ChatML)", *cf.PromptEvalCount, want)
	}
	if *cf.DoneReason != "length" || *cf.EvalCount != 6 || len(cp) == 0 {
		t.Errorf("chat: %d pieces, eval_count %d, %s", len(cp), *cf.EvalCount, *cf.DoneReason)
	}

	// An empty prompt loads the model: done_reason "load".
	var load ollamaFinal
	if st := ts.postJSON(t, "/api/generate", map[string]any{"model": "stories"}, &load); st != 200 || load.DoneReason == nil || *load.DoneReason != "load" {
		t.Errorf("generate with no prompt: %d %+v", st, load)
	}
}

// Options are range-checked as on the OpenAI routes (400 naming the
// field), errors have Ollama's shape, and the access checks apply.
func TestServeOllamaErrorsAndAccess(t *testing.T) {
	leakCheck(t)
	path := testmodels.Path(t, "stories260K-F32.gguf")
	ts := startServer(t, serveConfig{models: []modelArg{{id: "stories", name: path}}, apiKey: "k3y"})
	do := func(method, p, key, ct, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), method, ts.url+p, strings.NewReader(body))
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		if ct != "" {
			req.Header.Set("Content-Type", ct)
		}
		resp, err := ts.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// ollamaErr says whether b is Ollama's error body: {"error": "…"}.
	ollamaErr := func(b string) bool {
		var e map[string]any
		if json.Unmarshal([]byte(b), &e) != nil || len(e) != 1 {
			return false
		}
		s, ok := e["error"].(string)
		return ok && s != ""
	}
	for _, p := range []string{"/api/version", "/api/tags", "/api/ps"} {
		if st, b := do("GET", p, "", "", ""); st != 401 || !ollamaErr(b) {
			t.Errorf("GET %s without the key: %d %s, want 401 {\"error\"}", p, st, b)
		}
		if st, _ := do("GET", p, "k3y", "", ""); st != 200 {
			t.Errorf("GET %s with the key: %d", p, st)
		}
	}
	for _, p := range []string{"/api/show", "/api/generate", "/api/chat"} {
		if st, b := do("POST", p, "", "application/json", `{"model":"stories"}`); st != 401 || !ollamaErr(b) {
			t.Errorf("POST %s without the key: %d %s, want 401", p, st, b)
		}
		if st, b := do("POST", p, "k3y", "text/plain", `{"model":"stories"}`); st != 415 || !ollamaErr(b) {
			t.Errorf("POST %s as text/plain: %d %s, want 415", p, st, b)
		}
	}
	if st, b := do("DELETE", "/api/generate", "k3y", "", ""); st != 405 || !ollamaErr(b) {
		t.Errorf("DELETE /api/generate: %d %s, want 405", st, b)
	}
	// Not supported: pull, push, create, copy, delete, embeddings.
	if st, b := do("POST", "/api/pull", "k3y", "application/json", `{"model":"x"}`); st != 404 || !ollamaErr(b) {
		t.Errorf("POST /api/pull: %d %s, want 404", st, b)
	}
	// The OpenAI routes keep OpenAI's shape.
	if st, b := do("GET", "/v1/models", "", "", ""); st != 401 || ollamaErr(b) || !strings.Contains(b, `"invalid_api_key"`) {
		t.Errorf("GET /v1/models without the key: %d %s", st, b)
	}
	for _, c := range []struct{ path, opts, field string }{
		{"/api/generate", `{"temperature":-1}`, "temperature"},
		{"/api/generate", `{"top_p":1.5}`, "top_p"},
		{"/api/chat", `{"top_k":-3}`, "top_k"},
		{"/api/chat", `{"min_p":2}`, "min_p"},
		{"/api/generate", `{"repeat_penalty":-1}`, "repeat_penalty"},
	} {
		body := `{"model":"stories","prompt":"Hi","messages":[{"role":"user","content":"Hi"}],"stream":false,"options":` + c.opts + `}`
		st, b := do("POST", c.path, "k3y", "application/json", body)
		if st != 400 || !ollamaErr(b) || !strings.Contains(b, c.field) {
			t.Errorf("%s options %s: %d %s; want 400 {\"error\"} naming %s", c.path, c.opts, st, b, c.field)
		}
	}
	for _, c := range []struct {
		path, body string
		status     int
	}{
		{"/api/generate", `{"model":"missing","prompt":"Hi"}`, 404},
		{"/api/chat", `{"model":"stories","messages":[]}`, 400},
		{"/api/chat", `{"model":"stories","messages":[{"role":"tool","content":"x"}]}`, 400},
		{"/api/generate", `{"model":"stories","prompt":`, 400},
	} {
		st, b := do("POST", c.path, "k3y", "application/json", c.body)
		if st != c.status || !ollamaErr(b) {
			t.Errorf("%s %s: %d %s; want %d {\"error\"}", c.path, c.body, st, b, c.status)
		}
	}
}
