package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/forge-llm/forge/pipeline"
	"github.com/forge-llm/forge/pipeline/chat"
	"github.com/forge-llm/forge/pipeline/sample"
)

// server is the HTTP API over an engine: OpenAI's chat completions,
// completions and models endpoints, plus forge's load progress and
// status. Plain net/http routing (Go 1.22 patterns).
type server struct {
	eng *pipeline.Engine
	log *slog.Logger
	// defaultModel serves requests that name no model (the first -m).
	defaultModel string
	// pinned are the -m ids: a failed one makes /health "degraded".
	pinned map[string]bool
	// maxPrompt bounds a prompt's bytes (a chat's: all contents), checked
	// before tokenizing; maxBody bounds a request body.
	maxPrompt, maxBody int64
	// writeTimeout is each write's deadline.
	writeTimeout time.Duration
	// inflight counts running handlers, for shutdown to let them answer.
	inflight sync.WaitGroup
	nextID   atomic.Uint64
	// met counts requests and tokens for GET /metrics.
	met *metrics
	// template is --chat-template (nil: each model's own, else ChatML);
	// templateWarned holds the models already warned about.
	template       *chat.Template
	modelTemplates map[string]*chat.Template // --chat-template ID=…, before template
	templateWarned sync.Map
}

// DefaultMaxPrompt is --max-prompt-bytes' default.
const DefaultMaxPrompt = 1 << 20

func newServer(eng *pipeline.Engine, log *slog.Logger, maxPrompt int64) *server {
	if maxPrompt <= 0 {
		maxPrompt = DefaultMaxPrompt
	}
	// JSON escapes can double a text (more for control characters);
	// the rest of a request is small.
	return &server{eng: eng, log: log, pinned: map[string]bool{}, maxPrompt: maxPrompt, maxBody: 2*maxPrompt + 64<<10, met: newMetrics()}
}

func (s *server) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", s.health)
	mux.HandleFunc("GET /v1/models", s.listModels)
	mux.HandleFunc("GET /v1/models/{id...}", s.getModel)
	mux.HandleFunc("POST /v1/completions", s.completions)
	mux.HandleFunc("POST /v1/chat/completions", s.chatCompletions)
	mux.HandleFunc("GET /forge/status", s.status)
	mux.HandleFunc("POST /forge/load", s.load)
	mux.HandleFunc("POST /tokenize", s.tokenize)
	mux.HandleFunc("POST /detokenize", s.detokenize)
	mux.HandleFunc("GET /metrics", s.metricsHandler)
	s.ollamaRoutes(mux)
	s.embedRoutes(mux) // serve_embed.go
	// Known paths with another method get a JSON 405 (a pattern with a
	// method is more specific than the same path without one).
	for _, p := range append([]string{"/health", "/v1/models", "/v1/completions", "/v1/chat/completions", "/forge/status", "/forge/load", "/tokenize", "/detokenize", "/metrics"}, ollamaPaths...) {
		mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
			writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", fmt.Sprintf("%s does not take %s", r.URL.Path, r.Method))
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path))
	})
	return mux
}

// apiError is OpenAI's error body.
type apiError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    string  `json:"code,omitempty"`
	} `json:"error"`
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	var e apiError
	e.Error.Message, e.Error.Code = msg, code
	e.Error.Type = "invalid_request_error"
	if status >= 500 {
		e.Error.Type = "server_error"
	}
	writeJSON(w, status, e)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	b = append(b, '\n')
	// A length, not chunks: counted flushes each answer before shutdown
	// may close its connection, and a chunked answer's last chunk is only
	// written after that, when net/http finishes the request, so a client
	// could read a 503 cut short (TestServeShutdownQueued, seen once in CI).
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	w.Write(b)
}

