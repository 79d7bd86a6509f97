package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"github.com/forge-llm/forge/bench/loadbench"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/urfave/cli/v2"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels/gpu"
	"github.com/forge-llm/forge/pipeline"
)

// forge bench gen measures prompt (pp) and decode (tg) throughput the way
// llama-bench does, so that the two runtimes' numbers compare: pp is p
// prompt tokens in one request divided by the time to its first token, tg
// is n tokens decoded one at a time from a one-token context divided by
// their time, each the mean ± sample standard deviation of r repetitions
// after one warm-up, the model loaded once and fully resident before any
// timing.
func init() {
	for _, c := range commands {
		if c.Name == "bench" {
			c.Subcommands = append(c.Subcommands, benchGenCommand())
			return
		}
	}
	panic("forge: bench gen: no bench command to join")
}

func benchGenCommand() *cli.Command {
	return &cli.Command{
		Name:      "gen",
		Usage:     "prompt and decode throughput like llama-bench: pp and tg tokens/s per model",
		ArgsUsage: " ",
		Description: "pp: a p-token prompt (random ordinary tokens, new each repetition) timed to its first " +
			"token; tg: n tokens decoded from a one-token context, timed from the first generated token " +
			"to the last (n decode steps). Mean ± stddev over -r repetitions after a warm-up, the model " +
			"resident first. On a GPU, tg's weight bytes per second are compared with the device's copy " +
			"bandwidth. --peer runs llama-bench (its command, without -m/-p/-n/-r/-o, which are " +
			"added, with -t from --threads unless given) on the same models and shows its rows, parsed from its JSON output.",
		Flags: []cli.Flag{
			&cli.StringSliceFlag{Name: "model", Aliases: []string{"m"}, Usage: "GGUF model file (repeat for several)", Required: true},
			&cli.IntFlag{Name: "p", Value: 512, Usage: "prompt tokens (0: no pp test)"},
			&cli.IntFlag{Name: "n", Value: 128, Usage: "generated tokens (0: no tg test)"},
			&cli.IntFlag{Name: "r", Value: 3, Usage: "repetitions"},
			&cli.StringFlag{Name: "device", Value: "auto", Usage: deviceUsage},
			&cli.IntFlag{Name: "threads", Aliases: []string{"t"}, Usage: "CPU threads (0: all cores)"},
			&cli.StringFlag{Name: "peer", Usage: "llama-bench command line (e.g. 'llama-bench -ngl 99'); -m, -p, -n, -r and -o json are appended, and -t when --threads is set and the command has none"},
			&cli.BoolFlag{Name: "json", Usage: "print the rows as JSON instead of the table"},
			gpuMMQFlag(),
		},
		Action: benchGenCmd,
	}
}

// genRow is one test of one model on one runtime, as llama-bench reports it.
type genRow struct {
	Runtime   string    `json:"runtime"` // "forge" or "llama-bench"
	Model     string    `json:"model"`
	SizeBytes int64     `json:"size_bytes"` // tensor bytes
	Params    int64     `json:"params"`
	Backend   string    `json:"backend"`
	Test      string    `json:"test"` // "pp512", "tg128"
	NPrompt   int       `json:"n_prompt"`
	NGen      int       `json:"n_gen"`
	Samples   []float64 `json:"samples_ts"`
	AvgTS     float64   `json:"avg_ts"`
	StdevTS   float64   `json:"stddev_ts"`
	// BandwidthFraction (tg on a GPU): tensor bytes × tg tokens/s over the
	// device's copy bandwidth (read + write bytes/s, kernels/gpu
	// CopyBandwidth): how close decode comes to streaming the weights at
	// the memory's practical rate.
	BandwidthFraction float64 `json:"bandwidth_fraction,omitempty"`
}

type genConfig struct {
	p, n, r int
	device  string
	threads int
	mmq     string // --gpu-mmq
}

func benchGenCmd(c *cli.Context) error {
	ctx := c.Context
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, sigs := watchSignals(ctx)
	defer sigs.Stop()
	return sigs.Err(benchGen(ctx, c))
}

