package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/forge-llm/forge/bench/servebench"
	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/pipeline/tokenizer"
)

// benchServeCommand is `forge bench serve`: a load generator for
// OpenAI-compatible servers, forge serve (started here or running) and
// peers such as llama-server measured in the same run.
func benchServeCommand() *cli.Command {
	return &cli.Command{
		Name:      "serve",
		Usage:     "measure an OpenAI-compatible server under concurrent clients: tokens/s, first token, inter-token gaps",
		ArgsUsage: " ",
		Description: "By default it starts `forge serve` (this binary) on a free loopback port with the -m models " +
			"and waits until they are resident; --url measures a server that already runs instead. --peer-url adds " +
			"other servers (llama-server, vLLM), measured in the same run with byte-identical prompts, the targets' " +
			"order rotated at every client count. Requests are streaming /v1/completions, greedy, with ignore_eos so " +
			"every answer is --max-tokens long. --turns holds multi-turn conversations that resend their history; " +
			"--swap alternates one-token requests between two models under --budget.",
		Flags: []cli.Flag{
			&cli.StringSliceFlag{Name: "model", Aliases: []string{"m"}, Usage: "model for forge serve: PATH, store NAME or ID=PATH (repeat for several; with --url, the models to request, by the id forge serve would give them)"},
			&cli.StringFlag{Name: "clients", Value: "1,4,16,64", Usage: "concurrent clients per step, comma-separated"},
			&cli.IntFlag{Name: "prompt-tokens", Value: 32, Usage: "prompt length in tokens (calibrated where a tokenizer is at hand)"},
			&cli.IntFlag{Name: "max-tokens", Value: 128, Usage: "tokens generated per request"},
			&cli.IntFlag{Name: "requests-per-client", Value: 4, Usage: "requests each client sends in a step (--swap: rounds; --turns: conversations, one after the other)"},
			&cli.DurationFlag{Name: "duration", Usage: "instead of --requests-per-client: each client keeps sending for this long"},
			&cli.StringFlag{Name: "url", Usage: "measure this running server (`[NAME=]URL`) instead of starting forge serve"},
			&cli.StringSliceFlag{Name: "peer-url", Usage: "another server to measure in the same run, `[NAME=]URL` (repeatable)"},
			&cli.StringFlag{Name: "peer-api", Value: "openai", Usage: "how to talk to the peers: openai (streaming /v1/completions) or llama (llama-server's own /completion, for outputs its OpenAI stream refuses)"},
			&cli.BoolFlag{Name: "json", Usage: "print every request and the summary as JSON instead of the table"},
			&cli.StringFlag{Name: "svg", Usage: "write a chart of tokens/s by clients per target (--swap: first token per swap) to this `FILE`"},
			&cli.IntFlag{Name: "turns", Usage: "hold conversations of this many turns, each resending the history"},
			&cli.IntFlag{Name: "history-tokens", Value: 2000, Usage: "--turns: the shared history sent with turn 1"},
			&cli.IntFlag{Name: "turn-tokens", Value: 32, Usage: "--turns: new tokens each turn adds"},
			&cli.BoolFlag{Name: "swap", Usage: "alternate one-token requests between two models (give --budget room for one)"},
			&cli.IntFlag{Name: "warmup", Value: 1, Usage: "unmeasured requests to each target and model first"},
			&cli.Uint64Flag{Name: "seed", Value: 1, Usage: "seed of the prompts' words"},
			&cli.DurationFlag{Name: "request-timeout", Value: 5 * time.Minute, Usage: "limit on one request"},
			&cli.DurationFlag{Name: "ready-timeout", Value: 10 * time.Minute, Usage: "how long forge serve may take to load the models"},
			&cli.StringFlag{Name: "device", Value: "auto", Usage: "forge serve: auto or cpu"},
			&cli.IntFlag{Name: "threads", Aliases: []string{"t"}, Usage: "forge serve: CPU threads (0: every core)"},
			&cli.IntFlag{Name: "ctx", Usage: "forge serve: KV cache positions per model"},
			&cli.StringFlag{Name: "budget", Usage: "forge serve: memory budget for all loaded models, e.g. 8GiB"},
			&cli.StringSliceFlag{Name: "serve-flag", Usage: "forge serve: one more flag to pass on as it is, e.g. --serve-flag=--batch-seqs=64 (repeatable)"},
		},
		Action: benchServeCmd,
	}
}

// namedURL splits "[NAME=]URL"; the name defaults to the URL's host.
func namedURL(s string) (name, u string, err error) {
	if n, rest, ok := strings.Cut(s, "="); ok && !strings.Contains(n, "://") && !strings.Contains(n, "/") {
		name, s = n, rest
	}
	p, err := url.Parse(s)
	if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
		return "", "", fmt.Errorf("%q is not an http(s) URL", s)
	}
	if name == "" {
		name = p.Host
	}
	return name, strings.TrimSuffix(strings.TrimSuffix(s, "/"), "/v1"), nil
}

