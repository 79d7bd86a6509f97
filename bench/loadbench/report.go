package loadbench

import (
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
)

// WriteTable prints one table per model: a row per strategy and cache
// mode, a column per metric with min/median/max over the runs.
func WriteTable(w io.Writer, groups []Group) error {
	var models []string
	seen := map[string]bool{}
	for _, g := range groups {
		if !seen[g.Model] {
			seen[g.Model] = true
			models = append(models, g.Model)
		}
	}
	for i, model := range models {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "%s (min/median/max; times from the fork of the process)\n", model)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		head := []string{"strategy", "cache", "prompt", "runs"}
		for _, m := range Metrics {
			head = append(head, m.Name+" "+m.Unit)
		}
		head = append(head, "bound ms")
		fmt.Fprintln(tw, strings.Join(head, "\t")+"\t")
		for _, g := range groups {
			if g.Model != model {
				continue
			}
			runs := fmt.Sprint(g.Runs)
			if g.Failed > 0 {
				runs = fmt.Sprintf("%d (%d failed)", g.Runs, g.Failed)
			}
			prompt := "–"
			if g.Prompt > 0 {
				prompt = fmt.Sprint(g.Prompt)
			}
			row := []string{g.Strategy, g.Cache, prompt, runs}
			for _, m := range Metrics {
				row = append(row, fmtStat(g.Stats[m.Name], m.Unit))
			}
			row = append(row, fmtBound(g))
			fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		experts := 0
		for _, g := range groups {
			if g.Model == model {
				experts = max(experts, g.Experts)
			}
		}
		if experts > 0 {
			fmt.Fprintf(w, "resident@1st: the file's weights resident at the first token; experts routed: the distinct (layer, expert) the prompt's router chose, of %d, the only experts the first token waited for\n", experts)
		}
	}
	return nil
}

// fmtBound is the first-token bound with whether the median met it
// ("371 ok", "371 OVER"), "–" where there is none.
func fmtBound(g Group) string {
	ft, ok := g.Stats["first token"]
	if g.BoundMs <= 0 || !ok {
		return "–"
	}
	verdict := "ok"
	if ft.Median > g.BoundMs {
		verdict = "OVER"
	}
	return fmt.Sprintf("%.0f %s", g.BoundMs, verdict)
}

// fmtStat is "min/median/max" with a precision that suits the unit, "–"
// for a metric no run reached.
func fmtStat(s Stat, unit string) string {
	if s.N == 0 || math.IsNaN(s.Median) {
		return "–"
	}
	f := func(x float64) string {
		switch {
		case unit == "GB/s":
			return fmt.Sprintf("%.2f", x)
		case x >= 100:
			return fmt.Sprintf("%.0f", x)
		default:
			return fmt.Sprintf("%.1f", x)
		}
	}
	return f(s.Min) + "/" + f(s.Median) + "/" + f(s.Max)
}

// Pick chooses the run whose timeline to draw: among the successful runs
// of the model, strategy and cache mode that carry spans, the one with
// the median time to first token. nil when there is none.
func Pick(rs []Result, model, strategy, cache string) *Result {
	var cands []*Result
	for i := range rs {
		r := &rs[i]
		if r.Model == model && r.Strategy == strategy && r.Cache == cache && r.Err == "" && len(r.Spans) > 0 {
			cands = append(cands, r)
		}
	}
	if len(cands) == 0 {
		return nil
	}
	for i := 1; i < len(cands); i++ { // insertion sort by first token
		for j := i; j > 0 && cands[j].FirstTokenMs < cands[j-1].FirstTokenMs; j-- {
			cands[j], cands[j-1] = cands[j-1], cands[j]
		}
	}
	return cands[len(cands)/2]
}
