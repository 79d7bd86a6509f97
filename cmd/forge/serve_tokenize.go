package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"unicode/utf8"

	"github.com/forge-llm/forge/pipeline/tokenizer"
)

// tokenizeRequest is llama-server's /tokenize body, plus the model that
// tokenizes (default: the first -m).
type tokenizeRequest struct {
	Model      string `json:"model"`
	Content    string `json:"content"`
	AddSpecial bool   `json:"add_special"`
	// ParseSpecial reads the text of control tokens ("<s>") as those
	// tokens; on by default, as in llama-server.
	ParseSpecial *bool `json:"parse_special"`
	WithPieces   bool  `json:"with_pieces"`
}

// tokenPiece is one token with its text: a string when the piece is valid
// UTF-8, else its bytes (llama-server's shape).
type tokenPiece struct {
	ID    int32 `json:"id"`
	Piece any   `json:"piece"`
}

type detokenizeRequest struct {
	Model  string  `json:"model"`
	Tokens []int64 `json:"tokens"`
}

// decodeBody reads one JSON object of at most s.maxBody bytes and nothing
// after it.
func (s *server) decodeBody(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, s.maxBody))
	if err := dec.Decode(v); err != nil {
		if mb := (*http.MaxBytesError)(nil); errors.As(err, &mb) {
			return err
		}
		return badRequest("request body: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return badRequest("request body: trailing data after the JSON object")
	}
	return nil
}

// requestTokenizer is what /tokenize and /detokenize share: the model
// asked for (default: the first -m), the size of what they send checked
// against --max-prompt-bytes (size formatted by what), and that model's
// tokenizer. On failure it has answered the request and ok is false.
func (s *server) requestTokenizer(w http.ResponseWriter, r *http.Request, model string, size int, what string) (tok *tokenizer.Tokenizer, release func(), id string, ok bool) {
	id = cmp(model, s.defaultModel)
	setModel(r, id)
	if id == "" {
		s.engineError(w, r, id, badRequest("model is required"))
		return nil, nil, id, false
	}
	if int64(size) > s.maxPrompt {
		s.engineError(w, r, id, fmt.Errorf("%w: "+what+", over %d (--max-prompt-bytes)", errPromptTooLarge, size, s.maxPrompt))
		return nil, nil, id, false
	}
	tok, release, err := s.tokenizer(r, id)
	if err != nil {
		s.engineError(w, r, id, err)
		return nil, nil, id, false
	}
	return tok, release, id, true
}

// tokenizer acquires a model and waits for its tokenizer; release ends
// the use.
func (s *server) tokenizer(r *http.Request, id string) (tok *tokenizer.Tokenizer, release func(), err error) {
	lease, err := s.eng.Acquire(r.Context(), id)
	if err != nil {
		return nil, nil, err
	}
	tok, err = lease.Model().Tokenizer(r.Context())
	if err != nil {
		lease.Release()
		return nil, nil, fmt.Errorf("tokenizer of %q: %w", id, err)
	}
	return tok, lease.Release, nil
}

// tokenize is llama-server's POST /tokenize: text to token ids, with
// their pieces when asked. The text is bounded like a prompt.
func (s *server) tokenize(w http.ResponseWriter, r *http.Request) {
	var req tokenizeRequest
	if err := s.decodeBody(r, &req); err != nil {
		s.engineError(w, r, "", err)
		return
	}
	tok, release, id, ok := s.requestTokenizer(w, r, req.Model, len(req.Content), "content of %d bytes")
	if !ok {
		return
	}
	defer release()
	opts := tokenizer.EncodeOptions{ParseSpecial: req.ParseSpecial == nil || *req.ParseSpecial}
	if req.AddSpecial {
		opts.AddBOS, opts.AddEOS = tok.ShouldAddBOS(), tok.ShouldAddEOS()
	}
	ids, err := tok.EncodeContext(r.Context(), req.Content, opts)
	if err != nil {
		s.engineError(w, r, id, fmt.Errorf("tokenize: %w", err))
		return
	}
	if !req.WithPieces {
		if ids == nil {
			ids = []int32{}
		}
		writeJSON(w, http.StatusOK, map[string]any{"tokens": ids})
		return
	}
	out := make([]tokenPiece, len(ids))
	for i, t := range ids {
		p := tok.Piece(t)
		out[i] = tokenPiece{ID: t, Piece: p}
		if !utf8.ValidString(p) {
			b := make([]int, len(p))
			for j := range len(p) {
				b[j] = int(p[j])
			}
			out[i].Piece = b
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"tokens": out})
}

// detokenize is llama-server's POST /detokenize: token ids to text, as
// pipeline's tokenizer decodes them (control tokens print nothing). An id
// outside the vocabulary is a 400 naming it.
func (s *server) detokenize(w http.ResponseWriter, r *http.Request) {
	var req detokenizeRequest
	if err := s.decodeBody(r, &req); err != nil {
		s.engineError(w, r, "", err)
		return
	}
	tok, release, _, ok := s.requestTokenizer(w, r, req.Model, len(req.Tokens), "%d tokens")
	if !ok {
		return
	}
	defer release()
	ids := make([]int32, len(req.Tokens))
	for i, t := range req.Tokens {
		if t < 0 || t >= int64(tok.VocabSize()) {
			writeParamError(w, "tokens", fmt.Sprintf("tokens[%d] = %d: not in the vocabulary [0, %d)", i, t, tok.VocabSize()))
			return
		}
		ids[i] = int32(t)
	}
	writeJSON(w, http.StatusOK, map[string]string{"content": tok.Decode(ids)})
}
