package main

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf/testmodels"
)

// End-to-end client flows against forge serve on loopback, checking every
// answer's fields against the published API documents: Ollama's
// docs/api.md and OpenAI's API reference. The expected field sets are
// written out here; an answer must have every required field and no field
// outside required ∪ optional.

// fields is one object's documented fields.
type fields struct {
	required, optional []string
}

// checkFields compares obj's keys with f.
func checkFields(t *testing.T, where string, obj any, f fields) map[string]any {
	t.Helper()
	m, ok := obj.(map[string]any)
	if !ok {
		t.Fatalf("%s: %T, want an object", where, obj)
	}
	for _, k := range f.required {
		if _, ok := m[k]; !ok {
			t.Errorf("%s: no %q field (has %v)", where, k, keysOf(m))
		}
	}
	for k := range m {
		if !slices.Contains(f.required, k) && !slices.Contains(f.optional, k) {
			t.Errorf("%s: field %q is not in the API document", where, k)
		}
	}
	return m
}

func keysOf(m map[string]any) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// The documented shapes.
var (
	// Ollama docs/api.md.
	ollamaDetailsFields = fields{required: []string{"format", "family", "families", "parameter_size", "quantization_level"}, optional: []string{"parent_model"}}
	ollamaTagFields     = fields{required: []string{"name", "model", "modified_at", "size", "digest", "details"}}
	ollamaShowFields    = fields{required: []string{"modelfile", "parameters", "template", "details", "model_info"}, optional: []string{"capabilities", "modified_at", "license", "system", "projector_info", "tensors", "messages"}}
	ollamaChatPart      = fields{required: []string{"model", "created_at", "message", "done"}}
	ollamaChatFinal     = fields{required: []string{"model", "created_at", "message", "done", "total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count", "eval_duration"}, optional: []string{"done_reason", "context"}}
	ollamaMessage       = fields{required: []string{"role", "content"}, optional: []string{"images", "tool_calls", "thinking"}}
	ollamaEmbedFields   = fields{required: []string{"model", "embeddings"}, optional: []string{"total_duration", "load_duration", "prompt_eval_count"}}

	// OpenAI API reference.
	openaiChatFields      = fields{required: []string{"id", "object", "created", "model", "choices"}, optional: []string{"usage", "system_fingerprint", "service_tier"}}
	openaiChatChoice      = fields{required: []string{"index", "message", "finish_reason"}, optional: []string{"logprobs"}}
	openaiMessage         = fields{required: []string{"role", "content"}, optional: []string{"refusal", "tool_calls", "annotations", "audio"}}
	openaiUsage           = fields{required: []string{"prompt_tokens", "completion_tokens", "total_tokens"}, optional: []string{"prompt_tokens_details", "completion_tokens_details"}}
	openaiLogprobs        = fields{required: []string{"content"}, optional: []string{"refusal"}}
	openaiLogprobToken    = fields{required: []string{"token", "logprob", "bytes", "top_logprobs"}}
	openaiTopLogprob      = fields{required: []string{"token", "logprob", "bytes"}}
	openaiChunkFields     = fields{required: []string{"id", "object", "created", "model", "choices"}, optional: []string{"usage", "system_fingerprint", "service_tier"}}
	openaiChunkChoice     = fields{required: []string{"index", "delta", "finish_reason"}, optional: []string{"logprobs"}}
	openaiEmbedList       = fields{required: []string{"object", "data", "model", "usage"}}
	openaiEmbeddingFields = fields{required: []string{"object", "embedding", "index"}}
	openaiEmbedUsage      = fields{required: []string{"prompt_tokens", "total_tokens"}}
	openaiErrorBody       = fields{required: []string{"error"}}
	openaiErrorFields     = fields{required: []string{"message", "type", "param", "code"}}
	ollamaErrorBodyShape  = fields{required: []string{"error"}}
)

// do sends a request and decodes a JSON answer into a generic value.
func (ts *testServer) doJSON(t *testing.T, method, path string, body any) (int, any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, ts.url+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := ts.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v any
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatalf("%s %s: %d, body not JSON: %v", method, path, resp.StatusCode, err)
	}
	return resp.StatusCode, v
}

