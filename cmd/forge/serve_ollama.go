package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/pipeline"
	"github.com/forge-llm/forge/pipeline/chat"
	"github.com/forge-llm/forge/pipeline/sample"
)

// Ollama's API (/api/*), so that an Ollama client works against forge
// unchanged. The routes sit behind the same access checks as the rest
// (wrap): Host, Origin, key, JSON Content-Type on POST.
func (s *server) ollamaRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /api/version", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"version": ollamaVersion})
	})
	mux.HandleFunc("GET /api/tags", s.ollamaTags)
	mux.HandleFunc("POST /api/show", s.ollamaShow)
	mux.HandleFunc("GET /api/ps", s.ollamaPS)
	mux.HandleFunc("POST /api/generate", func(w http.ResponseWriter, r *http.Request) { s.ollamaGenerate(w, r, false) })
	mux.HandleFunc("POST /api/chat", func(w http.ResponseWriter, r *http.Request) { s.ollamaGenerate(w, r, true) })
}

// ollamaPaths are the Ollama routes, counted by GET /metrics under their
// own route label.
var ollamaPaths = []string{"/api/version", "/api/tags", "/api/show", "/api/ps", "/api/generate", "/api/chat"}

func init() { routes = append(routes, ollamaPaths...) }

// ollamaVersion is the Ollama API version forge answers as: clients check
// it against their minimum.
const ollamaVersion = "0.5.0"

// writeOllamaError is Ollama's error body: {"error": "…"}.
func writeOllamaError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

// errCapture records the OpenAI-shaped error engineError writes, for
// ollamaError to send it in Ollama's shape with the same status.
type errCapture struct {
	h      http.Header
	status int
	body   bytes.Buffer
}

func (c *errCapture) Header() http.Header         { return c.h }
func (c *errCapture) WriteHeader(status int)      { c.status = status }
func (c *errCapture) Write(b []byte) (int, error) { return c.body.Write(b) }

// ollamaError maps err as engineError does (the README's table of
// statuses) and answers it in Ollama's shape.
func (s *server) ollamaError(w http.ResponseWriter, r *http.Request, model string, err error) {
	c := &errCapture{h: http.Header{}, status: http.StatusInternalServerError}
	s.engineError(c, r, model, err)
	var e apiError
	msg := err.Error()
	if json.Unmarshal(c.body.Bytes(), &e) == nil && e.Error.Message != "" {
		msg = e.Error.Message
	}
	writeOllamaError(w, c.status, msg)
}

// ollamaDetails is Ollama's model details.
type ollamaDetails struct {
	ParentModel       string   `json:"parent_model"`
	Format            string   `json:"format"`
	Family            string   `json:"family"`
	Families          []string `json:"families"`
	ParameterSize     string   `json:"parameter_size"`
	QuantizationLevel string   `json:"quantization_level"`
}

// ggufFacts are what the Ollama routes tell of a model's file.
type ggufFacts struct {
	size     int64
	modified time.Time
	digest   string
	details  ollamaDetails
	info     map[string]any
	template string
}

