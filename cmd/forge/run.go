package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/pipeline"
	"github.com/forge-llm/forge/pipeline/model"
	"github.com/forge-llm/forge/pipeline/sample"
)

func init() {
	d := sample.Defaults()
	commands = append(commands, &cli.Command{
		Name:      "run",
		Usage:     "generate text from a prompt",
		ArgsUsage: "[MODEL]",
		Description: "Loads the model through the prefetching pipeline with a live display of the load " +
			"on stderr, streams the continuation of the prompt to stdout as it is generated, " +
			"then prints one line of statistics to stderr. --temp 0 is greedy. Ctrl-C stops.\n\n" +
			"MODEL (or -m) is a GGUF file or a store name: an Ollama name:tag, or a Hugging Face " +
			"cache org/name[:QUANT]. The prompt is -p TEXT, -f FILE, -p - (stdin), or stdin when it " +
			"is not a terminal and neither -p nor -f is given; one trailing newline of a file or of " +
			"stdin is dropped. --json prints one JSON result object on stdout at the end instead of " +
			"streaming the text.",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "model", Aliases: []string{"m"}, Usage: "GGUF model file or store name (or give it as MODEL)"},
			&cli.StringFlag{Name: "prompt", Aliases: []string{"p"}, Usage: "prompt `TEXT` (-: read stdin)"},
			&cli.StringFlag{Name: "file", Aliases: []string{"f"}, Usage: "read the prompt from `FILE` (-: stdin)"},
			&cli.BoolFlag{Name: "json", Usage: "print one JSON result (text, token ids, stop reason, timings) on stdout at the end instead of streaming the text"},
			&cli.IntFlag{Name: "max-tokens", Aliases: []string{"n"}, Value: 256, Usage: "most tokens to generate (0: until end of text or a full context)"},
			&cli.Float64Flag{Name: "temp", Value: exactFloat(d.Temp), Usage: "temperature; 0 is greedy"},
			&cli.IntFlag{Name: "top-k", Value: d.TopK, Usage: "keep the K most likely tokens (0: off)"},
			&cli.Float64Flag{Name: "top-p", Value: exactFloat(d.TopP), Usage: "nucleus sampling threshold (1: off)"},
			&cli.Float64Flag{Name: "min-p", Value: exactFloat(d.MinP), Usage: "drop tokens below min-p × the most likely (0: off)"},
			&cli.Float64Flag{Name: "repeat-penalty", Value: exactFloat(d.RepeatPenalty), Usage: "penalty on recently seen tokens (1: off)"},
			&cli.IntFlag{Name: "repeat-last-n", Value: d.RepeatLastN, Usage: "how many recent tokens the penalty looks at"},
			&cli.Int64Flag{Name: "seed", Value: -1, Usage: "random seed (-1: random)"},
			&cli.IntFlag{Name: "ctx", Aliases: []string{"c", "ctx-size"}, Usage: "context length to allocate (0: the model's, at most 4096)"},
			&cli.IntFlag{Name: "batch", Value: model.DefaultBatch, Usage: "most prompt tokens per forward step"},
			&cli.StringFlag{Name: "device", Value: "auto", Usage: deviceUsage + " (auto: a GPU if there is one, else cpu)"},
			splitFlag(),
			&cli.StringFlag{Name: "strategy", Value: "prefetch", Usage: "load strategy: prefetch, eager, lazy or host-f32"},
			&cli.StringFlag{Name: "expert-profiles", Usage: "`DIR` of expert usage profiles (a mixture of experts): its experts load most used first, as earlier runs of the same file routed, and this run's routing is added"},
			&cli.StringFlag{Name: "progress", Value: "auto", Usage: "load display on stderr: auto (tty on a terminal, else plain), tty, plain or json"},
			&cli.IntFlag{Name: "threads", Aliases: []string{"t"}, Usage: "CPU threads (0: all cores)"},
			&cli.BoolFlag{Name: "echo", Usage: "print the prompt before the generated text"},
			&cli.BoolFlag{Name: "interactive", Aliases: []string{"i"}, Usage: "talk with the model: forge chat (--system, --chat-template)"},
			// For tests and demonstrations: a slow disk, one reader.
			&cli.StringFlag{Name: "throttle", Hidden: true, Usage: "limit reads to this many bytes per second (e.g. 2MB)"},
			&cli.IntFlag{Name: "readers", Hidden: true, Usage: "file readers (0: the pipeline's default)"},
			// For comparisons and benchmarks.
			&cli.BoolFlag{Name: "no-graph", Usage: "run every decode step op by op instead of replaying it as a GPU graph, for comparisons"},
			gpuUploadFlag(),
			gpuMMQFlag(),
			// For tests and demonstrations: a slow generation, to interrupt.
			&cli.DurationFlag{Name: "token-delay", Hidden: true, Usage: "wait this long after each generated token"},
		}, constrainFlags()...),
		Action: runCmd,
	})
	run := commands[len(commands)-1]
	run.Flags = append(run.Flags, chatFlags()...)
}