// engineError maps an error to an HTTP status and code (the README's
// table). Messages never carry file contents or host paths: a model that
// is unknown, not allowed or unreadable is the same 404, whose message is
// the name the client sent.
func (s *server) engineError(w http.ResponseWriter, r *http.Request, model string, err error) {
	var fe *sample.FieldError
	var mb *http.MaxBytesError
	switch {
	case errors.Is(err, pipeline.ErrEngineClosed):
		writeError(w, http.StatusServiceUnavailable, "shutting_down", "the server is shutting down")
	case errors.Is(err, pipeline.ErrUnknownModel), errors.Is(err, pipeline.ErrInvalidModel):
		s.log.Debug("model not found", "model", model, "err", err)
		if len(model) > 128 {
			model = model[:128] + "…"
		}
		writeError(w, http.StatusNotFound, "model_not_found", fmt.Sprintf("model %q not found", model))
	case errors.As(err, &fe):
		writeParamError(w, fe.Field, fe.Error())
	case errors.As(err, &mb):
		writeError(w, http.StatusRequestEntityTooLarge, "request_too_large", fmt.Sprintf("request body over %d bytes", mb.Limit))
	case errors.Is(err, errPromptTooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, "prompt_too_large", err.Error())
	case errors.Is(err, pipeline.ErrContextLength):
		writeError(w, http.StatusBadRequest, "context_length_exceeded", err.Error())
	case errors.Is(err, chat.ErrNoTemplate), errors.Is(err, chat.ErrUnsupported), errors.Is(err, chat.ErrConversation), errors.Is(err, errBadRequest), errors.Is(err, pipeline.ErrToolChoice):
		writeError(w, http.StatusBadRequest, "invalid_request", err.Error())
	case errors.As(err, new(*pipeline.ModelFailedError)):
		// The model's file changed under its mapping: it was unloaded and
		// the next request loads it again. The message names no path.
		var mf *pipeline.ModelFailedError
		errors.As(err, &mf)
		writeError(w, http.StatusServiceUnavailable, "model_failed", mf.Error())
	case errors.Is(err, pipeline.ErrBudget):
		writeError(w, http.StatusServiceUnavailable, "insufficient_memory", redactPaths(err.Error()))
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		writeError(w, 499, "cancelled", "the request was cancelled")
	default:
		s.log.Error("request failed", "path", r.URL.Path, "model", model, "err", err)
		writeError(w, http.StatusInternalServerError, "internal_error", redactPaths(err.Error()))
	}
}

// writeParamError is a 400 naming the request field at fault.
func writeParamError(w http.ResponseWriter, field, msg string) {
	var e apiError
	e.Error.Message, e.Error.Code, e.Error.Type, e.Error.Param = msg, "invalid_value", "invalid_request_error", &field
	writeJSON(w, http.StatusBadRequest, e)
}

// maxPrompts bounds a completion's array of prompts: each is a
// generation of its own.
const maxPrompts = 16

var (
	errBadRequest     = errors.New("bad request")
	errPromptTooLarge = errors.New("prompt too large")
)

func badRequest(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errBadRequest, fmt.Sprintf(format, args...))
}