// unitVector checks an embedding: numbers, width d, norm 1.
func unitVector(t *testing.T, where string, v any, d int) []float64 {
	t.Helper()
	arr, ok := v.([]any)
	if !ok || len(arr) != d {
		t.Fatalf("%s: %T of %d values, want %d numbers", where, v, len(arr), d)
	}
	out := make([]float64, d)
	var n float64
	for i, x := range arr {
		f, ok := x.(float64)
		if !ok {
			t.Fatalf("%s[%d]: %T", where, i, x)
		}
		out[i] = f
		n += f * f
	}
	if math.Abs(math.Sqrt(n)-1) > 1e-4 {
		t.Errorf("%s: norm %v, want 1", where, math.Sqrt(n))
	}
	return out
}

// TestE2EOllamaClient drives what an Ollama client does: list the models,
// show one, chat with it streaming NDJSON, embed texts.
func TestE2EOllamaClient(t *testing.T) {
	ts := startServer(t, serveConfig{models: []modelArg{{id: "stories", name: testmodels.Path(t, "stories260K-Q8_0.gguf")}}})

	code, v := ts.doJSON(t, "GET", "/api/tags", nil)
	if code != 200 {
		t.Fatalf("tags: %d %v", code, v)
	}
	tags := checkFields(t, "tags", v, fields{required: []string{"models"}})
	list, _ := tags["models"].([]any)
	if len(list) != 1 {
		t.Fatalf("tags: %d models, want 1", len(list))
	}
	tag := checkFields(t, "tags.models[0]", list[0], ollamaTagFields)
	checkFields(t, "tags.models[0].details", tag["details"], ollamaDetailsFields)
	if tag["name"] != "stories" || tag["model"] != "stories" {
		t.Errorf("tag names %v %v", tag["name"], tag["model"])
	}

	code, v = ts.doJSON(t, "POST", "/api/show", map[string]any{"model": "stories"})
	if code != 200 {
		t.Fatalf("show: %d %v", code, v)
	}
	show := checkFields(t, "show", v, ollamaShowFields)
	checkFields(t, "show.details", show["details"], ollamaDetailsFields)
	info, _ := show["model_info"].(map[string]any)
	if info["general.architecture"] != "llama" || info["llama.embedding_length"] != float64(64) {
		t.Errorf("show.model_info %v", info)
	}

	// Chat, streamed as NDJSON: pieces, then a final line with the counts.
	b, _ := json.Marshal(map[string]any{"model": "stories", "messages": []map[string]string{{"role": "user", "content": "Tell me a story."}},
		"options": map[string]any{"temperature": 0, "num_predict": 12}})
	resp, err := ts.client.Post(ts.url+"/api/chat", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "application/x-ndjson" {
		t.Fatalf("chat: %d %q", resp.StatusCode, ct)
	}
	var text strings.Builder
	var lines []map[string]any
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var m any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		lines = append(lines, m.(map[string]any))
	}
	resp.Body.Close()
	if len(lines) < 2 {
		t.Fatalf("chat: %d lines", len(lines))
	}
	for i, m := range lines[:len(lines)-1] {
		checkFields(t, "chat line", m, ollamaChatPart)
		msg := checkFields(t, "chat line message", m["message"], ollamaMessage)
		if m["done"] != false || msg["role"] != "assistant" {
			t.Errorf("line %d: %v", i, m)
		}
		text.WriteString(msg["content"].(string))
	}
	last := checkFields(t, "chat final line", lines[len(lines)-1], ollamaChatFinal)
	checkFields(t, "chat final message", last["message"], ollamaMessage)
	if last["done"] != true || last["eval_count"] != float64(12) || last["done_reason"] != "length" {
		t.Errorf("final line %v", last)
	}
	if text.Len() == 0 {
		t.Error("chat streamed no text")
	}

	// Embed: one text and several; each a unit vector of the model's
	// width; the same text the same vector.
	code, v = ts.doJSON(t, "POST", "/api/embed", map[string]any{"model": "stories", "input": "Lily saw a red ball."})
	if code != 200 {
		t.Fatalf("embed: %d %v", code, v)
	}
	one := checkFields(t, "embed", v, ollamaEmbedFields)
	embs, _ := one["embeddings"].([]any)
	if len(embs) != 1 {
		t.Fatalf("embed: %d embeddings", len(embs))
	}
	a := unitVector(t, "embed[0]", embs[0], 64)
	code, v = ts.doJSON(t, "POST", "/api/embed", map[string]any{"model": "stories", "input": []string{"The cat slept.", "Lily saw a red ball."}})
	if code != 200 {
		t.Fatalf("embed two: %d %v", code, v)
	}
	two := checkFields(t, "embed two", v, ollamaEmbedFields)
	embs, _ = two["embeddings"].([]any)
	if len(embs) != 2 {
		t.Fatalf("embed two: %d embeddings", len(embs))
	}
	unitVector(t, "embed two[0]", embs[0], 64)
	b2 := unitVector(t, "embed two[1]", embs[1], 64)
	for i := range a {
		if math.Abs(a[i]-b2[i]) > 1e-5 {
			t.Fatalf("the same text embeds differently: %v vs %v", a[i], b2[i])
		}
	}
	if two["prompt_eval_count"].(float64) <= one["prompt_eval_count"].(float64) {
		t.Errorf("prompt_eval_count %v for two texts, %v for one", two["prompt_eval_count"], one["prompt_eval_count"])
	}
	// A text past the context is cut (truncate defaults to true), or
	// refused with truncate false, in Ollama's error shape.
	long := strings.Repeat("Once upon a time there was a dog. ", 40)
	if code, v = ts.doJSON(t, "POST", "/api/embed", map[string]any{"model": "stories", "input": long}); code != 200 {
		t.Errorf("long text, truncate default: %d %v", code, v)
	}
	code, v = ts.doJSON(t, "POST", "/api/embed", map[string]any{"model": "stories", "input": long, "truncate": false})
	if code != 400 {
		t.Errorf("long text, truncate false: %d %v", code, v)
	}
	checkFields(t, "embed error", v, ollamaErrorBodyShape)
	for _, bad := range []map[string]any{{"model": "stories"}, {"model": "stories", "input": []int{1, 2}}, {"model": "stories", "input": []string{}}, {"model": "nope", "input": "x"}} {
		code, v := ts.doJSON(t, "POST", "/api/embed", bad)
		if code != 400 && code != 404 {
			t.Errorf("%v: %d", bad, code)
		}
		checkFields(t, "embed error", v, ollamaErrorBodyShape)
	}
}

