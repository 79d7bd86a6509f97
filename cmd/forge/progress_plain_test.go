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

// TestExpertsLine: a mixture's experts, loading one by one after the
// blocks, show as one line per block in the plain display (when the
// block's last expert lands) and as a strip of per-block fractions with
// the total; a block whose attention and router are in but whose experts
// are not is drawn as still uploading.
func TestExpertsLine(t *testing.T) {
	var w bytes.Buffer
	li := loadInfo{Layers: 2, UnitTensors: []int{3, 5 + 3*4, 5 + 3*4}, UnitBytes: make([]int64, 3), Experts: []int{4, 4}}
	d := &plainDisplay{w: &w, s: newStats(li)}
	d.Event(pipeline.LayerReady{At: time.Millisecond, Layer: 0})
	if got := d.s.strip(); got != "G· ▓·" {
		t.Fatalf("strip %q with layer 0's experts pending", got)
	}
	for e := range 4 {
		d.Event(pipeline.ExpertReady{At: 2 * time.Millisecond, Layer: 0, Expert: e, Resident: e + 1, Of: 4})
	}
	d.Event(pipeline.ExpertReady{At: 3 * time.Millisecond, Layer: 1, Expert: 2, Resident: 1, Of: 4})
	if got := d.s.experts(); got != "█▂ 5/8" {
		t.Fatalf("experts line %q", got)
	}
	if got := d.s.strip(); got != "G· █·" {
		t.Fatalf("strip %q with layer 0's experts resident", got)
	}
	if out := w.String(); strings.Count(out, "experts resident") != 1 || !strings.Contains(out, "layer 0 experts resident 2ms (4 of 4;") {
		t.Fatalf("plain lines %q", out)
	}
	dense := newStats(loadInfo{Layers: 1, UnitTensors: make([]int, 2), UnitBytes: make([]int64, 2), Experts: make([]int, 1)})
	if got := dense.experts(); got != "" {
		t.Fatalf("a dense model's experts line %q", got)
	}
}
