package pipeline

import (
	"fmt"

	"github.com/forge-llm/forge/pipeline/chat"
)

// ErrToolChoice is wrapped when a request's tool_choice names no tool it
// offers, or asks for a call with no tools.
var ErrToolChoice = fmt.Errorf("pipeline: invalid tool choice")

// The tool choices besides a function's name.
const (
	ToolChoiceAuto     = "auto"
	ToolChoiceNone     = "none"
	ToolChoiceRequired = "required"
)

// offeredTools is what the template renders for a request: its tools, none
// for ToolChoice "none", only the named one for a named choice.
func offeredTools(r *EngineRequest) ([]chat.Tool, error) {
	switch r.ToolChoice {
	case "", ToolChoiceAuto:
		return r.Tools, nil
	case ToolChoiceNone:
		return nil, nil
	case ToolChoiceRequired:
		if len(r.Tools) == 0 {
			return nil, fmt.Errorf("%w: %q with no tools", ErrToolChoice, r.ToolChoice)
		}
		return r.Tools, nil
	}
	for _, t := range r.Tools {
		if t.Function.Name == r.ToolChoice {
			return []chat.Tool{t}, nil
		}
	}
	return nil, fmt.Errorf("%w: %q is not among the tools", ErrToolChoice, r.ToolChoice)
}

// toolCallIDs gives each call an id ("call_<request>_<n>"), as OpenAI's
// tool messages answer calls by id.
func toolCallIDs(reqID string, calls []chat.ToolCall) {
	for i := range calls {
		if calls[i].ID == "" {
			calls[i].ID = fmt.Sprintf("call_%s_%d", reqID, i)
		}
		if calls[i].Type == "" {
			calls[i].Type = "function"
		}
	}
}