// TestE2EOpenAIClient drives what an OpenAI client does on a model
// without a chat template: chat (the default ChatML template), chat with
// logprobs (whole and streamed), embeddings (float and base64), errors;
// then /metrics parses as Prometheus text and counts the requests.
func TestE2EOpenAIClient(t *testing.T) {
	ts := startServer(t, serveConfig{models: []modelArg{{id: "stories", name: testmodels.Path(t, "stories260K-Q8_0.gguf")}}})
	msgs := []map[string]string{{"role": "system", "content": "You tell stories."}, {"role": "user", "content": "Once upon a time"}}

	code, v := ts.doJSON(t, "POST", "/v1/chat/completions", map[string]any{"model": "stories", "messages": msgs, "max_tokens": 10, "temperature": 0})
	if code != 200 {
		t.Fatalf("chat: %d %v", code, v)
	}
	c := checkFields(t, "chat", v, openaiChatFields)
	if c["object"] != "chat.completion" || c["model"] != "stories" {
		t.Errorf("chat object %v model %v", c["object"], c["model"])
	}
	choices, _ := c["choices"].([]any)
	if len(choices) != 1 {
		t.Fatalf("chat: %d choices", len(choices))
	}
	ch := checkFields(t, "chat.choices[0]", choices[0], openaiChatChoice)
	msg := checkFields(t, "chat.choices[0].message", ch["message"], openaiMessage)
	if msg["role"] != "assistant" || msg["content"] == "" || ch["finish_reason"] != "length" {
		t.Errorf("chat choice %v", ch)
	}
	u := checkFields(t, "chat.usage", c["usage"], openaiUsage)
	if u["completion_tokens"] != float64(10) || u["total_tokens"] != u["prompt_tokens"].(float64)+10 {
		t.Errorf("usage %v", u)
	}

	// Logprobs with 3 alternatives each.
	code, v = ts.doJSON(t, "POST", "/v1/chat/completions", map[string]any{"model": "stories", "messages": msgs, "max_tokens": 6, "temperature": 0, "logprobs": true, "top_logprobs": 3})
	if code != 200 {
		t.Fatalf("chat logprobs: %d %v", code, v)
	}
	c = checkFields(t, "chat logprobs", v, openaiChatFields)
	ch = checkFields(t, "chat logprobs choice", c["choices"].([]any)[0], openaiChatChoice)
	lp := checkFields(t, "choice.logprobs", ch["logprobs"], openaiLogprobs)
	content, _ := lp["content"].([]any)
	if len(content) != 6 {
		t.Fatalf("logprobs.content: %d entries, want 6", len(content))
	}
	var joined strings.Builder
	var whole []float64
	for i, e := range content {
		ent := checkFields(t, "logprobs.content[i]", e, openaiLogprobToken)
		joined.WriteString(ent["token"].(string))
		whole = append(whole, ent["logprob"].(float64))
		tops, _ := ent["top_logprobs"].([]any)
		if len(tops) != 3 {
			t.Fatalf("content[%d]: %d top_logprobs, want 3", i, len(tops))
		}
		for _, tp := range tops {
			checkFields(t, "top_logprobs[j]", tp, openaiTopLogprob)
		}
		// Greedy: the pick is the most likely.
		if first := tops[0].(map[string]any); first["token"] != ent["token"] || first["logprob"] != ent["logprob"] || ent["logprob"].(float64) > 0 {
			t.Errorf("content[%d]: pick %v, most likely %v", i, ent, first)
		}
	}
	greedy := checkFields(t, "message", ch["message"], openaiMessage)["content"].(string)
	if joined.String() != greedy {
		t.Errorf("the tokens %q do not spell the message %q", joined.String(), greedy)
	}

	// The same, streamed: chunks with deltas and their logprobs, then the
	// finish reason, the usage chunk (choices empty), [DONE].
	b, _ := json.Marshal(map[string]any{"model": "stories", "messages": msgs, "max_tokens": 6, "temperature": 0, "logprobs": true, "top_logprobs": 3,
		"stream": true, "stream_options": map[string]any{"include_usage": true}})
	resp, err := ts.client.Post(ts.url+"/v1/chat/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	var chunks []map[string]any
	done := false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			done = true
			continue
		}
		var m any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("chunk %q: %v", line, err)
		}
		chunks = append(chunks, checkFields(t, "chunk", m, openaiChunkFields))
	}
	resp.Body.Close()
	if !done || len(chunks) < 3 {
		t.Fatalf("stream: %d chunks, [DONE] %v", len(chunks), done)
	}
	var streamed strings.Builder
	var streamedLP []float64
	for i, m := range chunks[:len(chunks)-1] {
		cs, _ := m["choices"].([]any)
		if len(cs) != 1 {
			t.Fatalf("chunk %d: %d choices", i, len(cs))
		}
		cc := checkFields(t, "chunk choice", cs[0], openaiChunkChoice)
		if d, ok := cc["delta"].(map[string]any); ok {
			if s, ok := d["content"].(string); ok {
				streamed.WriteString(s)
			}
		}
		if l, ok := cc["logprobs"].(map[string]any); ok {
			checkFields(t, "chunk logprobs", l, openaiLogprobs)
			for _, e := range l["content"].([]any) {
				ent := checkFields(t, "chunk logprobs.content[i]", e, openaiLogprobToken)
				streamedLP = append(streamedLP, ent["logprob"].(float64))
			}
		}
	}
	if streamed.String() != greedy {
		t.Errorf("streamed %q, whole %q", streamed.String(), greedy)
	}
	if !slices.Equal(streamedLP, whole) {
		t.Errorf("streamed logprobs %v, whole %v", streamedLP, whole)
	}
	usageChunk := chunks[len(chunks)-1]
	if cs, _ := usageChunk["choices"].([]any); cs == nil || len(cs) != 0 {
		t.Errorf("usage chunk choices %v, want []", usageChunk["choices"])
	}
	checkFields(t, "usage chunk usage", usageChunk["usage"], openaiUsage)

	// Embeddings, float and base64.
	code, v = ts.doJSON(t, "POST", "/v1/embeddings", map[string]any{"model": "stories", "input": []string{"Lily saw a red ball.", "The cat slept."}})
	if code != 200 {
		t.Fatalf("embeddings: %d %v", code, v)
	}
	el := checkFields(t, "embeddings", v, openaiEmbedList)
	if el["object"] != "list" || el["model"] != "stories" {
		t.Errorf("embeddings %v %v", el["object"], el["model"])
	}
	data, _ := el["data"].([]any)
	if len(data) != 2 {
		t.Fatalf("embeddings: %d items", len(data))
	}
	var first []float64
	for i, d := range data {
		e := checkFields(t, "embeddings.data[i]", d, openaiEmbeddingFields)
		if e["object"] != "embedding" || e["index"] != float64(i) {
			t.Errorf("data[%d]: %v %v", i, e["object"], e["index"])
		}
		vec := unitVector(t, "embedding", e["embedding"], 64)
		if i == 0 {
			first = vec
		}
	}
	eu := checkFields(t, "embeddings.usage", el["usage"], openaiEmbedUsage)
	if eu["prompt_tokens"] != eu["total_tokens"] || eu["prompt_tokens"].(float64) < 4 {
		t.Errorf("embeddings usage %v", eu)
	}
	code, v = ts.doJSON(t, "POST", "/v1/embeddings", map[string]any{"model": "stories", "input": "Lily saw a red ball.", "encoding_format": "base64"})
	if code != 200 {
		t.Fatalf("embeddings base64: %d %v", code, v)
	}
	e := checkFields(t, "embeddings base64 data", checkFields(t, "embeddings base64", v, openaiEmbedList)["data"].([]any)[0], openaiEmbeddingFields)
	raw, err := base64.StdEncoding.DecodeString(e["embedding"].(string))
	if err != nil || len(raw) != 4*64 {
		t.Fatalf("base64 embedding: %d bytes, %v", len(raw), err)
	}
	for i := range 64 {
		if x := math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:])); math.Abs(float64(x)-first[i]) > 1e-6 {
			t.Fatalf("base64 value %d: %v, float %v", i, x, first[i])
		}
	}
	for _, bad := range []map[string]any{
		{"model": "stories"}, {"model": "stories", "input": [][]int{{1, 2}}}, {"model": "stories", "input": "x", "encoding_format": "hex"},
		{"model": "stories", "input": "x", "dimensions": 8}, {"model": "stories", "input": ""},
	} {
		code, v := ts.doJSON(t, "POST", "/v1/embeddings", bad)
		if code != 400 {
			t.Errorf("%v: %d %v", bad, code, v)
		}
		body := checkFields(t, "error", v, openaiErrorBody)
		checkFields(t, "error.error", body["error"], openaiErrorFields)
	}

	// /metrics: Prometheus text, with the requests above counted.
	mt := ts.metrics(t)
	if n := mt[`forge_http_requests_total{route="/v1/embeddings",code="200"}`]; n != 2 {
		t.Errorf("embeddings counted %v times", n)
	}
	if n := mt[`forge_http_requests_total{route="/v1/chat/completions",code="200"}`]; n != 3 {
		t.Errorf("chat completions counted %v times", n)
	}
	// Prompt tokens count the embedded texts' too: the first chat's and
	// the first embeddings' together are at most the total.
	if pt := mt[`forge_prompt_tokens_total{model="stories"}`]; pt < u["prompt_tokens"].(float64)+eu["prompt_tokens"].(float64) {
		t.Errorf("forge_prompt_tokens_total %v: the embeddings' %v tokens not counted", pt, eu["prompt_tokens"])
	}
}

