package pipeline_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/pipeline"
	"github.com/forge-llm/forge/pipeline/chat"
	"github.com/forge-llm/forge/pipeline/tokenizer"
)

// An Engine serves requests on models it loads on demand; Stream gives the
// request's id at once, the text as it comes, and the result with its
// usage last.
func ExampleEngine_Stream() {
	e := pipeline.NewEngine(pipeline.EngineOptions{})
	defer e.Close()
	path := filepath.Join(testmodels.Dir(), "stories260K-F32.gguf")
	for d, err := range e.Stream(context.Background(), pipeline.EngineRequest{Model: path, Prompt: "Once upon a time", MaxTokens: 10}) {
		if err != nil {
			fmt.Println(err)
			return
		}
		switch {
		case d.Result != nil:
			fmt.Printf("\n%d tokens, finish %s\n", d.Result.Usage.CompletionTokens, d.Result.FinishReason)
		case d.Text == "":
			fmt.Println("started:", strings.HasPrefix(d.RequestID, "req-"))
		default:
			fmt.Print(d.Text)
		}
	}
	// Output:
	// started: true
	// , there was a little girl named Lily
	// 10 tokens, finish length
}

// A Session holds a conversation; each turn sends the history, which a
// batching engine finds in its prefix cache.
func ExampleSession() {
	// A context longer than the tiny model's 128 positions, for the history.
	e := pipeline.NewEngine(pipeline.EngineOptions{Open: pipeline.Options{Ctx: 512}})
	defer e.Close()
	path := filepath.Join(testmodels.Dir(), "stories260K-F32.gguf")
	// stories260K has no chat template of its own: ChatML.
	s := e.NewSession(path, pipeline.SessionOptions{System: "Tell stories.", MaxTokens: 8, Template: &chat.Template{Family: chat.ChatML}})
	for _, q := range []string{"Once upon a time", "And then?"} {
		res, err := s.Send(context.Background(), q)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(res.Usage.CompletionTokens, "tokens")
	}
	fmt.Println(len(s.Messages()), "messages")
	// Output:
	// 8 tokens
	// 8 tokens
	// 5 messages
}

// Tools go with a request; the model's calls come back parsed from its
// format. A real model writes the call itself; this tiny test model is
// held to one by a ToolConstraint (the hook constrained decoding uses).
func ExampleEngineRequest_tools() {
	call := func(tok *tokenizer.Tokenizer, r *pipeline.EngineRequest) (pipeline.Constraint, error) {
		text, err := chat.ToolCallText(chat.Hermes, chat.ToolCall{Function: chat.FunctionCall{Name: "get_weather", Arguments: `{"city":"Paris"}`}})
		if err != nil {
			return nil, err
		}
		return pipeline.ForceText(text)(tok, r)
	}
	e := pipeline.NewEngine(pipeline.EngineOptions{ToolConstraint: call})
	defer e.Close()
	res, err := e.Generate(context.Background(), pipeline.EngineRequest{
		Model:    filepath.Join(testmodels.Dir(), "stories260K-F32.gguf"),
		Messages: []chat.Message{{Role: "user", Content: "Weather in Paris?"}},
		Template: &chat.Template{Family: chat.ChatML},
		Tools: []chat.Tool{{Type: "function", Function: chat.Function{
			Name: "get_weather", Parameters: []byte(`{"type":"object","properties":{"city":{"type":"string"}}}`),
		}}},
		MaxTokens: 100,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(res.FinishReason, res.ToolCalls[0].Function.Name, res.ToolCalls[0].Function.Arguments)
	// Output:
	// tool_calls get_weather {"city":"Paris"}
}

// Breaking out of a stream cancels the request: its slot is free at the
// next step, and the loop returns once it ended. A reader that stops
// reading never holds up the model or Close.
func ExampleEngine_Stream_cancel() {
	e := pipeline.NewEngine(pipeline.EngineOptions{})
	path := filepath.Join(testmodels.Dir(), "stories260K-F32.gguf")
	pieces := 0
	for d, err := range e.Stream(context.Background(), pipeline.EngineRequest{Model: path, Prompt: "Once upon a time", IgnoreEOG: true}) {
		if err != nil {
			fmt.Println(err)
			return
		}
		if d.Text != "" {
			if pieces++; pieces == 3 {
				break
			}
		}
	}
	fmt.Println("stopped after", pieces, "pieces; close:", e.Close())
	// Output:
	// stopped after 3 pieces; close: <nil>
}
