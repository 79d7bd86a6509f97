package main

import (
	"bufio"
	"encoding/json"
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf/testmodels"
)

type completionOut struct {
	Choices []struct {
		Index        int
		Text         string
		FinishReason string `json:"finish_reason"`
		Logprobs     *struct {
			Tokens        []string
			TokenLogprobs []float64            `json:"token_logprobs"`
			TopLogprobs   []map[string]float64 `json:"top_logprobs"`
		}
	}
	Usage usage
}

// TestServePenalties: presence_penalty and frequency_penalty are
// range-checked ([-2, 2], a 400 naming the field) and change what greedy
// decoding picks.
func TestServePenalties(t *testing.T) {
	ts := startServer(t, serveConfig{models: []modelArg{{id: "plain", name: testmodels.Path(t, "stories260K-Q8_0.gguf")}}})
	for _, f := range []string{"presence_penalty", "frequency_penalty"} {
		for _, v := range []any{2.5, -3, "x"} {
			var e apiError
			if c := ts.postJSON(t, "/v1/completions", map[string]any{"prompt": "Once", f: v}, &e); c != 400 {
				t.Errorf("%s %v: %d, want 400", f, v, c)
			} else if _, isNum := v.(string); !isNum && (e.Error.Param == nil || *e.Error.Param != f) {
				t.Errorf("%s %v: param %v, want %s", f, v, e.Error.Param, f)
			}
		}
	}
	run := func(extra map[string]any) string {
		body := map[string]any{"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0, "ignore_eos": true}
		for k, v := range extra {
			body[k] = v
		}
		var out completionOut
		if c := ts.postJSON(t, "/v1/completions", body, &out); c != 200 || len(out.Choices) != 1 {
			t.Fatalf("%v: %d %+v", extra, c, out)
		}
		return out.Choices[0].Text
	}
	plain := run(nil)
	if again := run(map[string]any{"presence_penalty": 0, "frequency_penalty": 0}); again != plain {
		t.Fatalf("zero penalties changed greedy output: %q vs %q", again, plain)
	}
	for _, f := range []string{"presence_penalty", "frequency_penalty"} {
		if pen := run(map[string]any{f: 2}); pen == plain {
			t.Errorf("%s 2 left the greedy output as it was: %q", f, pen)
		}
	}
}

// TestServePromptArray: a completion's prompt may be an array; each
// prompt is answered as a choice with its index, as it would be alone,
// and usage sums them.
func TestServePromptArray(t *testing.T) {
	ts := startServer(t, serveConfig{models: []modelArg{{id: "plain", name: testmodels.Path(t, "stories260K-Q8_0.gguf")}}})
	prompts := []string{"Once upon a time", "The dog", "Lily wanted"}
	var alone []completionOut
	for _, p := range prompts {
		var out completionOut
		if c := ts.postJSON(t, "/v1/completions", map[string]any{"prompt": p, "max_tokens": 8, "seed": 3, "ignore_eos": true}, &out); c != 200 {
			t.Fatalf("%q: %d", p, c)
		}
		alone = append(alone, out)
	}
	var all completionOut
	if c := ts.postJSON(t, "/v1/completions", map[string]any{"prompt": prompts, "max_tokens": 8, "seed": 3, "ignore_eos": true}, &all); c != 200 || len(all.Choices) != len(prompts) {
		t.Fatalf("array: %d, %d choices", c, len(all.Choices))
	}
	var u usage
	for i, ch := range all.Choices {
		if ch.Index != i || ch.Text != alone[i].Choices[0].Text || ch.FinishReason != "length" {
			t.Errorf("choice %d: index %d, text %q, finish %q; alone: %q", i, ch.Index, ch.Text, ch.FinishReason, alone[i].Choices[0].Text)
		}
		u.PromptTokens += alone[i].Usage.PromptTokens
		u.CompletionTokens += alone[i].Usage.CompletionTokens
		u.TotalTokens += alone[i].Usage.TotalTokens
	}
	if all.Usage != u || u.CompletionTokens != 24 {
		t.Errorf("usage %+v, want the sum %+v", all.Usage, u)
	}
	many := make([]string, maxPrompts+1)
	for i := range many {
		many[i] = "x"
	}
	if c := ts.postJSON(t, "/v1/completions", map[string]any{"prompt": many}, nil); c != 400 {
		t.Errorf("%d prompts: %d, want 400", len(many), c)
	}
}

// TestServeStreamUsageChunk: with stream_options.include_usage, usage
// comes in its own chunk with no choices, after the finish reason and
// before [DONE], as OpenAI sends it; without it, no chunk has usage.
func TestServeStreamUsageChunk(t *testing.T) {
	ts := startServer(t, serveConfig{models: []modelArg{{id: "plain", name: testmodels.Path(t, "stories260K-Q8_0.gguf")}}})
	for _, withUsage := range []bool{true, false} {
		body := map[string]any{"prompt": "Once upon a time", "max_tokens": 6, "ignore_eos": true, "stream": true, "seed": 1}
		if withUsage {
			body["stream_options"] = map[string]any{"include_usage": true}
		}
		resp, err := ts.post(t.Context(), "/v1/completions", body)
		if err != nil {
			t.Fatal(err)
		}
		var events []string
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				events = append(events, d)
			}
		}
		resp.Body.Close()
		if len(events) < 3 || events[len(events)-1] != "[DONE]" {
			t.Fatalf("include_usage %v: events %q", withUsage, events)
		}
		type chunk struct {
			Choices []struct {
				FinishReason *string `json:"finish_reason"`
			}
			Usage *usage
		}
		var chunks []chunk
		for _, e := range events[:len(events)-1] {
			var c chunk
			if err := json.Unmarshal([]byte(e), &c); err != nil {
				t.Fatalf("chunk %q: %v", e, err)
			}
			chunks = append(chunks, c)
		}
		n := len(chunks)
		if withUsage {
			last, fin := chunks[n-1], chunks[n-2]
			if last.Choices == nil || len(last.Choices) != 0 || last.Usage == nil || last.Usage.CompletionTokens != 6 || last.Usage.PromptTokens == 0 {
				t.Errorf("usage chunk %s: want choices [] and usage of 6 tokens", events[n-1])
			}
			if len(fin.Choices) != 1 || fin.Choices[0].FinishReason == nil || *fin.Choices[0].FinishReason != "length" || fin.Usage != nil {
				t.Errorf("finish chunk %s", events[n-2])
			}
			chunks = chunks[:n-1]
		}
		for i, c := range chunks {
			if c.Usage != nil || len(c.Choices) != 1 {
				t.Errorf("include_usage %v: chunk %d = %s", withUsage, i, events[i])
			}
		}
	}
}
