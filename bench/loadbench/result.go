// Package loadbench measures how long a model takes to load and answer
// from a fresh process: each run is a child process (the forge binary
// re-executed), timed from the parent's fork, with the file's page cache
// warm or evicted. It turns the runs into a table, JSON and an SVG
// timeline of one run. `forge bench load` is built on it.
package loadbench

import (
	"math"
	"slices"
)

// Result is one run: forge's child process or a peer command. Times are
// milliseconds since the parent started the process (fork and exec count).
type Result struct {
	Model    string `json:"model"`
	Strategy string `json:"strategy"` // a load strategy, or "peer"
	Cache    string `json:"cache"`    // "warm" or "cold"
	Run      int    `json:"run"`
	Device   string `json:"device,omitempty"`
	// CachedBefore is the fraction of the file's pages in the page cache
	// just before the run (mincore): ~1 warm, ~0 cold.
	CachedBefore float64 `json:"cached_before"`

	MainMs       float64 `json:"main_ms"`        // the child's main ran
	OpenMs       float64 `json:"open_ms"`        // pipeline.Open returned
	ContextMs    float64 `json:"context_ms"`     // the GPU context became current (0 on the CPU)
	ReadyMs      float64 `json:"ready_ms"`       // embedding and head resident
	ResidentMs   float64 `json:"resident_ms"`    // every weight resident
	FirstTokenMs float64 `json:"first_token_ms"` // first token of the prompt's answer
	ExitMs       float64 `json:"exit_ms"`        // the process ended (parent's clock)

	// ResidentAtFirst is the fraction of the planned weights' file bytes
	// resident when the first token came (globals, blocks and, for a
	// mixture, experts: the units whose ready events came before it).
	// ExpertsRouted is how many distinct (layer, expert) the prompt's
	// router chose by then (its request's ExpertRun events), of Experts
	// (every block's experts; 0 for a dense model): under prefetch a
	// mixture's first token waits for those experts only.
	ResidentAtFirst float64 `json:"resident_at_first_token"`
	ExpertsRouted   int     `json:"experts_routed,omitempty"`
	Experts         int     `json:"experts,omitempty"`

	PromptTokens int     `json:"prompt_tokens"`
	FileBytes    int64   `json:"file_bytes"`
	ReadBytes    int64   `json:"read_bytes"`
	PlacedBytes  int64   `json:"placed_bytes"`
	LoadBps      float64 `json:"load_bytes_per_s"` // file bytes / (resident − open started)
	// LinkBps is the rate of the copies alone: file bytes / (resident −
	// context current), the time every device had its context (0 on the
	// CPU). A split over several GPUs multiplies this rate (one link
	// each); the context's start-up, which it leaves out, is the same
	// fixed cost for one GPU or several.
	LinkBps     float64 `json:"link_bytes_per_s,omitempty"`
	PeakRSS     int64   `json:"peak_rss_bytes"` // VmHWM (peer: rusage maxrss)
	PeakRssAnon int64   `json:"peak_rss_anon_bytes"`
	DevicePeak  int64   `json:"device_peak_bytes"` // pipeline.Memory Peak

	Spans []Span `json:"spans,omitempty"`
	Err   string `json:"error,omitempty"`
}

// Span is one stage of one unit of weights in a run's timeline: Layer -1
// is the globals (embedding, output norm, head). Stage is "read",
// "convert", "upload", "wait" or "compute".
type Span struct {
	Layer   int     `json:"layer"`
	Stage   string  `json:"stage"`
	StartMs float64 `json:"start_ms"`
	EndMs   float64 `json:"end_ms"`
}

// Stat is min, median and max of one metric over runs.
type Stat struct {
	Min    float64 `json:"min"`
	Median float64 `json:"median"`
	Max    float64 `json:"max"`
	N      int     `json:"n"`
}

