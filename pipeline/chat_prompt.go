package pipeline

import (
	"context"

	"github.com/forge-llm/forge/pipeline/chat"
)

// ChatPrompt renders a conversation with tmpl (nil: the model's own
// tokenizer.chat_template), ending with the opening of an assistant turn,
// and tokenizes it as the Engine does: special tokens are read in the
// template's text only, never in the messages, and BOS comes from the
// template or the vocabulary. The ids go to Generate as PromptIDs; an
// interactive chat calls it each turn with the whole history.
func (m *Model) ChatPrompt(ctx context.Context, msgs []chat.Message, tmpl *chat.Template) ([]int32, error) {
	return chatPrompt(ctx, m, msgs, tmpl)
}
