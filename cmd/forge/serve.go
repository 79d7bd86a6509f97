package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/pipeline"
	"github.com/urfave/cli/v2"
)

func init() {
	commands = append(commands, &cli.Command{
		Name:  "serve",
		Usage: "serve models over an OpenAI-compatible HTTP API",
		Description: `Serves /v1/chat/completions, /v1/completions and /v1/models (streaming with
server-sent events when "stream": true), POST /forge/load (load progress as
server-sent events), /forge/status and /health, and Ollama's /api/* routes
(version, tags, show, ps, generate, chat). Models named with -m are
opened at start (serve exits if one cannot be); a request may also name a
model of the Ollama store or the Hugging Face cache, loaded on first use, and
a file path only under an --allow-paths directory. Listens on loopback unless
--addr says otherwise; --api-key (or FORGE_API_KEY) requires a bearer token.`,
		ArgsUsage: " ",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "addr", Value: "127.0.0.1:8080", Usage: "listen address HOST:PORT (port 0: any free port)"},
			&cli.StringFlag{Name: "host", Usage: "listen host (default 127.0.0.1), with --port instead of --addr"},
			&cli.IntFlag{Name: "port", Usage: "listen port (default 8080; 0: any free port), with --host instead of --addr"},
			&cli.StringSliceFlag{Name: "model", Aliases: []string{"m"}, Usage: "model to load at start: PATH, store NAME, or ID=PATH (repeatable)"},
			&cli.StringFlag{Name: "keep-alive", Value: "5m", Usage: "how long an idle model stays loaded (0: unload when idle, negative: forever)"},
			&cli.StringFlag{Name: "budget", Usage: "memory budget for all loaded models, e.g. 8GiB (empty: none); least recently used idle models are evicted"},
			&cli.DurationFlag{Name: "grace", Value: 10 * time.Second, Usage: "on shutdown, how long in-flight requests may finish before they are cancelled"},
			&cli.StringFlag{Name: "device", Value: "auto", Usage: deviceUsage + "; a split model runs its requests one at a time"},
			splitFlag(),
			&cli.IntFlag{Name: "threads", Aliases: []string{"t"}, Usage: "CPU worker threads (0: every core)"},
			&cli.IntFlag{Name: "ctx", Aliases: []string{"c", "ctx-size"}, Usage: "KV cache positions per model (0: the model's, at most 4096)"},
			&cli.StringFlag{Name: "api-key", EnvVars: []string{"FORGE_API_KEY"}, Usage: "require Authorization: Bearer KEY on every route but /health"},
			&cli.StringSliceFlag{Name: "allow-origin", Usage: "browser Origin allowed besides loopback and the --addr host, e.g. https://app.example (repeatable; * for any)"},
			&cli.StringSliceFlag{Name: "allow-paths", Usage: "directory whose GGUF files requests may name by path (repeatable; default: none)"},
			&cli.StringFlag{Name: "max-prompt-bytes", Value: "1MiB", Usage: "largest prompt (a chat's contents together) accepted, checked before tokenizing"},
			&cli.DurationFlag{Name: "read-timeout", Value: time.Minute, Usage: "longest time to read a request, body included"},
			&cli.DurationFlag{Name: "write-timeout", Value: time.Minute, Usage: "longest time one write to a client may block (a stream may run longer)"},
			&cli.DurationFlag{Name: "idle-timeout", Value: 2 * time.Minute, Usage: "how long an idle keep-alive connection stays open"},
			&cli.StringFlag{Name: "pin-files", Value: "auto", Usage: "host memory for keeping served model files registered with the GPU between loads, so a model swapped back in copies at the link's rate (0: none; auto: a quarter of the host's memory, or none when exactly one --model is served)"},
			&cli.IntFlag{Name: "batch-seqs", Usage: "requests per model run together by continuous batching (0: 16; at most 64); on a GPU, batching is on only when this is given"},
			&cli.IntFlag{Name: "kv-blocks", Usage: "KV pool blocks of 16 positions per model (0: enough for batch-seqs/4 full contexts, at least 2)"},
			&cli.BoolFlag{Name: "single-sequence", Usage: "run each model's requests one at a time instead of batching them"},
			&cli.StringFlag{Name: "expert-profiles", Usage: "`DIR` of expert usage profiles (a mixture of experts): its experts load most used first, as earlier runs of the same file routed, and each model adds its requests' routing (batched or not) when it is unloaded"},
			gpuUploadFlag(),
			gpuMMQFlag(),
			&cli.StringSliceFlag{Name: "chat-template", Usage: "chat template: chatml, llama2, llama3, mistral, or a FILE holding a template, for every model, or ID=NAME|FILE for the -m model ID (repeatable; default: each model's own, else chatml)"},
			&cli.BoolFlag{Name: "deterministic", Usage: "no KV prefix shared between requests, so that a request gives the same tokens alone or among others on a GPU too"},
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

	apiKey       string
	allowOrigins []string
	allowPaths   []string
	maxPrompt    int64 // 0: DefaultMaxPrompt
	// chatTemplate is --chat-template ("": each model's own);
	// modelTemplates are the ID=NAME|FILE ones (serve_templates.go).
	chatTemplate   string
	modelTemplates map[string]string
	// Timeouts; 0 takes the flags' defaults.
	readTimeout, writeTimeout, idleTimeout time.Duration
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
	if err := checkServeFlags(c); err != nil {
		return err
	}
	split, err := splitShares(c)
	if err != nil {
		return err
	}
	addr, err := serveAddr(c)
	if err != nil {
		return err
	}
	cfg := serveConfig{
		addr: addr, grace: c.Duration("grace"),
		apiKey: c.String("api-key"), allowOrigins: c.StringSlice("allow-origin"), allowPaths: c.StringSlice("allow-paths"),
		readTimeout: c.Duration("read-timeout"), writeTimeout: c.Duration("write-timeout"), idleTimeout: c.Duration("idle-timeout"),
	}
	mp, err := humanize.ParseBytes(c.String("max-prompt-bytes"))
	if err != nil || mp == 0 || mp > 1<<30 {
		return fmt.Errorf("--max-prompt-bytes %q: want a size in [1, 1GiB]", c.String("max-prompt-bytes"))
	}
	cfg.maxPrompt = int64(mp)
	cfg.engine = pipeline.EngineOptions{
		KeepAlive: &keep,
		Open: pipeline.Options{Device: c.String("device"), Split: split, Threads: c.Int("threads"), Ctx: c.Int("ctx"),
			Batching:       pipeline.Batching{Seqs: c.Int("batch-seqs"), Blocks: c.Int("kv-blocks"), Deterministic: c.Bool("deterministic"), GPU: c.IsSet("batch-seqs")},
			ExpertProfiles: c.String("expert-profiles")},
		SingleSequence: c.Bool("single-sequence"),
	}
	if cfg.engine.Open.Upload, err = gpuUpload(c); err != nil {
		return err
	}
	if cfg.engine.Open.MMQ, err = gpuMMQ(c); err != nil {
		return err
	}
	if b := c.String("budget"); b != "" {
		n, err := humanize.ParseBytes(b)
		if err != nil || n > 1<<62 {
			return fmt.Errorf("--budget %q: not a size", b)
		}
		cfg.engine.Budget = int64(n)
	}
	if cfg.engine.PinFiles, err = pinFilesFlag(c.String("pin-files"), len(c.StringSlice("model"))); err != nil {
		return err
	}
	for _, m := range c.StringSlice("model") {
		cfg.models = append(cfg.models, parseModelArg(m))
	}
	if cfg.chatTemplate, cfg.modelTemplates, err = splitTemplates(c.StringSlice("chat-template"), cfg.models); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	return serve(ctx, ln, cfg, slog.Default())
}

// deviceFlag is what --device takes.
var deviceFlag = regexp.MustCompile(`^(auto|cpu|gpu(:([0-9]{1,3}(,[0-9]{1,3})*|all))?)$`)

// checkServeFlags range-checks the numeric and enumerated flags.
func checkServeFlags(c *cli.Context) error {
	switch {
	case !deviceFlag.MatchString(c.String("device")):
		return fmt.Errorf("--device %q: want auto, cpu, gpu, gpu:N, gpu:N,M,… or gpu:all", c.String("device"))
	case c.IsSet("batch-seqs") && (strings.Contains(c.String("device"), ",") || c.String("device") == "gpu:all"):
		return fmt.Errorf("--batch-seqs with --device %s: continuous batching runs on one device; a model split over several runs its requests one at a time", c.String("device"))
	case c.Int("threads") < 0 || c.Int("threads") > 4096:
		return fmt.Errorf("--threads %d: want 0 (every core) to 4096", c.Int("threads"))
	case c.Int("ctx") < 0 || c.Int("ctx") > 1<<24:
		return fmt.Errorf("--ctx %d: want 0 (the model's) to %d", c.Int("ctx"), 1<<24)
	case c.Duration("grace") < 0:
		return fmt.Errorf("--grace %s: must not be negative", c.Duration("grace"))
	case c.Int("batch-seqs") < 0 || c.Int("batch-seqs") > kernels.MaxBatchRows:
		return fmt.Errorf("--batch-seqs %d: want 0 (the default, 16) to %d", c.Int("batch-seqs"), kernels.MaxBatchRows)
	case c.IsSet("batch-seqs") && c.Bool("single-sequence"):
		return fmt.Errorf("--batch-seqs and --single-sequence exclude each other")
	case c.Int("kv-blocks") < 0 || c.Int("kv-blocks") > 1<<24:
		return fmt.Errorf("--kv-blocks %d: want 0 (sized from --batch-seqs) to %d", c.Int("kv-blocks"), 1<<24)
	}
	if _, err := expertProfilesDir(c); err != nil {
		return err
	}
	for _, f := range []string{"read-timeout", "write-timeout", "idle-timeout"} {
		if c.Duration(f) <= 0 {
			return fmt.Errorf("--%s %s: must be positive", f, c.Duration(f))
		}
	}
	return nil
}

// serve runs the API on ln until ctx is done, then shuts down: it stops
// accepting, lets in-flight requests finish for the grace period, cancels
// the rest and unloads every model. A -m model that cannot be opened is
// an error before anything is served.
func serve(ctx context.Context, ln net.Listener, cfg serveConfig, log *slog.Logger) error {
	cfg.engine.Logger = log
	policy, err := newModelPolicy(cfg.models, cfg.allowPaths, cfg.engine.Resolve)
	if err != nil {
		ln.Close()
		return fmt.Errorf("serve: %w", err)
	}
	cfg.engine.Resolve = policy.Resolve
	eng := pipeline.NewEngine(cfg.engine)
	s := newServer(eng, log, cfg.maxPrompt)
	s.writeTimeout = cmpDur(cfg.writeTimeout, time.Minute)
	if cfg.chatTemplate != "" {
		if s.template, err = loadChatTemplate(cfg.chatTemplate); err != nil {
			eng.Close()
			ln.Close()
			return fmt.Errorf("serve: %w", err)
		}
	}
	if s.modelTemplates, err = loadModelTemplates(cfg.modelTemplates); err != nil {
		eng.Close()
		ln.Close()
		return fmt.Errorf("serve: %w", err)
	}
	for _, m := range cfg.models {
		if err := eng.Add(m.id, m.name); err != nil {
			eng.Close()
			ln.Close()
			return err
		}
		s.pinned[m.id] = true
		s.defaultModel = cmp(s.defaultModel, m.id)
	}
	// Models named on the command line are opened now (their weights
	// then stream in while requests wait for what they need): one that
	// cannot be opened stops serve with the reason.
	for _, m := range cfg.models {
		l, err := eng.Acquire(ctx, m.id)
		if err == nil {
			err = l.WaitDevice(ctx)
			l.Release()
		}
		if err != nil {
			eng.Close()
			ln.Close()
			return fmt.Errorf("serve: model %q (-m %s): %w", m.id, m.name, err)
		}
	}
	acc := newAccess(ln.Addr().String(), cfg.apiKey, cfg.allowOrigins)
	if cfg.apiKey == "" {
		if tcp, ok := ln.Addr().(*net.TCPAddr); ok && !tcp.IP.IsLoopback() {
			log.Warn("listening off loopback without --api-key: anyone who can reach this address can use every model", "addr", ln.Addr().String())
		}
	}

	hs := &http.Server{
		Handler:           s.counted(ollamaShape(s.wrap(acc, s.handler()))),
		ReadHeaderTimeout: min(10*time.Second, cmpDur(cfg.readTimeout, time.Minute)),
		ReadTimeout:       cmpDur(cfg.readTimeout, time.Minute),
		IdleTimeout:       cmpDur(cfg.idleTimeout, 2*time.Minute),
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
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
	err = hs.Shutdown(sctx)
	if errors.Is(err, context.DeadlineExceeded) {
		log.Warn("grace period over: cancelling in-flight requests")
		err = nil
	}
	// Closing the engine cancels what is still running or queued; the
	// handlers answer 503 shutting_down (each write bounded by the write
	// timeout), then the connections close.
	eng.Close()
	answered := make(chan struct{})
	go func() { s.inflight.Wait(); close(answered) }()
	select {
	case <-answered:
	case <-time.After(s.writeTimeout):
	}
	hs.Close()
	<-errc
	<-answered
	return err
}

// cmpDur returns d if set, else def.
func cmpDur(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// cmp returns a if set, else b.
func cmp(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// expertProfilesDir is --expert-profiles checked: a folder, or a path
// where one can be made (its profiles are written when models close, so a
// regular file there is refused now rather than logged then).
func expertProfilesDir(c *cli.Context) (string, error) {
	dir := c.String("expert-profiles")
	if dir == "" {
		return "", nil
	}
	if st, err := os.Stat(dir); err == nil && !st.IsDir() {
		return "", fmt.Errorf("--expert-profiles %s: not a directory", dir)
	}
	return dir, nil
}
