package loadbench

import (
	"bytes"
	"context"
	"encoding/xml"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/pipeline"
)

func TestStat(t *testing.T) {
	s := stat([]float64{5, math.NaN(), 1, 3})
	if s.Min != 1 || s.Median != 3 || s.Max != 5 || s.N != 3 {
		t.Errorf("odd: %+v", s)
	}
	s = stat([]float64{4, 1, 2, 8})
	if s.Min != 1 || s.Median != 3 || s.Max != 8 || s.N != 4 {
		t.Errorf("even: %+v", s)
	}
	if s := stat([]float64{math.NaN()}); s.N != 0 || !math.IsNaN(s.Median) {
		t.Errorf("empty: %+v", s)
	}
	if got := fmtStat(Stat{Min: 1.25, Median: 150, Max: 151, N: 3}, "ms"); got != "1.2/150/151" {
		t.Errorf("fmtStat %q", got)
	}
	if got := fmtStat(Stat{}, "ms"); got != "–" {
		t.Errorf("fmtStat of nothing %q", got)
	}
	for _, c := range [][2]float64{{0.3, 0.5}, {7, 10}, {101, 200}, {2, 2}, {0, 1}} {
		if got := niceCeil(c[0]); got != c[1] {
			t.Errorf("niceCeil(%v) = %v, want %v", c[0], got, c[1])
		}
	}
}

func TestSummarizeAndPick(t *testing.T) {
	rs := []Result{
		{Model: "m", Strategy: "prefetch", Cache: "warm", Run: 1, OpenMs: 2, FirstTokenMs: 30, Spans: []Span{{}}},
		{Model: "m", Strategy: "prefetch", Cache: "warm", Run: 2, OpenMs: 4, FirstTokenMs: 10, Spans: []Span{{}}},
		{Model: "m", Strategy: "prefetch", Cache: "warm", Run: 3, OpenMs: 3, FirstTokenMs: 20, Spans: []Span{{}}},
		{Model: "m", Strategy: "lazy", Cache: "warm", Run: 1, Err: "boom"},
		{Model: "m", Strategy: "peer", Cache: "warm", Run: 1, FirstTokenMs: 7, ExitMs: 9},
	}
	gs := Summarize(rs)
	if len(gs) != 3 || gs[0].Strategy != "prefetch" || gs[1].Strategy != "lazy" || gs[2].Strategy != "peer" {
		t.Fatalf("groups %+v", gs)
	}
	if s := gs[0].Stats["open"]; s.Min != 2 || s.Median != 3 || s.Max != 4 || gs[0].Runs != 3 {
		t.Errorf("prefetch open %+v", s)
	}
	if gs[1].Runs != 1 || gs[1].Failed != 1 || len(gs[1].Stats) != 0 {
		t.Errorf("failed group %+v", gs[1])
	}
	if _, ok := gs[2].Stats["ready"]; ok || gs[2].Stats["first token"].Median != 7 {
		t.Errorf("peer stats %+v", gs[2].Stats)
	}
	if r := Pick(rs, "m", "prefetch", "warm"); r == nil || r.Run != 3 {
		t.Errorf("Pick chose %+v, want the median run 3", r)
	}
	if Pick(rs, "m", "lazy", "warm") != nil {
		t.Error("Pick chose a failed run")
	}
	var b bytes.Buffer
	if err := WriteTable(&b, gs); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "1 (1 failed)") || !strings.Contains(b.String(), "2.0/3.0/4.0") {
		t.Errorf("table:\n%s", b.String())
	}
}

