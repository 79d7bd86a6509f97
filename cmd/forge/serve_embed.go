package main

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/forge-llm/forge/pipeline"
)

// Embeddings: OpenAI's POST /v1/embeddings and Ollama's POST /api/embed.
// A text's embedding is its tokens' final hidden states pooled as the
// model's metadata says (mean unless it names first or last token) and
// normalized to unit length (pipeline.Model.Embed).

// maxEmbedInputs bounds one request's texts: each is a forward pass.
const maxEmbedInputs = 256

func (s *server) embedRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/embeddings", s.embeddings)
	mux.HandleFunc("POST /api/embed", s.ollamaEmbed)
	for _, p := range embedPaths {
		mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
			writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", fmt.Sprintf("%s does not take %s", r.URL.Path, r.Method))
		})
	}
}

var embedPaths = []string{"/v1/embeddings", "/api/embed"}

func init() { routes = append(routes, embedPaths...) }

// embedInput reads OpenAI's and Ollama's input: a string or an array of
// strings. Token-id arrays (OpenAI allows them) are refused by name.
func embedInput(raw json.RawMessage, field string) ([]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, badRequest("%s is required", field)
	}
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		return []string{one}, nil
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err != nil {
		var ids []json.Number
		if json.Unmarshal(raw, &ids) == nil {
			return nil, badRequest("%s: token-id arrays are not supported; send text", field)
		}
		return nil, badRequest("%s must be a string or an array of strings", field)
	}
	if len(many) == 0 {
		return nil, badRequest("%s must not be empty", field)
	}
	if len(many) > maxEmbedInputs {
		return nil, badRequest("%s: %d texts, at most %d", field, len(many), maxEmbedInputs)
	}
	return many, nil
}

// embedCheck bounds the texts like a prompt (--max-prompt-bytes over all
// of them) and refuses empty ones.
func (s *server) embedCheck(texts []string, field string) error {
	var total int64
	for i, t := range texts {
		if t == "" {
			return badRequest("%s[%d] is empty", field, i)
		}
		total += int64(len(t))
	}
	if total > s.maxPrompt {
		return fmt.Errorf("%w: %s of %d bytes, over %d (--max-prompt-bytes)", errPromptTooLarge, field, total, s.maxPrompt)
	}
	return nil
}

// openaiEmbedRequest is OpenAI's embeddings request.
type openaiEmbedRequest struct {
	Model          string          `json:"model"`
	Input          json.RawMessage `json:"input"`
	EncodingFormat string          `json:"encoding_format"`
	Dimensions     *int            `json:"dimensions"`
	User           string          `json:"user"`
}

// openaiEmbedding is one item of the response's data.
type openaiEmbedding struct {
	Object    string `json:"object"`
	Index     int    `json:"index"`
	Embedding any    `json:"embedding"` // []float32, or a base64 string
}