func parseClients(s string) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("--clients %q: %q is not a positive count", s, f)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--clients: none given")
	}
	return out, nil
}

func benchServeCmd(c *cli.Context) error {
	ctx := c.Context
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	if c.NArg() > 0 {
		return fmt.Errorf("bench serve: unexpected arguments %q", c.Args().Slice())
	}
	log := slog.Default()
	clients, err := parseClients(c.String("clients"))
	if err != nil {
		return err
	}
	models := c.StringSlice("model")
	self := c.String("url") == ""
	if self && len(models) == 0 {
		return errors.New("bench serve: give -m MODEL for forge serve to load, or --url of a running server")
	}
	if c.Bool("swap") && len(models) != 2 {
		return fmt.Errorf("bench serve: --swap needs two -m models, %d given", len(models))
	}
	if c.IsSet("duration") && c.IsSet("requests-per-client") {
		return errors.New("bench serve: --duration and --requests-per-client exclude each other")
	}
	if n := c.Int("requests-per-client"); n <= 0 {
		return fmt.Errorf("--requests-per-client %d: must be positive", n)
	}
	for _, f := range []string{"prompt-tokens", "max-tokens", "history-tokens", "turn-tokens"} {
		if c.Int(f) <= 0 {
			return fmt.Errorf("--%s %d: must be positive", f, c.Int(f))
		}
	}
	if api := c.String("peer-api"); api != "openai" && api != "llama" {
		return fmt.Errorf("--peer-api %q: want openai or llama", api)
	}
	if c.Int("turns") < 0 {
		return fmt.Errorf("--turns %d: must not be negative", c.Int("turns"))
	}
	if c.Bool("swap") && c.Int("turns") > 0 {
		return errors.New("bench serve: --swap and --turns are separate runs")
	}
	if self {
		if err := checkDevice(c.String("device")); err != nil {
			return err
		}
	}
	// Every URL is checked before forge serve starts.
	type peer struct{ name, url string }
	var peers []peer
	for _, p := range c.StringSlice("peer-url") {
		name, u, err := namedURL(p)
		if err != nil {
			return fmt.Errorf("--peer-url: %w", err)
		}
		peers = append(peers, peer{name, u})
	}
	if !self {
		if _, _, err := namedURL(c.String("url")); err != nil {
			return fmt.Errorf("--url: %w", err)
		}
	}

	maxClients := slices.Max(clients)
	tr := &http.Transport{MaxIdleConnsPerHost: maxClients + 4, DisableCompression: true}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}

	var targets []servebench.Target
	var primary servebench.Target
	if self {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("bench serve: finding this program to run forge serve: %w", err)
		}
		argv := []string{exe, "serve", "--addr", "127.0.0.1:0", "--device", c.String("device")}
		for _, f := range []string{"threads", "ctx"} {
			if c.IsSet(f) {
				argv = append(argv, "--"+f, strconv.Itoa(c.Int(f)))
			}
		}
		if c.IsSet("budget") {
			argv = append(argv, "--budget", c.String("budget"))
		}
		argv = append(argv, c.StringSlice("serve-flag")...)
		var ids []string
		for _, m := range models {
			argv = append(argv, "-m", m)
			ids = append(ids, parseModelArg(m).id)
		}
		log.Info("starting forge serve", "models", ids)
		rctx, cancel := context.WithTimeout(ctx, c.Duration("ready-timeout"))
		srv, err := servebench.StartServer(rctx, hc, argv, nil, ids, c.Bool("swap"))
		cancel()
		if err != nil {
			return err
		}
		defer func() {
			if serr := srv.Stop(); serr != nil {
				log.Error("stopping forge serve", "err", serr)
			}
		}()
		primary = servebench.Target{Name: "forge", URL: srv.URL, Models: ids}
	} else {
		name, u, err := namedURL(c.String("url"))
		if err != nil {
			return fmt.Errorf("--url: %w", err)
		}
		primary = servebench.Target{Name: name, URL: u}
		for _, m := range models { // the ids the server knows them by
			primary.Models = append(primary.Models, parseModelArg(m).id)
		}
	}
	targets = append(targets, primary)
	for _, p := range peers {
		name, u := p.name, p.url
		for slices.ContainsFunc(targets, func(t servebench.Target) bool { return t.Name == name }) {
			name += "'"
		}
		hctx, cancel := context.WithTimeout(ctx, c.Duration("ready-timeout"))
		err := servebench.WaitLoading(hctx, hc, u)
		cancel()
		if err != nil {
			return fmt.Errorf("--peer-url %s: %w", name, err)
		}
		t := servebench.Target{Name: name, URL: u, Models: peerModels(ctx, hc, u, primary.Models, c.Bool("swap"))}
		if c.String("peer-api") == "llama" {
			t.API = "llama"
		}
		if c.Bool("swap") && len(t.Models) < 2 {
			return fmt.Errorf("--peer-url %s: --swap needs two models and its /v1/models lists fewer", name)
		}
		log.Info("peer", "name", name, "url", u, "models", t.Models)
		targets = append(targets, t)
	}

	cal := calibrate(ctx, hc, c.Uint64("seed"), self, models, targets, log)
	cfg := servebench.Config{
		Targets: targets, Clients: clients, PromptTokens: c.Int("prompt-tokens"), MaxTokens: c.Int("max-tokens"),
		RequestsPerClient: c.Int("requests-per-client"), Duration: c.Duration("duration"),
		RequestTimeout: c.Duration("request-timeout"), Warmup: c.Int("warmup"),
		Prompter: servebench.Prompter{Seed: c.Uint64("seed"), WordsPerToken: cal.WordsPerToken},
		Turns:    c.Int("turns"), HistoryTokens: c.Int("history-tokens"), TurnTokens: c.Int("turn-tokens"),
		Swap: c.Bool("swap"), Client: hc, Log: log,
	}
	if c.IsSet("duration") {
		cfg.RequestsPerClient = 0
	}
	rep, runErr := servebench.Run(ctx, cfg)
	if rep == nil {
		return fmt.Errorf("bench serve: %w", runErr)
	}
	// Interrupted: what was measured is still printed, then the error.
	rep.Calibration = cal
	if f := c.String("svg"); f != "" {
		if err := writeFileWith(f, func(fl *os.File) error { return servebench.WriteSVG(fl, rep) }); err != nil {
			return fmt.Errorf("--svg: %w", err)
		}
	}
	stdout := c.App.Writer
	if c.Bool("json") {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		out := map[string]any{"report": rep, "prompt_tokens": cfg.PromptTokens, "max_tokens": cfg.MaxTokens,
			"clients": clients, "requests_per_client": cfg.RequestsPerClient, "duration_s": cfg.Duration.Seconds(), "seed": cfg.Prompter.Seed}
		if cfg.Turns > 0 {
			out["turns"], out["history_tokens"], out["turn_tokens"] = cfg.Turns, cfg.HistoryTokens, cfg.TurnTokens
		}
		if err := enc.Encode(out); err != nil {
			return err
		}
	} else if err := servebench.WriteTable(stdout, rep); err != nil {
		return err
	}
	if runErr != nil {
		return fmt.Errorf("bench serve: stopped early: %w", runErr)
	}
	if failed := rep.AllFailed(); len(failed) > 0 {
		return fmt.Errorf("bench serve: every request failed on %s", strings.Join(failed, ", "))
	}
	return nil
}

