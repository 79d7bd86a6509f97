package loadbench

import (
	"fmt"
	"html"
	"io"
	"math"
	"path/filepath"
	"slices"
	"strings"
)

// sortSpans orders spans by layer (globals first), then by stage in the
// pipeline's order.
func sortSpans(s []Span) {
	slices.SortFunc(s, func(a, b Span) int {
		if a.Layer != b.Layer {
			return a.Layer - b.Layer
		}
		return stageIndex(a.Stage) - stageIndex(b.Stage)
	})
}

var stages = []string{"read", "convert", "upload", "wait", "compute"}

var stageColor = map[string]string{
	"read": "#4e79a7", "convert": "#f28e2b", "upload": "#59a14f", "wait": "#bab0ac", "compute": "#e15759",
}

func stageIndex(s string) int {
	if i := slices.Index(stages, s); i >= 0 {
		return i
	}
	return len(stages)
}

// WriteSVG draws one run's timeline: a row per unit of weights (G for the
// embedding and head, then each block), a thin bar per stage in the row,
// and vertical lines at open, ready, first token and all resident. Times
// are from the fork of the process, so the gap before the first span is
// process start-up.
func WriteSVG(w io.Writer, r *Result) error {
	const (
		left, right, top, rowH, barH = 70.0, 20.0, 60.0, 18.0, 3.2
		width                        = 1000.0
	)
	layers := map[int]bool{}
	end := max(r.ResidentMs, r.FirstTokenMs)
	for _, s := range r.Spans {
		layers[s.Layer] = true
		end = max(end, s.EndMs)
	}
	var rows []int
	for l := range layers {
		rows = append(rows, l)
	}
	slices.Sort(rows)
	if end <= 0 {
		end = 1
	}
	end = niceCeil(end)
	plotW := width - left - right
	height := top + rowH*float64(len(rows)) + 50
	x := func(t float64) float64 { return left + plotW*t/end }
	row := map[int]int{}
	for i, l := range rows {
		row[l] = i
	}

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="11">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="18" font-size="13">%s</text>`+"\n", left,
		html.EscapeString(fmt.Sprintf("%s · %s · %s cache · run %d · prompt %d tokens · %s", filepath.Base(r.Model), r.Strategy, r.Cache, r.Run, r.PromptTokens, r.Device)))
	// Legend.
	lx := left
	for _, s := range stages {
		fmt.Fprintf(&b, `<rect x="%.1f" y="28" width="10" height="10" fill="%s"/><text x="%.1f" y="37">%s</text>`+"\n", lx, stageColor[s], lx+14, s)
		lx += 80
	}
	// Time axis with about ten ticks.
	step := niceCeil(end / 10)
	for t := 0.0; t <= end+1e-9; t += step {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#eee"/>`+"\n", x(t), top-4, x(t), height-40)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`+"\n", x(t), height-26, trimFloat(t))
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle">ms since the process was started</text>`+"\n", left+plotW/2, height-10)
	// Rows.
	for i, l := range rows {
		y := top + rowH*float64(i)
		name := "G"
		if l >= 0 {
			name = fmt.Sprintf("blk %d", l)
		}
		fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y+rowH/2+4, name)
	}
	for _, s := range r.Spans {
		y := top + rowH*float64(row[s.Layer]) + 1 + barH*float64(stageIndex(s.Stage))
		w := math.Max(x(s.EndMs)-x(s.StartMs), 0.8)
		fmt.Fprintf(&b, `<rect x="%.2f" y="%.1f" width="%.2f" height="%.1f" fill="%s"><title>%s</title></rect>`+"\n",
			x(s.StartMs), y, w, barH-0.4, stageColor[s.Stage],
			html.EscapeString(fmt.Sprintf("layer %d %s %.2f–%.2f ms", s.Layer, s.Stage, s.StartMs, s.EndMs)))
	}
	// Milestones.
	for _, m := range []struct {
		name string
		at   float64
	}{{"main", r.MainMs}, {"open", r.OpenMs}, {"ready", r.ReadyMs}, {"first token", r.FirstTokenMs}, {"resident", r.ResidentMs}} {
		if m.at <= 0 {
			continue
		}
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="black" stroke-dasharray="3,3"/>`+"\n", x(m.at), top-8, x(m.at), height-40)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" font-size="10" transform="rotate(-30 %.1f %.0f)">%s %.1f</text>`+"\n",
			x(m.at)+2, top-10, x(m.at)+2, top-10, m.name, m.at)
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// niceCeil rounds x up to 1, 2 or 5 times a power of ten.
func niceCeil(x float64) float64 {
	if x <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(x)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= x {
			return m * p
		}
	}
	return 10 * p
}

func trimFloat(x float64) string {
	s := fmt.Sprintf("%.3f", x)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s
}
