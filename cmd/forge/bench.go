package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/forge-llm/forge/bench/loadbench"
	"github.com/forge-llm/forge/pipeline"
)

func init() {
	commands = append(commands, &cli.Command{
		Name:  "bench",
		Usage: "benchmarks",
		Subcommands: []*cli.Command{
			{
				Name:      "load",
				Usage:     "time loads from fresh processes: open, ready, resident, first token, memory",
				ArgsUsage: " ",
				Description: "Each run re-executes this binary in a fresh process, so process start and device " +
					"initialisation count; times are from the parent's fork. --cache cold evicts the file " +
					"from the page cache first (posix_fadvise DONTNEED, no root). --peer runs another " +
					"runtime's command ({model} is replaced by the path) in the same rounds; its first token " +
					"is when its stdout first shows output, so make it print only the generated text.",
				Flags: []cli.Flag{
					&cli.StringSliceFlag{Name: "model", Aliases: []string{"m"}, Usage: "GGUF model file or store name (repeat for several)", Required: true},
					&cli.StringFlag{Name: "strategies", Value: "prefetch,eager,lazy,host-f32", Usage: "load strategies, comma-separated"},
					&cli.IntFlag{Name: "runs", Value: 3, Usage: "runs per strategy and cache mode"},
					&cli.StringFlag{Name: "cache", Value: "both", Usage: "page cache before each run: warm, cold or both"},
					&cli.StringFlag{Name: "prompt-tokens", Value: "32", Usage: "prompt lengths in tokens drawn from the vocabulary, comma-separated (a sweep: 1,8,32,128,512)"},
					&cli.BoolFlag{Name: "fresh-kernel-cache", Usage: "give every run an empty kernel cache folder, as on a machine that never ran forge"},
					&cli.StringFlag{Name: "device", Value: "auto", Usage: deviceUsage},
					&cli.IntFlag{Name: "threads", Aliases: []string{"t"}, Usage: "CPU threads (0: all cores)"},
					&cli.StringFlag{Name: "peer", Usage: "another runtime's command, with {model} for the model path"},
					&cli.BoolFlag{Name: "json", Usage: "print every run and the summary as JSON instead of the table"},
					&cli.StringFlag{Name: "svg", Usage: "write the timeline of one run (the first model and strategy, median first token) to this SVG file"},
					&cli.StringFlag{Name: "expert-profiles", Usage: "`DIR` of expert usage profiles for every forge run (a mixture of experts): each run loads the experts earlier runs routed to first and adds its own routing, so the first run loads by index and the later ones by profile"},
					gpuUploadFlag(),
					splitFlag(),
				},
				Action: benchLoadCmd,
			},
			{
				Name:   "load-once",
				Hidden: true,
				Usage:  "one measured load (the child process of bench load); prints one JSON line",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "model", Aliases: []string{"m"}, Required: true},
					&cli.StringFlag{Name: "strategy", Value: "prefetch"},
					&cli.IntFlag{Name: "prompt-tokens", Value: 32},
					&cli.StringFlag{Name: "prompt-ids", Usage: "the prompt as comma-separated token ids (overrides --prompt-tokens)"},
					&cli.StringFlag{Name: "device", Value: "auto"},
					&cli.IntFlag{Name: "threads", Aliases: []string{"t"}},
					&cli.BoolFlag{Name: "trace"},
					&cli.Int64Flag{Name: "fork-ns", Usage: "the parent's wall clock (Unix ns) when it started this process"},
					&cli.StringFlag{Name: "expert-profiles"},
					gpuUploadFlag(),
					splitFlag(),
				},
				Action: benchLoadOnceCmd,
			},
			benchServeCommand(),
		},
	})
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func benchLoadCmd(c *cli.Context) error {
	ctx := c.Context
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, sigs := watchSignals(ctx)
	defer sigs.Stop()
	return sigs.Err(benchLoad(ctx, c))
}