// modelFacts reads a model's GGUF header. The digest is sha256 over the
// id, size and modification time, not the file's bytes: hashing gigabytes
// on every /api/tags would stall it; it changes when the file does.
func modelFacts(st pipeline.ModelStatus) (ggufFacts, error) {
	f, err := gguf.Open(st.Path)
	if err != nil {
		return ggufFacts{}, fmt.Errorf("model %q: %w", st.ID, err)
	}
	defer f.Close()
	fi, err := os.Stat(st.Path)
	if err != nil {
		return ggufFacts{}, fmt.Errorf("model %q: %w", st.ID, err)
	}
	h := sha256.Sum256(fmt.Appendf(nil, "%s\x00%d\x00%d", st.ID, fi.Size(), fi.ModTime().UnixNano()))
	arch, _ := f.String("general.architecture")
	var params uint64
	byType := map[string]uint64{}
	for _, t := range f.Tensors {
		n := uint64(1)
		for _, d := range t.Dims {
			n *= d
		}
		params += n
		if len(t.Dims) >= 2 {
			byType[t.Type.String()] += t.Size
		}
	}
	quant, most := "", uint64(0)
	for k, v := range byType {
		if v > most || v == most && k < quant {
			quant, most = k, v
		}
	}
	info := map[string]any{"general.architecture": arch, "general.parameter_count": params}
	for _, k := range []string{"general.name", "general.file_type", arch + ".context_length", arch + ".embedding_length", arch + ".block_count", arch + ".attention.head_count", arch + ".attention.head_count_kv"} {
		if v, ok := f.Lookup(k); ok {
			info[k] = metaValue(v)
		}
	}
	tmpl, _ := f.String("tokenizer.chat_template")
	return ggufFacts{
		size: fi.Size(), modified: fi.ModTime(), digest: hex.EncodeToString(h[:]), info: info, template: tmpl,
		details: ollamaDetails{Format: "gguf", Family: arch, Families: []string{arch}, ParameterSize: paramSize(params), QuantizationLevel: quant},
	}, nil
}

// metaValue is a scalar metadata value as JSON takes it.
func metaValue(v gguf.Value) any {
	if t, ok := v.Text(); ok {
		return t
	}
	if n, ok := v.Uint(); ok {
		return n
	}
	if n, ok := v.Int(); ok {
		return n
	}
	if x, ok := v.Float(); ok {
		return x
	}
	return v.String()
}

// paramSize writes a parameter count as Ollama does: 7.2B, 260K.
func paramSize(n uint64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.1fB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.1fM", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.0fK", float64(n)/1e3)
	}
	return fmt.Sprint(n)
}

// ollamaTags lists the models known to the server (the -m models and
// those loaded since), with what their files say.
func (s *server) ollamaTags(w http.ResponseWriter, r *http.Request) {
	models := []map[string]any{}
	for _, st := range s.eng.Status() {
		f, err := modelFacts(st)
		if err != nil {
			s.log.Debug("api/tags: skipping model", "model", st.ID, "err", err)
			continue
		}
		models = append(models, map[string]any{
			"name": st.ID, "model": st.ID, "size": f.size, "digest": f.digest,
			"details": f.details, "modified_at": f.modified.UTC().Format(time.RFC3339Nano),
		})
	}
	writeJSON(w, http.StatusOK, map[string]any{"models": models})
}

// ollamaShow is POST /api/show {"model"} (or "name", Ollama's older
// field): details, a few GGUF metadata keys and the chat template.
func (s *server) ollamaShow(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model string `json:"model"`
		Name  string `json:"name"`
	}
	if err := s.decodeBody(r, &req); err != nil {
		s.ollamaError(w, r, "", err)
		return
	}
	id := cmp(req.Model, req.Name)
	setModel(r, id)
	if id == "" {
		writeOllamaError(w, http.StatusBadRequest, "model is required")
		return
	}
	lease, err := s.eng.Acquire(r.Context(), id)
	if err != nil {
		s.ollamaError(w, r, id, err)
		return
	}
	lease.Release()
	st, ok := s.eng.StatusOf(id)
	if !ok {
		s.ollamaError(w, r, id, pipeline.ErrUnknownModel)
		return
	}
	f, err := modelFacts(st)
	if err != nil {
		s.ollamaError(w, r, id, err)
		return
	}
	// modelfile and parameters as Ollama writes them for a model
	// imported from a GGUF file with no Modelfile options; capabilities
	// are what forge serves on any model.
	writeJSON(w, http.StatusOK, map[string]any{
		"modelfile": "# Modelfile served by forge\nFROM " + id + "\n", "parameters": "",
		"details": f.details, "model_info": f.info, "template": f.template,
		"capabilities": []string{"completion", "embedding"},
		"modified_at":  f.modified.UTC().Format(time.RFC3339Nano),
	})
}

