package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/pipeline"
	"github.com/forge-llm/forge/pipeline/synth"
	"go.uber.org/goleak"
)

// llama2Template is meta-llama/Llama-2-7b-chat-hf's chat template.
const llama2Template = `{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}`

// chatModel writes a tiny synthetic Llama with stories260K's vocabulary and
// the Llama 2 chat template (the bundled real models have no template).
func chatModel(t testing.TB, shape string) string {
	t.Helper()
	f, err := gguf.Open(testmodels.Path(t, "stories260K-F32.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	voc, err := f.Tokenizer()
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	voc.ChatTemplate = llama2Template
	path := filepath.Join(t.TempDir(), shape+"-chat.gguf")
	if err := synth.WriteFile(context.Background(), path, synth.Options{Shape: synth.Presets[shape], Vocab: voc, Seed: 11, Name: "chat"}); err != nil {
		t.Fatal(err)
	}
	return path
}

// testServer is an in-process `forge serve` on 127.0.0.1:0.
type testServer struct {
	url    string
	client *http.Client
	stop   func() error
}

func startServer(t *testing.T, cfg serveConfig) *testServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.grace == 0 {
		cfg.grace = 5 * time.Second
	}
	cfg.engine.Open.Threads = 1
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- serve(ctx, ln, cfg, slog.New(slog.DiscardHandler)) }()
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	ts := &testServer{url: "http://" + ln.Addr().String(), client: &http.Client{Transport: tr}}
	var once sync.Once
	var stopErr error
	ts.stop = func() error {
		once.Do(func() {
			cancel()
			stopErr = <-errc
			tr.CloseIdleConnections()
		})
		return stopErr
	}
	t.Cleanup(func() {
		if err := ts.stop(); err != nil {
			t.Error(err)
		}
	})
	return ts
}

