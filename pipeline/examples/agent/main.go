// Command agent shows a program embedding forge's pipeline API: it opens a
// model (Open returns once the metadata is parsed; weights keep streaming),
// reports loading progress as JSON lines on stderr, and answers each line
// of stdin with a streamed completion on stdout. The first answer starts
// as soon as the embedding and LM head are resident, while later layers
// are still loading.
//
//	go run ./pipeline/examples/agent -model gguf/testdata/stories260K-F32.gguf <<< "Once upon a time"
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"

	"github.com/forge-llm/forge/pipeline"
	"github.com/forge-llm/forge/pipeline/sample"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "agent:", err)
		os.Exit(1)
	}
}

// lockedWriter lets the progress goroutine and the answer loop share
// stderr.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func run(ctx context.Context, args []string, in io.Reader, out, errOut io.Writer) error {
	errw := &lockedWriter{w: errOut}
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	fs.SetOutput(errw)
	path := fs.String("model", "", "GGUF model file")
	strategy := fs.String("strategy", "prefetch", "load strategy: prefetch, eager, lazy, host-f32")
	maxTokens := fs.Int("n", 64, "most tokens per answer")
	temp := fs.Float64("temp", 0, "sampling temperature (0: greedy)")
	events := fs.Bool("events", true, "write progress events as JSON lines to stderr")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *path == "" {
		return fmt.Errorf("-model is required")
	}
	s, err := pipeline.ParseStrategy(*strategy)
	if err != nil {
		return err
	}

	m, err := pipeline.Open(ctx, *path, pipeline.Options{Strategy: s})
	if err != nil {
		return err
	}
	closed := false
	defer func() {
		if !closed {
			m.Close()
		}
	}()

	// Progress: the subscription replays the load so far, then follows it.
	// Events about requests are left out here; an agent could forward
	// them too.
	sub := m.Subscribe()
	progress := make(chan struct{})
	go func() {
		defer close(progress)
		for e := range sub.C {
			switch e.(type) {
			case pipeline.TokenEvent, pipeline.LayerRun:
				continue
			}
			if *events {
				b, err := pipeline.EventJSON(e)
				if err == nil {
					fmt.Fprintf(errw, "%s\n", b)
				}
			}
		}
	}()
	defer func() { // on an early return
		sub.Close()
		<-progress
	}()

	sc := bufio.NewScanner(in)
	for sc.Scan() {
		prompt := sc.Text()
		res, err := m.Generate(ctx, prompt, pipeline.GenerateOptions{
			MaxTokens: *maxTokens,
			Sampling:  sample.Params{Temp: float32(*temp), Seed: 1},
			OnToken: func(t pipeline.Token) error {
				_, err := io.WriteString(out, t.Text)
				return err
			},
		})
		fmt.Fprintln(out)
		if err != nil {
			return err
		}
		fmt.Fprintf(errw, "{\"event\":\"answer\",\"tokens\":%d,\"stop\":%q}\n", len(res.Tokens), res.Stop)
	}
	if err := sc.Err(); err != nil {
		return err
	}
	// The answers may come before the last layers do (the executor starts
	// early): let the load finish, then close the model, which hands the
	// subscription every event published so far before closing it, and
	// wait for them to be written. A lazy mixture of experts is never all
	// resident (the experts no request routed to never load): nothing
	// more comes, so it closes at once.
	if !m.LazyExperts() {
		if err := m.Resident().Wait(ctx); err != nil {
			return err
		}
	}
	closed = true
	m.Close()
	<-progress
	return nil
}