type openaiEmbedResponse struct {
	Object string            `json:"object"`
	Data   []openaiEmbedding `json:"data"`
	Model  string            `json:"model"`
	Usage  struct {
		PromptTokens int `json:"prompt_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
}

// embeddings is OpenAI's POST /v1/embeddings.
func (s *server) embeddings(w http.ResponseWriter, r *http.Request) {
	var req openaiEmbedRequest
	if err := s.decodeBody(r, &req); err != nil {
		s.engineError(w, r, "", err)
		return
	}
	id := cmp(req.Model, s.defaultModel)
	setModel(r, id)
	texts, err := embedInput(req.Input, "input")
	if err == nil && id == "" {
		err = badRequest("model is required")
	}
	if err == nil {
		err = s.embedCheck(texts, "input")
	}
	switch req.EncodingFormat {
	case "", "float", "base64":
	default:
		if err == nil {
			err = badRequest("encoding_format %q: want float or base64", req.EncodingFormat)
		}
	}
	if err != nil {
		s.engineError(w, r, id, err)
		return
	}
	embs, err := s.eng.Embed(r.Context(), id, texts, pipeline.EmbedOptions{})
	if err != nil {
		s.engineError(w, r, id, err)
		return
	}
	if req.Dimensions != nil && *req.Dimensions != len(embs[0].Vector) {
		s.engineError(w, r, id, badRequest("dimensions %d: this model's embeddings have %d", *req.Dimensions, len(embs[0].Vector)))
		return
	}
	resp := openaiEmbedResponse{Object: "list", Model: id, Data: make([]openaiEmbedding, len(embs))}
	for i, e := range embs {
		var v any = e.Vector
		if req.EncodingFormat == "base64" {
			v = base64Floats(e.Vector)
		}
		resp.Data[i] = openaiEmbedding{Object: "embedding", Index: i, Embedding: v}
		resp.Usage.PromptTokens += e.Tokens
	}
	resp.Usage.TotalTokens = resp.Usage.PromptTokens
	s.met.tokens(id, resp.Usage.PromptTokens, 0)
	writeJSON(w, http.StatusOK, resp)
}

// base64Floats is OpenAI's base64 encoding of an embedding: the float32
// values little-endian, base64 with padding.
func base64Floats(v []float32) string {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return base64.StdEncoding.EncodeToString(b)
}

// ollamaEmbedRequest is Ollama's /api/embed request.
type ollamaEmbedRequest struct {
	Model      string          `json:"model"`
	Input      json.RawMessage `json:"input"`
	Truncate   *bool           `json:"truncate"`
	Dimensions int             `json:"dimensions"`
	Options    json.RawMessage `json:"options"`
	KeepAlive  json.RawMessage `json:"keep_alive"`
}

type ollamaEmbedResponse struct {
	Model           string      `json:"model"`
	Embeddings      [][]float32 `json:"embeddings"`
	TotalDuration   int64       `json:"total_duration"`
	LoadDuration    int64       `json:"load_duration"`
	PromptEvalCount int         `json:"prompt_eval_count"`
}

// ollamaEmbed is Ollama's POST /api/embed: truncate (default true) cuts a
// text to the context instead of refusing it.
func (s *server) ollamaEmbed(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	var req ollamaEmbedRequest
	if err := s.decodeBody(r, &req); err != nil {
		s.ollamaError(w, r, "", err)
		return
	}
	id := cmp(req.Model, s.defaultModel)
	setModel(r, id)
	texts, err := embedInput(req.Input, "input")
	if err == nil && id == "" {
		err = badRequest("model is required")
	}
	if err == nil {
		err = s.embedCheck(texts, "input")
	}
	if err != nil {
		s.ollamaError(w, r, id, err)
		return
	}
	lease, err := s.eng.Acquire(r.Context(), id)
	if err != nil {
		s.ollamaError(w, r, id, err)
		return
	}
	defer lease.Release()
	loaded := time.Since(start)
	embs, err := lease.Model().Embed(r.Context(), texts, pipeline.EmbedOptions{Truncate: req.Truncate == nil || *req.Truncate})
	if err != nil {
		s.ollamaError(w, r, id, err)
		return
	}
	if req.Dimensions != 0 && req.Dimensions != len(embs[0].Vector) {
		s.ollamaError(w, r, id, badRequest("dimensions %d: this model's embeddings have %d", req.Dimensions, len(embs[0].Vector)))
		return
	}
	resp := ollamaEmbedResponse{Model: id, Embeddings: make([][]float32, len(embs)), LoadDuration: loaded.Nanoseconds()}
	for i, e := range embs {
		resp.Embeddings[i] = e.Vector
		resp.PromptEvalCount += e.Tokens
	}
	resp.TotalDuration = time.Since(start).Nanoseconds()
	s.met.tokens(id, resp.PromptEvalCount, 0)
	writeJSON(w, http.StatusOK, resp)
}
