package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/forge-llm/forge/pipeline/chat"
)

// defaultTemplate is what a model without a usable chat template gets, as
// llama-server does: ChatML, whose markers are plain text to a vocabulary
// without them, so any model can at least be talked to.
var defaultTemplate = &chat.Template{Family: chat.ChatML}

// loadChatTemplate reads --chat-template: a family pipeline/chat renders
// in Go (chatml, llama2, llama3, mistral), or a file holding any Jinja
// chat template.
func loadChatTemplate(arg string) (*chat.Template, error) {
	switch f := chat.Family(arg); f {
	case chat.ChatML, chat.Llama2, chat.Llama3, chat.Mistral:
		return &chat.Template{Family: f}, nil
	}
	b, err := os.ReadFile(arg)
	if err != nil {
		return nil, fmt.Errorf("--chat-template %q: not chatml, llama2, llama3 or mistral, and not a readable file: %w", arg, err)
	}
	t, err := chat.Parse(string(b))
	if err != nil {
		return nil, fmt.Errorf("--chat-template %q: %w", arg, err)
	}
	return t, nil
}

// chatTemplate chooses a chat request's template: --chat-template when
// given, else the model's own, else ChatML with a warning logged once per
// model. It loads the model (the request would anyway), so an unknown
// model is the usual error.
func (s *server) chatTemplate(ctx context.Context, model string) (*chat.Template, error) {
	if t, ok := s.modelTemplates[model]; ok {
		return t, nil
	}
	if s.template != nil {
		return s.template, nil
	}
	lease, err := s.eng.Acquire(ctx, model)
	if err != nil {
		return nil, err
	}
	src := lease.Model().ChatTemplate()
	lease.Release()
	t, err := chat.Parse(src)
	if err == nil {
		return t, nil
	}
	if !errors.Is(err, chat.ErrNoTemplate) && !errors.Is(err, chat.ErrUnsupported) {
		return nil, err
	}
	if _, warned := s.templateWarned.LoadOrStore(model, true); !warned {
		s.log.Warn("model has no usable chat template: using ChatML (see --chat-template)", "model", model, "reason", err)
	}
	return defaultTemplate, nil
}
