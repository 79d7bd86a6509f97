package servebench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"
)

// request is one streaming completion to send.
type request struct {
	model     string
	prompt    string
	maxTokens int
}

// outcome is what one streamed completion gave: times from the moment
// the request was sent.
type outcome struct {
	status int
	// ttft is the arrival of the first chunk that carries text; 0 when
	// none did.
	ttft  time.Duration
	total time.Duration
	// gaps are the times between consecutive chunks that carry text.
	gaps   []time.Duration
	chunks int
	text   string
	// usage is the server's count, when it sent one.
	usage *usage
	err   error
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

// chunk is the part of a streamed completion chunk (or an error object)
// that the benchmark reads. Completions carry text; a chat server would
// carry delta.content, read too so a chat-only proxy still counts.
type chunk struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *usage          `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// body is the request as every target receives it: greedy, the end of
// text ignored so every answer runs to maxTokens, streamed with usage.
func (r request) body() ([]byte, error) {
	m := map[string]any{
		"prompt":         r.prompt,
		"max_tokens":     r.maxTokens,
		"temperature":    0,
		"ignore_eos":     true,
		"stream":         true,
		"stream_options": map[string]bool{"include_usage": true},
	}
	if r.model != "" {
		m["model"] = r.model
	}
	return json.Marshal(m)
}

// errorText is at most 300 bytes of an error body, on one line.
func errorText(b []byte) string {
	s := strings.Join(strings.Fields(string(b)), " ")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

var requestSeq atomic.Uint64

// complete sends one streaming POST /v1/completions to base and reads the
// server-sent events to the end. Any HTTP status but 200, an error event,
// a read error or a stream that ends without "data: [DONE]" is an error
// in the outcome (with the times measured so far).
func complete(ctx context.Context, hc *http.Client, base string, r request) outcome {
	b, err := r.body()
	if err != nil {
		return outcome{err: err}
	}
	return stream(ctx, hc, base+"/v1/completions", b, "data: [DONE]", func(field, value string, o *outcome) (string, bool, error) {
		switch field {
		case "data":
		case "error": // some servers name the event instead of the object
			return "", false, fmt.Errorf("error event: %s", errorText([]byte(value)))
		default: // event:, id:, retry:
			return "", false, nil
		}
		if value == "[DONE]" {
			return "", true, nil
		}
		var c chunk
		if err := json.Unmarshal([]byte(value), &c); err != nil {
			return "", false, fmt.Errorf("bad chunk %q: %w", errorText([]byte(value)), err)
		}
		if len(c.Error) > 0 && string(c.Error) != "null" {
			return "", false, fmt.Errorf("error in the stream: %s", errorText(c.Error))
		}
		if c.Usage != nil {
			o.usage = c.Usage
		}
		piece := ""
		for _, ch := range c.Choices {
			piece += ch.Text + ch.Delta.Content
		}
		return piece, false, nil
	})
}

// stream POSTs body to url and reads the server-sent events of the
// answer, handing each event's field and value to event, which returns
// the text the event carries (timed as a chunk: the first one's arrival
// is the time to first token, the others' gaps the inter-token latency)
// and whether the stream ended there. An HTTP status but 200, an error
// from event, a read error or a stream that ends before event says so is
// an error in the outcome (named by end, the end the stream lacked), with
// the times measured so far.
func stream(ctx context.Context, hc *http.Client, url string, body []byte, end string,
	event func(field, value string, o *outcome) (piece string, done bool, err error)) outcome {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return outcome{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	// llama-server (cpp-httplib) closes kept-alive connections on its own
	// schedule; a POST that raced such a close fails with "server closed
	// idle connection" or EOF before any byte of an answer. The key lets
	// net/http resend it on a fresh connection in exactly that case (a
	// reused connection, nothing read), which the server never saw; the
	// time of the lost try stays in the request's figures.
	req.Header.Set("X-Idempotency-Key", fmt.Sprintf("forge-bench-%d", requestSeq.Add(1)))
	start := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return outcome{err: err, total: time.Since(start)}
	}
	defer resp.Body.Close()
	o := outcome{status: resp.StatusCode}
	if resp.StatusCode != http.StatusOK {
		eb, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		o.total = time.Since(start)
		o.err = fmt.Errorf("HTTP %d: %s", resp.StatusCode, errorText(eb))
		return o
	}
	var text strings.Builder
	var last time.Time
	rd := bufio.NewReaderSize(resp.Body, 64<<10)
	for {
		line, err := rd.ReadString('\n')
		now := time.Now()
		if err != nil {
			o.total, o.text = now.Sub(start), text.String()
			if errors.Is(err, io.EOF) {
				o.err = fmt.Errorf("stream ended without %s", end)
			} else {
				o.err = fmt.Errorf("reading the stream: %w", err)
			}
			return o
		}
		field, value, ok := strings.Cut(strings.TrimRight(line, "\r\n"), ":")
		if !ok || field == "" { // blank line between events, or a comment
			continue
		}
		piece, done, err := event(field, strings.TrimPrefix(value, " "), &o)
		if err != nil {
			o.err = err
			break
		}
		if piece != "" {
			text.WriteString(piece)
			o.chunks++
			if o.chunks == 1 {
				o.ttft = now.Sub(start)
			} else {
				o.gaps = append(o.gaps, now.Sub(last))
			}
			last = now
		}
		if done {
			break
		}
	}
	o.total, o.text = time.Since(start), text.String()
	return o
}

// getJSON fetches base+path into v; the status is returned with any error.
func getJSON(ctx context.Context, hc *http.Client, url string, v any) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return resp.StatusCode, fmt.Errorf("GET %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, fmt.Errorf("GET %s: HTTP %d: %s", url, resp.StatusCode, errorText(b))
	}
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			return resp.StatusCode, fmt.Errorf("GET %s: %w", url, err)
		}
	}
	return resp.StatusCode, nil
}

// TokenCounter counts tokens through a server's POST /tokenize
// (llama-server's: {"content": TEXT} → {"tokens": [...]}), for Calibrate.
func TokenCounter(ctx context.Context, hc *http.Client, base string) func(string) (int, error) {
	return func(text string) (int, error) {
		b, _ := json.Marshal(map[string]any{"content": text, "add_special": false})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/tokenize", bytes.NewReader(b))
		if err != nil {
			return 0, err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		rb, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
		if err != nil {
			return 0, err
		}
		if resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("POST %s/tokenize: HTTP %d: %s", base, resp.StatusCode, errorText(rb))
		}
		var out struct {
			Tokens []json.RawMessage `json:"tokens"`
		}
		if err := json.Unmarshal(rb, &out); err != nil {
			return 0, fmt.Errorf("POST %s/tokenize: %w", base, err)
		}
		return len(out.Tokens), nil
	}
}

// llamaChunk is one event of llama-server's own streaming /completion.
type llamaChunk struct {
	Content         string          `json:"content"`
	Stop            bool            `json:"stop"`
	TokensPredicted int             `json:"tokens_predicted"`
	TokensEvaluated int             `json:"tokens_evaluated"`
	Error           json.RawMessage `json:"error"`
}

// completeLlama is complete through llama-server's native API: POST
// /completion with n_predict, events of {"content", "stop"} until one
// with stop true (which carries the token counts), no [DONE].
func completeLlama(ctx context.Context, hc *http.Client, base string, r request) outcome {
	b, err := json.Marshal(map[string]any{"prompt": r.prompt, "n_predict": r.maxTokens, "temperature": 0,
		"ignore_eos": true, "stream": true, "cache_prompt": true})
	if err != nil {
		return outcome{err: err}
	}
	return stream(ctx, hc, base+"/completion", b, "a stop event", func(field, value string, o *outcome) (string, bool, error) {
		if field != "data" {
			return "", false, nil
		}
		var c llamaChunk
		if err := json.Unmarshal([]byte(value), &c); err != nil {
			return "", false, fmt.Errorf("bad chunk %q: %w", errorText([]byte(value)), err)
		}
		if len(c.Error) > 0 && string(c.Error) != "null" {
			return "", false, fmt.Errorf("error in the stream: %s", errorText(c.Error))
		}
		if c.Stop {
			o.usage = &usage{PromptTokens: c.TokensEvaluated, CompletionTokens: c.TokensPredicted}
		}
		return c.Content, c.Stop, nil
	})
}