func (ts *testServer) post(ctx context.Context, path string, body any) (*http.Response, error) {
	var b []byte
	switch v := body.(type) {
	case string:
		b = []byte(v)
	default:
		b, _ = json.Marshal(v)
	}
	req, err := http.NewRequestWithContext(ctx, "POST", ts.url+path, bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return ts.client.Do(req)
}

func (ts *testServer) getJSON(t *testing.T, path string, v any) int {
	t.Helper()
	resp, err := ts.client.Get(ts.url + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return resp.StatusCode
}

// streamChat sends a streaming chat request and returns the concatenated
// content and the finish reason. onChunk, if set, sees each content piece.
func (ts *testServer) streamChat(ctx context.Context, body map[string]any, onChunk func(string)) (string, string, error) {
	body["stream"] = true
	resp, err := ts.post(ctx, "/v1/chat/completions", body)
	if err != nil {
		return "", "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return "", "", fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		return "", "", fmt.Errorf("content type %q", ct)
	}
	var text strings.Builder
	finish := ""
	sc := bufio.NewScanner(resp.Body)
	done := false
	for sc.Scan() {
		line := sc.Text()
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done = true
			break
		}
		var c struct {
			Object  string `json:"object"`
			Choices []struct {
				Delta struct {
					Role    string  `json:"role"`
					Content *string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Error *struct{ Message string } `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			return "", "", fmt.Errorf("chunk %q: %w", data, err)
		}
		if c.Error != nil {
			return text.String(), "", fmt.Errorf("stream error: %s", c.Error.Message)
		}
		if c.Object != "chat.completion.chunk" || len(c.Choices) != 1 {
			return "", "", fmt.Errorf("chunk %q", data)
		}
		if p := c.Choices[0].Delta.Content; p != nil {
			text.WriteString(*p)
			if onChunk != nil {
				onChunk(*p)
			}
		}
		if f := c.Choices[0].FinishReason; f != nil {
			finish = *f
		}
	}
	if err := sc.Err(); err != nil {
		return text.String(), finish, err
	}
	if !done {
		return text.String(), finish, fmt.Errorf("stream ended without [DONE]")
	}
	return text.String(), finish, nil
}

func chatBody(model string, seed int, user string, max int) map[string]any {
	return map[string]any{
		"model": model, "seed": seed, "temperature": 0.9, "top_p": 0.95, "max_tokens": max,
		"messages": []map[string]string{{"role": "system", "content": "You tell stories."}, {"role": "user", "content": user}},
	}
}

// 32 concurrent streaming chat requests with fixed seeds each give what
// the same request gives alone.
func TestServeConcurrentStreamingChat(t *testing.T) {
	leakCheck(t)
	path := chatModel(t, "tiny")
	ts := startServer(t, serveConfig{models: []modelArg{{id: "chat", name: path}}, engine: pipeline.EngineOptions{KeepAlive: new(time.Duration(-1))}})
	const n = 32
	body := func(i int) map[string]any { return chatBody("chat", 1000+i, fmt.Sprintf("Story number %d", i%4), 12) }
	alone := make([]string, n)
	for i := range n {
		text, finish, err := ts.streamChat(t.Context(), body(i), nil)
		if err != nil {
			t.Fatalf("alone %d: %v", i, err)
		}
		if finish != "stop" && finish != "length" {
			t.Fatalf("alone %d: finish %q", i, finish)
		}
		alone[i] = text
	}
	got := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { got[i], _, errs[i] = ts.streamChat(t.Context(), body(i), nil) })
	}
	wg.Wait()
	distinct := map[string]bool{}
	for i := range n {
		if errs[i] != nil {
			t.Errorf("request %d: %v", i, errs[i])
		} else if got[i] != alone[i] {
			t.Errorf("request %d: concurrent %q, alone %q", i, got[i], alone[i])
		}
		distinct[alone[i]] = true
	}
	if len(distinct) < n/2 {
		t.Errorf("only %d distinct outputs of %d: the seeds do not matter, the test checks little", len(distinct), n)
	}
	// The non-streaming answer is the same text.
	resp, err := ts.post(t.Context(), "/v1/chat/completions", body(3))
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		Object  string
		Choices []struct {
			Message      struct{ Role, Content string }
			FinishReason string `json:"finish_reason"`
		}
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		}
	}
	json.NewDecoder(resp.Body).Decode(&out)
	resp.Body.Close()
	if out.Object != "chat.completion" || len(out.Choices) != 1 || out.Choices[0].Message.Content != alone[3] ||
		out.Choices[0].Message.Role != "assistant" || out.Usage.PromptTokens == 0 || out.Usage.CompletionTokens == 0 {
		t.Errorf("non-streaming: %+v, want content %q", out, alone[3])
	}
}

// A request cancelled mid-stream frees the model at once: the request
// queued behind it starts and gives what it gives alone.
func TestServeCancelMidStream(t *testing.T) {
	leakCheck(t)
	path := chatModel(t, "tiny")
	ts := startServer(t, serveConfig{models: []modelArg{{id: "chat", name: path}}, engine: pipeline.EngineOptions{KeepAlive: new(time.Duration(-1))}})
	bBody := chatBody("chat", 7, "The second one", 10)
	want, _, err := ts.streamChat(t.Context(), chatBody("chat", 7, "The second one", 10), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctxA, cancelA := context.WithCancel(t.Context())
	defer cancelA()
	a := chatBody("chat", 1, "The first one", 100000)
	a["ignore_eos"] = true
	firstA := make(chan struct{})
	aDone := make(chan error, 1)
	var aPieces int
	go func() {
		var once sync.Once
		_, _, err := ts.streamChat(ctxA, a, func(string) { aPieces++; once.Do(func() { close(firstA) }) })
		aDone <- err
	}()
	select {
	case <-firstA:
	case err := <-aDone:
		t.Fatalf("stream a ended before its first piece: %v", err)
	}
	bDone := make(chan string, 1)
	bErr := make(chan error, 1)
	go func() {
		text, _, err := ts.streamChat(t.Context(), bBody, nil)
		bDone <- text
		bErr <- err
	}()
	// Wait until b is queued behind a (both hold the model), then hang up a.
	for {
		var st pipeline.ModelStatus
		ts.getJSON(t, "/v1/models/chat", &struct {
			Forge *pipeline.ModelStatus `json:"forge"`
		}{&st})
		if st.Active == 2 {
			break
		}
		select {
		case text := <-bDone:
			t.Fatalf("b ended while a held the model: %q %v", text, <-bErr)
		case <-time.After(2 * time.Millisecond):
		}
	}
	cancelA()
	if err := <-aDone; err == nil {
		t.Error("a completed although cancelled")
	}
	got := <-bDone
	if err := <-bErr; err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("b after a's cancel: %q, alone %q", got, want)
	}
	// a's context holds 256 positions: had it not been stopped it would
	// have run to its full context before b.
	if aPieces >= 250 {
		t.Errorf("a streamed %d pieces: it was not stopped", aPieces)
	}
}

// Malformed requests get a 4xx with an OpenAI-style JSON error, and the
// server keeps serving.
func TestServeMalformed(t *testing.T) {
	leakCheck(t)
	chatPath := chatModel(t, "tiny")
	plain := testmodels.Path(t, "stories260K-Q8_0.gguf")
	ts := startServer(t, serveConfig{models: []modelArg{{id: "chat", name: chatPath}, {id: "plain", name: plain}}})
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	cases := []struct {
		path, body string
		status     int
	}{
		{"/v1/chat/completions", `{`, 400},
		{"/v1/chat/completions", `not json`, 400},
		{"/v1/chat/completions", `{"model":"chat"}`, 400},
		{"/v1/chat/completions", `{"model":"chat","messages":[]}`, 400},
		{"/v1/chat/completions", `{"model":"chat","messages":"hi"}`, 400},
		{"/v1/chat/completions", `{"model":"chat","messages":[{"role":"tool","content":"x"}]}`, 400},
		{"/v1/chat/completions", `{"model":"chat","messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]}`, 400},
		{"/v1/chat/completions", `{"model":"chat",` + msgs + `,"temperature":5}`, 400},
		{"/v1/chat/completions", `{"model":"chat",` + msgs + `,"top_p":0}`, 400},
		{"/v1/chat/completions", `{"model":"chat",` + msgs + `,"max_tokens":-1}`, 400},
		{"/v1/chat/completions", `{"model":"chat",` + msgs + `,"max_tokens":"ten"}`, 400},
		{"/v1/chat/completions", `{"model":"chat",` + msgs + `,"n":2}`, 400},
		{"/v1/chat/completions", `{"model":"chat",` + msgs + `,"stop":[1,2]}`, 400},
		{"/v1/chat/completions", `{"model":"chat",` + msgs + `} {"x":1}`, 400},
		{"/v1/chat/completions", `{"model":"chat","messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}]}`, 400},
		// A conversation the template rejects (Llama 2: user first). A
		// model with no template gets ChatML (serve_template_test.go).
		{"/v1/chat/completions", `{"model":"chat","messages":[{"role":"assistant","content":"hi"}]}`, 400},
		{"/v1/chat/completions", `{"model":"chat","messages":[{"role":"assistant","content":"hi"}],"stream":true}`, 400},
		{"/v1/chat/completions", `{"model":"no-such-model",` + msgs + `}`, 404},
		{"/v1/completions", `{"model":"plain"}`, 400},
		{"/v1/completions", `{"model":"plain","prompt":["a",""]}`, 400},
		{"/v1/completions", `{"model":"plain","prompt":["a","b"],"stream":true}`, 400},
		{"/v1/completions", `{"model":"plain","prompt":""}`, 400},
		{"/v1/nothing", `{}`, 404},
	}
	for _, c := range cases {
		resp, err := ts.post(t.Context(), c.path, c.body)
		if err != nil {
			t.Fatal(err)
		}
		var e apiError
		derr := json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != c.status || derr != nil || e.Error.Message == "" || e.Error.Type == "" {
			t.Errorf("%s %s: status %d (want %d), error %+v, decode %v", c.path, c.body, resp.StatusCode, c.status, e.Error, derr)
		}
	}
	// Wrong method on a known path.
	resp, err := ts.client.Get(ts.url + "/v1/chat/completions")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET chat completions: %d", resp.StatusCode)
	}
	// Still serving.
	resp, err = ts.post(t.Context(), "/v1/completions", map[string]any{"model": "plain", "prompt": "Once upon a time", "max_tokens": 5, "seed": 1, "stop": "zz"})
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		Object  string
		Choices []struct{ Text string }
	}
	json.NewDecoder(resp.Body).Decode(&out)
	resp.Body.Close()
	if resp.StatusCode != 200 || out.Object != "text_completion" || len(out.Choices) != 1 || out.Choices[0].Text == "" {
		t.Errorf("completion after bad requests: %d %+v", resp.StatusCode, out)
	}
	var h map[string]any
	if ts.getJSON(t, "/health", &h) != 200 || h["status"] != "ok" {
		t.Errorf("health: %v", h)
	}
}

// /v1/models lists the models with their state; /forge/load streams a
// load's progress and ends with the resident status.
func TestServeModelsAndLoadProgress(t *testing.T) {
	leakCheck(t)
	plain := testmodels.Path(t, "stories260K-Q4_K_M.gguf")
	ts := startServer(t, serveConfig{engine: pipeline.EngineOptions{KeepAlive: new(time.Duration(-1)), Resolve: func(n string) (string, error) {
		if n == "stories" {
			return plain, nil
		}
		return "", fmt.Errorf("no %q", n)
	}}})
	var list struct {
		Object string
		Data   []modelObject
	}
	if ts.getJSON(t, "/v1/models", &list); list.Object != "list" || len(list.Data) != 0 {
		t.Fatalf("models before: %+v", list)
	}
	resp, err := ts.post(t.Context(), "/forge/load?model=stories", "")
	if err != nil {
		t.Fatal(err)
	}
	if resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("load content type %q", resp.Header.Get("Content-Type"))
	}
	sc := bufio.NewScanner(resp.Body)
	events := map[string]int{}
	var kinds []string
	var last string
	for sc.Scan() {
		if ev, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
			events[ev]++
			last = ev
		}
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok && last == "progress" {
			var e struct{ Event string }
			json.Unmarshal([]byte(data), &e)
			kinds = append(kinds, e.Event)
		}
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok && last == "status" {
			var st pipeline.ModelStatus
			json.Unmarshal([]byte(data), &st)
			if st.State != pipeline.StateResident || st.LoadedBytes != st.WeightBytes || st.WeightBytes == 0 {
				t.Errorf("final status %+v", st)
			}
		}
	}
	resp.Body.Close()
	if events["status"] != 1 || events["progress"] < 3 || kinds[len(kinds)-1] != "all_resident" {
		t.Errorf("load events %v, kinds %v", events, kinds)
	}
	ts.getJSON(t, "/v1/models", &list)
	if len(list.Data) != 1 || list.Data[0].ID != "stories" || list.Data[0].Forge.State != pipeline.StateResident || list.Data[0].Forge.MemoryBytes == 0 {
		t.Errorf("models after load: %+v", list)
	}
	var e apiError
	resp, err = ts.post(t.Context(), "/forge/load", map[string]string{"model": "other"})
	if err != nil {
		t.Fatal(err)
	}
	json.NewDecoder(resp.Body).Decode(&e)
	resp.Body.Close()
	if resp.StatusCode != 404 || e.Error.Code != "model_not_found" {
		t.Errorf("load of an unknown model: %d %+v", resp.StatusCode, e)
	}
}

// With keep-alive 0 the model unloads when idle and the memory
// accounting returns to its starting level; with a budget for one model,
// using a second evicts the first.
func TestServeKeepAliveZeroAndBudget(t *testing.T) {
	leakCheck(t)
	a := testmodels.Path(t, "stories260K-Q8_0.gguf")
	b := testmodels.Path(t, "stories260K-Q4_0.gguf")
	ts := startServer(t, serveConfig{allowPaths: []string{filepath.Dir(a)}, engine: pipeline.EngineOptions{KeepAlive: new(time.Duration(0))}})
	var h struct {
		MemoryBytes int64 `json:"memory_bytes"`
	}
	ts.getJSON(t, "/health", &h)
	start := h.MemoryBytes
	resp, err := ts.post(t.Context(), "/v1/completions", map[string]any{"model": a, "prompt": "Hi", "max_tokens": 3, "seed": 1})
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	var st struct {
		Models      []pipeline.ModelStatus
		MemoryBytes int64 `json:"memory_bytes"`
	}
	ts.getJSON(t, "/forge/status", &st)
	if st.MemoryBytes != start || len(st.Models) != 1 || st.Models[0].State != pipeline.StateUnloaded {
		t.Errorf("after an idle keep-alive 0: memory %d (start %d), %+v", st.MemoryBytes, start, st.Models)
	}

	// Budget: room for one of the two, from their sizes as served alone
	// (single-sequence: about 0.9 and 1 MB, which grow with the model's
	// scratch, so they are measured, not written here).
	sizes := map[string]int64{}
	tu := startServer(t, serveConfig{allowPaths: []string{filepath.Dir(a)}, engine: pipeline.EngineOptions{KeepAlive: new(time.Duration(-1)), SingleSequence: true}})
	for _, m := range []string{a, b} {
		resp, err := tu.post(t.Context(), "/v1/completions", map[string]any{"model": m, "prompt": "Hi", "max_tokens": 2})
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s alone: status %d", m, resp.StatusCode)
		}
	}
	tu.getJSON(t, "/forge/status", &st)
	for _, m := range st.Models {
		sizes[m.ID] = m.MemoryBytes
	}
	if sizes[a] <= 0 || sizes[b] <= 0 {
		t.Fatalf("sizes served alone: %v", sizes)
	}
	budget := max(sizes[a], sizes[b]) + min(sizes[a], sizes[b])/2
	tb := startServer(t, serveConfig{allowPaths: []string{filepath.Dir(a)}, engine: pipeline.EngineOptions{Budget: budget, KeepAlive: new(time.Duration(-1)), SingleSequence: true}})
	for _, m := range []string{a, b} {
		resp, err := tb.post(t.Context(), "/v1/completions", map[string]any{"model": m, "prompt": "Hi", "max_tokens": 2})
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: status %d", m, resp.StatusCode)
		}
	}
	tb.getJSON(t, "/forge/status", &st)
	states := map[string]pipeline.ModelState{}
	for _, m := range st.Models {
		states[m.ID] = m.State
	}
	if states[a] != pipeline.StateEvicted || states[b] != pipeline.StateResident || st.MemoryBytes > budget {
		t.Errorf("budget %d: states %v, memory %d", budget, states, st.MemoryBytes)
	}
}

