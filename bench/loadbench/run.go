package loadbench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Config is a benchmark: every model × cache mode × run × strategy, each a
// fresh process, with the peer command (if any) after forge's strategies in
// every round, so slow drifts of the machine hit all of them alike. The
// host-f32 runs come after those rounds, in a block of their own: a
// process that held 31 GB on the host and the device (the 8B shape) slows
// the next process's GPU driver start by ~0.1 s after it ends (bench/
// results/2026-11-25-gpu-h100.md), which would otherwise land on whichever
// strategy follows it.
type Config struct {
	Models     []string
	Strategies []string
	Caches     []string // "warm", "cold"
	Runs       int
	// PromptLengths are the prompt lengths in tokens, each measured with
	// every strategy (a sweep such as 1,8,32,128,512 finds length cliffs).
	// The peer runs with the first length only: its command has no prompt
	// length to vary.
	PromptLengths []int
	Device        string
	Threads       int
	// Self is the command that runs one load and prints its Result as one
	// JSON line: the forge binary and its hidden subcommand
	// ("/path/forge", "bench", "load-once"). Run adds the flags.
	Self []string
	// Peer is another runtime's shell command with {model} for the model
	// path; its time to first token is when its stdout first shows output.
	Peer string
	// Trace asks each run for its per-layer spans.
	Trace bool
	// FreshKernelCache gives every forge run an empty kernel cache folder
	// of its own (FORGE_CACHE_DIR), as on a machine that never ran forge:
	// what a first run costs when no shipped object fits the device.
	FreshKernelCache bool
	// GPUUpload is the GPU uploader's settings for every forge run
	// (pipeline.UploadTuning.Parse; "": the defaults).
	GPUUpload string
	// Split is --split for every forge run: each GPU's share of the
	// layers of a model split over several ("": by free memory).
	Split string
	// ExpertProfiles is --expert-profiles for every forge run: a folder
	// of expert usage profiles each run orders its load by and adds its
	// routing to ("": none).
	ExpertProfiles string
	// Log reports progress (one line per run); nil: none.
	Log io.Writer
}

// Run runs the benchmark and returns every run's result (failed runs
// carry Err). It stops early only when ctx is done.
func Run(ctx context.Context, c Config) ([]Result, error) {
	if c.Runs <= 0 {
		c.Runs = 1
	}
	if len(c.PromptLengths) == 0 {
		c.PromptLengths = []int{32}
	}
	var out []Result
	for _, model := range c.Models {
		for li, n := range c.PromptLengths {
			ids, err := PromptIDs(model, n)
			if err != nil {
				return out, err
			}
			rs, err := runLength(ctx, c, model, ids, li == 0)
			out = append(out, rs...)
			if err != nil {
				return out, err
			}
		}
	}
	return out, nil
}

// runLength runs every cache mode's schedule for one model and prompt.
func runLength(ctx context.Context, c Config, model string, ids []int32, withPeer bool) ([]Result, error) {
	var out []Result
	for _, cache := range c.Caches {
		for _, sl := range schedule(c.Strategies, withPeer && c.Peer != "", c.Runs) {
			if err := ctx.Err(); err != nil {
				return out, err
			}
			if err := prepare(model, cache); err != nil {
				return out, err
			}
			frac, _ := CachedFraction(model)
			var r Result
			if sl.kind == "peer" {
				r = runPeer(ctx, c.Peer, model)
			} else {
				r = runSelf(ctx, c, model, sl.kind, ids)
			}
			r.Model, r.Strategy, r.Cache, r.Run, r.CachedBefore = model, sl.kind, cache, sl.run, frac
			if sl.kind != "peer" && r.PromptTokens == 0 {
				r.PromptTokens = len(ids)
			}
			if c.Log != nil {
				status := fmt.Sprintf("first token %.1f ms, resident %.1f ms, exit %.1f ms", r.FirstTokenMs, r.ResidentMs, r.ExitMs)
				if sl.kind == "peer" {
					status = fmt.Sprintf("first output %.1f ms, exit %.1f ms", r.FirstTokenMs, r.ExitMs)
				}
				if r.Err != "" {
					status = "error: " + r.Err
				}
				fmt.Fprintf(c.Log, "%s %s %s prompt %d run %d (cached %.0f%%): %s\n", model, sl.kind, cache, len(ids), sl.run, 100*frac, status)
			}
			out = append(out, r)
		}
	}
	return out, nil
}