// stat summarizes xs, leaving out NaN (a metric a run did not reach).
func stat(xs []float64) Stat {
	var v []float64
	for _, x := range xs {
		if !math.IsNaN(x) {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return Stat{Min: math.NaN(), Median: math.NaN(), Max: math.NaN()}
	}
	slices.Sort(v)
	med := v[len(v)/2]
	if len(v)%2 == 0 {
		med = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return Stat{Min: v[0], Median: med, Max: v[len(v)-1], N: len(v)}
}

// Metric is one column of the table.
type Metric struct {
	Name, Unit string
	// Get reads the metric from a result; NaN when the run lacks it.
	Get func(r *Result) float64
}

func posOrNaN(x float64) float64 {
	if x <= 0 {
		return math.NaN()
	}
	return x
}

// Metrics are the table's columns, in order.
var Metrics = []Metric{
	{"main", "ms", func(r *Result) float64 { return posOrNaN(r.MainMs) }},
	{"open", "ms", func(r *Result) float64 { return posOrNaN(r.OpenMs) }},
	{"context", "ms", func(r *Result) float64 { return posOrNaN(r.ContextMs) }},
	{"ready", "ms", func(r *Result) float64 { return posOrNaN(r.ReadyMs) }},
	{"resident", "ms", func(r *Result) float64 { return posOrNaN(r.ResidentMs) }},
	{"first token", "ms", func(r *Result) float64 { return posOrNaN(r.FirstTokenMs) }},
	{"exit", "ms", func(r *Result) float64 { return posOrNaN(r.ExitMs) }},
	{"resident@1st", "%", func(r *Result) float64 { return posOrNaN(100 * r.ResidentAtFirst) }},
	{"experts routed", "n", func(r *Result) float64 { return posOrNaN(float64(r.ExpertsRouted)) }},
	{"load", "GB/s", func(r *Result) float64 { return posOrNaN(r.LoadBps / 1e9) }},
	{"link", "GB/s", func(r *Result) float64 { return posOrNaN(r.LinkBps / 1e9) }},
	{"peak RSS", "MiB", func(r *Result) float64 { return posOrNaN(float64(r.PeakRSS) / (1 << 20)) }},
	{"RssAnon", "MiB", func(r *Result) float64 { return posOrNaN(float64(r.PeakRssAnon) / (1 << 20)) }},
	{"device", "MiB", func(r *Result) float64 { return posOrNaN(float64(r.DevicePeak) / (1 << 20)) }},
}

// Group is the runs of one model, prompt length, strategy and cache mode with their
// summary per metric (keyed by Metric.Name; absent when no run reached
// it, such as a peer's ready time).
type Group struct {
	Model    string `json:"model"`
	Prompt   int    `json:"prompt_tokens"` // 0 for the peer
	Strategy string `json:"strategy"`
	Cache    string `json:"cache"`
	Runs     int    `json:"runs"`
	// FileBytes is the model file's size, for the first-token bound.
	FileBytes int64 `json:"file_bytes"`
	// Experts is the model's experts over all blocks (0: dense), what
	// the "experts routed" column counts against.
	Experts int             `json:"experts,omitempty"`
	Failed  int             `json:"failed"`
	Stats   map[string]Stat `json:"stats"`
	// BoundMs is what issue 19 allows the median first token on a GPU
	// with the page cache warm: the median time the context became
	// current, plus the file at 55 GB/s, plus 40 ms for the prompt. 0
	// where no run made a GPU context (CPU runs, the peer).
	BoundMs float64 `json:"first_token_bound_ms,omitempty"`
}

// Summarize groups results by model, strategy and cache mode, in the order
// they first appear, and computes each metric's min/median/max over the
// runs without an error.
func Summarize(rs []Result) []Group {
	var groups []Group
	type key struct {
		model, strategy, cache string
		prompt                 int
	}
	idx := map[key]int{}
	members := map[int][]*Result{}
	for i := range rs {
		r := &rs[i]
		prompt := r.PromptTokens
		if r.Strategy == "peer" {
			prompt = 0
		}
		k := key{r.Model, r.Strategy, r.Cache, prompt}
		g, ok := idx[k]
		if !ok {
			g = len(groups)
			idx[k] = g
			groups = append(groups, Group{Model: r.Model, Prompt: prompt, Strategy: r.Strategy, Cache: r.Cache, Stats: map[string]Stat{}})
		}
		if r.FileBytes > groups[g].FileBytes {
			groups[g].FileBytes = r.FileBytes
		}
		groups[g].Experts = max(groups[g].Experts, r.Experts)
		groups[g].Runs++
		if r.Err != "" {
			groups[g].Failed++
			continue
		}
		members[g] = append(members[g], r)
	}
	for g := range groups {
		for _, m := range Metrics {
			var xs []float64
			for _, r := range members[g] {
				xs = append(xs, m.Get(r))
			}
			// A metric no run reached is left out (JSON has no NaN).
			if st := stat(xs); st.N > 0 {
				groups[g].Stats[m.Name] = st
			}
		}
		if ctx, ok := groups[g].Stats["context"]; ok && groups[g].FileBytes > 0 {
			groups[g].BoundMs = ctx.Median + float64(groups[g].FileBytes)/55e9*1000 + 40
		}
	}
	return groups
}