// syncBuffer is a bytes.Buffer safe for a logger and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// The real command: `forge serve --addr 127.0.0.1:0 -m ID=PATH` serves,
// and shuts down cleanly when its context ends.
func TestServeCommand(t *testing.T) {
	leakCheck(t)
	path := chatModel(t, "tiny")
	ts, addr, stop := runServeCommand(t, "-m", "chat="+path, "--keep-alive", "1m", "--budget", "64MiB")
	if !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Errorf("listening on %s, not loopback", addr)
	}
	text, finish, err := ts.streamChat(t.Context(), chatBody("", 5, "Hello", 6), nil) // no model: the -m one
	if err != nil || text == "" || finish == "" {
		t.Fatalf("chat through the command: %q %q %v", text, finish, err)
	}
	if err := stop(); err != nil {
		t.Errorf("serve returned %v", err)
	}
}

// runServeCommand runs `forge serve --addr 127.0.0.1:0 --threads 1` with
// args through the CLI, as a user would, waits for its listening line and
// returns a client for it, its address, and stop, which ends the command
// and returns its error.
func runServeCommand(t *testing.T, args ...string) (ts *testServer, addr string, stop func() error) {
	t.Helper()
	var stdout, stderr syncBuffer
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- newApp(&stdout, &stderr).RunContext(ctx, append([]string{"forge", "serve", "--addr", "127.0.0.1:0", "--threads", "1"}, args...))
	}()
	for addr == "" {
		select {
		case err := <-done:
			cancel()
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
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			err = <-done
			tr.CloseIdleConnections()
		})
		return err
	}
	t.Cleanup(func() { stop() })
	return &testServer{url: "http://" + addr, client: &http.Client{Transport: tr}}, addr, stop
}

