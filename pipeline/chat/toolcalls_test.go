package chat

import (
	"encoding/json"
	"testing"
)

func TestParseToolCalls(t *testing.T) {
	weather := ToolCall{Type: "function", Function: FunctionCall{Name: "get_weather", Arguments: `{"city":"Paris"}`}}
	cases := []struct {
		name    string
		f       Family
		out     string
		content string
		calls   []ToolCall
	}{
		{"hermes", Hermes, "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", "Let me check.", []ToolCall{weather}},
		{"hermes-two", Hermes, "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}</tool_call>\n<tool_call>{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}</tool_call>", "", []ToolCall{weather, weather}},
		{"hermes-text", Hermes, "It is sunny.", "It is sunny.", nil},
		{"llama", Llama31, `{"name": "get_weather", "parameters": {"city": "Paris"}}`, "", []ToolCall{weather}},
		{"llama-python-tag", Llama31, `<|python_tag|>{"type": "function", "name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_weather", "parameters": {"city": "Paris"}}`, "", []ToolCall{weather, weather}},
		{"llama-text", Llama31, `{braces} are fine`, `{braces} are fine`, nil},
		{"llama-json-not-call", Llama31, `{"answer": 42}`, `{"answer": 42}`, nil},
		{"mistral", MistralTools, `[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abcdefghi"}]`, "", []ToolCall{weather}},
		{"mistral-args", MistralTools, `[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}`, "", []ToolCall{weather}},
		{"harmony", Harmony, `<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>`, "", []ToolCall{weather}},
		{"harmony-final", Harmony, `<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>Hello!`, "Hello!", nil},
		{"deepseek", DeepSeek, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "", []ToolCall{weather}},
		{"other-bare", Other, `{"name": "get_weather", "arguments": {"city": "Paris"}}`, "", []ToolCall{weather}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			content, calls := ParseToolCalls(c.f, c.out)
			if content != c.content || !sameCalls(calls, c.calls) {
				t.Fatalf("got %q %+v, want %q %+v", content, calls, c.content, c.calls)
			}
		})
	}
}

func sameCalls(a, b []ToolCall) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

// What ToolCallText writes for a family parses back to the call.
func TestToolCallTextRoundTrip(t *testing.T) {
	c := ToolCall{Type: "function", Function: FunctionCall{Name: "get_weather", Arguments: `{"city":"Paris","unit":"celsius"}`}}
	for _, f := range []Family{Llama31, Hermes, MistralTools, Harmony, ChatML, Gemma, Phi, Other} {
		text, err := ToolCallText(f, c)
		if err != nil {
			t.Fatal(err)
		}
		content, calls := ParseToolCalls(f, text)
		if content != "" || !sameCalls(calls, []ToolCall{c}) {
			t.Errorf("%s: %q parses to %q %+v", f, text, content, calls)
		}
	}
	if _, err := ToolCallText(Hermes, ToolCall{Function: FunctionCall{Name: "f", Arguments: "{nope"}}); err == nil {
		t.Error("invalid arguments: no error")
	}
}

// Arguments arrive as a JSON string (OpenAI) or an object (Ollama).
func TestFunctionCallUnmarshal(t *testing.T) {
	for _, in := range []string{`{"name":"f","arguments":"{\"a\":1}"}`, `{"name":"f","arguments":{"a":1}}`} {
		var f FunctionCall
		if err := json.Unmarshal([]byte(in), &f); err != nil || f.Name != "f" || f.Arguments != `{"a":1}` {
			t.Errorf("%s: %+v %v", in, f, err)
		}
	}
}

// The families of the templates under test.
func TestDetect(t *testing.T) {
	want := map[string]Family{
		"meta-llama-Llama-3.1-8B-Instruct": Llama31, "meta-llama-Llama-3.2-3B-Instruct": Llama31,
		"meta-llama-Meta-Llama-3-8B-Instruct": Llama3, "meta-llama-Llama-2-7b-chat-hf": Llama2,
		"Qwen-Qwen2.5-7B-Instruct": Hermes, "Qwen-Qwen3-0.6B": Hermes, "Qwen-Qwen2-7B-Instruct": ChatML,
		"mistralai-Mistral-Nemo-Instruct-2407": MistralTools, "Mistral-Small-3.2-24B-Instruct-2506": MistralTools,
		"mistralai-Mistral-7B-Instruct-v0.2": Mistral, "google-gemma-2-2b-it": Gemma,
		"microsoft-phi-4": Phi, "microsoft-Phi-3.5-mini-instruct": Phi, "openai-gpt-oss-120b": Harmony,
		"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": DeepSeek,
	}
	for name, f := range want {
		tm, err := parseFile(t, name)
		if err != nil {
			t.Fatal(err)
		}
		if tm.Family != f {
			t.Errorf("%s: family %q, want %q", name, tm.Family, f)
		}
	}
}
