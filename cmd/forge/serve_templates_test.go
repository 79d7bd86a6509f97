package main

import (
	"testing"

	"github.com/forge-llm/forge/gguf/testmodels"
)

// TestServeChatTemplatePerModel: --chat-template ID=NAME sets one model's
// template, a value without an id the others'; two for one model, or two
// for every model, are usage errors.
func TestServeChatTemplatePerModel(t *testing.T) {
	path := testmodels.Path(t, "stories260K-F32.gguf")
	models := []modelArg{{id: "a", name: path}, {id: "b", name: path}, {id: "c", name: path}}
	all, per, err := splitTemplates([]string{"a=llama2", "chatml", "b=llama3"}, models)
	if err != nil || all != "chatml" || len(per) != 2 || per["a"] != "llama2" || per["b"] != "llama3" {
		t.Fatalf("split: %q %v %v", all, per, err)
	}
	for _, bad := range [][]string{{"a=llama2", "a=chatml"}, {"chatml", "llama3"}, {"a="}} {
		if _, _, err := splitTemplates(bad, models); exitCode(err) != 2 {
			t.Errorf("%q: %v, want a usage error", bad, err)
		}
	}
	// A value whose prefix is no model's id is a file name for all.
	if all, per, err := splitTemplates([]string{"x=y.jinja"}, models); err != nil || all != "x=y.jinja" || per != nil {
		t.Errorf("x=y.jinja: %q %v %v", all, per, err)
	}

	ts := startServer(t, serveConfig{models: models, chatTemplate: "chatml", modelTemplates: map[string]string{"a": "llama2"}})
	tokens := func(model string) int {
		var a chatAnswer
		body := map[string]any{"model": model, "messages": []map[string]string{{"role": "user", "content": "Hello there"}}, "temperature": 0, "max_tokens": 2}
		if st := ts.postJSON(t, "/v1/chat/completions", body, &a); st != 200 {
			t.Fatalf("%s: status %d %+v", model, st, a.Error)
		}
		return a.Usage.PromptTokens
	}
	if got, want := tokens("a"), ts.tokenCount(t, "a", "<s>[INST] Hello there [/INST]", false); got != want {
		t.Errorf("model a: %d prompt tokens, want %d (Llama 2's)", got, want)
	}
	if got, want := tokens("b"), ts.tokenCount(t, "b", "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n", true); got != want {
		t.Errorf("model b: %d prompt tokens, want %d (ChatML's)", got, want)
	}
}