// ollamaPS lists the loaded models. size_vram is 0: the runtime keeps no
// per-device split, and on a CPU there is none.
func (s *server) ollamaPS(w http.ResponseWriter, r *http.Request) {
	models := []map[string]any{}
	for _, st := range s.eng.Status() {
		if st.State != pipeline.StateLoading && st.State != pipeline.StateReady && st.State != pipeline.StateResident {
			continue
		}
		m := map[string]any{"name": st.ID, "model": st.ID, "size": st.MemoryBytes, "size_vram": 0, "expires_at": nil}
		if !st.ExpiresAt.IsZero() {
			m["expires_at"] = st.ExpiresAt.UTC().Format(time.RFC3339Nano)
		}
		if f, err := modelFacts(st); err == nil {
			m["digest"], m["details"] = f.digest, f.details
		}
		models = append(models, m)
	}
	writeJSON(w, http.StatusOK, map[string]any{"models": models})
}

// ollamaOptions are the options forge reads from Ollama's "options".
type ollamaOptions struct {
	Temperature   *float64        `json:"temperature"`
	TopK          *int            `json:"top_k"`
	TopP          *float64        `json:"top_p"`
	MinP          *float64        `json:"min_p"`
	RepeatPenalty *float64        `json:"repeat_penalty"`
	Seed          *int64          `json:"seed"`
	NumPredict    *int            `json:"num_predict"`
	Stop          json.RawMessage `json:"stop"`
}

// ollamaRequest is the union of /api/generate's and /api/chat's bodies.
type ollamaRequest struct {
	Model    string         `json:"model"`
	Prompt   string         `json:"prompt"`
	System   string         `json:"system"`
	Raw      bool           `json:"raw"`
	Messages []chat.Message `json:"messages"`
	Tools    []chat.Tool    `json:"tools"`
	Stream   *bool          `json:"stream"`
	Options  ollamaOptions  `json:"options"`
	// Format is "json" or a JSON schema (serve_constrain.go).
	Format json.RawMessage `json:"format"`
}

// ollamaDecode reads a generate or chat request into an engine request.
// The options are checked by the same Validate as the OpenAI routes
// (400 naming the field).
func (s *server) ollamaDecode(r *http.Request, chatReq bool) (ollamaRequest, pipeline.EngineRequest, error) {
	var req ollamaRequest
	if err := s.decodeBody(r, &req); err != nil {
		return req, pipeline.EngineRequest{}, err
	}
	er := pipeline.EngineRequest{Model: cmp(req.Model, s.defaultModel), Sampling: sample.Defaults()}
	setModel(r, er.Model)
	if er.Model == "" {
		return req, er, badRequest("model is required")
	}
	var total int64
	if chatReq {
		if len(req.Messages) == 0 {
			return req, er, badRequest("messages must be a non-empty array")
		}
		for i, m := range req.Messages {
			if m.Role != "system" && m.Role != "user" && m.Role != "assistant" && m.Role != "tool" {
				return req, er, badRequest("messages[%d].role %q is not system, user, assistant or tool", i, m.Role)
			}
			total += int64(len(m.Content))
		}
		er.Messages = req.Messages
		if err := checkTools(req.Tools); err != nil {
			return req, er, err
		}
		er.Tools = req.Tools
	} else {
		total = int64(len(req.Prompt) + len(req.System))
		switch {
		case req.Raw:
			er.Prompt = req.Prompt
		case req.Prompt != "":
			if req.System != "" {
				er.Messages = append(er.Messages, chat.Message{Role: "system", Content: req.System})
			}
			er.Messages = append(er.Messages, chat.Message{Role: "user", Content: req.Prompt})
		}
	}
	if total > s.maxPrompt {
		return req, er, fmt.Errorf("%w: over %d bytes (--max-prompt-bytes)", errPromptTooLarge, s.maxPrompt)
	}
	o := req.Options
	if o.Temperature != nil {
		er.Sampling.Temp = float32(*o.Temperature)
	}
	if o.TopK != nil {
		er.Sampling.TopK = *o.TopK
	}
	if o.TopP != nil {
		er.Sampling.TopP = float32(*o.TopP)
	}
	if o.MinP != nil {
		er.Sampling.MinP = float32(*o.MinP)
	}
	if o.RepeatPenalty != nil {
		er.Sampling.RepeatPenalty = float32(*o.RepeatPenalty)
	}
	if o.Seed != nil {
		er.Sampling.Seed = uint64(*o.Seed)
	} else {
		er.Sampling.Seed = rand.Uint64()
	}
	if o.NumPredict != nil && *o.NumPredict > 0 {
		// Ollama's -1 (and -2) mean "until the end": MaxTokens ≤ 0.
		er.MaxTokens = *o.NumPredict
	}
	stops, err := stringOrList(o.Stop, "options.stop")
	if err != nil {
		return req, er, err
	}
	er.Stop = stops
	if er.Grammar, err = ollamaGrammar(req.Format); err != nil {
		return req, er, err
	}
	if err := (pipeline.GenerateOptions{MaxTokens: er.MaxTokens, Sampling: er.Sampling}).Validate(); err != nil {
		return req, er, err
	}
	return req, er, nil
}

