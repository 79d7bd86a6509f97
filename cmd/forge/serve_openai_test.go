package main

import (
	"bufio"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

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

// TestServeLogprobs: chat's logprobs/top_logprobs and completions'
// logprobs N, on the batching scheduler and on the single-sequence path.
// At temperature 0 each token is the most likely: its logprob is the
// first alternative's; the tokens spell the text; every value is ≤ 0.
func TestServeLogprobs(t *testing.T) {
	for _, single := range []bool{false, true} {
		cfg := serveConfig{models: []modelArg{{id: "chat", name: chatModel(t, "tiny")}, {id: "plain", name: testmodels.Path(t, "stories260K-Q8_0.gguf")}}}
		cfg.engine.SingleSequence = single
		ts := startServer(t, cfg)

		var out completionOut
		if c := ts.postJSON(t, "/v1/completions", map[string]any{"model": "plain", "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "ignore_eos": true, "logprobs": 3}, &out); c != 200 || len(out.Choices) != 1 || out.Choices[0].Logprobs == nil {
			t.Fatalf("single %v: completion: %d %+v", single, c, out)
		}
		lp := out.Choices[0].Logprobs
		if len(lp.Tokens) != 8 || len(lp.TokenLogprobs) != 8 || len(lp.TopLogprobs) != 8 || strings.Join(lp.Tokens, "") != out.Choices[0].Text {
			t.Fatalf("single %v: logprobs %+v for text %q", single, lp, out.Choices[0].Text)
		}
		for i, v := range lp.TokenLogprobs {
			top := lp.TopLogprobs[i]
			if v > 0 || len(top) != 3 || top[lp.Tokens[i]] != v {
				t.Errorf("single %v: token %d %q: logprob %v, top %v", single, i, lp.Tokens[i], v, top)
			}
			for _, a := range top {
				if a > v {
					t.Errorf("single %v: token %d: an alternative at %v beats the greedy pick at %v", single, i, a, v)
				}
			}
		}

		var chat struct {
			Choices []struct {
				Message  struct{ Content string }
				Logprobs struct {
					Content []struct {
						Token       string
						Logprob     float64
						Bytes       []int
						TopLogprobs []struct {
							Token   string
							Logprob float64
						} `json:"top_logprobs"`
					}
				}
			}
			Usage usage
		}
		body := chatBody("chat", 4, "Tell me a story", 6)
		body["temperature"], body["logprobs"], body["top_logprobs"] = 0, true, 2
		if c := ts.postJSON(t, "/v1/chat/completions", body, &chat); c != 200 || len(chat.Choices) != 1 {
			t.Fatalf("single %v: chat: %d", single, c)
		}
		content := chat.Choices[0].Logprobs.Content
		if len(content) != chat.Usage.CompletionTokens || len(content) == 0 {
			t.Fatalf("single %v: %d logprobs for %d tokens", single, len(content), chat.Usage.CompletionTokens)
		}
		for i, e := range content {
			if e.Logprob > 0 || len(e.TopLogprobs) != 2 || e.TopLogprobs[0].Token != e.Token || e.TopLogprobs[0].Logprob != e.Logprob ||
				e.TopLogprobs[1].Logprob > e.Logprob || len(e.Bytes) == 0 {
				t.Errorf("single %v: chat token %d: %+v", single, i, e)
			}
			// bytes are the token's own; its text is them where they
			// are valid UTF-8 (a byte token's text is U+FFFD in JSON).
			if b := intsToBytes(e.Bytes); utf8.Valid(b) && string(b) != e.Token {
				t.Errorf("single %v: chat token %d: %+v", single, i, e)
			}
		}
	}
	ts := startServer(t, serveConfig{models: []modelArg{{id: "plain", name: testmodels.Path(t, "stories260K-Q8_0.gguf")}}})
	for _, c := range []struct {
		path string
		body map[string]any
	}{
		{"/v1/completions", map[string]any{"prompt": "x", "logprobs": 6}},
		{"/v1/completions", map[string]any{"prompt": "x", "logprobs": true}},
		{"/v1/completions", map[string]any{"prompt": "x", "top_logprobs": 1}},
		{"/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "user", "content": "x"}}, "logprobs": 2}},
		{"/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "user", "content": "x"}}, "top_logprobs": 2}},
		{"/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "user", "content": "x"}}, "logprobs": true, "top_logprobs": 21}},
	} {
		if code := ts.postJSON(t, c.path, c.body, nil); code != 400 {
			t.Errorf("%s %v: %d, want 400", c.path, c.body, code)
		}
	}
}

func intsToBytes(v []int) []byte {
	b := make([]byte, len(v))
	for i, x := range v {
		b[i] = byte(x)
	}
	return b
}

// TestServeCachedTokens: a prompt sent again finds its full 16-token
// blocks in the prefix cache, and usage says how many tokens came from it
// (prompt_tokens_details.cached_tokens, as OpenAI reports prompt
// caching); a first prompt reports none (the field is left out).
func TestServeCachedTokens(t *testing.T) {
	ts := startServer(t, serveConfig{models: []modelArg{{id: "plain", name: testmodels.Path(t, "stories260K-Q8_0.gguf")}}})
	prompt := "Once upon a time there was a little girl named Lily. She loved to play outside in the park with her dog and her friends every day."
	post := func() (completionOut, map[string]any) {
		var raw map[string]any
		if c := ts.postJSON(t, "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 4, "temperature": 0}, &raw); c != 200 {
			t.Fatalf("%d", c)
		}
		b, _ := json.Marshal(raw)
		var out completionOut
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatal(err)
		}
		return out, raw["usage"].(map[string]any)
	}
	first, raw := post()
	if _, ok := raw["prompt_tokens_details"]; ok || first.Usage.PromptTokens < 33 {
		t.Fatalf("first request: usage %v (want no cached tokens, a prompt of 33 tokens or more)", raw)
	}
	second, _ := post()
	if c := second.Usage.PromptTokensDetails.CachedTokens; c < 32 || c%16 != 0 || c >= second.Usage.PromptTokens {
		t.Errorf("the same prompt again: %d cached of %d prompt tokens, want whole 16-token blocks, at least 2, not the last token's", c, second.Usage.PromptTokens)
	}
}
