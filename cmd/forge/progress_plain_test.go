package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/forge-llm/forge/pipeline"
)

// TestPlainDisplayHoldsLinesDuringText: once the text started (Finish),
// the plain display writes no milestone line until Close, which writes
// the held lines before the statistics, so none lands inside the text on
// a screen that shows stderr and stdout together; an error is written at
// once.
func TestPlainDisplayHoldsLinesDuringText(t *testing.T) {
	var w bytes.Buffer
	d := &plainDisplay{w: &w, s: newStats(loadInfo{Layers: 1, UnitTensors: make([]int, 2), UnitBytes: make([]int64, 2)})}
	d.Event(pipeline.ModelReady{At: time.Millisecond, Bytes: 1000})
	if !strings.HasPrefix(w.String(), "ready ") {
		t.Fatalf("before the text: %q", w.String())
	}
	d.Finish()
	before := w.Len()
	d.Event(pipeline.FirstToken{At: 2 * time.Millisecond, Latency: time.Millisecond})
	if w.Len() != before {
		t.Fatalf("a line was written during the text: %q", w.String()[before:])
	}
	d.Close("max_tokens")
	rest := w.String()[before:]
	i, j := strings.Index(rest, "first token 2ms"), strings.Index(rest, "stop max_tokens")
	if i < 0 || j < i {
		t.Errorf("after Close: %q", rest)
	}
}
