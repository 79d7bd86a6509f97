package main

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/forge-llm/forge/pipeline"
	"github.com/forge-llm/forge/pipeline/batch"
)

// metrics are the server's counters for GET /metrics (Prometheus text
// exposition, written by hand: a few counters and gauges do not need a
// client library). Gauges about models are read from the engine at
// scrape time.
type metrics struct {
	mu       sync.Mutex
	requests map[reqKey]uint64
	prompt   map[string]uint64 // prompt tokens by model
	gen      map[string]uint64 // generated tokens by model
	inFlight int
	// loadSec is each loaded model's time from Open until every weight
	// was resident, read once from its load events; pruned of models no
	// longer loaded so that a closed model is not kept alive.
	loadSec map[*pipeline.Model]float64
}

type reqKey struct {
	route string
	code  int
}

func newMetrics() *metrics {
	return &metrics{requests: map[reqKey]uint64{}, prompt: map[string]uint64{}, gen: map[string]uint64{}, loadSec: map[*pipeline.Model]float64{}}
}

// tokens counts a finished generation's tokens. A request that counted
// none (an unknown model, a bad template) adds no series: clients cannot
// grow the label set with made-up model names.
func (m *metrics) tokens(model string, prompt, gen int) {
	if prompt == 0 && gen == 0 {
		return
	}
	m.mu.Lock()
	m.prompt[model] += uint64(prompt)
	m.gen[model] += uint64(gen)
	m.mu.Unlock()
}

// routes are the label values of the route label: the server's patterns,
// so that a client probing paths cannot grow the series without bound.
var routes = []string{"/health", "/metrics", "/tokenize", "/detokenize", "/v1/models", "/v1/completions", "/v1/chat/completions", "/forge/status", "/forge/load"}

func routeOf(path string) string {
	if slices.Contains(routes, path) {
		return path
	}
	if strings.HasPrefix(path, "/v1/models/") {
		return "/v1/models/{id}"
	}
	return "other"
}

// obsKey is the context key of a request's *reqObs.
type obsKey struct{}

// reqObs is what the access log and the metrics learn of a request from
// its handler.
type reqObs struct{ model string }

// setModel records the model a request is for (the access log's model).
func setModel(r *http.Request, id string) {
	if o, ok := r.Context().Value(obsKey{}).(*reqObs); ok {
		o.model = id
	}
}

