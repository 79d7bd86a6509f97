package loadbench

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/pipeline"
)

// tracer turns a run's progress events into per-layer spans. The events
// carry only when a stage finished, so a tensor's stage starts where its
// previous stage ended; a read starts when the read hook sees the tensor's
// first chunk. A layer's span of a stage runs from the first start to the
// last end among its tensors.
type tracer struct {
	mu        sync.Mutex
	readStart map[string]time.Time // wall time of a tensor's first chunk read
	readEnd   map[string]time.Duration
	convEnd   map[string]time.Duration
	spans     map[[2]string]*Span // (layer, stage)
	runs      []pipeline.LayerRun
	first     time.Duration
}

func newTracer() *tracer {
	return &tracer{readStart: map[string]time.Time{}, readEnd: map[string]time.Duration{},
		convEnd: map[string]time.Duration{}, spans: map[[2]string]*Span{}}
}

// readHook is a pipeline read hook that records when each tensor's first
// chunk read begins.
func (t *tracer) readHook(_ context.Context, tensor string, _, _ int64) error {
	now := time.Now()
	t.mu.Lock()
	if _, ok := t.readStart[tensor]; !ok {
		t.readStart[tensor] = now
	}
	t.mu.Unlock()
	return nil
}

// layerOf is the block index in a tensor name, -1 (the globals) outside
// blocks.
func layerOf(name string) int {
	l, _, err := gguf.BlockOf(name)
	if err != nil {
		return -1
	}
	return l
}

// widen extends layer's span of stage over [a, b] (pipeline times).
func (t *tracer) widen(layer int, stage string, a, b time.Duration) {
	k := [2]string{strconv.Itoa(layer), stage}
	s, ok := t.spans[k]
	if !ok {
		t.spans[k] = &Span{Layer: layer, Stage: stage, StartMs: ms(a), EndMs: ms(b)}
		return
	}
	s.StartMs = min(s.StartMs, ms(a))
	s.EndMs = max(s.EndMs, ms(b))
}

// event folds one event in; started is the pipeline's start (Model.Started).
func (t *tracer) event(e pipeline.Event, started time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch e := e.(type) {
	case pipeline.TensorRead:
		a := e.At
		if w, ok := t.readStart[e.Tensor]; ok {
			a = min(w.Sub(started), e.At)
		}
		t.readEnd[e.Tensor] = e.At
		t.widen(layerOf(e.Tensor), "read", max(a, 0), e.At)
	case pipeline.TensorConverted:
		t.convEnd[e.Tensor] = e.At
		t.widen(layerOf(e.Tensor), "convert", min(t.readEnd[e.Tensor], e.At), e.At)
	case pipeline.TensorUploaded:
		t.widen(layerOf(e.Tensor), "upload", min(t.convEnd[e.Tensor], e.At), e.At)
	case pipeline.LayerRun:
		t.runs = append(t.runs, e)
	case pipeline.FirstToken:
		if t.first == 0 {
			t.first = e.At
		}
	}
}

// result lists the spans shifted by offset ms (the pipeline's start in the
// run's clock): wait and compute of the first forward pass from the
// LayerRun events, each layer's compute ending where the next one's wait
// began (the last at the first token).
func (t *tracer) result(offset float64) []Span {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []Span
	for _, s := range t.spans {
		out = append(out, *s)
	}
	for i, r := range t.runs {
		if r.Waited > 0 {
			out = append(out, Span{Layer: r.Layer, Stage: "wait", StartMs: ms(r.At - r.Waited), EndMs: ms(r.At)})
		}
		end := t.first
		if i+1 < len(t.runs) {
			end = t.runs[i+1].At - t.runs[i+1].Waited
		}
		if end > r.At {
			out = append(out, Span{Layer: r.Layer, Stage: "compute", StartMs: ms(r.At), EndMs: ms(end)})
		}
	}
	for i := range out {
		out[i].StartMs += offset
		out[i].EndMs += offset
	}
	sortSpans(out)
	return out
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