// checkDevice accepts auto, cpu, gpu and gpu:N.
func checkDevice(s string) error {
	switch {
	case s == "auto", s == "cpu", s == "gpu":
		return nil
	case strings.HasPrefix(s, "gpu:"):
		if n, err := strconv.Atoi(s[4:]); err == nil && n >= 0 {
			return nil
		}
		if deviceFlag.MatchString(s) { // gpu:N,M,… or gpu:all: a split
			return nil
		}
	}
	return usageErrorf("--device %q: want auto, cpu, gpu, gpu:N, gpu:N,M,… or gpu:all", s)
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// progressMode resolves --progress auto.
func progressMode(mode string, stderr io.Writer) string {
	if mode == "auto" {
		if isTerminal(stderr) {
			return "tty"
		}
		return "plain"
	}
	return mode
}

// throttleHook makes reads take n/rate seconds: a slow disk, so that the
// display can be watched (and tested) on small models.
func throttleHook(rate uint64) func(ctx context.Context, tensor string, off, n int64) error {
	return func(ctx context.Context, _ string, _, n int64) error {
		t := time.NewTimer(time.Duration(float64(n) / float64(rate) * float64(time.Second)))
		defer t.Stop()
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// flagOfField is the flag of each field GenerateOptions.Validate names.
var flagOfField = map[string]string{
	"temperature": "temp", "top_k": "top-k", "top_p": "top-p", "min_p": "min-p",
	"repeat_penalty": "repeat-penalty", "repeat_last_n": "repeat-last-n", "max_tokens": "max-tokens",
}

// checkGenerate range-checks the generation flags: a usage error naming
// the flag for the first value out of range.
func checkGenerate(o pipeline.GenerateOptions) error {
	err := o.Validate()
	if fe, ok := errors.AsType[*sample.FieldError](err); ok {
		name := fe.Field
		if f, ok := flagOfField[name]; ok {
			name = f
		}
		return usageErrorf("--%s %v: %s", name, fe.Value, fe.Reason)
	}
	return err
}

// intRange is one integer flag's accepted range.
type intRange struct {
	flag   string
	lo, hi int
	what   string
}

// checkInts range-checks integer flags: a usage error naming the first
// one out of range.
func checkInts(c *cli.Context, rs ...intRange) error {
	for _, r := range rs {
		if v := c.Int(r.flag); v < r.lo || v > r.hi {
			return usageErrorf("--%s %d: must be in [%d, %d] (%s)", r.flag, v, r.lo, r.hi, r.what)
		}
	}
	return nil
}

// maxThreads bounds --threads: far more than any machine's cores, small
// enough not to spawn a goroutine storm.
const maxThreads = 4096

// samplingFlags reads the sampling flags.
func samplingFlags(c *cli.Context) sample.Params {
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
	return p
}

func runCmd(c *cli.Context) error {
	ctx := c.Context
	if ctx == nil {
		ctx = context.Background()
	}
	// Ctrl-C cancels the load and the request; the partial text and the
	// statistics are still printed, then the exit status is 130 (143 for
	// SIGTERM).
	if c.Bool("interactive") {
		// A conversation handles Ctrl-C itself: it stops a reply.
		return runChat(ctx, c, "run")
	}
	ctx, sigs := watchSignals(ctx)
	defer sigs.Stop()
	err := runModel(ctx, c)
	return sigs.Err(err)
}

// runModel is forge run once its signals are watched.
func runModel(ctx context.Context, c *cli.Context) error {
	stdout, stderr := c.App.Writer, c.App.ErrWriter

	// Every flag is checked before the model is opened.
	device := c.String("device")
	if err := checkDevice(device); err != nil {
		return err
	}
	strategy, err := pipeline.ParseStrategy(c.String("strategy"))
	if err != nil {
		return usageErrorf("--strategy: %w", err)
	}
	mode := progressMode(c.String("progress"), stderr)
	// Check the mode before loading anything, without making a display:
	// a live one would start drawing.
	switch mode {
	case "tty", "plain", "json":
	default:
		return usageErrorf("--progress %q: want auto, tty, plain or json", mode)
	}
	if err := checkInts(c,
		intRange{"ctx", 0, gguf.MaxContext, "0: the model's, at most 4096"},
		intRange{"batch", 1, 1 << 16, "prompt tokens per forward step"},
		intRange{"threads", 0, maxThreads, "0: all cores"},
		intRange{"readers", 0, 1024, "0: the pipeline's default"},
	); err != nil {
		return err
	}
	if s := c.Int64("seed"); s < -1 {
		return usageErrorf("--seed %d: must be ≥ -1 (-1: random)", s)
	}
	if d := c.Duration("token-delay"); d < 0 {
		return usageErrorf("--token-delay %v: must be ≥ 0", d)
	}
	gopts := pipeline.GenerateOptions{MaxTokens: c.Int("max-tokens"), Sampling: samplingFlags(c)}
	if err := checkGenerate(gopts); err != nil {
		return err
	}
	split, err := splitShares(c)
	if err != nil {
		return err
	}
	if gopts.Grammar, err = grammarFlags(c); err != nil {
		return err
	}
	profiles, err := expertProfilesDir(c)
	if err != nil {
		return err
	}
	opts := pipeline.Options{Strategy: strategy, Device: device, Threads: c.Int("threads"),
		Ctx: c.Int("ctx"), Batch: c.Int("batch"), Readers: c.Int("readers"), Split: split, NoGraph: c.Bool("no-graph"),
		ExpertProfiles: profiles}
	if opts.Upload, err = gpuUpload(c); err != nil {
		return err
	}
	if opts.MMQ, err = gpuMMQ(c); err != nil {
		return err
	}
	if s := c.String("throttle"); s != "" {
		rate, err := parseBytes(s)
		if err != nil || rate == 0 {
			return usageErrorf("--throttle %q: want a byte rate such as 2MB", s)
		}
		opts.Hooks.Read = throttleHook(rate)
	}

	path, err := modelFlagOrArg(c, "run")
	if err != nil {
		return err
	}
	text, err := readPrompt(c)
	if err != nil {
		return err
	}
	asJSON := c.Bool("json")

	// The tensor index, for the display's totals and the layer strip.
	f, err := gguf.Open(path)
	if err != nil {
		return err
	}
	cfg, err := model.ConfigFromFile(f)
	if err != nil {
		f.Close()
		return err
	}
	li := newLoadInfo(f, cfg.Layers)
	f.Close()
	li.Path, li.Arch, li.Strategy, li.Device = path, cfg.Arch, strategy.String(), device

	m, err := pipeline.Open(ctx, path, opts)
	if err != nil {
		if strings.HasPrefix(device, "gpu") {
			return fmt.Errorf("--device %s: no GPU backend could be opened (no CUDA or HIP driver, no such device, or kernel compilation failed; --device cpu runs on the CPU): %w", device, err)
		}
		return err
	}
	defer m.Close()
	st := newStats(li)
	disp, _ := newDisplay(mode, stderr, st)
	sub := m.Subscribe()
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		for e := range sub.C {
			disp.Event(e)
		}
	}()

	var printed strings.Builder // what went to stdout, to add what a flush completes
	var werr error
	started := false
	delay := c.Duration("token-delay")
	gopts.OnToken = func(t pipeline.Token) error {
		if !started {
			started = true
			disp.Finish() // the text starts below the display
			if c.Bool("echo") && !asJSON {
				io.WriteString(stdout, text)
			}
		}
		if asJSON {
			return nil // the text comes whole, at the end
		}
		printed.WriteString(t.Text)
		if _, werr = io.WriteString(stdout, t.Text); werr != nil {
			return werr
		}
		if delay > 0 {
			t := time.NewTimer(delay)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
			}
		}
		return nil
	}
	if c.String("system") != "" || c.String("chat-template") != "" {
		// The prompt is a user turn of a conversation (chat.go).
		if gopts.PromptIDs, err = chatTurn(ctx, c, m, text); err != nil {
			m.Close()
			<-drained
			disp.Finish()
			return err
		}
	}
	res, err := m.Generate(ctx, text, gopts)
	stop := res.Stop
	if errors.Is(err, context.Canceled) {
		stop = "interrupted"
	} else if err != nil {
		m.Close()
		<-drained
		disp.Finish()
		if _, ok := errors.AsType[*pipeline.DeviceError](err); ok && strings.HasPrefix(device, "gpu") {
			// The device opens in the background: its failure comes here.
			return fmt.Errorf("--device %s: no GPU backend could be opened (no CUDA or HIP driver, no such device, or kernel compilation failed; --device cpu runs on the CPU): %w", device, err)
		}
		return err
	}
	disp.Finish()
	if !asJSON {
		if !started && c.Bool("echo") {
			io.WriteString(stdout, text)
		}
		// A multi-byte character cut at the end is only in the final text.
		if rest, ok := strings.CutPrefix(res.Text, printed.String()); ok {
			io.WriteString(stdout, rest)
		}
		io.WriteString(stdout, "\n")
	}
	st.devicePeak = m.Memory().Peak()
	m.Close() // ends the subscription once every event is delivered
	<-drained
	disp.Close(stop)
	if asJSON {
		if jerr := writeRunJSON(stdout, path, res, stop, st); jerr != nil {
			return jerr
		}
	}
	if stop == "interrupted" {
		return err // a signal's exit status, or the cancellation of the caller's context
	}
	return nil
}

// parseBytes reads "2MB", "512KiB", "1000".
func parseBytes(s string) (uint64, error) {
	return humanizeParse(s)
}