func benchGen(ctx context.Context, c *cli.Context) error {
	if err := checkInts(c,
		intRange{"p", 0, 1 << 20, "prompt tokens"},
		intRange{"n", 0, pipeline.MaxGenerateTokens - 1, "generated tokens"},
		intRange{"r", 1, 10000, "repetitions"},
		intRange{"threads", 0, maxThreads, "0: all cores"},
	); err != nil {
		return err
	}
	if c.Int("p") == 0 && c.Int("n") == 0 {
		return usageErrorf("-p 0 -n 0: nothing to measure")
	}
	if err := checkDevice(c.String("device")); err != nil {
		return err
	}
	cfg := genConfig{p: c.Int("p"), n: c.Int("n"), r: c.Int("r"), device: c.String("device"), threads: c.Int("threads")}
	var err error
	if cfg.mmq, err = gpuMMQ(c); err != nil {
		return err
	}
	models := c.StringSlice("model")
	for _, m := range models {
		if _, err := os.Stat(m); err != nil {
			return fmt.Errorf("bench gen: %w", err)
		}
	}
	var rows []genRow
	for _, m := range models {
		rs, err := benchGenModel(ctx, m, cfg)
		if err != nil {
			return fmt.Errorf("bench gen: %s: %w", m, err)
		}
		rows = append(rows, rs...)
	}
	addBandwidth(rows, cfg.device)
	if peer := c.String("peer"); peer != "" {
		for _, m := range models {
			rs, err := runPeerBench(ctx, peer, m, cfg)
			if err != nil {
				return fmt.Errorf("bench gen: --peer on %s: %w", m, err)
			}
			rows = append(rows, rs...)
		}
	}
	if c.Bool("json") {
		enc := json.NewEncoder(c.App.Writer)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	return writeGenTable(c.App.Writer, rows)
}

// modelSize is the tensor bytes and parameter count of a GGUF file.
func modelSize(path string) (bytes, params int64, err error) {
	f, err := gguf.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	for i := range f.Tensors {
		bytes += int64(f.Tensors[i].Size)
		params += int64(f.Tensors[i].Elements())
	}
	return bytes, params, nil
}

func benchGenModel(ctx context.Context, path string, cfg genConfig) ([]genRow, error) {
	size, params, err := modelSize(path)
	if err != nil {
		return nil, err
	}
	_, pool, err := loadbench.OrdinaryTokens(path)
	if err != nil {
		return nil, err
	}
	// The default strategy (prefetch) loads every weight, a mixture's
	// experts too, so Resident resolves (only a lazy mixture's never
	// does: LazyExperts); the timings start once it has.
	m, err := pipeline.Open(ctx, path, pipeline.Options{Device: cfg.device, Threads: cfg.threads, MMQ: cfg.mmq})
	if err != nil {
		return nil, err
	}
	defer m.Close()
	if err := m.Resident().Wait(ctx); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(1, 2))
	prompt := func(n int) []int32 {
		ids := make([]int32, n)
		for i := range ids {
			ids[i] = pool[rng.IntN(len(pool))]
		}
		return ids
	}
	// timed runs one request and returns the times its tokens came, from
	// the call.
	timed := func(ids []int32, max int) ([]time.Duration, error) {
		var at []time.Duration
		t0 := time.Now()
		res, err := m.Generate(ctx, "", pipeline.GenerateOptions{MaxTokens: max, PromptIDs: ids, IgnoreEOG: true,
			OnToken: func(pipeline.Token) error { at = append(at, time.Since(t0)); return nil }})
		if err != nil {
			return nil, err
		}
		if len(at) != max {
			return nil, fmt.Errorf("%d tokens generated of %d (stop: %s)", len(at), max, res.Stop)
		}
		return at, nil
	}
	pp := func() (float64, error) {
		at, err := timed(prompt(cfg.p), 1)
		if err != nil {
			return 0, fmt.Errorf("pp%d: %w", cfg.p, err)
		}
		return float64(cfg.p) / at[0].Seconds(), nil
	}
	tg := func() (float64, error) {
		at, err := timed(prompt(1), cfg.n+1)
		if err != nil {
			return 0, fmt.Errorf("tg%d: %w", cfg.n, err)
		}
		return float64(cfg.n) / (at[cfg.n] - at[0]).Seconds(), nil
	}
	backend := backendName(m.String())
	row := func(test string, np, ng int) genRow {
		return genRow{Runtime: "forge", Model: filepath.Base(path), SizeBytes: size, Params: params, Backend: backend,
			Test: test, NPrompt: np, NGen: ng}
	}
	var rows []genRow
	for _, t := range []struct {
		on   bool
		r    genRow
		once func() (float64, error)
	}{
		{cfg.p > 0, row(fmt.Sprintf("pp%d", cfg.p), cfg.p, 0), pp},
		{cfg.n > 0, row(fmt.Sprintf("tg%d", cfg.n), 0, cfg.n), tg},
	} {
		if !t.on {
			continue
		}
		if _, err := t.once(); err != nil { // warm-up, as llama-bench
			return nil, err
		}
		for i := 0; i < cfg.r; i++ {
			v, err := t.once()
			if err != nil {
				return nil, err
			}
			t.r.Samples = append(t.r.Samples, v)
		}
		t.r.AvgTS, t.r.StdevTS = meanStddev(t.r.Samples)
		rows = append(rows, t.r)
	}
	return rows, nil
}

