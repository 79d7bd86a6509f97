package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/dustin/go-humanize"

	"github.com/forge-llm/forge/pipeline"
)

// plainDisplay writes one line per milestone (globals ready, each layer
// resident, everything resident, first token, errors): for logs and
// pipes, where a redrawn display would be noise.
//
// Once the generated text starts (Finish), the lines of later events are
// held back and written at Close, before the statistics: the text goes
// to stdout as it comes, and a "first token" line written to stderr
// between two of its pieces would land in the middle of it on a screen
// showing both.
type plainDisplay struct {
	w io.Writer
	s *stats

	mu       sync.Mutex
	finished bool
	held     bytes.Buffer
}

func (d *plainDisplay) Event(e pipeline.Event) {
	d.mu.Lock()
	defer d.mu.Unlock()
	w := d.w
	if _, isErr := e.(pipeline.ErrorEvent); d.finished && !isErr {
		w = &d.held // errors are never held: an error return skips Close
	}
	d.event(w, e)
}

func (d *plainDisplay) event(w io.Writer, e pipeline.Event) {
	d.s.add(e)
	switch e := e.(type) {
	case pipeline.ModelReady:
		fmt.Fprintf(w, "ready %s: embedding, output norm and head resident (%s)\n", fmtDur(e.At), humanize.Bytes(uint64(e.Bytes)))
	case pipeline.LayerReady:
		fmt.Fprintf(w, "layer %d resident %s (%s)\n", e.Layer, fmtDur(e.At), humanize.Bytes(uint64(e.Bytes)))
	case pipeline.ExpertReady:
		if e.Resident == e.Of { // one line per block, not per expert
			fmt.Fprintf(w, "layer %d experts resident %s (%d of %d; %s)\n", e.Layer, fmtDur(e.At), e.Resident, e.Of, d.s.experts())
		}
	case pipeline.AllResident:
		fmt.Fprintf(w, "all resident %s: read %s at %s, placed %s\n", fmtDur(e.At),
			humanize.Bytes(uint64(d.s.read)), bytesRate(d.s.read, d.s.lastRead), humanize.Bytes(uint64(e.Bytes)))
	case pipeline.FirstToken:
		fmt.Fprintf(w, "first token %s (%s after the request started)\n", fmtDur(e.At), fmtDur(e.Latency))
	case pipeline.ErrorEvent:
		if errors.Is(e.Err, context.Canceled) {
			// Ctrl-C: whatever wait it cut short is not the failure.
			fmt.Fprintf(w, "interrupted %s\n", fmtDur(e.At))
			return
		}
		fmt.Fprintf(w, "error %s: %v\n", fmtDur(e.At), e.Err)
	}
}

func (d *plainDisplay) Finish() {
	d.mu.Lock()
	d.finished = true
	d.mu.Unlock()
}

func (d *plainDisplay) Close(stop string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.w.Write(d.held.Bytes())
	d.held.Reset()
	fmt.Fprintln(d.w, d.s.line(stop))
}

// jsonDisplay writes one JSON object per line: an "open" header, every
// event as pipeline.EventJSON encodes it, and a closing "stats" object.
// The schema is in the README (section "Progress as JSON lines").
type jsonDisplay struct {
	w io.Writer
	s *stats
}

func newJSONDisplay(w io.Writer, s *stats) *jsonDisplay {
	d := &jsonDisplay{w: w, s: s}
	tensors := 0
	for _, n := range s.info.UnitTensors {
		tensors += n
	}
	d.write(map[string]any{"event": "open", "at_ms": 0.0, "model": s.info.Path, "arch": s.info.Arch,
		"layers": s.info.Layers, "tensors": tensors, "file_bytes": s.info.FileBytes,
		"strategy": s.info.Strategy, "device": s.info.Device})
	return d
}

func (d *jsonDisplay) write(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		b, _ = json.Marshal(map[string]any{"event": "error", "error": err.Error()})
	}
	d.w.Write(append(b, '\n'))
}

func (d *jsonDisplay) Event(e pipeline.Event) {
	d.s.add(e)
	b, err := pipeline.EventJSON(e)
	if err != nil {
		d.write(map[string]any{"event": "error", "error": err.Error()})
		return
	}
	d.w.Write(append(b, '\n'))
}

func (d *jsonDisplay) Finish() {}

func (d *jsonDisplay) Close(stop string) {
	s := d.s
	m := map[string]any{"event": "stats", "ready_ms": ms(s.ready), "first_token_ms": ms(s.firstToken),
		"prompt_tokens": s.promptTokens, "prompt_tok_s": round1(s.promptRate()),
		"decode_tokens": max(s.tokens-1, 0), "decode_tok_s": round1(s.decodeRate()),
		"read_bytes": s.read, "placed_bytes": s.uploaded, "peak_rss_bytes": peakRSS(), "stop": stop}
	if s.resident > 0 {
		m["resident_ms"] = ms(s.resident)
	}
	if s.devicePeak > 0 {
		m["peak_device_bytes"] = s.devicePeak
	}
	d.write(m)
}
