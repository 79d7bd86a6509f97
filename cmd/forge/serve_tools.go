package main

import (
	"encoding/json"
	"strings"

	"github.com/forge-llm/forge/pipeline"
	"github.com/forge-llm/forge/pipeline/chat"
)

// Tool calling on the OpenAI and Ollama routes: the request's tools go to
// the model's template, the answer's calls come back as tool_calls (see
// pipeline.EngineRequest.Tools).

// checkTools validates a request's tools (OpenAI's and Ollama's shape:
// {"type": "function", "function": {"name", "description", "parameters"}}).
func checkTools(tools []chat.Tool) error {
	seen := map[string]bool{}
	for i, t := range tools {
		if t.Type != "" && t.Type != "function" {
			return badRequest("tools[%d].type %q is not function", i, t.Type)
		}
		if t.Function.Name == "" {
			return badRequest("tools[%d].function.name is required", i)
		}
		if seen[t.Function.Name] {
			return badRequest("tools[%d].function.name %q is repeated", i, t.Function.Name)
		}
		seen[t.Function.Name] = true
		if p := t.Function.Parameters; len(p) > 0 && !json.Valid(p) {
			return badRequest("tools[%d].function.parameters is not JSON", i)
		}
	}
	return nil
}

// toolChoice reads OpenAI's tool_choice: "auto", "none", "required", or
// {"type": "function", "function": {"name": …}}; absent is "auto".
func toolChoice(raw json.RawMessage, tools []chat.Tool) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		switch s {
		case pipeline.ToolChoiceAuto, pipeline.ToolChoiceNone:
			return s, nil
		case pipeline.ToolChoiceRequired:
			if len(tools) == 0 {
				return "", badRequest("tool_choice %q needs tools", s)
			}
			return s, nil
		}
		return "", badRequest("tool_choice %q is not auto, none, required or a function", s)
	}
	var named struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &named); err != nil || named.Type != "function" || named.Function.Name == "" {
		return "", badRequest(`tool_choice must be "auto", "none", "required" or {"type": "function", "function": {"name": …}}`)
	}
	for _, t := range tools {
		if t.Function.Name == named.Function.Name {
			return named.Function.Name, nil
		}
	}
	return "", badRequest("tool_choice names %q, which is not among the tools", named.Function.Name)
}

// openAIToolCall is a call in OpenAI's response shape: arguments as a
// string holding the JSON object.
type openAIToolCall struct {
	Index    *int   `json:"index,omitempty"` // in streamed deltas only
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

func openAIToolCalls(calls []chat.ToolCall, indexed bool) []openAIToolCall {
	out := make([]openAIToolCall, len(calls))
	for i, c := range calls {
		out[i].ID, out[i].Type = c.ID, "function"
		out[i].Function.Name, out[i].Function.Arguments = c.Function.Name, c.Function.Arguments
		if indexed {
			out[i].Index = &i
		}
	}
	return out
}

// assistantMessage is a chat completion's message: the text, and the
// calls when the model made some (content null when it wrote nothing
// else, as OpenAI answers).
func assistantMessage(res pipeline.EngineResult) map[string]any {
	m := map[string]any{"role": "assistant", "content": res.Text}
	if len(res.ToolCalls) > 0 {
		m["tool_calls"] = openAIToolCalls(res.ToolCalls, false)
		if strings.TrimSpace(res.Text) == "" {
			m["content"] = nil
		}
	}
	return m
}

// toolCallsChunk is the streamed chunk that carries the calls, each whole
// (id, name and arguments at once), before the finish reason's chunk.
func toolCallsChunk(id, object, model string, created int64, calls []chat.ToolCall) map[string]any {
	return map[string]any{"id": id, "object": object, "created": created, "model": model, "choices": []any{
		map[string]any{"index": 0, "finish_reason": nil, "delta": map[string]any{"tool_calls": openAIToolCalls(calls, true)}},
	}}
}

// ollamaToolCalls is Ollama's shape: arguments as the object itself.
func ollamaToolCalls(calls []chat.ToolCall) []map[string]any {
	out := make([]map[string]any, len(calls))
	for i, c := range calls {
		args := json.RawMessage(c.Function.Arguments)
		if !json.Valid(args) {
			args = json.RawMessage("{}")
		}
		out[i] = map[string]any{"function": map[string]any{"name": c.Function.Name, "arguments": args}}
	}
	return out
}

// ollamaWithCalls adds the calls to a chat line's message.
func ollamaWithCalls(line map[string]any, calls []chat.ToolCall) map[string]any {
	if len(calls) == 0 {
		return line
	}
	msg, ok := line["message"].(map[string]string)
	if !ok {
		return line
	}
	m := map[string]any{"tool_calls": ollamaToolCalls(calls)}
	for k, v := range msg {
		m[k] = v
	}
	line["message"] = m
	return line
}
