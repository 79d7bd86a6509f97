package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/forge-llm/forge/pipeline"
	"github.com/urfave/cli/v2"
)

func init() {
	commands = append(commands, &cli.Command{
		Name:  "serve",
		Usage: "serve models over an OpenAI-compatible HTTP API",
		Description: `Serves /v1/chat/completions, /v1/completions and /v1/models (streaming with
server-sent events when "stream": true), /forge/load?model=ID (load progress
as server-sent events), /forge/status and /health. Models named with -m are
loaded at start; any other model a request names (a file path, an Ollama name
or a Hugging Face cache name) is loaded on first use. Listens on loopback
unless --addr says otherwise.`,
		ArgsUsage: " ",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "addr", Value: "127.0.0.1:8080", Usage: "listen address HOST:PORT (port 0: any free port)"},
			&cli.StringSliceFlag{Name: "model", Aliases: []string{"m"}, Usage: "model to load at start: PATH, store NAME, or ID=PATH (repeatable)"},
			&cli.StringFlag{Name: "keep-alive", Value: "5m", Usage: "how long an idle model stays loaded (0: unload when idle, negative: forever)"},
			&cli.StringFlag{Name: "budget", Usage: "memory budget for all loaded models, e.g. 8GiB (empty: none); least recently used idle models are evicted"},
			&cli.DurationFlag{Name: "grace", Value: 10 * time.Second, Usage: "on shutdown, how long in-flight requests may finish before they are cancelled"},
			&cli.StringFlag{Name: "device", Value: "auto", Usage: "auto or cpu"},
			&cli.IntFlag{Name: "threads", Usage: "CPU worker threads (0: every core)"},
			&cli.IntFlag{Name: "ctx", Usage: "KV cache positions per model (0: the model's, at most 4096)"},
			&cli.IntFlag{Name: "batch-seqs", Usage: "requests per model run together by continuous batching (0: 8)"},
			&cli.IntFlag{Name: "kv-blocks", Usage: "KV pool blocks of 16 positions per model (0: enough for batch-seqs/4 full contexts, at least 2)"},
			&cli.BoolFlag{Name: "single-sequence", Usage: "run each model's requests one at a time instead of batching them"},
		},
		Action: serveAction,
	})
}

// serveConfig is what serve runs with, parsed from its flags.
type serveConfig struct {
	addr   string
	models []modelArg
	engine pipeline.EngineOptions
	grace  time.Duration
}

// modelArg is one -m: the id clients use and the name the engine resolves.
type modelArg struct{ id, name string }

func parseModelArg(s string) modelArg {
	if id, name, ok := strings.Cut(s, "="); ok && id != "" && name != "" {
		return modelArg{id: id, name: name}
	}
	return modelArg{id: modelID(s), name: s}
}

// modelID is the id of a model given by path: its file name without
// .gguf; a store name is its own id.
func modelID(name string) string {
	if strings.HasSuffix(strings.ToLower(name), ".gguf") {
		return strings.TrimSuffix(filepath.Base(name), filepath.Ext(name))
	}
	return name
}

// parseKeepAlive reads a duration ("5m", "0", "-1"); a bare number is
// seconds, as in Ollama.
func parseKeepAlive(s string) (time.Duration, error) {
	if d, err := time.ParseDuration(s); err == nil {
		return d, nil
	}
	var n int64
	if _, err := fmt.Sscan(s, &n); err == nil {
		return time.Duration(n) * time.Second, nil
	}
	return 0, fmt.Errorf("--keep-alive %q: not a duration (5m, 30s, 0, -1)", s)
}

func serveAction(c *cli.Context) error {
	if c.NArg() > 0 {
		return fmt.Errorf("serve: unexpected arguments %q (name models with -m)", c.Args().Slice())
	}
	keep, err := parseKeepAlive(c.String("keep-alive"))
	if err != nil {
		return err
	}
	cfg := serveConfig{addr: c.String("addr"), grace: c.Duration("grace")}
	cfg.engine = pipeline.EngineOptions{
		KeepAlive: &keep,
		Open: pipeline.Options{Device: c.String("device"), Threads: c.Int("threads"), Ctx: c.Int("ctx"),
			Batching: pipeline.Batching{Seqs: c.Int("batch-seqs"), Blocks: c.Int("kv-blocks")}},
		SingleSequence: c.Bool("single-sequence"),
	}
	if b := c.String("budget"); b != "" {
		n, err := humanize.ParseBytes(b)
		if err != nil {
			return fmt.Errorf("--budget %q: %w", b, err)
		}
		cfg.engine.Budget = int64(n)
	}
	for _, m := range c.StringSlice("model") {
		cfg.models = append(cfg.models, parseModelArg(m))
	}
	ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	return serve(ctx, ln, cfg, slog.Default())
}

// serve runs the API on ln until ctx is done, then shuts down: it stops
// accepting, lets in-flight requests finish for the grace period, cancels
// the rest and unloads every model.
func serve(ctx context.Context, ln net.Listener, cfg serveConfig, log *slog.Logger) error {
	cfg.engine.Logger = log
	eng := pipeline.NewEngine(cfg.engine)
	s := newServer(eng, log)
	for _, m := range cfg.models {
		if err := eng.Add(m.id, m.name); err != nil {
			eng.Close()
			ln.Close()
			return err
		}
		s.defaultModel = cmp(s.defaultModel, m.id)
	}
	// Models named on the command line load now, in the background;
	// requests for them wait for what they need.
	loadCtx, cancelLoads := context.WithCancel(ctx)
	var loads sync.WaitGroup
	defer loads.Wait()
	defer cancelLoads()
	for _, m := range cfg.models {
		loads.Go(func() {
			l, err := eng.Acquire(loadCtx, m.id)
			if err != nil {
				if loadCtx.Err() == nil {
					log.Error("loading model", "model", m.id, "err", err)
				}
				return
			}
			l.Release()
		})
	}

	hs := &http.Server{Handler: s.handler(), ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	log.Info("forge serve listening", "addr", ln.Addr().String(), "models", len(cfg.models))

	select {
	case err := <-errc:
		eng.Close()
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down", "grace", cfg.grace)
	sctx, cancel := context.WithTimeout(context.Background(), cfg.grace)
	defer cancel()
	err := hs.Shutdown(sctx)
	if errors.Is(err, context.DeadlineExceeded) {
		log.Warn("grace period over: cancelling in-flight requests")
		err = nil
	}
	// Closing the engine cancels what is still running; then the
	// handlers return and the connections close.
	eng.Close()
	hs.Close()
	<-errc
	return err
}

// cmp returns a if set, else b.
func cmp(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
