package pipeline

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/pipeline/chat"
	"github.com/forge-llm/forge/pipeline/synth"
	"github.com/forge-llm/forge/pipeline/tokenizer"
)

// templateModel writes a tiny synthetic model with stories260K's
// vocabulary and the chat template of testdata file name.
func templateModel(t testing.TB, name string) string {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("chat/testdata/templates", name+".jinja"))
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
	path := filepath.Join(t.TempDir(), "tiny-tools.gguf")
	if err := synth.WriteFile(context.Background(), path, synth.Options{Shape: synth.Presets["tiny"], Vocab: voc, Seed: 7, Name: "tiny-tools"}); err != nil {
		t.Fatal(err)
	}
	return path
}

var weatherTool = chat.Tool{Type: "function", Function: chat.Function{
	Name: "get_weather", Description: "Get the weather in a city.",
	Parameters: []byte(`{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`),
}}

// scriptedTools is a ToolConstraint for tests: a tiny random model never
// writes a tool call, so the constraint forces one (in the model's format)
// when the last message is the user's, and a final answer after a tool
// result. It stands where constrained decoding plugs in.
func scriptedTools(family chat.Family, answer string) ConstraintFactory {
	return func(tok *tokenizer.Tokenizer, r *EngineRequest) (Constraint, error) {
		if r.Messages[len(r.Messages)-1].Role == "tool" {
			return ForceText(answer)(tok, r)
		}
		text, err := chat.ToolCallText(family, chat.ToolCall{Function: chat.FunctionCall{Name: "get_weather", Arguments: `{"city":"Paris"}`}})
		if err != nil {
			return nil, err
		}
		return ForceText(text)(tok, r)
	}
}

// A request with tools gets the call back as ToolCalls (finish reason
// tool_calls); the conversation goes on with the tool's result and ends
// with the answer, streamed and not.
func TestEngineToolCalls(t *testing.T) {
	path := templateModel(t, "Qwen-Qwen2.5-7B-Instruct")
	e := newTestEngine(t, EngineOptions{Open: Options{Ctx: 4096}, ToolConstraint: scriptedTools(chat.Hermes, "It is sunny in Paris.")})
	msgs := []chat.Message{{Role: "user", Content: "Weather in Paris?"}}
	req := EngineRequest{Model: path, Messages: msgs, Tools: []chat.Tool{weatherTool}, MaxTokens: 200}
	res, err := e.Generate(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	if res.FinishReason != FinishToolCalls || len(res.ToolCalls) != 1 || strings.TrimSpace(res.Text) != "" {
		t.Fatalf("finish %q, calls %+v, text %q", res.FinishReason, res.ToolCalls, res.Text)
	}
	call := res.ToolCalls[0]
	if call.Function.Name != "get_weather" || call.Function.Arguments != `{"city":"Paris"}` || call.ID == "" || call.Type != "function" {
		t.Fatalf("call %+v", call)
	}

	// The same, streamed: the calls come on the last Delta.
	var streamed []chat.ToolCall
	for d, err := range e.Stream(t.Context(), req) {
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(d.Text) != "" {
			t.Errorf("text delta %q from a call", d.Text)
		}
		if d.Result != nil {
			streamed = d.ToolCalls
		}
	}
	if len(streamed) != 1 || streamed[0].Function.Name != "get_weather" {
		t.Fatalf("streamed calls %+v", streamed)
	}

	// The tool's result, then the answer.
	req.Messages = append(msgs, chat.Message{Role: "assistant", ToolCalls: res.ToolCalls},
		chat.Message{Role: "tool", ToolCallID: call.ID, Name: "get_weather", Content: `{"sky":"sunny"}`})
	var text strings.Builder
	var final *EngineResult
	for d, err := range e.Stream(t.Context(), req) {
		if err != nil {
			t.Fatal(err)
		}
		text.WriteString(d.Text)
		if d.Result != nil {
			final = d.Result
		}
	}
	if final == nil || final.FinishReason != FinishStop || final.ToolCalls != nil || strings.TrimSpace(final.Text) != "It is sunny in Paris." || text.String() != final.Text {
		t.Fatalf("final %+v, streamed %q", final, text.String())
	}

	// tool_choice none: the tools are not offered, nothing is forced or
	// parsed; a name not among the tools is refused.
	req.Messages, req.ToolChoice, req.MaxTokens = msgs, ToolChoiceNone, 8
	if res, err := e.Generate(t.Context(), req); err != nil || res.ToolCalls != nil || res.FinishReason == FinishToolCalls {
		t.Fatalf("tool_choice none: %+v %v", res, err)
	}
	req.ToolChoice = "get_time"
	if _, err := e.Generate(t.Context(), req); !errors.Is(err, ErrToolChoice) {
		t.Fatalf("unknown tool choice: %v", err)
	}
}

// A Session with tools: the call joins the conversation, the tool's
// result is added, and Continue has the model answer it.
func TestSessionTools(t *testing.T) {
	path := templateModel(t, "Qwen-Qwen2.5-7B-Instruct")
	e := newTestEngine(t, EngineOptions{Open: Options{Ctx: 4096}, ToolConstraint: scriptedTools(chat.Hermes, "It is sunny in Paris.")})
	s := e.NewSession(path, SessionOptions{Tools: []chat.Tool{weatherTool}, MaxTokens: 200})
	res, err := s.Send(t.Context(), "Weather in Paris?")
	if err != nil {
		t.Fatal(err)
	}
	if res.FinishReason != FinishToolCalls || len(res.ToolCalls) != 1 {
		t.Fatalf("first turn %+v", res)
	}
	s.AddToolResult(res.ToolCalls[0].ID, "get_weather", `{"sky":"sunny"}`)
	final, err := collectStream(s.Continue(t.Context()))
	if err != nil {
		t.Fatal(err)
	}
	msgs := s.Messages()
	if strings.TrimSpace(final.Text) != "It is sunny in Paris." || len(msgs) != 4 || len(msgs[1].ToolCalls) != 1 || msgs[2].Role != "tool" || msgs[3].Content != final.Text {
		t.Fatalf("final %q, conversation %+v", final.Text, msgs)
	}
}
