package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/forge-llm/forge/pipeline"
)

// readPrompt is forge run's prompt: -p TEXT, -f FILE, "-" for either
// meaning stdin, or stdin itself when neither flag is given and stdin is
// not a terminal (echo text | forge run MODEL). One trailing newline of a
// file or of stdin is dropped: it is the end of the line, not part of
// the prompt.
func readPrompt(c *cli.Context) (string, error) {
	p, f := c.IsSet("prompt"), c.IsSet("file")
	switch {
	case p && f:
		return "", usageErrorf("run: -p and -f both given: give the prompt one way")
	case f && c.String("file") != "-":
		name := c.String("file")
		b, err := os.ReadFile(name)
		if err != nil {
			return "", fmt.Errorf("run: prompt file: %w", err)
		}
		return trimNewline(string(b)), nil
	case p && c.String("prompt") != "-":
		return c.String("prompt"), nil
	case !p && !f && (c.App.Reader == nil || isReaderTerminal(c.App.Reader)):
		return "", nil // a person at a terminal, no prompt: generate from nothing
	}
	if c.App.Reader == nil {
		return "", fmt.Errorf("run: prompt from stdin: no stdin")
	}
	b, err := io.ReadAll(c.App.Reader)
	if err != nil {
		return "", fmt.Errorf("run: prompt from stdin: %w", err)
	}
	return trimNewline(string(b)), nil
}

func trimNewline(s string) string {
	if t, ok := strings.CutSuffix(s, "\n"); ok {
		return strings.TrimSuffix(t, "\r")
	}
	return s
}

// runResult is forge run --json's one object on stdout: the generated
// text and ids, and the figures of the statistics line.
type runResult struct {
	Model        string  `json:"model"`
	Text         string  `json:"text"`
	Tokens       []int32 `json:"tokens"`
	PromptTokens int     `json:"prompt_tokens"`
	Stop         string  `json:"stop"`
	ReadyMS      float64 `json:"ready_ms"`
	FirstTokenMS float64 `json:"first_token_ms"`
	PromptTokS   float64 `json:"prompt_tok_s"`
	DecodeTokens int     `json:"decode_tokens"`
	DecodeTokS   float64 `json:"decode_tok_s"`
}

func writeRunJSON(w io.Writer, model string, res pipeline.Result, stop string, st *stats) error {
	r := runResult{Model: model, Text: res.Text, Tokens: res.Tokens, PromptTokens: res.PromptTokens, Stop: stop,
		ReadyMS: ms(st.ready), FirstTokenMS: ms(st.firstToken), PromptTokS: round1(st.promptRate()),
		DecodeTokens: max(st.tokens-1, 0), DecodeTokS: round1(st.decodeRate())}
	if r.Tokens == nil {
		r.Tokens = []int32{}
	}
	if r.PromptTokens == 0 {
		r.PromptTokens = st.promptTokens
	}
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("run: writing the JSON result: %w", err)
	}
	return nil
}
