package pipeline

import (
	"context"
	"fmt"

	"github.com/forge-llm/forge/pipeline/chat"
)

// ContextLengthError is a prompt with more tokens than the model's context
// holds; nothing was queued or computed for it. It matches
// ErrContextLength with errors.Is, and errors.As gives the counts (an
// agent trims its history by Prompt - Context tokens and more).
type ContextLengthError struct {
	Prompt  int // the prompt's tokens
	Context int // the positions the context holds
}

func (e *ContextLengthError) Error() string {
	return fmt.Sprintf("%v: %d prompt tokens, the context holds %d", ErrContextLength, e.Prompt, e.Context)
}

// Is makes errors.Is(err, ErrContextLength) hold.
func (e *ContextLengthError) Is(target error) bool { return target == ErrContextLength }

// CountTokens is the number of tokens a request's prompt has, tokenized
// exactly as Generate would (a conversation through the chat template,
// with the tools it offers), and the context the model holds: an agent
// checks a turn fits before sending it. The model is loaded if it is not.
func (e *Engine) CountTokens(ctx context.Context, r EngineRequest) (prompt, contextLen int, err error) {
	lease, err := e.Acquire(ctx, r.Model)
	if err != nil {
		return 0, 0, err
	}
	defer lease.Release()
	m := lease.Model()
	var ids []int32
	if r.Messages != nil {
		var tools []chat.Tool
		if tools, err = offeredTools(&r); err != nil {
			return 0, 0, err
		}
		ids, _, err = chatPromptTools(ctx, m, r.Messages, r.Template, tools)
	} else {
		ids, err = textPrompt(ctx, m, r.Prompt)
	}
	if err != nil {
		return 0, 0, err
	}
	return len(ids), ctxPositions(m.Config(), e.o.Open), nil
}