// backendName is the device part of pipeline.Model.String ("cuda:0",
// "cpu"…).
func backendName(s string) string {
	if i := strings.Index(s, " ("); i >= 0 {
		if f := strings.Split(s[i+2:], ", "); len(f) >= 3 {
			return f[2]
		}
	}
	return "?"
}

// meanStddev returns the mean and the sample standard deviation (n − 1),
// as llama-bench reports.
func meanStddev(v []float64) (float64, float64) {
	var sum float64
	for _, x := range v {
		sum += x
	}
	mean := sum / float64(len(v))
	if len(v) < 2 {
		return mean, 0
	}
	var ss float64
	for _, x := range v {
		ss += (x - mean) * (x - mean)
	}
	return mean, math.Sqrt(ss / float64(len(v)-1))
}

// addBandwidth fills BandwidthFraction of the GPU tg rows from the copy
// bandwidth of the device, measured once on a backend of its own after the
// models are closed; on the CPU, or where it cannot be measured, the rows
// keep none.
func addBandwidth(rows []genRow, device string) {
	need := false
	for _, r := range rows {
		if r.NGen > 0 && (strings.HasPrefix(r.Backend, "cuda") || strings.HasPrefix(r.Backend, "hip")) {
			need = true
		}
	}
	if !need {
		return
	}
	ord := 0
	if s, ok := strings.CutPrefix(device, "gpu:"); ok {
		ord, _ = strconv.Atoi(s)
	}
	b, err := gpu.Open(ord, gpu.Options{})
	if err != nil {
		return
	}
	defer b.Close()
	gbs, err := b.CopyBandwidth()
	if err != nil || gbs <= 0 {
		return
	}
	for i := range rows {
		if r := &rows[i]; r.NGen > 0 && r.Runtime == "forge" && r.Backend != "cpu" {
			r.BandwidthFraction = float64(r.SizeBytes) * r.AvgTS / (gbs * 1e9)
		}
	}
}

// peerRow is the part of a llama-bench JSON record that bench gen shows.
type peerRow struct {
	ModelType string    `json:"model_type"`
	ModelSize int64     `json:"model_size"`
	NParams   int64     `json:"model_n_params"`
	Backends  string    `json:"backends"`
	NPrompt   int       `json:"n_prompt"`
	NGen      int       `json:"n_gen"`
	AvgTS     float64   `json:"avg_ts"`
	StdevTS   float64   `json:"stddev_ts"`
	Samples   []float64 `json:"samples_ts"`
}