// health is 200 while the server answers: "ok", or "degraded" with the
// ids of the -m models that failed (a model a client named that fails does
// not make the server unhealthy).
func (s *server) health(w http.ResponseWriter, r *http.Request) {
	all := s.eng.Status()
	status, failed := "ok", []string{}
	for _, st := range all {
		if st.State == pipeline.StateFailed && s.pinned[st.ID] {
			status = "degraded"
			failed = append(failed, st.ID)
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": status, "failed": failed, "models": len(all), "memory_bytes": s.eng.InUse()})
}

// modelObject is OpenAI's model object, with forge's status beside it.
type modelObject struct {
	ID      string               `json:"id"`
	Object  string               `json:"object"`
	Created int64                `json:"created"`
	OwnedBy string               `json:"owned_by"`
	Forge   pipeline.ModelStatus `json:"forge"`
}

func toModelObject(st pipeline.ModelStatus) modelObject {
	created := st.LastUsed.Unix()
	if st.LastUsed.IsZero() {
		created = 0
	}
	return modelObject{ID: st.ID, Object: "model", Created: created, OwnedBy: "forge", Forge: publicStatus(st)}
}

func (s *server) listModels(w http.ResponseWriter, r *http.Request) {
	data := []modelObject{}
	for _, st := range s.eng.Status() {
		data = append(data, toModelObject(st))
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

func (s *server) getModel(w http.ResponseWriter, r *http.Request) {
	st, ok := s.eng.StatusOf(r.PathValue("id"))
	if !ok {
		writeError(w, http.StatusNotFound, "model_not_found", fmt.Sprintf("model %q is not known", r.PathValue("id")))
		return
	}
	writeJSON(w, http.StatusOK, toModelObject(st))
}

func (s *server) status(w http.ResponseWriter, r *http.Request) {
	all := s.eng.Status()
	for i := range all {
		all[i] = publicStatus(all[i])
	}
	writeJSON(w, http.StatusOK, map[string]any{"models": all, "memory_bytes": s.eng.InUse()})
}

// load loads a model and streams its progress as server-sent events: one
// "progress" event per pipeline event (pipeline.EventJSON), then a
// "status" event when every weight is resident (or an "error" event).
func (s *server) load(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("model")
	var body struct {
		Model string `json:"model"`
	}
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 64<<10))
	if err := dec.Decode(&body); err != nil && err != io.EOF {
		s.engineError(w, r, id, badRequest("request body: %v", err))
		return
	}
	id = cmp(body.Model, id)
	if id == "" {
		writeError(w, http.StatusBadRequest, "invalid_request", `load: missing model ({"model":"ID"} or ?model=ID)`)
		return
	}
	lease, err := s.eng.Acquire(r.Context(), id)
	if err != nil {
		s.engineError(w, r, id, err)
		return
	}
	defer lease.Release()
	sub := lease.Model().Subscribe()
	defer sub.Close()
	sse := newSSE(w)
	for {
		select {
		case <-r.Context().Done():
			return
		case ev, ok := <-sub.C:
			if !ok {
				sse.event("error", map[string]string{"error": "model closed while loading"})
				return
			}
			b, err := pipeline.EventJSON(ev)
			if err != nil {
				continue
			}
			if !sse.raw("progress", []byte(redactPaths(string(b)))) {
				return
			}
			switch ev := ev.(type) {
			case pipeline.AllResident:
				st, _ := s.eng.StatusOf(id)
				sse.event("status", publicStatus(st))
				return
			case pipeline.ErrorEvent:
				if ev.Req == 0 {
					sse.event("error", map[string]string{"error": redactPaths(ev.Err.Error())})
					return
				}
			}
		}
	}
}

// sse writes server-sent events, flushing each.
type sse struct {
	w  http.ResponseWriter
	rc *http.ResponseController
	ok bool
}

func newSSE(w http.ResponseWriter) *sse {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	return &sse{w: w, rc: http.NewResponseController(w), ok: true}
}

// raw writes one event (name "" for a plain data event); false once the
// client is gone.
func (e *sse) raw(name string, data []byte) bool {
	if !e.ok {
		return false
	}
	var b bytes.Buffer
	if name != "" {
		b.WriteString("event: " + name + "\n")
	}
	b.WriteString("data: ")
	b.Write(data)
	b.WriteString("\n\n")
	if _, err := e.w.Write(b.Bytes()); err != nil {
		e.ok = false
		return false
	}
	if err := e.rc.Flush(); err != nil {
		e.ok = false
	}
	return e.ok
}

func (e *sse) event(name string, v any) bool {
	b, err := json.Marshal(v)
	if err != nil {
		return false
	}
	return e.raw(name, b)
}

// completionRequest is the union of the fields of OpenAI's completion and
// chat completion requests that forge reads; others are ignored.
type completionRequest struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            []chatMessage   `json:"messages"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	TopK                *int            `json:"top_k"`
	MinP                *float64        `json:"min_p"`
	RepeatPenalty       *float64        `json:"repeat_penalty"`
	Seed                *int64          `json:"seed"`
	Stop                json.RawMessage `json:"stop"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	N                *int     `json:"n"`
	IgnoreEOS        bool     `json:"ignore_eos"`
	PresencePenalty  *float64 `json:"presence_penalty"`
	FrequencyPenalty *float64 `json:"frequency_penalty"`
	// Logprobs is a bool on chat and an int on completions
	// (parseLogprobs).
	Logprobs    json.RawMessage `json:"logprobs"`
	TopLogprobs *int            `json:"top_logprobs"`
	// Tools and ToolChoice are OpenAI's (serve_tools.go).
	Tools      []chat.Tool     `json:"tools"`
	ToolChoice json.RawMessage `json:"tool_choice"`
	// Constrained output (serve_constrain.go).
	ResponseFormat json.RawMessage `json:"response_format"`
	Grammar        string          `json:"grammar"`
	JSONSchema     json.RawMessage `json:"json_schema"`

	// prompts are a completion's prompts (OpenAI takes an array, each
	// answered as its own choice); Prompt above is the first.
	prompts []string
	// logprobs says the answer carries log-probabilities.
	logprobs bool
}

// chatMessage takes content as a string or as an array of text parts.
type chatMessage struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	ToolCalls  []chat.ToolCall `json:"tool_calls"`
	ToolCallID string          `json:"tool_call_id"`
	Name       string          `json:"name"`
}

