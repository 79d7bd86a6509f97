package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/pipeline/generate"
	"github.com/forge-llm/forge/pipeline/model"
	"github.com/forge-llm/forge/pipeline/sample"
	"github.com/forge-llm/forge/pipeline/tokenizer"
)

func init() {
	d := sample.Defaults()
	commands = append(commands, &cli.Command{
		Name:      "run",
		Usage:     "generate text from a prompt",
		ArgsUsage: " ",
		Description: "Streams the continuation of the prompt to stdout as it is generated, " +
			"then prints one line of statistics to stderr. --temp 0 is greedy.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "model", Aliases: []string{"m"}, Usage: "GGUF model file", Required: true},
			&cli.StringFlag{Name: "prompt", Aliases: []string{"p"}, Usage: "prompt text"},
			&cli.IntFlag{Name: "max-tokens", Aliases: []string{"n"}, Value: 256, Usage: "most tokens to generate (≤ 0: until end of text or a full context)"},
			&cli.Float64Flag{Name: "temp", Value: float64(d.Temp), Usage: "temperature; 0 is greedy"},
			&cli.IntFlag{Name: "top-k", Value: d.TopK, Usage: "keep the K most likely tokens (0: off)"},
			&cli.Float64Flag{Name: "top-p", Value: float64(d.TopP), Usage: "nucleus sampling threshold (1: off)"},
			&cli.Float64Flag{Name: "min-p", Value: float64(d.MinP), Usage: "drop tokens below min-p × the most likely (0: off)"},
			&cli.Float64Flag{Name: "repeat-penalty", Value: float64(d.RepeatPenalty), Usage: "penalty on recently seen tokens (1: off)"},
			&cli.IntFlag{Name: "repeat-last-n", Value: d.RepeatLastN, Usage: "how many recent tokens the penalty looks at"},
			&cli.Int64Flag{Name: "seed", Value: -1, Usage: "random seed (-1: random)"},
			&cli.IntFlag{Name: "ctx", Usage: "context length to allocate (0: the model's, at most 4096)"},
			&cli.IntFlag{Name: "batch", Value: model.DefaultBatch, Usage: "most prompt tokens per forward step"},
			&cli.StringFlag{Name: "device", Value: "auto", Usage: "cpu (auto picks cpu; GPUs come later)"},
			&cli.IntFlag{Name: "threads", Aliases: []string{"t"}, Usage: "CPU threads (0: all cores)"},
			&cli.BoolFlag{Name: "echo", Usage: "print the prompt before the generated text"},
		},
		Action: runCmd,
	})
}

// newBackend opens the device asked for.
func newBackend(device string, threads int) (kernels.Backend, func(), error) {
	switch device {
	case "auto", "cpu":
		b := cpu.New(threads)
		return b, b.Close, nil
	}
	return nil, nil, fmt.Errorf("device %q is not available (have: cpu, auto)", device)
}

func runCmd(c *cli.Context) error {
	ctx := c.Context
	if ctx == nil {
		ctx = context.Background()
	}
	// Ctrl-C stops the generation; the statistics are still printed.
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt)
	defer stop()
	start := time.Now()
	path := c.String("model")
	f, err := gguf.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	cfg, err := model.ConfigFromFile(f)
	if err != nil {
		return err
	}
	tok, err := tokenizer.FromFile(f)
	if err != nil {
		return err
	}
	w, err := model.NewFileWeights(f, cfg)
	if err != nil {
		return err
	}
	be, closeBackend, err := newBackend(c.String("device"), c.Int("threads"))
	if err != nil {
		return err
	}
	defer closeBackend()
	m, err := model.New(be, cfg, w, model.Options{Ctx: c.Int("ctx"), Batch: c.Int("batch")})
	if err != nil {
		return err
	}
	defer m.Close()
	loadTime := time.Since(start)
	slog.Debug("model loaded", "file", path, "arch", cfg.Arch, "layers", cfg.Layers, "embd", cfg.Embd,
		"vocab", cfg.Vocab, "ctx", m.Ctx(), "device", be.Name(), "load", loadTime)

	text := c.String("prompt")
	prompt, err := tok.Encode(text, tokenizer.EncodeOptions{AddBOS: tok.ShouldAddBOS(), AddEOS: tok.ShouldAddEOS()})
	if err != nil {
		return fmt.Errorf("tokenizing the prompt: %w", err)
	}
	if len(prompt) == 0 {
		return fmt.Errorf("the prompt is empty and the model adds no BOS token")
	}

	p := sample.Params{
		Temp:          float32(c.Float64("temp")),
		TopK:          c.Int("top-k"),
		TopP:          float32(c.Float64("top-p")),
		MinP:          float32(c.Float64("min-p")),
		RepeatPenalty: float32(c.Float64("repeat-penalty")),
		RepeatLastN:   c.Int("repeat-last-n"),
	}
	if s := c.Int64("seed"); s >= 0 {
		p.Seed = uint64(s)
	} else {
		p.Seed = rand.Uint64()
	}
	slog.Debug("sampling", "params", fmt.Sprintf("%+v", p), "prompt_tokens", len(prompt))

	out := c.App.Writer
	if c.Bool("echo") {
		io.WriteString(out, text)
	}
	stream := tok.NewStream()
	var werr error
	_, st, err := generate.Run(ctx, m, prompt, generate.Options{
		MaxTokens: c.Int("max-tokens"),
		Sampler:   sample.New(p, cfg.Vocab),
		IsEOG:     tok.IsEOG,
		OnToken: func(id int32) error {
			if s := stream.Add(id); s != "" {
				_, werr = io.WriteString(out, s)
			}
			return werr
		},
	})
	io.WriteString(out, stream.Flush()+"\n")
	if errors.Is(err, context.Canceled) {
		st.Stop = "interrupted"
	} else if err != nil {
		return err
	}
	fmt.Fprintf(c.App.ErrWriter, "load %s · first token %s · prompt %d tok %.1f tok/s · decode %d tok %.1f tok/s · stop %s\n",
		round(loadTime), round(st.FirstToken), st.PromptTokens, st.PromptRate(), st.DecodeSteps, st.DecodeRate(), st.Stop)
	return nil
}

func round(d time.Duration) time.Duration {
	if d > time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(10 * time.Microsecond)
}
