package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/pipeline"
	"github.com/forge-llm/forge/pipeline/chat"
	"github.com/forge-llm/forge/pipeline/synth"
	"github.com/forge-llm/forge/pipeline/tokenizer"
)

// qwenModel writes a tiny synthetic model with stories260K's vocabulary
// and Qwen2.5-7B-Instruct's chat template, which renders tools and whose
// calls are <tool_call>{…}</tool_call>.
func qwenModel(t testing.TB) string {
	t.Helper()
	src, err := os.ReadFile("../../pipeline/chat/testdata/templates/Qwen-Qwen2.5-7B-Instruct.jinja")
	if err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Open(testmodels.Path(t, "stories260K-F32.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	voc, err := f.Tokenizer()
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	voc.ChatTemplate = string(src)
	path := filepath.Join(t.TempDir(), "tiny-qwen.gguf")
	if err := synth.WriteFile(context.Background(), path, synth.Options{Shape: synth.Presets["tiny"], Vocab: voc, Seed: 5, Name: "tiny-qwen"}); err != nil {
		t.Fatal(err)
	}
	return path
}

const sunny = "It is sunny in Paris."

// scriptedTools stands where constrained decoding plugs in
// (EngineOptions.ToolConstraint): a tiny random model never writes a tool
// call by itself, so this test constraint forces one in the model's format
// when the last message is the user's, and the final answer after the
// tool's result.
func scriptedTools(tok *tokenizer.Tokenizer, r *pipeline.EngineRequest) (pipeline.Constraint, error) {
	if r.Messages[len(r.Messages)-1].Role == "tool" {
		return pipeline.ForceText(sunny)(tok, r)
	}
	text, err := chat.ToolCallText(chat.Hermes, chat.ToolCall{Function: chat.FunctionCall{Name: "get_weather", Arguments: `{"city":"Paris"}`}})
	if err != nil {
		return nil, err
	}
	return pipeline.ForceText(text)(tok, r)
}

var weatherToolJSON = map[string]any{"type": "function", "function": map[string]any{
	"name": "get_weather", "description": "Get the weather in a city.",
	"parameters": map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}, "required": []string{"city"}},
}}

func toolServer(t *testing.T) *testServer {
	cfg := serveConfig{models: []modelArg{{id: "q", name: qwenModel(t)}}}
	cfg.engine.Open.Ctx = 4096
	cfg.engine.ToolConstraint = scriptedTools
	return startServer(t, cfg)
}

