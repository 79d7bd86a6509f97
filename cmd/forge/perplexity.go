package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/pipeline"
)

func init() {
	commands = append(commands, &cli.Command{
		Name:      "perplexity",
		Usage:     "estimate a model's perplexity on a text, as llama-perplexity does",
		ArgsUsage: "[MODEL]",
		Description: "Tokenizes the text (with BOS), cuts it into chunks of -c tokens, evaluates each " +
			"chunk from an empty context and scores the second half of each window: the same " +
			"estimate as llama.cpp's llama-perplexity with the same -c, so quantizations and " +
			"backends compare with numbers users know. The running estimate after each chunk goes " +
			"to stderr ([1]3.5814,[2]…), the final estimate to stdout:\n\n" +
			"   Final estimate: PPL = 4.5509 +/- 0.16302\n\n" +
			"The text needs at least 2·c tokens. -f - reads stdin. --json prints one object instead.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "model", Aliases: []string{"m"}, Usage: "GGUF model file or store name (or give it as MODEL)"},
			&cli.StringFlag{Name: "file", Aliases: []string{"f"}, Required: true, Usage: "the text, a `FILE` (-: stdin)"},
			&cli.IntFlag{Name: "ctx", Aliases: []string{"c", "ctx-size"}, Usage: "tokens per chunk (0: the model's context, at most 4096)"},
			&cli.IntFlag{Name: "batch", Aliases: []string{"b", "batch-size"}, Usage: "most tokens per forward step (0: the chunk, at most 512); changes the speed, not the estimate"},
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object (ppl, stderr, chunks, tokens, per-chunk estimates) on stdout"},
			&cli.StringFlag{Name: "device", Value: "auto", Usage: "auto, cpu, gpu or gpu:N"},
			&cli.IntFlag{Name: "threads", Aliases: []string{"t"}, Usage: "CPU threads (0: all cores)"},
			&cli.StringFlag{Name: "strategy", Value: "prefetch", Usage: "load strategy: prefetch, eager, lazy or host-f32 (host-f32: every weight as F32, plain float math)"},
			gpuMMQFlag(),
		},
		Action: perplexityCmd,
	})
}

// perplexityResult is forge perplexity --json's object.
type perplexityResult struct {
	Model   string    `json:"model"`
	PPL     float64   `json:"ppl"`
	StdErr  float64   `json:"stderr"`
	Ctx     int       `json:"ctx"`
	Chunks  int       `json:"chunks"`
	Tokens  int       `json:"tokens"`
	Scored  int       `json:"scored_tokens"`
	Running []float64 `json:"running"`
	Seconds float64   `json:"seconds"`
}

func perplexityCmd(c *cli.Context) error {
	ctx := c.Context
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, sigs := watchSignals(ctx)
	defer sigs.Stop()
	return sigs.Err(perplexity(ctx, c))
}

func perplexity(ctx context.Context, c *cli.Context) error {
	stdout, stderr := c.App.Writer, c.App.ErrWriter
	device := c.String("device")
	if err := checkDevice(device); err != nil {
		return err
	}
	mmq, err := gpuMMQ(c)
	if err != nil {
		return err
	}
	if err := checkInts(c,
		intRange{"ctx", 0, gguf.MaxContext, "0: the model's, at most 4096"},
		intRange{"batch", 0, 1 << 16, "0: the chunk, at most 512"},
		intRange{"threads", 0, maxThreads, "0: all cores"},
	); err != nil {
		return err
	}
	if n := c.Int("ctx"); n != 0 && n < 4 {
		return usageErrorf("--ctx %d: at least 4 tokens per chunk", n)
	}
	strategy, err := pipeline.ParseStrategy(c.String("strategy"))
	if err != nil {
		return usageErrorf("--strategy: %w", err)
	}
	path, err := modelFlagOrArg(c, "perplexity")
	if err != nil {
		return err
	}
	var text []byte
	if name := c.String("file"); name == "-" {
		if c.App.Reader == nil {
			return fmt.Errorf("perplexity: text from stdin: no stdin")
		}
		text, err = io.ReadAll(c.App.Reader)
	} else {
		text, err = os.ReadFile(name)
	}
	if err != nil {
		return fmt.Errorf("perplexity: text: %w", err)
	}

	// The executor's own cache is sized like a chunk: it sits unused.
	m, err := pipeline.Open(ctx, path, pipeline.Options{Strategy: strategy, Device: device, Threads: c.Int("threads"), Ctx: c.Int("ctx"), Batch: c.Int("batch"), MMQ: mmq})
	if err != nil {
		return err
	}
	defer m.Close()
	asJSON := c.Bool("json")
	var running []float64
	start := time.Now()
	res, err := m.Perplexity(ctx, string(text), pipeline.PerplexityOptions{
		Ctx: c.Int("ctx"), Batch: c.Int("batch"),
		OnChunk: func(chunk, chunks int, ppl float64) {
			running = append(running, ppl)
			if !asJSON {
				fmt.Fprintf(stderr, "[%d]%.4f,", chunk, ppl)
				if chunk == chunks {
					fmt.Fprintln(stderr)
				}
			}
		},
	})
	if err != nil {
		if !asJSON && len(running) > 0 {
			fmt.Fprintln(stderr)
		}
		return err
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetEscapeHTML(false)
		return enc.Encode(perplexityResult{Model: path, PPL: res.PPL, StdErr: res.StdErr, Ctx: res.Ctx,
			Chunks: res.Chunks, Tokens: res.Tokens, Scored: res.Scored, Running: running,
			Seconds: time.Since(start).Seconds()})
	}
	fmt.Fprintf(stderr, "perplexity: %d tokens, %d chunks of %d, %d scored, %.2f s\n",
		res.Tokens, res.Chunks, res.Ctx, res.Scored, time.Since(start).Seconds())
	_, err = fmt.Fprintf(stdout, "Final estimate: PPL = %.4f +/- %.5f\n", res.PPL, res.StdErr)
	return err
}

// perplexityLine parses the final line of forge perplexity or
// llama-perplexity ("Final estimate: PPL = 4.5509 +/- 0.16302").
func perplexityLine(s string) (float64, bool) {
	i := strings.Index(s, "Final estimate: PPL = ")
	if i < 0 {
		return 0, false
	}
	var ppl float64
	if _, err := fmt.Sscanf(s[i+len("Final estimate: PPL = "):], "%g", &ppl); err != nil {
		return 0, false
	}
	return ppl, true
}