// benchLoad is forge bench load once its signals are watched. It fails
// (after printing what it measured) when any run failed: a benchmark with
// a missing strategy is no result.
func benchLoad(ctx context.Context, c *cli.Context) error {
	stdout, stderr := c.App.Writer, c.App.ErrWriter

	strategies := splitList(c.String("strategies"))
	for _, s := range strategies {
		if _, err := pipeline.ParseStrategy(s); err != nil {
			return usageErrorf("--strategies: %w", err)
		}
	}
	if len(strategies) == 0 {
		return usageErrorf("--strategies: none given")
	}
	if err := checkInts(c,
		intRange{"runs", 1, 10000, "runs per strategy and cache mode"},
		intRange{"threads", 0, maxThreads, "0: all cores"},
	); err != nil {
		return err
	}
	var lengths []int
	for _, f := range splitList(c.String("prompt-tokens")) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || n > 1<<20 {
			return usageErrorf("--prompt-tokens %q: want prompt lengths from 1 to %d, comma-separated", c.String("prompt-tokens"), 1<<20)
		}
		lengths = append(lengths, n)
	}
	if len(lengths) == 0 {
		return usageErrorf("--prompt-tokens: none given")
	}
	var caches []string
	switch cm := c.String("cache"); cm {
	case "warm", "cold":
		caches = []string{cm}
	case "both":
		caches = []string{"warm", "cold"}
	default:
		return usageErrorf("--cache %q: want warm, cold or both", cm)
	}
	if err := checkDevice(c.String("device")); err != nil {
		return err
	}
	var models []string
	for _, m := range c.StringSlice("model") {
		p, err := resolveModel(m)
		if err != nil {
			return fmt.Errorf("bench load: %w", err)
		}
		models = append(models, p)
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("bench load: finding this program to re-run: %w", err)
	}
	cfg := loadbench.Config{
		Models: models, Strategies: strategies, Caches: caches, Runs: c.Int("runs"),
		PromptLengths: lengths, Device: c.String("device"), Threads: c.Int("threads"),
		Self: []string{exe, "bench", "load-once"}, Peer: c.String("peer"), Trace: c.String("svg") != "", Log: stderr,
		FreshKernelCache: c.Bool("fresh-kernel-cache"), GPUUpload: c.String("gpu-upload"), Split: c.String("split"),
	}
	if _, err := gpuUpload(c); err != nil {
		return err
	}
	if _, err := splitShares(c); err != nil {
		return err
	}
	if cfg.ExpertProfiles, err = expertProfilesDir(c); err != nil {
		return err
	}
	results, err := loadbench.Run(ctx, cfg)
	if err != nil {
		return err
	}
	failed := runsFailed(results)
	groups := loadbench.Summarize(results)
	if c.String("svg") != "" {
		var first []loadbench.Result // the first prompt length's runs
		for _, r := range results {
			if r.PromptTokens == lengths[0] {
				first = append(first, r)
			}
		}
		r := loadbench.Pick(first, models[0], strategies[0], caches[0])
		if r == nil {
			return fmt.Errorf("--svg: no successful %s %s run of %s to draw", strategies[0], caches[0], models[0])
		}
		f, err := os.Create(c.String("svg"))
		if err != nil {
			return err
		}
		if err := loadbench.WriteSVG(f, r); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	if c.Bool("json") {
		for i := range results { // the spans are in the SVG; keep the JSON readable
			results[i].Spans = nil
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(map[string]any{"runs": results, "summary": groups, "prompt_tokens": cfg.PromptLengths,
			"device": cfg.Device, "peer": cfg.Peer}); err != nil {
			return err
		}
		return failed
	}
	if err := loadbench.WriteTable(stdout, groups); err != nil {
		return err
	}
	return failed
}

// runsFailed is an error counting the failed runs (naming the first), nil
// when every run succeeded.
func runsFailed(results []loadbench.Result) error {
	n := 0
	var first *loadbench.Result
	for i := range results {
		if results[i].Err != "" {
			if n == 0 {
				first = &results[i]
			}
			n++
		}
	}
	if n == 0 {
		return nil
	}
	return fmt.Errorf("bench load: %d of %d runs failed; the first, %s %s run %d of %s: %s",
		n, len(results), first.Strategy, first.Cache, first.Run, first.Model, firstLine(first.Err))
}

// firstLine keeps an error one line long.
func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

func benchLoadOnceCmd(c *cli.Context) error {
	ctx := c.Context
	if ctx == nil {
		ctx = context.Background()
	}
	fork := time.Now()
	if ns := c.Int64("fork-ns"); ns > 0 {
		fork = time.Unix(0, ns)
	}
	split, err := splitShares(c)
	if err != nil {
		return err
	}
	var ids []int32
	for _, f := range splitList(c.String("prompt-ids")) {
		id, err := strconv.ParseInt(f, 10, 32)
		if err != nil {
			return fmt.Errorf("--prompt-ids: %w", err)
		}
		ids = append(ids, int32(id))
	}
	r := loadbench.RunOnce(ctx, loadbench.OnceConfig{
		Model: c.String("model"), Strategy: c.String("strategy"), Device: c.String("device"),
		Threads: c.Int("threads"), PromptTokens: c.Int("prompt-tokens"), PromptIDs: ids, Fork: fork, Trace: c.Bool("trace"),
		GPUUpload: c.String("gpu-upload"), Split: split, ExpertProfiles: c.String("expert-profiles"),
	})
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	fmt.Fprintln(c.App.Writer, string(b))
	if r.Err != "" {
		return fmt.Errorf("%s", r.Err)
	}
	return nil
}