// ollamaGenerate answers /api/generate and /api/chat: NDJSON lines of
// text, then a last line with done, done_reason, counts and durations
// (nanoseconds, measured here: load is the wait for the model, prompt
// evaluation the time to the first text, eval the rest); stream false:
// one object.
func (s *server) ollamaGenerate(w http.ResponseWriter, r *http.Request, chatReq bool) {
	start := time.Now()
	req, er, err := s.ollamaDecode(r, chatReq)
	if err != nil {
		s.ollamaError(w, r, er.Model, err)
		return
	}
	lease, err := s.eng.Acquire(r.Context(), er.Model)
	if err == nil {
		err = lease.WaitDevice(r.Context())
		lease.Release()
	}
	if err != nil {
		s.ollamaError(w, r, er.Model, err)
		return
	}
	loaded := time.Now()
	stream := req.Stream == nil || *req.Stream
	line := func(extra map[string]any) map[string]any {
		m := map[string]any{"model": er.Model, "created_at": time.Now().UTC().Format(time.RFC3339Nano)}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	text := func(t string) map[string]any {
		if chatReq {
			return map[string]any{"message": map[string]string{"role": "assistant", "content": t}, "done": false}
		}
		return map[string]any{"response": t, "done": false}
	}
	if er.Messages == nil && er.Prompt == "" {
		// An empty prompt loads the model, as in Ollama.
		m := text("")
		m["done"], m["done_reason"] = true, "load"
		writeJSON(w, http.StatusOK, line(m))
		return
	}
	if er.Messages != nil {
		if er.Template, err = s.chatTemplate(r.Context(), er.Model); err != nil {
			s.ollamaError(w, r, er.Model, err)
			return
		}
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	var first time.Time
	if stream {
		d := &deltas{wake: make(chan struct{}, 1)}
		er.OnText = func(t string) error {
			if first.IsZero() {
				first = time.Now()
			}
			d.push(t)
			return nil
		}
		s.ollamaStream(ctx, w, r, er, d, line, text, start, loaded, &first)
		return
	}
	er.OnText = func(string) error {
		if first.IsZero() {
			first = time.Now()
		}
		return nil
	}
	res, err := s.eng.Generate(ctx, er)
	s.met.tokens(er.Model, res.PromptTokens, len(res.Tokens))
	if err != nil {
		s.ollamaError(w, r, er.Model, err)
		return
	}
	m := ollamaWithCalls(text(res.Text), res.ToolCalls)
	for k, v := range ollamaStats(res, start, loaded, first, time.Now()) {
		m[k] = v
	}
	writeJSON(w, http.StatusOK, line(m))
}

// ollamaStats is the final line's fields.
func ollamaStats(res pipeline.EngineResult, start, loaded, first, end time.Time) map[string]any {
	if first.IsZero() {
		first = end
	}
	return map[string]any{
		"done": true, "done_reason": res.FinishReason,
		"prompt_eval_count": res.PromptTokens, "eval_count": len(res.Tokens),
		"total_duration": end.Sub(start).Nanoseconds(), "load_duration": loaded.Sub(start).Nanoseconds(),
		"prompt_eval_duration": first.Sub(loaded).Nanoseconds(), "eval_duration": end.Sub(first).Nanoseconds(),
	}
}

// ollamaStream writes NDJSON: one line per piece of text, flushed, then
// the final line. The generation runs in its own goroutine, ended (and
// waited for) when the client goes.
func (s *server) ollamaStream(ctx context.Context, w http.ResponseWriter, r *http.Request, er pipeline.EngineRequest, d *deltas,
	line func(map[string]any) map[string]any, text func(string) map[string]any, start, loaded time.Time, first *time.Time) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan outcome, 1)
	go func() {
		res, err := s.eng.Generate(ctx, er)
		done <- outcome{res, err}
	}()
	rc := http.NewResponseController(w)
	started, ok := false, true
	send := func(v map[string]any) bool {
		if !started {
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
			started = true
		}
		b, err := json.Marshal(line(v))
		if err == nil {
			_, err = w.Write(append(b, '\n'))
		}
		if err == nil {
			err = rc.Flush()
		}
		ok = ok && err == nil
		return ok
	}
	flush := func() bool {
		for _, t := range d.take() {
			if !send(text(t)) {
				return false
			}
		}
		return true
	}
	o, ok := s.follow(d, done, cancel, flush, er.Model)
	if !ok {
		return
	}
	if o.err != nil && !started {
		s.ollamaError(w, r, er.Model, o.err)
		return
	}
	if !flush() {
		return
	}
	if o.err != nil {
		msg := redactPaths(o.err.Error())
		if strings.Contains(msg, pipeline.ErrEngineClosed.Error()) {
			msg = "the server is shutting down"
		}
		send(map[string]any{"error": msg})
		return
	}
	if len(o.res.ToolCalls) > 0 && !send(ollamaWithCalls(text(""), o.res.ToolCalls)) {
		return
	}
	m := text("")
	for k, v := range ollamaStats(o.res, start, loaded, *first, time.Now()) {
		m[k] = v
	}
	send(m)
}