// slot is one run of a schedule: a strategy or "peer", and its round.
type slot struct {
	run  int
	kind string
}

// schedule orders one cache mode's runs: rounds of every strategy (and the
// peer) in turn, then the host-f32 runs (see Config).
func schedule(strategies []string, peer bool, runs int) []slot {
	var rounds, last []string
	for _, s := range strategies {
		if s == "host-f32" {
			last = append(last, s)
		} else {
			rounds = append(rounds, s)
		}
	}
	if peer {
		rounds = append(rounds, "peer")
	}
	var out []slot
	for _, block := range [][]string{rounds, last} {
		for run := 1; run <= runs; run++ {
			for _, kind := range block {
				out = append(out, slot{run, kind})
			}
		}
	}
	return out
}

// prepare puts the file's page cache in the state a cache mode asks for.
func prepare(model, cache string) error {
	switch cache {
	case "warm":
		return Warm(model)
	case "cold":
		return Evict(model)
	}
	return fmt.Errorf("loadbench: cache mode %q: want warm or cold", cache)
}

// runSelf runs one load in a fresh forge process.
func runSelf(ctx context.Context, c Config, model, strategy string, ids []int32) Result {
	idList := make([]string, len(ids))
	for i, id := range ids {
		idList[i] = strconv.Itoa(int(id))
	}
	args := append(append([]string(nil), c.Self[1:]...), "-m", model, "--strategy", strategy,
		"--prompt-ids", strings.Join(idList, ","), "--device", c.Device, "--threads", strconv.Itoa(c.Threads))
	if c.Trace {
		args = append(args, "--trace")
	}
	if c.GPUUpload != "" {
		args = append(args, "--gpu-upload", c.GPUUpload)
	}
	if c.Split != "" {
		args = append(args, "--split", c.Split)
	}
	if c.ExpertProfiles != "" {
		args = append(args, "--expert-profiles", c.ExpertProfiles)
	}
	cmd := exec.CommandContext(ctx, c.Self[0], args...)
	if c.FreshKernelCache {
		dir, err := os.MkdirTemp("", "forge-bench-kernels-")
		if err != nil {
			return Result{Err: fmt.Sprintf("fresh kernel cache: %v", err)}
		}
		defer os.RemoveAll(dir)
		cmd.Env = append(os.Environ(), "FORGE_CACHE_DIR="+dir)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	fork := time.Now()
	cmd.Args = append(cmd.Args, "--fork-ns", strconv.FormatInt(fork.UnixNano(), 10))
	err := cmd.Run()
	exit := time.Since(fork)
	var r Result
	line := strings.TrimSpace(stdout.String())
	if i := strings.LastIndexByte(line, '\n'); i >= 0 {
		line = line[i+1:]
	}
	if jerr := json.Unmarshal([]byte(line), &r); jerr != nil {
		if err == nil {
			err = jerr
		}
		return Result{Err: fmt.Sprintf("%v: %s", err, strings.TrimSpace(stderr.String()))}
	}
	if err != nil && r.Err == "" {
		r.Err = fmt.Sprintf("%v: %s", err, strings.TrimSpace(stderr.String()))
	}
	r.ExitMs = float64(exit.Microseconds()) / 1000
	return r
}

// runPeer runs the peer command through sh with {model} replaced, timing
// from its start to the first bytes on its stdout and to its exit; its
// peak RSS is the kernel's rusage maxrss.
func runPeer(ctx context.Context, command, model string) Result {
	cmd := exec.CommandContext(ctx, "sh", "-c", strings.ReplaceAll(command, "{model}", shellQuote(model)))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		return Result{Err: err.Error()}
	}
	fork := time.Now()
	if err := cmd.Start(); err != nil {
		return Result{Err: err.Error()}
	}
	var first time.Duration
	br := bufio.NewReader(pipe)
	if _, err := br.ReadByte(); err == nil {
		first = time.Since(fork)
	}
	io.Copy(io.Discard, br)
	err = cmd.Wait()
	r := Result{ExitMs: float64(time.Since(fork).Microseconds()) / 1000, FirstTokenMs: float64(first.Microseconds()) / 1000}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		r.PeakRSS = ru.Maxrss << 10
	}
	if err != nil {
		r.Err = fmt.Sprintf("peer: %v: %s", err, lastLine(stderr.String()))
		slog.Debug("peer failed", "command", command, "stderr", stderr.String())
	} else if first == 0 {
		r.Err = "peer: no output on stdout"
	}
	return r
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// shellQuote quotes s for sh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
