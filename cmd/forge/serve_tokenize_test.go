package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf/testmodels"
)

// postJSON posts body and decodes the answer into v; it returns the status.
func (ts *testServer) postJSON(t *testing.T, path string, body any, v any) int {
	t.Helper()
	resp, err := ts.post(t.Context(), path, body)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("POST %s: %v in %q", path, err, b)
		}
	}
	return resp.StatusCode
}

// TestTokenizeDetokenize: llama-server's shapes. Tokens with add_special
// start with BOS; pieces spell the text; detokenizing gives the text
// back; the model field picks the model and defaults to the first -m.
func TestTokenizeDetokenize(t *testing.T) {
	plain := testmodels.Path(t, "stories260K-Q8_0.gguf")
	ts := startServer(t, serveConfig{models: []modelArg{{id: "plain", name: plain}, {id: "other", name: testmodels.Path(t, "stories260K-F32.gguf")}}})
	const text = "Once upon a time, there was a cat."

	var plainOut struct{ Tokens []int32 }
	if c := ts.postJSON(t, "/tokenize", map[string]any{"content": text}, &plainOut); c != 200 {
		t.Fatalf("tokenize: status %d", c)
	}
	var withBOS struct{ Tokens []int32 }
	if c := ts.postJSON(t, "/tokenize", map[string]any{"content": text, "add_special": true, "model": "other"}, &withBOS); c != 200 {
		t.Fatalf("tokenize add_special: status %d", c)
	}
	if len(plainOut.Tokens) < 5 || len(withBOS.Tokens) != len(plainOut.Tokens)+1 || withBOS.Tokens[0] != 1 {
		t.Fatalf("tokens %v, with add_special %v: want the same ids after BOS (1)", plainOut.Tokens, withBOS.Tokens)
	}
	for i, id := range plainOut.Tokens {
		if withBOS.Tokens[i+1] != id {
			t.Fatalf("token %d: %d without BOS, %d with", i, id, withBOS.Tokens[i+1])
		}
	}

	var pieces struct {
		Tokens []struct {
			ID    int32           `json:"id"`
			Piece json.RawMessage `json:"piece"`
		}
	}
	if c := ts.postJSON(t, "/tokenize", map[string]any{"content": text, "with_pieces": true}, &pieces); c != 200 {
		t.Fatalf("tokenize with_pieces: status %d", c)
	}
	var spelled strings.Builder
	for i, p := range pieces.Tokens {
		var s string
		if err := json.Unmarshal(p.Piece, &s); err != nil {
			t.Fatalf("piece %d = %s: not a string (the text is ASCII)", i, p.Piece)
		}
		if p.ID != plainOut.Tokens[i] {
			t.Fatalf("piece %d has id %d, want %d", i, p.ID, plainOut.Tokens[i])
		}
		spelled.WriteString(s)
	}
	if got := strings.TrimPrefix(spelled.String(), " "); got != text {
		t.Errorf("pieces spell %q, want %q (after the SentencePiece space prefix)", got, text)
	}

	var back struct{ Content string }
	if c := ts.postJSON(t, "/detokenize", map[string]any{"tokens": withBOS.Tokens}, &back); c != 200 || back.Content != text {
		t.Fatalf("detokenize: status %d, content %q, want %q", c, back.Content, text)
	}
	var empty struct{ Tokens []int32 }
	if c := ts.postJSON(t, "/tokenize", map[string]any{"content": ""}, &empty); c != 200 || empty.Tokens == nil || len(empty.Tokens) != 0 {
		t.Fatalf("tokenize \"\": status %d, tokens %v, want []", c, empty.Tokens)
	}
}

// TestTokenizeRefusals: the routes go through the server's checks (key,
// content type) and bound their input like a prompt.
func TestTokenizeRefusals(t *testing.T) {
	plain := testmodels.Path(t, "stories260K-Q8_0.gguf")
	ts := startServer(t, serveConfig{models: []modelArg{{id: "plain", name: plain}}, apiKey: "sekrit", maxPrompt: 64})
	do := func(path, ctype, key, body string) (int, apiError) {
		t.Helper()
		req, _ := http.NewRequestWithContext(context.Background(), "POST", ts.url+path, strings.NewReader(body))
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := ts.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var e apiError
		json.NewDecoder(resp.Body).Decode(&e)
		return resp.StatusCode, e
	}
	long := `{"content":"` + strings.Repeat("a", 65) + `"}`
	for _, c := range []struct {
		path, ctype, key, body string
		status                 int
		code                   string
	}{
		{"/tokenize", "application/json", "", `{"content":"hi"}`, 401, "invalid_api_key"},
		{"/detokenize", "application/json", "wrong", `{"tokens":[1]}`, 401, "invalid_api_key"},
		{"/tokenize", "text/plain", "sekrit", `{"content":"hi"}`, 415, "unsupported_media_type"},
		{"/tokenize", "application/json", "sekrit", long, 413, "prompt_too_large"},
		{"/tokenize", "application/json", "sekrit", `{"content":"hi","model":"nope"}`, 404, "model_not_found"},
		{"/tokenize", "application/json", "sekrit", `{"content":"hi"} {}`, 400, "invalid_request"},
		{"/detokenize", "application/json", "sekrit", `{"tokens":[1, 512]}`, 400, "invalid_value"},
		{"/detokenize", "application/json", "sekrit", `{"tokens":[-1]}`, 400, "invalid_value"},
		{"/detokenize", "application/json", "sekrit", `{"tokens":[` + strings.Repeat("1,", 64) + `1]}`, 413, "prompt_too_large"},
	} {
		status, e := do(c.path, c.ctype, c.key, c.body)
		if status != c.status || e.Error.Code != c.code {
			t.Errorf("POST %s %s (key %q): %d %q, want %d %q", c.path, c.body[:min(len(c.body), 40)], c.key, status, e.Error.Code, c.status, c.code)
		}
	}
	if status, _ := do("/detokenize", "application/json", "sekrit", `{"tokens":[1, 400, 511]}`); status != 200 {
		t.Errorf("detokenize of ids in the vocabulary: %d", status)
	}
	// /metrics is behind the key too.
	resp, err := ts.client.Get(ts.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Errorf("GET /metrics without the key: %d, want 401", resp.StatusCode)
	}
	req, _ := http.NewRequest("GET", ts.url+"/tokenize", nil)
	req.Header.Set("Authorization", "Bearer sekrit")
	resp, err = ts.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 405 {
		t.Errorf("GET /tokenize: %d, want 405", resp.StatusCode)
	}
}