// TestTracer feeds a made-up load: two tensors of block 0 and the
// embedding, then the prompt pass through two blocks.
func TestTracer(t *testing.T) {
	tr := newTracer()
	start := time.Now()
	tr.readStart["blk.0.a"] = start.Add(1 * time.Millisecond)
	tr.readStart["blk.0.b"] = start.Add(2 * time.Millisecond)
	ms := time.Millisecond
	for _, e := range []pipeline.Event{
		pipeline.TensorRead{At: 3 * ms, Tensor: "blk.0.a"},
		pipeline.TensorRead{At: 5 * ms, Tensor: "blk.0.b"},
		pipeline.TensorRead{At: 4 * ms, Tensor: "token_embd.weight"},
		pipeline.TensorConverted{At: 6 * ms, Tensor: "blk.0.a"},
		pipeline.TensorConverted{At: 7 * ms, Tensor: "blk.0.b"},
		pipeline.TensorUploaded{At: 8 * ms, Tensor: "blk.0.b"},
		pipeline.LayerRun{At: 10 * ms, Layer: 0, Waited: 2 * ms},
		pipeline.LayerRun{At: 12 * ms, Layer: 1},
		pipeline.FirstToken{At: 15 * ms},
	} {
		tr.event(e, start)
	}
	got := map[string]Span{}
	for _, s := range tr.result(100) {
		got[s.Stage+" "+string(rune('0'+s.Layer+1))] = s
	}
	want := map[string][2]float64{
		"read 1": {101, 105}, "read 0": {104, 104}, "convert 1": {103, 107}, "upload 1": {107, 108},
		"wait 1": {108, 110}, "compute 1": {110, 112}, "compute 2": {112, 115},
	}
	for k, w := range want {
		if s, ok := got[k]; !ok || s.StartMs != w[0] || s.EndMs != w[1] {
			t.Errorf("%s: got %+v, want %v", k, s, w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d spans, want %d: %v", len(got), len(want), got)
	}
}

// TestCache: Evict drops a file from the page cache and Warm brings it
// back, as mincore sees it.
func TestCache(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, bytes.Repeat([]byte{7}, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Evict(p); err != nil {
		t.Fatal(err)
	}
	if f, err := CachedFraction(p); err != nil || f > 0.01 {
		t.Errorf("after Evict: %.2f cached (%v)", f, err)
	}
	if err := Warm(p); err != nil {
		t.Fatal(err)
	}
	if f, err := CachedFraction(p); err != nil || f < 0.99 {
		t.Errorf("after Warm: %.2f cached (%v)", f, err)
	}
}

// TestRunOnce measures a load in this process and draws its timeline.
func TestRunOnce(t *testing.T) {
	fork := time.Now()
	r := RunOnce(context.Background(), OnceConfig{Model: testmodels.Path(t, "stories260K-Q4_K_M.gguf"), Strategy: "prefetch",
		Device: "cpu", Threads: 2, PromptTokens: 9, Fork: fork, Trace: true})
	if r.Err != "" {
		t.Fatal(r.Err)
	}
	// Loading starts inside Open, so on a model this small "ready" may
	// come before Open has returned: the two are not ordered.
	if !(r.MainMs >= 0 && r.MainMs <= r.OpenMs && r.MainMs <= r.ReadyMs && r.ReadyMs <= r.FirstTokenMs && r.ReadyMs <= r.ResidentMs) {
		t.Errorf("milestones out of order: %+v", r)
	}
	if r.PromptTokens != 9 || r.ReadBytes != r.FileBytes || r.PlacedBytes != r.FileBytes || r.DevicePeak < r.FileBytes {
		t.Errorf("prompt %d, file %d, read %d, placed %d, device %d", r.PromptTokens, r.FileBytes, r.ReadBytes, r.PlacedBytes, r.DevicePeak)
	}
	for _, s := range r.Spans {
		if s.StartMs > s.EndMs || s.StartMs < r.MainMs || s.EndMs > r.ResidentMs+1000 {
			t.Errorf("span %+v outside the run", s)
		}
	}
	var b bytes.Buffer
	if err := WriteSVG(&b, &r); err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(&b)
	rects := 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("SVG: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "rect" {
			rects++
		}
	}
	if want := 1 + len(stages) + len(r.Spans); rects != want {
		t.Errorf("%d rects, want %d", rects, want)
	}
}

func TestPromptIDs(t *testing.T) {
	ids, err := PromptIDs(testmodels.Path(t, "stories260K-F32.gguf"), 20)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := PromptIDs(testmodels.Path(t, "stories260K-F32.gguf"), 20)
	if len(ids) != 20 || ids[0] != 1 {
		t.Errorf("ids %v: want 20 starting with BOS", ids)
	}
	for i := range ids {
		if ids[i] != again[i] || ids[i] < 0 || ids[i] >= 512 {
			t.Fatalf("ids %v / %v", ids, again)
		}
	}
}

// TestSchedule: strategies alternate round by round with the peer last in
// each round; host-f32's runs come after every round.
func TestSchedule(t *testing.T) {
	got := schedule([]string{"prefetch", "host-f32", "eager"}, true, 2)
	want := []slot{
		{1, "prefetch"}, {1, "eager"}, {1, "peer"},
		{2, "prefetch"}, {2, "eager"}, {2, "peer"},
		{1, "host-f32"}, {2, "host-f32"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("schedule = %v, want %v", got, want)
	}
	if got := schedule([]string{"lazy"}, false, 3); !slices.Equal(got, []slot{{1, "lazy"}, {2, "lazy"}, {3, "lazy"}}) {
		t.Errorf("one strategy: %v", got)
	}
}

// TestFirstTokenBound checks issue 19's bound: the median context time,
// plus the file at 55 GB/s, plus 40 ms, judged against the median first
// token in the table; runs without a GPU context get no bound.
func TestFirstTokenBound(t *testing.T) {
	const file = 5.5e9 // 100 ms at 55 GB/s
	rs := []Result{
		{Model: "m", Strategy: "prefetch", Cache: "warm", PromptTokens: 8, ContextMs: 100, FirstTokenMs: 230, FileBytes: file},
		{Model: "m", Strategy: "prefetch", Cache: "warm", PromptTokens: 8, ContextMs: 110, FirstTokenMs: 235, FileBytes: file},
		{Model: "m", Strategy: "prefetch", Cache: "warm", PromptTokens: 512, ContextMs: 100, FirstTokenMs: 300, FileBytes: file},
		{Model: "m", Strategy: "eager", Cache: "warm", PromptTokens: 8, FirstTokenMs: 50, FileBytes: file}, // CPU: no context
	}
	gs := Summarize(rs)
	if len(gs) != 3 {
		t.Fatalf("%d groups, want 3 (prefetch at 8 and 512 tokens, eager)", len(gs))
	}
	if b := gs[0].BoundMs; b < 244.99 || b > 245.01 {
		t.Errorf("bound at 8 tokens %.2f ms, want 105 + 100 + 40 = 245", b)
	}
	if gs[2].BoundMs != 0 {
		t.Errorf("CPU group has a bound of %.1f ms", gs[2].BoundMs)
	}
	var b strings.Builder
	if err := WriteTable(&b, gs); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "245 ok") || !strings.Contains(b.String(), "240 OVER") {
		t.Errorf("table lacks the verdicts:\n%s", b.String())
	}
}
