package servebench

import (
	"fmt"
	"html"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// WriteTable prints the report: a row per target and client count (and
// kind of request in a --turns run), then the turn-by-turn comparison or
// the swap figures, then the first error of every step that had one.
func WriteTable(w io.Writer, r *Report) error {
	fmt.Fprintf(w, "prompts: %s\n", calibrationLine(r.Calibration))
	if r.Mode != "swap" {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		head := []string{"target", "clients"}
		if r.Mode == "turns" {
			head = append(head, "kind")
		}
		head = append(head, "requests", "errors", "tokens", "wall s", "tok/s", "TTFT p50/p99/max ms", "ITL p50/p99 ms", "prompt tok")
		fmt.Fprintln(tw, strings.Join(head, "\t")+"\t")
		for _, s := range r.Steps {
			row := []string{s.Target, strconv.Itoa(s.Clients)}
			if r.Mode == "turns" {
				row = append(row, s.Kind)
			}
			row = append(row, strconv.Itoa(s.Requests), strconv.Itoa(s.Errors), strconv.Itoa(s.Tokens),
				fmt.Sprintf("%.2f", s.WallMs/1000), num(s.TokensPerS),
				q3(s.TTFT), q2(s.ITL), promptCol(s.PromptTokens))
			fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(r.Turns) > 0 {
		fmt.Fprintf(w, "\nfirst token of each turn vs its new text alone (bar: turn ≤ %.1f × alone, medians)\n", Bar)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "target\tclients\tturn\tprompt tok\tturn TTFT p50/max ms\talone TTFT p50/max ms\tratio\tbar\t")
		for _, t := range r.Turns {
			ratio, bar := "–", "–"
			if t.Ratio > 0 {
				ratio = fmt.Sprintf("%.2f", t.Ratio)
				bar = "over"
				if t.WithinBar {
					bar = "ok"
				}
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t\n", t.Target, t.Clients, t.Turn, promptCol(t.PromptTokens),
				q2max(t.TTFT), q2max(t.AloneTTFT), ratio, bar)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(r.Swaps) > 0 {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "target\tmodels\trequests\terrors\tswaps\tswap TTFT p50/max ms\twarm TTFT p50/max ms\t")
		for _, s := range r.Swaps {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%s\t\n", s.Target, strings.Join(s.Models, " ⇄ "), s.Requests, s.Errors, s.Swaps.N, q2max(s.Swaps), q2max(s.Warm))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	for _, s := range r.Steps {
		if s.FirstError != "" {
			fmt.Fprintf(w, "%s, %d clients (%s): %d errors, the first: %s\n", s.Target, s.Clients, s.Kind, s.Errors, s.FirstError)
		}
	}
	for _, s := range r.Swaps {
		if s.FirstError != "" {
			fmt.Fprintf(w, "%s (swap): %d errors, the first: %s\n", s.Target, s.Errors, s.FirstError)
		}
	}
	return nil
}

func calibrationLine(c Calibration) string {
	if c.Source == "" || c.Source == "none" {
		return "about one token a word assumed (no tokenizer to calibrate with)"
	}
	return fmt.Sprintf("%.3f words a token, measured with %s (%d words, %d tokens)", c.WordsPerToken, c.Source, c.SampleWords, c.SampleTokens)
}

func num(x float64) string {
	switch {
	case x >= 100:
		return fmt.Sprintf("%.0f", x)
	case x >= 10:
		return fmt.Sprintf("%.1f", x)
	default:
		return fmt.Sprintf("%.2f", x)
	}
}

func q3(q Quantiles) string {
	if q.N == 0 {
		return "–"
	}
	return num(q.P50) + "/" + num(q.P99) + "/" + num(q.Max)
}

func q2(q Quantiles) string {
	if q.N == 0 {
		return "–"
	}
	return num(q.P50) + "/" + num(q.P99)
}

func q2max(q Quantiles) string {
	if q.N == 0 {
		return "–"
	}
	return num(q.P50) + "/" + num(q.Max)
}

func promptCol(x float64) string {
	if x <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f", x)
}

// series is one line of a chart.
type series struct {
	name string
	y    []float64 // NaN: no point
}

var palette = []string{"#4e79a7", "#e15759", "#59a14f", "#f28e2b", "#76b7b2", "#b07aa1", "#edc948", "#9c755f"}

// WriteSVG draws the report as a line chart: tokens/s against the client
// count for every target (the conversation turns in a --turns run), or,
// for --swap, each swap's time to first token in order.
func WriteSVG(w io.Writer, r *Report) error {
	var xs []string
	var ss []series
	title, ylabel, xlabel := "generated tokens/s by concurrent clients", "tokens/s", "clients"
	if r.Mode == "swap" {
		title, ylabel, xlabel = "time to first token of each model swap", "ms", "swap"
		n := 0
		for _, t := range r.Targets {
			var y []float64
			for _, q := range r.Requests {
				if q.Target == t.Name && q.Kind == "swap" {
					v := q.TTFTMs
					if q.Err != "" || q.Chunks == 0 {
						v = math.NaN()
					}
					y = append(y, v)
				}
			}
			n = max(n, len(y))
			ss = append(ss, series{name: t.Name, y: y})
		}
		for i := range n {
			xs = append(xs, strconv.Itoa(i+1))
		}
	} else {
		kind := "load"
		if r.Mode == "turns" {
			kind = "turn"
			title = "generated tokens/s of the conversation turns by concurrent clients"
		}
		var clients []int
		for _, s := range r.Steps {
			if !slices.Contains(clients, s.Clients) {
				clients = append(clients, s.Clients)
			}
		}
		for _, c := range clients {
			xs = append(xs, strconv.Itoa(c))
		}
		for _, t := range r.Targets {
			y := make([]float64, len(clients))
			for i := range y {
				y[i] = math.NaN()
			}
			for _, s := range r.Steps {
				if s.Target == t.Name && s.Kind == kind && s.Requests > s.Errors {
					y[slices.Index(clients, s.Clients)] = s.TokensPerS
				}
			}
			ss = append(ss, series{name: t.Name, y: y})
		}
	}
	return lineChart(w, title, xlabel, ylabel, xs, ss)
}

// lineChart draws series over evenly spaced categories xs (client counts
// grow by factors, so even spacing reads like a log axis).
func lineChart(w io.Writer, title, xlabel, ylabel string, xs []string, ss []series) error {
	const (
		width, height            = 760.0, 440.0
		left, right, top, bottom = 70.0, 160.0, 40.0, 50.0
	)
	plotW, plotH := width-left-right, height-top-bottom
	ymax := 0.0
	for _, s := range ss {
		for _, v := range s.y {
			if !math.IsNaN(v) {
				ymax = max(ymax, v)
			}
		}
	}
	ymax = niceCeil(ymax * 1.05)
	x := func(i int) float64 {
		if len(xs) <= 1 {
			return left + plotW/2
		}
		return left + plotW*float64(i)/float64(len(xs)-1)
	}
	y := func(v float64) float64 { return top + plotH*(1-v/ymax) }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="11">`+"\n", width, height)
	b.WriteString(`<rect width="100%" height="100%" fill="white"/>` + "\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="22" font-size="13">%s</text>`+"\n", left, html.EscapeString(title))
	step := niceCeil(ymax / 5)
	for v := 0.0; v <= ymax+1e-9; v += step {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#eee"/>`+"\n", left, y(v), left+plotW, y(v))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y(v)+4, trimFloat(v))
	}
	for i, l := range xs {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x(i), top+plotH+16, html.EscapeString(l))
	}
	fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", left, top+plotH, left+plotW, top+plotH)
	fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", left, top, left, top+plotH)
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", left+plotW/2, height-12, html.EscapeString(xlabel))
	fmt.Fprintf(&b, `<text x="16" y="%.1f" text-anchor="middle" transform="rotate(-90 16 %.1f)">%s</text>`+"\n", top+plotH/2, top+plotH/2, html.EscapeString(ylabel))
	for k, s := range ss {
		color := palette[k%len(palette)]
		var pts []string
		flush := func() {
			if len(pts) > 1 {
				fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", color, strings.Join(pts, " "))
			}
			pts = pts[:0]
		}
		for i, v := range s.y {
			if math.IsNaN(v) {
				flush()
				continue
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(i), y(v)))
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"><title>%s</title></circle>`+"\n", x(i), y(v), color,
				html.EscapeString(fmt.Sprintf("%s, %s %s: %s %s", s.name, xlabel, xs[i], num(v), ylabel)))
		}
		flush()
		ly := top + 10 + 18*float64(k)
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="12" height="3" fill="%s"/><text x="%.1f" y="%.1f">%s</text>`+"\n",
			left+plotW+16, ly-4, color, left+plotW+34, ly, html.EscapeString(s.name))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// niceCeil rounds x up to 1, 2 or 5 times a power of ten.
func niceCeil(x float64) float64 {
	if x <= 0 || math.IsNaN(x) {
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
	return strings.TrimRight(strings.TrimRight(s, "0"), ".")
}