// writeFileWith creates path and writes it with fn, closing it either way.
func writeFileWith(path string, fn func(*os.File) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := fn(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// peerModels are the model ids to send a peer: those its /v1/models lists
// (the first, or the first two for --swap), else the primary target's
// ids (llama-server answers whatever model is named) — but not for --swap,
// where a server that lists one model has nothing to swap.
func peerModels(ctx context.Context, hc *http.Client, base string, fallback []string, swap bool) []string {
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	want := 1
	if swap {
		want = 2
	}
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := getJSONURL(lctx, hc, base+"/v1/models", &list); err != nil || len(list.Data) < want {
		if swap {
			return nil
		}
		return fallback
	}
	var ids []string
	for _, m := range list.Data[:want] {
		ids = append(ids, m.ID)
	}
	return ids
}

func getJSONURL(ctx context.Context, hc *http.Client, u string, v any) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, fmt.Errorf("GET %s: HTTP %d", u, resp.StatusCode)
	}
	return resp.StatusCode, json.NewDecoder(resp.Body).Decode(v)
}

// calibrate measures words per token for the prompts: with the first
// model's own tokenizer when forge serve runs it from a local file, else
// through the first target with a /tokenize endpoint (llama-server has
// one), else it assumes a token a word and says so.
func calibrate(ctx context.Context, hc *http.Client, seed uint64, self bool, models []string, targets []servebench.Target, log *slog.Logger) servebench.Calibration {
	if self && len(models) > 0 {
		path := parseModelArg(models[0]).name
		if st, err := os.Stat(path); err == nil && st.Mode().IsRegular() {
			cal, err := servebench.Calibrate(seed, 512, "the local tokenizer of "+path, func(text string) (int, error) {
				f, err := gguf.Open(path)
				if err != nil {
					return 0, err
				}
				tok, err := tokenizer.FromFile(f)
				f.Close()
				if err != nil {
					return 0, err
				}
				ids, err := tok.Encode(text, tokenizer.EncodeOptions{})
				return len(ids), err
			})
			if err == nil {
				return cal
			}
			log.Warn("calibrating prompts", "err", err)
		}
	}
	for _, t := range targets {
		tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		cal, err := servebench.Calibrate(seed, 512, t.Name+" /tokenize", servebench.TokenCounter(tctx, hc, t.URL))
		cancel()
		if err == nil {
			return cal
		}
		log.Debug("no /tokenize to calibrate with", "target", t.Name, "err", err)
	}
	return servebench.Calibration{Source: "none", WordsPerToken: 1}
}