type openAICall struct {
	Index    *int   `json:"index"`
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// sseChat reads a streamed chat completion: the text, the calls, the
// finish reason; it fails on a malformed stream.
func sseChat(t *testing.T, ts *testServer, body map[string]any) (string, []openAICall, string) {
	t.Helper()
	body["stream"] = true
	resp, err := ts.post(t.Context(), "/v1/chat/completions", body)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	var text strings.Builder
	var calls []openAICall
	finish, done := "", false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done = true
			break
		}
		var c struct {
			Choices []struct {
				Delta struct {
					Content   *string      `json:"content"`
					ToolCalls []openAICall `json:"tool_calls"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil || len(c.Choices) != 1 {
			t.Fatalf("chunk %q: %v", data, err)
		}
		if p := c.Choices[0].Delta.Content; p != nil {
			text.WriteString(*p)
		}
		calls = append(calls, c.Choices[0].Delta.ToolCalls...)
		if f := c.Choices[0].FinishReason; f != nil {
			finish = *f
		}
	}
	if !done {
		t.Fatal("no [DONE]")
	}
	return text.String(), calls, finish
}

// The OpenAI tool flow over HTTP, not streamed and streamed: a request
// with tools gets tool_calls (finish tool_calls); the conversation with
// the assistant's call and the tool's result gets the final answer.
func TestServeOpenAIToolFlow(t *testing.T) {
	leakCheck(t)
	ts := toolServer(t)
	user := []any{map[string]any{"role": "user", "content": "What is the weather in Paris?"}}
	body := func(msgs []any) map[string]any {
		return map[string]any{"model": "q", "messages": msgs, "tools": []any{weatherToolJSON}, "tool_choice": "auto", "max_tokens": 200}
	}
	var a struct {
		Choices []struct {
			Message struct {
				Role      string       `json:"role"`
				Content   *string      `json:"content"`
				ToolCalls []openAICall `json:"tool_calls"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	if st := ts.postJSON(t, "/v1/chat/completions", body(user), &a); st != 200 {
		t.Fatalf("status %d", st)
	}
	m := a.Choices[0].Message
	if a.Choices[0].FinishReason != "tool_calls" || m.Content != nil || len(m.ToolCalls) != 1 {
		t.Fatalf("answer %+v", a)
	}
	call := m.ToolCalls[0]
	if call.ID == "" || call.Type != "function" || call.Function.Name != "get_weather" || call.Function.Arguments != `{"city":"Paris"}` {
		t.Fatalf("call %+v", call)
	}

	// Streamed: one chunk carries the call (index, id, name, arguments).
	text, calls, finish := sseChat(t, ts, body(user))
	if strings.TrimSpace(text) != "" || finish != "tool_calls" || len(calls) != 1 || calls[0].Index == nil || *calls[0].Index != 0 ||
		calls[0].ID == "" || calls[0].Function.Name != "get_weather" || calls[0].Function.Arguments != `{"city":"Paris"}` {
		t.Fatalf("streamed %q %+v %q", text, calls, finish)
	}

	// The tool's result; the answer, not streamed and streamed.
	follow := append(user,
		map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{"id": call.ID, "type": "function", "function": map[string]any{"name": "get_weather", "arguments": call.Function.Arguments}}}},
		map[string]any{"role": "tool", "tool_call_id": call.ID, "content": `{"sky": "sunny"}`})
	a.Choices = nil
	if st := ts.postJSON(t, "/v1/chat/completions", body(follow), &a); st != 200 {
		t.Fatalf("status %d", st)
	}
	m = a.Choices[0].Message
	if a.Choices[0].FinishReason != "stop" || m.Content == nil || strings.TrimSpace(*m.Content) != sunny || m.ToolCalls != nil {
		t.Fatalf("final answer %+v", a)
	}
	text, calls, finish = sseChat(t, ts, body(follow))
	if strings.TrimSpace(text) != sunny || calls != nil || finish != "stop" {
		t.Fatalf("streamed final %q %+v %q", text, calls, finish)
	}

	// tool_choice none offers no tools (no call forced or parsed); a
	// named choice that is not a tool is a 400.
	b := body(user)
	b["tool_choice"], b["max_tokens"] = "none", 6
	a.Choices = nil
	if st := ts.postJSON(t, "/v1/chat/completions", b, &a); st != 200 || a.Choices[0].FinishReason == "tool_calls" || a.Choices[0].Message.ToolCalls != nil {
		t.Fatalf("tool_choice none: %d %+v", st, a)
	}
	b["tool_choice"] = map[string]any{"type": "function", "function": map[string]any{"name": "get_time"}}
	if st := ts.postJSON(t, "/v1/chat/completions", b, nil); st != 400 {
		t.Fatalf("unknown named tool_choice: status %d", st)
	}
}

// Ollama's tool flow over /api/chat, not streamed and streamed: calls with
// arguments as objects, then the tool's result and the answer.
func TestServeOllamaToolFlow(t *testing.T) {
	leakCheck(t)
	ts := toolServer(t)
	user := []any{map[string]any{"role": "user", "content": "What is the weather in Paris?"}}
	type ollamaMsg struct {
		Role      string `json:"role"`
		Content   string `json:"content"`
		ToolCalls []struct {
			Function struct {
				Name      string          `json:"name"`
				Arguments json.RawMessage `json:"arguments"`
			} `json:"function"`
		} `json:"tool_calls"`
	}
	type ollamaLine struct {
		Message    ollamaMsg `json:"message"`
		Done       bool      `json:"done"`
		DoneReason string    `json:"done_reason"`
	}
	chatOnce := func(msgs []any, stream bool) (ollamaMsg, string) {
		t.Helper()
		resp, err := ts.post(t.Context(), "/api/chat", map[string]any{"model": "q", "messages": msgs, "tools": []any{weatherToolJSON}, "stream": stream, "options": map[string]any{"num_predict": 200}})
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		var all ollamaMsg
		reason := ""
		sc := bufio.NewScanner(resp.Body)
		n := 0
		for sc.Scan() {
			var l ollamaLine
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				t.Fatalf("line %q: %v", sc.Text(), err)
			}
			n++
			all.Role = l.Message.Role
			all.Content += l.Message.Content
			all.ToolCalls = append(all.ToolCalls, l.Message.ToolCalls...)
			if l.Done {
				reason = l.DoneReason
			}
		}
		if !stream && n != 1 {
			t.Fatalf("%d lines, want 1", n)
		}
		return all, reason
	}
	for _, stream := range []bool{false, true} {
		m, reason := chatOnce(user, stream)
		if reason != "tool_calls" || len(m.ToolCalls) != 1 || m.ToolCalls[0].Function.Name != "get_weather" || string(m.ToolCalls[0].Function.Arguments) != `{"city":"Paris"}` {
			t.Fatalf("stream %v: %+v %q", stream, m, reason)
		}
		follow := append(append([]any{}, user...),
			map[string]any{"role": "assistant", "content": "", "tool_calls": []any{map[string]any{"function": map[string]any{"name": "get_weather", "arguments": map[string]any{"city": "Paris"}}}}},
			map[string]any{"role": "tool", "content": `{"sky": "sunny"}`})
		m, reason = chatOnce(follow, stream)
		if reason != "stop" || strings.TrimSpace(m.Content) != sunny || m.ToolCalls != nil {
			t.Fatalf("stream %v final: %+v %q", stream, m, reason)
		}
	}
}
