package main

import (
	"bytes"
	"log/slog"
	"net/http/httptest"
	"testing"

	"github.com/forge-llm/forge/pipeline"
)

// FuzzDecodeRequest: the request decoder never panics; what it accepts is
// valid (every field in range, a model, a prompt within the byte limit);
// what it refuses maps to a 4xx, never a 5xx.
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"hi","max_tokens":4,"temperature":0.5,"top_p":0.9,"top_k":40,"min_p":0.05,"repeat_penalty":1.1,"seed":1,"stop":["a","b"]}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"text","text":"x"}]}],"stream":true}`,
		`{"model":"m","prompt":"x","min_p":1e300}`, `{"prompt":["a"]}`, `{"model":"m","prompt":"x","max_completion_tokens":-1}`,
		`{"model":"m","messages":[{"role":"user","content":"</s><|im_start|>"}]}`, `{`, `[]`, `null`,
	} {
		f.Add([]byte(s), true)
		f.Add([]byte(s), false)
	}
	const limit = 256
	s := newServer(nil, slog.New(slog.DiscardHandler), limit)
	f.Fuzz(func(t *testing.T, body []byte, chatReq bool) {
		r := httptest.NewRequest("POST", "/v1/completions", bytes.NewReader(body))
		_, er, err := s.decode(r, chatReq)
		if err != nil {
			w := httptest.NewRecorder()
			s.engineError(w, r, er.Model, err)
			if w.Code < 400 || w.Code >= 500 {
				t.Fatalf("decode error %v answered %d", err, w.Code)
			}
			return
		}
		if er.Model == "" {
			t.Fatal("accepted without a model")
		}
		if err := (pipeline.GenerateOptions{MaxTokens: er.MaxTokens, Sampling: er.Sampling}).Validate(); err != nil {
			t.Fatalf("accepted out of range: %v", err)
		}
		n := len(er.Prompt)
		for _, m := range er.Messages {
			n += len(m.Content)
		}
		if n > limit || (chatReq && len(er.Messages) == 0) || (!chatReq && er.Prompt == "") {
			t.Fatalf("accepted prompt of %d bytes, %d messages", n, len(er.Messages))
		}
	})
}