// runPeerBench runs the llama-bench command line on one model with the
// same -p, -n and -r and parses its `-o json` output.
func runPeerBench(ctx context.Context, peer, model string, cfg genConfig) ([]genRow, error) {
	args := strings.Fields(peer)
	if len(args) == 0 {
		return nil, usageErrorf("--peer: empty command")
	}
	args = append(args, "-m", model, "-p", strconv.Itoa(cfg.p), "-n", strconv.Itoa(cfg.n), "-r", strconv.Itoa(cfg.r), "-o", "json")
	// The same threads as forge, unless the command line sets its own.
	if cfg.threads > 0 && !slices.ContainsFunc(args[1:], func(a string) bool { return a == "-t" || a == "--threads" }) {
		args = append(args, "-t", strconv.Itoa(cfg.threads))
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, lastLine(stderr.String()))
	}
	return parsePeerJSON(out, model)
}

func parsePeerJSON(out []byte, model string) ([]genRow, error) {
	var recs []peerRow
	if err := json.Unmarshal(out, &recs); err != nil {
		return nil, fmt.Errorf("llama-bench output is not its JSON (-o json): %w", err)
	}
	var rows []genRow
	for _, p := range recs {
		test := fmt.Sprintf("pp%d", p.NPrompt)
		switch {
		case p.NPrompt > 0 && p.NGen > 0:
			test = fmt.Sprintf("pp%d+tg%d", p.NPrompt, p.NGen)
		case p.NGen > 0:
			test = fmt.Sprintf("tg%d", p.NGen)
		}
		rows = append(rows, genRow{Runtime: "llama-bench", Model: filepath.Base(model), SizeBytes: p.ModelSize, Params: p.NParams,
			Backend: p.Backends, Test: test, NPrompt: p.NPrompt, NGen: p.NGen, Samples: p.Samples, AvgTS: p.AvgTS, StdevTS: p.StdevTS})
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("llama-bench reported no tests")
	}
	return rows, nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// writeGenTable prints the rows as a markdown table like llama-bench's,
// with the runtime first and the bandwidth fraction last.
func writeGenTable(w io.Writer, rows []genRow) error {
	table := [][]string{{"runtime", "model", "size", "params", "backend", "test", "t/s", "of copy BW"}}
	for _, r := range rows {
		bw := ""
		if r.BandwidthFraction > 0 {
			bw = fmt.Sprintf("%.0f%%", 100*r.BandwidthFraction)
		}
		table = append(table, []string{r.Runtime, r.Model, humanBytes(r.SizeBytes), humanCount(r.Params), r.Backend,
			r.Test, fmt.Sprintf("%.2f ± %.2f", r.AvgTS, r.StdevTS), bw})
	}
	width := make([]int, len(table[0]))
	for _, l := range table {
		for i, c := range l {
			width[i] = max(width[i], utf8.RuneCountInString(c))
		}
	}
	var b strings.Builder
	line := func(cells []string, right func(i int) bool) {
		for i, c := range cells {
			pad := strings.Repeat(" ", width[i]-utf8.RuneCountInString(c))
			if right(i) {
				fmt.Fprintf(&b, "| %s%s ", pad, c)
			} else {
				fmt.Fprintf(&b, "| %s%s ", c, pad)
			}
		}
		b.WriteString("|\n")
	}
	numeric := func(i int) bool { return i >= 6 }
	line(table[0], numeric)
	for i, wd := range width {
		dash := strings.Repeat("-", wd)
		if numeric(i) {
			dash = dash[1:] + ":"
		}
		fmt.Fprintf(&b, "| %s ", dash)
	}
	b.WriteString("|\n")
	for _, l := range table[1:] {
		line(l, numeric)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20))
	default:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
}

func humanCount(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2f B", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.2f M", float64(n)/1e6)
	default:
		return fmt.Sprintf("%.1f K", float64(n)/1e3)
	}
}
