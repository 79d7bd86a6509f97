package main

import (
	"encoding/json"
	"io"
	"strconv"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

const weatherSchema = `{"type":"object","properties":{"location":{"type":"string","maxLength":20},"unit":{"enum":["celsius","fahrenheit"]},"days":{"type":"integer","minimum":1,"maximum":7}},"required":["location","unit","days"],"additionalProperties":false}`

func validateWeather(t *testing.T, where, text string) {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(weatherSchema))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("weather.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("weather.json")
	if err != nil {
		t.Fatal(err)
	}
	inst, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		t.Fatalf("%s: %q does not parse: %v", where, text, err)
	}
	if err := s.Validate(inst); err != nil {
		t.Fatalf("%s: %q does not validate: %v", where, text, err)
	}
}

// TestServeConstrained: OpenAI's response_format (json_object and
// json_schema, plain and streamed), llama.cpp's grammar and json_schema
// fields, and Ollama's format ("json" and a schema) hold a model of random
// weights to valid output; malformed constraints are 400s.
func TestServeConstrained(t *testing.T) {
	ts := startServer(t, serveConfig{models: []modelArg{{id: "chat", name: chatModel(t, "tiny")}}})
	schema := json.RawMessage(weatherSchema)
	chat := func(extra map[string]any) map[string]any {
		b := map[string]any{"model": "chat", "seed": 3, "temperature": 0.9, "max_tokens": 150,
			"messages": []map[string]string{{"role": "user", "content": "Weather in Paris?"}}}
		for k, v := range extra {
			b[k] = v
		}
		return b
	}
	var out struct {
		Choices []struct {
			Message      struct{ Content string }
			Text         string
			FinishReason string `json:"finish_reason"`
		}
	}
	rfSchema := map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "weather", "schema": schema, "strict": true}}
	if c := ts.postJSON(t, "/v1/chat/completions", chat(map[string]any{"response_format": rfSchema}), &out); c != 200 {
		t.Fatalf("json_schema: %d", c)
	}
	if out.Choices[0].FinishReason != "stop" {
		t.Errorf("json_schema: finish %q", out.Choices[0].FinishReason)
	}
	validateWeather(t, "chat json_schema", out.Choices[0].Message.Content)

	text, finish, err := ts.streamChat(t.Context(), chat(map[string]any{"response_format": rfSchema, "seed": 9}), nil)
	if err != nil {
		t.Fatal(err)
	}
	if finish != "stop" {
		t.Errorf("streamed json_schema: finish %q", finish)
	}
	validateWeather(t, "streamed json_schema", text)

	if c := ts.postJSON(t, "/v1/chat/completions", chat(map[string]any{"response_format": map[string]any{"type": "json_object"}}), &out); c != 200 {
		t.Fatalf("json_object: %d", c)
	}
	var obj map[string]any
	if err := json.Unmarshal([]byte(out.Choices[0].Message.Content), &obj); err != nil {
		t.Errorf("json_object: %q: %v", out.Choices[0].Message.Content, err)
	}

	// llama.cpp's fields on /v1/completions.
	comp := map[string]any{"model": "chat", "prompt": "List:", "seed": 1, "max_tokens": 80, "grammar": `root ::= ("- " [a-z]{1,8} "\n"){1,3}`}
	if c := ts.postJSON(t, "/v1/completions", comp, &out); c != 200 {
		t.Fatalf("grammar: %d", c)
	}
	for _, line := range strings.Split(strings.TrimSuffix(out.Choices[0].Text, "\n"), "\n") {
		if !strings.HasPrefix(line, "- ") || len(line) < 3 || strings.Trim(line[2:], "abcdefghijklmnopqrstuvwxyz") != "" {
			t.Errorf("grammar output %q: line %q", out.Choices[0].Text, line)
		}
	}
	delete(comp, "grammar")
	comp["json_schema"] = schema
	if c := ts.postJSON(t, "/v1/completions", comp, &out); c != 200 {
		t.Fatalf("json_schema field: %d", c)
	}
	validateWeather(t, "completion json_schema", out.Choices[0].Text)

	// Ollama.
	var ol struct {
		Message  struct{ Content string }
		Response string
	}
	ob := map[string]any{"model": "chat", "stream": false, "format": schema, "options": map[string]any{"seed": 4, "num_predict": 150},
		"messages": []map[string]string{{"role": "user", "content": "Weather?"}}}
	if c := ts.postJSON(t, "/api/chat", ob, &ol); c != 200 {
		t.Fatalf("ollama format schema: %d", c)
	}
	validateWeather(t, "ollama chat", ol.Message.Content)
	gb := map[string]any{"model": "chat", "stream": false, "format": "json", "prompt": "Data:", "options": map[string]any{"seed": 5, "num_predict": 150}}
	if c := ts.postJSON(t, "/api/generate", gb, &ol); c != 200 {
		t.Fatalf("ollama format json: %d", c)
	}
	if err := json.Unmarshal([]byte(ol.Response), &obj); err != nil {
		t.Errorf("ollama json: %q: %v", ol.Response, err)
	}

	// The masks show in /metrics.
	resp, err := ts.client.Get(ts.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var masks float64
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, "forge_constrain_masks_total "); ok {
			masks, _ = strconv.ParseFloat(v, 64)
		}
	}
	if masks < 10 {
		t.Errorf("forge_constrain_masks_total %v after constrained requests", masks)
	}

	// Malformed constraints.
	for _, bad := range []struct {
		path string
		body map[string]any
	}{
		{"/v1/chat/completions", chat(map[string]any{"response_format": map[string]any{"type": "xml"}})},
		{"/v1/chat/completions", chat(map[string]any{"response_format": map[string]any{"type": "json_schema"}})},
		{"/v1/chat/completions", chat(map[string]any{"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"schema": map[string]any{"type": "strange"}}}})},
		{"/v1/chat/completions", chat(map[string]any{"response_format": map[string]any{"type": "json_object"}, "grammar": `root ::= "x"`})},
		{"/v1/completions", map[string]any{"model": "chat", "prompt": "x", "grammar": `root ::= root "x"`}},
		{"/v1/completions", map[string]any{"model": "chat", "prompt": "x", "grammar": `root ::= "x"`, "ignore_eos": true}},
		{"/v1/completions", map[string]any{"model": "chat", "prompt": "x", "json_schema": map[string]any{"type": "string", "pattern": "(?=x)"}}},
		{"/api/generate", map[string]any{"model": "chat", "prompt": "x", "stream": false, "format": "yaml"}},
	} {
		var e map[string]any // OpenAI's error object or Ollama's string
		if c := ts.postJSON(t, bad.path, bad.body, &e); c != 400 || e["error"] == nil {
			t.Errorf("%s %v: %d, want 400", bad.path, bad.body, c)
		}
	}
}
