package main

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/pipeline"
	"github.com/forge-llm/forge/pipeline/chat"
)

// tokenCount is /tokenize's count of text (special tokens parsed).
func (ts *testServer) tokenCount(t *testing.T, model, text string, addSpecial bool) int {
	t.Helper()
	var tk struct{ Tokens []int32 }
	if st := ts.postJSON(t, "/tokenize", map[string]any{"model": model, "content": text, "add_special": addSpecial}, &tk); st != 200 {
		t.Fatalf("tokenize: %d", st)
	}
	return len(tk.Tokens)
}

type chatAnswer struct {
	Choices []struct {
		Message struct{ Content string }
	}
	Usage usage
	Error *struct{ Message string }
}

// A model without a chat template (the bundled stories260K) answers a
// chat request with ChatML: the prompt has the tokens of the ChatML
// rendering, and greedy decoding gives what a completion of that very
// text gives.
func TestServeDefaultChatTemplate(t *testing.T) {
	leakCheck(t)
	path := testmodels.Path(t, "stories260K-F32.gguf")
	ts := startServer(t, serveConfig{models: []modelArg{{id: "s", name: path}}})
	msgs := []map[string]string{{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Once upon a time"}}
	var a chatAnswer
	if st := ts.postJSON(t, "/v1/chat/completions", map[string]any{"model": "s", "messages": msgs, "temperature": 0, "max_tokens": 12}, &a); st != 200 {
		t.Fatalf("chat: status %d %+v", st, a.Error)
	}
	chatml := "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nOnce upon a time<|im_end|>\n<|im_start|>assistant\n"
	if want := ts.tokenCount(t, "s", chatml, true); a.Usage.PromptTokens != want {
		t.Errorf("prompt tokens %d, want %d (ChatML's)", a.Usage.PromptTokens, want)
	}
	var c struct {
		Choices []struct{ Text string }
		Usage   usage
	}
	if st := ts.postJSON(t, "/v1/completions", map[string]any{"model": "s", "prompt": chatml, "temperature": 0, "max_tokens": 12}, &c); st != 200 {
		t.Fatalf("completion: status %d", st)
	}
	if c.Usage.PromptTokens != a.Usage.PromptTokens || c.Choices[0].Text != a.Choices[0].Message.Content {
		t.Errorf("chat %d tokens %q; completion of the ChatML text %d tokens %q", a.Usage.PromptTokens, a.Choices[0].Message.Content, c.Usage.PromptTokens, c.Choices[0].Text)
	}
}

// --chat-template overrides every model's template, by family name or
// by a file holding a template text.
func TestServeChatTemplateFlag(t *testing.T) {
	leakCheck(t)
	path := testmodels.Path(t, "stories260K-F32.gguf")
	file := filepath.Join(t.TempDir(), "llama2.jinja")
	if err := os.WriteFile(file, []byte(llama2Template), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, arg := range []string{"llama2", file} {
		t.Run(filepath.Base(arg), func(t *testing.T) {
			ts := startServer(t, serveConfig{models: []modelArg{{id: "s", name: path}}, chatTemplate: arg})
			var a chatAnswer
			body := map[string]any{"model": "s", "messages": []map[string]string{{"role": "user", "content": "Hello there"}}, "temperature": 0, "max_tokens": 4}
			if st := ts.postJSON(t, "/v1/chat/completions", body, &a); st != 200 {
				t.Fatalf("chat: status %d %+v", st, a.Error)
			}
			// Llama 2: BOS (the template's <s>, parsed as the token), then the turn.
			if want := ts.tokenCount(t, "s", "<s>[INST] Hello there [/INST]", false); a.Usage.PromptTokens != want {
				t.Errorf("prompt tokens %d, want %d (Llama 2's)", a.Usage.PromptTokens, want)
			}
		})
	}
	if _, err := loadChatTemplate("no-such-family-or-file"); err == nil {
		t.Error("--chat-template of an unknown name: no error")
	}
	bad := filepath.Join(t.TempDir(), "bad.jinja")
	os.WriteFile(bad, []byte("{% if messages %}unclosed"), 0o644)
	if _, err := loadChatTemplate(bad); err == nil || !strings.Contains(err.Error(), "unsupported") {
		t.Errorf("--chat-template of a template that does not compile: %v", err)
	}
	for _, f := range []chat.Family{chat.ChatML, chat.Llama2, chat.Llama3, chat.Mistral} {
		if tm, err := loadChatTemplate(string(f)); err != nil || tm.Family != f {
			t.Errorf("--chat-template %s: %v %v", f, tm, err)
		}
	}
}

// The ChatML fallback is logged once per model, not once per request.
func TestServeChatTemplateWarnOnce(t *testing.T) {
	leakCheck(t)
	var buf syncBuffer
	eng := pipeline.NewEngine(pipeline.EngineOptions{Open: pipeline.Options{Threads: 1}, Logger: slog.New(slog.DiscardHandler)})
	defer eng.Close()
	if err := eng.Add("s", testmodels.Path(t, "stories260K-F32.gguf")); err != nil {
		t.Fatal(err)
	}
	s := newServer(eng, slog.New(slog.NewTextHandler(&buf, nil)), 0)
	for range 3 {
		tm, err := s.chatTemplate(t.Context(), "s")
		if err != nil || tm.Family != chat.ChatML {
			t.Fatalf("template %v, %v; want ChatML", tm, err)
		}
	}
	if n := strings.Count(buf.String(), "no usable chat template"); n != 1 {
		t.Errorf("%d warnings, want 1:\n%s", n, buf.String())
	}
}

// The flag reaches serve: an unusable --chat-template stops it at start
// with the reason, before it serves anything.
func TestServeChatTemplateFlagCommand(t *testing.T) {
	leakCheck(t)
	var stdout, stderr syncBuffer
	err := newApp(&stdout, &stderr).RunContext(t.Context(), []string{"forge", "serve", "--addr", "127.0.0.1:0", "--threads", "1",
		"-m", "s=" + testmodels.Path(t, "stories260K-F32.gguf"), "--chat-template", "vicuna-nonesuch"})
	if err == nil || !strings.Contains(err.Error(), "--chat-template") {
		t.Errorf("serve with an unknown --chat-template: %v", err)
	}
}