func (m chatMessage) text() (string, error) {
	if len(m.Content) == 0 && (m.Role == "assistant" && len(m.ToolCalls) > 0) {
		return "", nil // an assistant turn that only called tools
	}
	var s string
	if err := json.Unmarshal(m.Content, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(m.Content, &parts); err != nil {
		return "", badRequest("message content must be a string or an array of text parts")
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type != "text" {
			return "", badRequest("content part of type %q is not supported (text only)", p.Type)
		}
		b.WriteString(p.Text)
	}
	return b.String(), nil
}

// stringOrList reads a JSON string, or an array of strings.
func stringOrList(raw json.RawMessage, field string) ([]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return []string{s}, nil
	}
	var l []string
	if err := json.Unmarshal(raw, &l); err != nil {
		return nil, badRequest("%s must be a string or an array of strings", field)
	}
	return l, nil
}

// decode reads and checks a request; chat says which endpoint.
func (s *server) decode(r *http.Request, chatReq bool) (completionRequest, pipeline.EngineRequest, error) {
	var req completionRequest
	body := http.MaxBytesReader(nil, r.Body, s.maxBody)
	dec := json.NewDecoder(body)
	if err := dec.Decode(&req); err != nil {
		if mb := (*http.MaxBytesError)(nil); errors.As(err, &mb) {
			return req, pipeline.EngineRequest{}, err
		}
		return req, pipeline.EngineRequest{}, badRequest("request body: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return req, pipeline.EngineRequest{}, badRequest("request body: trailing data after the JSON object")
	}
	er := pipeline.EngineRequest{Model: cmp(req.Model, s.defaultModel), Sampling: sample.Defaults()}
	setModel(r, er.Model)
	if er.Model == "" {
		return req, er, badRequest("model is required")
	}
	if req.N != nil && *req.N != 1 {
		return req, er, badRequest("n must be 1")
	}
	if chatReq {
		if len(req.Messages) == 0 {
			return req, er, badRequest("messages must be a non-empty array")
		}
		var total int64
		for i, m := range req.Messages {
			text, err := m.text()
			if err != nil {
				return req, er, fmt.Errorf("messages[%d]: %w", i, err)
			}
			if m.Role != "system" && m.Role != "user" && m.Role != "assistant" && m.Role != "tool" {
				return req, er, badRequest("messages[%d].role %q is not system, user, assistant or tool", i, m.Role)
			}
			er.Messages = append(er.Messages, chat.Message{Role: m.Role, Content: text, ToolCalls: m.ToolCalls, ToolCallID: m.ToolCallID, Name: m.Name})
			if total += int64(len(text)); total > s.maxPrompt {
				return req, er, fmt.Errorf("%w: messages hold over %d bytes (--max-prompt-bytes)", errPromptTooLarge, s.maxPrompt)
			}
		}
		if err := checkTools(req.Tools); err != nil {
			return req, er, err
		}
		er.Tools = req.Tools
		choice, err := toolChoice(req.ToolChoice, req.Tools)
		if err != nil {
			return req, er, err
		}
		er.ToolChoice = choice
	} else {
		p, err := stringOrList(req.Prompt, "prompt")
		if err != nil {
			return req, er, err
		}
		if len(p) == 0 || len(p) > maxPrompts {
			return req, er, badRequest("prompt must be a non-empty string or an array of 1 to %d of them", maxPrompts)
		}
		var total int64
		for i, x := range p {
			if x == "" {
				return req, er, badRequest("prompt[%d] is empty", i)
			}
			if total += int64(len(x)); total > s.maxPrompt {
				return req, er, fmt.Errorf("%w: prompts of over %d bytes together (--max-prompt-bytes)", errPromptTooLarge, s.maxPrompt)
			}
		}
		if len(p) > 1 && req.Stream {
			return req, er, badRequest("stream with several prompts is not supported: send one prompt per request")
		}
		er.Prompt, req.prompts = p[0], p
	}
	mt := req.MaxTokens
	if req.MaxCompletionTokens != nil {
		mt = req.MaxCompletionTokens
	}
	if mt != nil {
		er.MaxTokens = *mt
	}
	// OpenAI's ranges, narrower than the sampler's (Validate, below).
	if t := req.Temperature; t != nil {
		if !(*t >= 0 && *t <= 2) {
			return req, er, &sample.FieldError{Field: "temperature", Value: *t, Reason: "must be a number in [0, 2]"}
		}
		er.Sampling.Temp = float32(*t)
	}
	if p := req.TopP; p != nil {
		if !(*p > 0 && *p <= 1) {
			return req, er, &sample.FieldError{Field: "top_p", Value: *p, Reason: "must be a number in (0, 1]"}
		}
		er.Sampling.TopP = float32(*p)
	}
	if k := req.TopK; k != nil {
		er.Sampling.TopK = *k
	}
	if p := req.MinP; p != nil {
		er.Sampling.MinP = float32(*p)
	}
	if p := req.RepeatPenalty; p != nil {
		er.Sampling.RepeatPenalty = float32(*p)
	}
	if p := req.PresencePenalty; p != nil {
		er.Sampling.PresencePenalty = float32(*p)
	}
	if p := req.FrequencyPenalty; p != nil {
		er.Sampling.FrequencyPenalty = float32(*p)
	}
	if req.Seed != nil {
		er.Sampling.Seed = uint64(*req.Seed)
	} else {
		er.Sampling.Seed = rand.Uint64()
	}
	stops, err := stringOrList(req.Stop, "stop")
	if err != nil {
		return req, er, err
	}
	if len(stops) > 4 {
		return req, er, badRequest("at most 4 stop strings")
	}
	er.Stop = stops
	er.IgnoreEOG = req.IgnoreEOS
	if req.logprobs, er.Sampling.TopLogprobs, err = parseLogprobs(req, chatReq); err != nil {
		return req, er, err
	}
	if er.Grammar, err = openAIGrammar(req.ResponseFormat, req.Grammar, req.JSONSchema); err != nil {
		return req, er, err
	}
	if err := checkConstrained(er.Grammar, er.IgnoreEOG); err != nil {
		return req, er, err
	}
	if err := (pipeline.GenerateOptions{MaxTokens: er.MaxTokens, Sampling: er.Sampling}).Validate(); err != nil {
		if mt != nil && req.MaxCompletionTokens != nil {
			var fe *sample.FieldError
			if errors.As(err, &fe) && fe.Field == "max_tokens" {
				fe.Field = "max_completion_tokens"
			}
		}
		return req, er, err
	}
	return req, er, nil
}

func (s *server) completions(w http.ResponseWriter, r *http.Request)     { s.complete(w, r, false) }
func (s *server) chatCompletions(w http.ResponseWriter, r *http.Request) { s.complete(w, r, true) }

// usage is OpenAI's token accounting; prompt_tokens_details.cached_tokens
// (left out when 0) counts the prompt tokens the prefix cache gave, as
// OpenAI reports its own prompt caching.
type usage struct {
	PromptTokens        int           `json:"prompt_tokens"`
	CompletionTokens    int           `json:"completion_tokens"`
	TotalTokens         int           `json:"total_tokens"`
	PromptTokensDetails promptDetails `json:"prompt_tokens_details,omitzero"`
}

type promptDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

func usageOf(res pipeline.EngineResult) *usage {
	return &usage{PromptTokens: res.PromptTokens, CompletionTokens: len(res.Tokens), TotalTokens: res.PromptTokens + len(res.Tokens),
		PromptTokensDetails: promptDetails{CachedTokens: res.CachedTokens}}
}

func (s *server) complete(w http.ResponseWriter, r *http.Request, chatReq bool) {
	req, er, err := s.decode(r, chatReq)
	if err != nil {
		s.engineError(w, r, er.Model, err)
		return
	}
	object, prefix := "text_completion", "cmpl-"
	if chatReq {
		object, prefix = "chat.completion", "chatcmpl-"
		if er.Template, err = s.chatTemplate(r.Context(), er.Model); err != nil {
			s.engineError(w, r, er.Model, err)
			return
		}
	}
	id := fmt.Sprintf("%s%d", prefix, s.nextID.Add(1))
	created := time.Now().Unix()
	if !req.Stream {
		results, cols, err := s.generateAll(r.Context(), er, req.prompts, req.logprobs)
		if err != nil {
			s.engineError(w, r, er.Model, err)
			return
		}
		choices := make([]any, len(results))
		var u usage
		for i, res := range results {
			choice := map[string]any{"index": i, "finish_reason": res.FinishReason}
			if chatReq {
				choice["message"] = assistantMessage(res)
			} else {
				choice["text"] = res.Text
			}
			choices[i] = choice
			ru := usageOf(res)
			u.PromptTokens += ru.PromptTokens
			u.CompletionTokens += ru.CompletionTokens
			u.TotalTokens += ru.TotalTokens
			u.PromptTokensDetails.CachedTokens += ru.PromptTokensDetails.CachedTokens
		}
		if req.logprobs {
			if err := s.addLogprobs(r, er.Model, chatReq, choices, results, cols); err != nil {
				s.engineError(w, r, er.Model, err)
				return
			}
		}
		writeJSON(w, http.StatusOK, map[string]any{
			"id": id, "object": object, "created": created, "model": er.Model,
			"choices": choices, "usage": &u,
		})
		return
	}
	s.stream(w, r, er, chatReq, id, object+chunkSuffix(chatReq), created, req.StreamOptions != nil && req.StreamOptions.IncludeUsage, req.logprobs)
}

// generateAll runs one generation per prompt (prompts nil: er as it
// is), together so that a batching model runs them in one batch, and
// returns the results in the prompts' order. The first error cancels the
// rest and is returned.
//
// With logprobs, each generation's sampler reports its picks to its own
// collector.
func (s *server) generateAll(ctx context.Context, er pipeline.EngineRequest, prompts []string, logprobs bool) ([]pipeline.EngineResult, []*logprobCollector, error) {
	n := max(len(prompts), 1)
	cols := make([]*logprobCollector, n)
	reqs := make([]pipeline.EngineRequest, n)
	for i := range n {
		reqs[i] = er
		if len(prompts) > 0 {
			reqs[i].Prompt = prompts[i]
		}
		if logprobs {
			cols[i] = &logprobCollector{}
			reqs[i].Sampling.OnLogprob = cols[i].add
		}
	}
	if n == 1 {
		res, err := s.eng.Generate(ctx, reqs[0])
		s.met.tokens(er.Model, res.PromptTokens, len(res.Tokens))
		return []pipeline.EngineResult{res}, cols, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	out := make([]pipeline.EngineResult, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := reqs[i]
			out[i], errs[i] = s.eng.Generate(ctx, r)
			s.met.tokens(er.Model, out[i].PromptTokens, len(out[i].Tokens))
			if errs[i] != nil {
				cancel()
			}
		}()
	}
	wg.Wait()
	// The first error that is not the cancellation the others caused.
	var first error
	for _, err := range errs {
		if err != nil && (first == nil || errors.Is(first, context.Canceled) && !errors.Is(err, context.Canceled)) {
			first = err
		}
	}
	return out, cols, first
}

func chunkSuffix(chatReq bool) string {
	if chatReq {
		return ".chunk"
	}
	return ""
}

// deltas carries text from the executor to the handler. The executor
// must never wait for a slow client (it would stall every request queued
// on the model), so the queue has no bound; a request's output is bounded
// by its context anyway.
type deltas struct {
	mu   sync.Mutex
	q    []string
	wake chan struct{}
}

func (d *deltas) push(s string) {
	d.mu.Lock()
	d.q = append(d.q, s)
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

func (d *deltas) take() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	q := d.q
	d.q = nil
	return q
}

// outcome is how a streamed generation ended.
type outcome struct {
	res pipeline.EngineResult
	err error
}

// follow streams a generation's text pieces to the client through flush
// as they come, until the generation ends, and returns how it ended
// (counted in the metrics). ok is false when the client went away (flush
// failed): the generation is then cancelled and its end awaited.
func (s *server) follow(d *deltas, done <-chan outcome, cancel func(), flush func() bool, model string) (o outcome, ok bool) {
	for {
		select {
		case <-d.wake:
			if !flush() {
				cancel()
				<-done
				return outcome{}, false
			}
		case o := <-done:
			s.met.tokens(model, o.res.PromptTokens, len(o.res.Tokens))
			return o, true
		}
	}
}

// stream answers with server-sent events: one chunk per piece of text,
// a last chunk with the finish reason (and usage when asked), then
// "data: [DONE]". The request is cancelled as soon as the client goes.
func (s *server) stream(w http.ResponseWriter, r *http.Request, er pipeline.EngineRequest, chatReq bool, id, object string, created int64, withUsage, logprobs bool) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	// With logprobs, each chunk carries the picks since the last one
	// (serve_logprobs.go).
	var lp *streamLogprobs
	if logprobs {
		tok, release, err := s.tokenizer(r, er.Model)
		if err != nil {
			s.engineError(w, r, er.Model, err)
			return
		}
		defer release()
		lp = &streamLogprobs{col: &logprobCollector{}, tok: tok, chat: chatReq}
		er.Sampling.OnLogprob = lp.col.add
	}
	d := &deltas{wake: make(chan struct{}, 1)}
	er.OnText = func(t string) error { d.push(t); return nil }
	done := make(chan outcome, 1)
	go func() {
		res, err := s.eng.Generate(ctx, er)
		done <- outcome{res, err}
	}()
	var ended bool    // the generation ended, its tokens are known:
	var final []int32 // the returned tokens
	chunk := func(delta string, role bool, finish any) map[string]any {
		c := map[string]any{"index": 0, "finish_reason": finish}
		if chatReq {
			dl := map[string]string{}
			if role {
				dl["role"] = "assistant"
			}
			if delta != "" || !role && finish == nil {
				dl["content"] = delta
			}
			c["delta"] = dl
		} else {
			c["text"] = delta
		}
		if lp != nil && !role {
			c["logprobs"] = lp.next(ended, final)
		}
		return map[string]any{"id": id, "object": object, "created": created, "model": er.Model, "choices": []any{c}}
	}
	var sse *sse
	// Errors before the first byte (unknown model, bad template) are
	// plain JSON errors with a status; after it, an error event.
	start := func() {
		if sse == nil {
			sse = newSSE(w)
			if chatReq {
				sse.event("", chunk("", true, nil))
			}
		}
	}
	flush := func() bool {
		for _, t := range d.take() {
			start()
			if !sse.event("", chunk(t, false, nil)) {
				return false
			}
		}
		return true
	}
	o, ok := s.follow(d, done, cancel, flush, er.Model)
	if !ok {
		return
	}
	if o.err != nil && sse == nil {
		s.engineError(w, r, er.Model, o.err)
		return
	}
	ended, final = true, o.res.Tokens
	flush()
	if o.err != nil {
		var e apiError
		e.Error.Message, e.Error.Type = redactPaths(o.err.Error()), "server_error"
		if errors.Is(o.err, pipeline.ErrEngineClosed) {
			e.Error.Message, e.Error.Code = "the server is shutting down", "shutting_down"
		}
		sse.event("", e)
		return
	}
	start()
	if chatReq && len(o.res.ToolCalls) > 0 {
		sse.event("", toolCallsChunk(id, object, er.Model, created, o.res.ToolCalls))
	}
	sse.event("", chunk("", false, o.res.FinishReason))
	if withUsage {
		// OpenAI's usage chunk: after the finish reason, with no
		// choices, before [DONE].
		sse.event("", map[string]any{"id": id, "object": object, "created": created, "model": er.Model, "choices": []any{}, "usage": usageOf(o.res)})
	}
	sse.raw("", []byte("[DONE]"))
}