// statusWriter records the status and the bytes written.
type statusWriter struct {
	http.ResponseWriter
	code  int
	bytes int64
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	return n, err
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// observe starts a request's accounting: it returns the writer to answer
// through, the request carrying its *reqObs, and the function that counts
// it and writes its access log line (method, path, status, bytes,
// duration, model; never a body or a header) once it is answered.
func (s *server) observe(w http.ResponseWriter, r *http.Request) (*statusWriter, *http.Request, func()) {
	t0 := time.Now()
	o := &reqObs{}
	r = r.WithContext(context.WithValue(r.Context(), obsKey{}, o))
	sw := &statusWriter{ResponseWriter: w}
	s.met.mu.Lock()
	s.met.inFlight++
	s.met.mu.Unlock()
	return sw, r, func() {
		code := sw.code
		if code == 0 {
			code = http.StatusOK
		}
		s.met.mu.Lock()
		s.met.inFlight--
		s.met.requests[reqKey{routeOf(r.URL.Path), code}]++
		s.met.mu.Unlock()
		attrs := []slog.Attr{slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Int("status", code),
			slog.Int64("bytes", sw.bytes), slog.Duration("duration", time.Since(t0))}
		if o.model != "" {
			attrs = append(attrs, slog.String("model", o.model))
		}
		s.log.LogAttrs(r.Context(), slog.LevelInfo, "request", attrs...)
	}
}

// loadSeconds is a resident model's load time, from its AllResident event
// (replayed to a new subscriber); false while it is still loading.
func (s *server) loadSeconds(ctx context.Context, m *pipeline.Model) (float64, bool) {
	s.met.mu.Lock()
	v, ok := s.met.loadSec[m]
	s.met.mu.Unlock()
	if ok {
		return v, true
	}
	select {
	case <-m.Resident().Done():
		if m.Resident().Err() != nil {
			return 0, false
		}
	default:
		return 0, false
	}
	// The future resolves just before AllResident is published: the
	// event is in the history or follows at once.
	sub := m.Subscribe()
	defer sub.Close()
	for {
		select {
		case <-ctx.Done():
			return 0, false
		case ev, open := <-sub.C:
			if !open {
				return 0, false
			}
			if ar, ok := ev.(pipeline.AllResident); ok {
				v = ar.When().Seconds()
				s.met.mu.Lock()
				s.met.loadSec[m] = v
				s.met.mu.Unlock()
				return v, true
			}
		}
	}
}

// promWriter writes metric families: HELP and TYPE, then the samples.
type promWriter struct{ b *bufio.Writer }

func (p promWriter) family(name, typ, help string) {
	fmt.Fprintf(p.b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
}

// sample writes name{labels} value; labels are name, value pairs.
func (p promWriter) sample(name string, v float64, labels ...string) {
	p.b.WriteString(name)
	if len(labels) > 0 {
		p.b.WriteByte('{')
		for i := 0; i+1 < len(labels); i += 2 {
			if i > 0 {
				p.b.WriteByte(',')
			}
			p.b.WriteString(labels[i] + `="` + escapeLabel(labels[i+1]) + `"`)
		}
		p.b.WriteByte('}')
	}
	p.b.WriteString(" " + strconv.FormatFloat(v, 'g', -1, 64) + "\n")
}

var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

func escapeLabel(s string) string { return labelEscaper.Replace(s) }

// metricsHandler is GET /metrics in Prometheus text format 0.0.4.
func (s *server) metricsHandler(w http.ResponseWriter, r *http.Request) {
	status := s.eng.Status()
	loaded := s.eng.Loaded()
	type modelGauges struct {
		id    string
		m     *pipeline.Model
		load  float64
		hasLd bool
	}
	var gs []modelGauges
	live := map[*pipeline.Model]bool{}
	for _, l := range loaded {
		live[l.Model] = true
		v, ok := s.loadSeconds(r.Context(), l.Model)
		gs = append(gs, modelGauges{id: l.ID, m: l.Model, load: v, hasLd: ok})
	}
	slices.SortFunc(gs, func(a, b modelGauges) int { return strings.Compare(a.id, b.id) })

	s.met.mu.Lock()
	for m := range s.met.loadSec {
		if !live[m] {
			delete(s.met.loadSec, m)
		}
	}
	reqs := make([]reqKey, 0, len(s.met.requests))
	for k := range s.met.requests {
		reqs = append(reqs, k)
	}
	slices.SortFunc(reqs, func(a, b reqKey) int {
		if c := strings.Compare(a.route, b.route); c != 0 {
			return c
		}
		return a.code - b.code
	})
	counts := make([]uint64, len(reqs))
	for i, k := range reqs {
		counts[i] = s.met.requests[k]
	}
	prompt, gen := maps(s.met.prompt), maps(s.met.gen)
	inFlight := s.met.inFlight
	s.met.mu.Unlock()

	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriter(w)
	p := promWriter{bw}

	p.family("forge_http_requests_total", "counter", "HTTP requests answered, by route and status code.")
	for i, k := range reqs {
		p.sample("forge_http_requests_total", float64(counts[i]), "route", k.route, "code", strconv.Itoa(k.code))
	}
	p.family("forge_http_requests_in_flight", "gauge", "HTTP requests being answered (this scrape included).")
	p.sample("forge_http_requests_in_flight", float64(inFlight))
	p.family("forge_prompt_tokens_total", "counter", "Prompt tokens of finished generations, by model.")
	for _, kv := range prompt {
		p.sample("forge_prompt_tokens_total", float64(kv.v), "model", kv.k)
	}
	p.family("forge_generated_tokens_total", "counter", "Tokens generated by finished generations, by model.")
	for _, kv := range gen {
		p.sample("forge_generated_tokens_total", float64(kv.v), "model", kv.k)
	}
	p.family("forge_model_requests_active", "gauge", "Requests running or queued on a model.")
	for _, st := range status {
		p.sample("forge_model_requests_active", float64(st.Active), "model", st.ID)
	}
	p.family("forge_model_memory_bytes", "gauge", "Bytes a model's accountant holds.")
	for _, st := range status {
		p.sample("forge_model_memory_bytes", float64(st.MemoryBytes), "model", st.ID)
	}
	p.family("forge_memory_bytes", "gauge", "Bytes all loaded models hold, shared GPU staging included.")
	p.sample("forge_memory_bytes", float64(s.eng.InUse()))
	p.family("forge_model_load_seconds", "gauge", "Time from opening a loaded model until every weight was resident.")
	for _, g := range gs {
		if g.hasLd {
			p.sample("forge_model_load_seconds", g.load, "model", g.id)
		}
	}
	// The batching scheduler's gauges, for models that run one (a
	// model serving one sequence at a time has no pool).
	type batched struct {
		id string
		st batch.Stats
	}
	var bs []batched
	for _, g := range gs {
		if st := g.m.BatchStats(); st.Blocks > 0 {
			bs = append(bs, batched{g.id, st})
		}
	}
	p.family("forge_batch_requests_running", "gauge", "Sequences in a model's batching step loop.")
	for _, b := range bs {
		p.sample("forge_batch_requests_running", float64(b.st.Running), "model", b.id)
	}
	p.family("forge_batch_requests_queued", "gauge", "Requests waiting for admission to a model's batch.")
	for _, b := range bs {
		p.sample("forge_batch_requests_queued", float64(b.st.Waiting), "model", b.id)
	}
	p.family("forge_kv_blocks", "gauge", "KV pool blocks of a batching model: held by sequences, cached for their prefix, or free.")
	for _, b := range bs {
		p.sample("forge_kv_blocks", float64(b.st.Held), "model", b.id, "state", "held")
		p.sample("forge_kv_blocks", float64(b.st.Cached), "model", b.id, "state", "cached")
		p.sample("forge_kv_blocks", float64(b.st.Blocks-b.st.Held-b.st.Cached), "model", b.id, "state", "free")
	}
	constrainMetrics(p)
	bw.Flush()
}

// kv is one entry of a sorted map copy.
type kv struct {
	k string
	v uint64
}

func maps(m map[string]uint64) []kv {
	out := make([]kv, 0, len(m))
	for k, v := range m {
		out = append(out, kv{k, v})
	}
	slices.SortFunc(out, func(a, b kv) int { return strings.Compare(a.k, b.k) })
	return out
}