// ollamaShape gives the /api/* errors written outside the Ollama handlers
// (the access checks' 401, 403 and 415, routing's 404 and 405) Ollama's
// shape, {"error": "…"}, with their status; every other answer passes
// through untouched, streams included.
func ollamaShape(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/api/") {
			next.ServeHTTP(w, r)
			return
		}
		ow := &ollamaErrWriter{ResponseWriter: w}
		next.ServeHTTP(ow, r)
		ow.finish()
	})
}

// ollamaErrWriter holds back an error answer's body to reshape it.
type ollamaErrWriter struct {
	http.ResponseWriter
	status int // ≥ 400 once an error answer began
	body   bytes.Buffer
}

func (w *ollamaErrWriter) WriteHeader(code int) {
	if code >= 400 {
		w.status = code
		return
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *ollamaErrWriter) Write(b []byte) (int, error) {
	if w.status != 0 {
		return w.body.Write(b)
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (flushes,
// deadlines).
func (w *ollamaErrWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *ollamaErrWriter) finish() {
	if w.status == 0 {
		return
	}
	msg := strings.TrimSpace(w.body.String())
	var e apiError
	var o struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(w.body.Bytes(), &e) == nil && e.Error.Message != "" {
		msg = e.Error.Message
	} else if json.Unmarshal(w.body.Bytes(), &o) == nil && o.Error != "" {
		msg = o.Error
	}
	writeOllamaError(w.ResponseWriter, w.status, msg)
}