// TestStreamedCompletionLogprobs: a streamed completion's chunks carry
// the legacy logprobs of their tokens; joined, they are the whole
// answer's, text offsets included.
func TestStreamedCompletionLogprobs(t *testing.T) {
	ts := startServer(t, serveConfig{models: []modelArg{{id: "stories", name: testmodels.Path(t, "stories260K-Q8_0.gguf")}}})
	body := map[string]any{"model": "stories", "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "logprobs": 2}
	code, v := ts.doJSON(t, "POST", "/v1/completions", body)
	if code != 200 {
		t.Fatalf("%d %v", code, v)
	}
	whole := v.(map[string]any)["choices"].([]any)[0].(map[string]any)["logprobs"].(map[string]any)
	body["stream"] = true
	b, _ := json.Marshal(body)
	resp, err := ts.client.Post(ts.url+"/v1/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	joined := map[string][]any{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || line == "[DONE]" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatal(err)
		}
		for _, c := range m["choices"].([]any) {
			lp, ok := c.(map[string]any)["logprobs"].(map[string]any)
			if !ok {
				continue
			}
			for _, k := range []string{"tokens", "token_logprobs", "top_logprobs", "text_offset"} {
				joined[k] = append(joined[k], lp[k].([]any)...)
			}
		}
	}
	for _, k := range []string{"tokens", "token_logprobs", "top_logprobs", "text_offset"} {
		a, _ := json.Marshal(whole[k])
		b, _ := json.Marshal(joined[k])
		if !bytes.Equal(a, b) {
			t.Errorf("%s streamed %s, whole %s", k, b, a)
		}
	}
}