// leakCheck fails the test if goroutines it started outlive it; as the
// first cleanup registered, it runs after the servers' cleanups.
func leakCheck(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
}

// Shutdown lets in-flight requests finish within the grace period, and
// past it cancels them; either way everything is freed.
func TestServeShutdown(t *testing.T) {
	leakCheck(t)
	path := chatModel(t, "tiny")
	for _, c := range []struct {
		name   string
		grace  time.Duration
		finish bool
	}{{"finishes", time.Minute, true}, {"cancels", time.Nanosecond, false}} {
		t.Run(c.name, func(t *testing.T) {
			ts := startServer(t, serveConfig{models: []modelArg{{id: "chat", name: path}}, grace: c.grace})
			b := chatBody("chat", 3, "Once", 20)
			if !c.finish {
				b["max_tokens"] = 100000
				b["ignore_eos"] = true
			}
			first := make(chan struct{})
			done := make(chan error, 1)
			go func() {
				var once sync.Once
				_, _, err := ts.streamChat(context.Background(), b, func(string) { once.Do(func() { close(first) }) })
				done <- err
			}()
			select {
			case <-first:
			case err := <-done:
				t.Fatalf("the stream ended before its first piece: %v", err)
			}
			if err := ts.stop(); err != nil {
				t.Errorf("serve: %v", err)
			}
			err := <-done
			if c.finish && err != nil {
				t.Errorf("in-flight request did not finish: %v", err)
			}
			if !c.finish && err == nil {
				t.Error("in-flight request ran to its end past the grace period")
			}
		})
	}
}
