package pipeline

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/forge-llm/forge/pipeline/synth"
)

// BenchmarkEngineClients measures generated tokens per second summed over
// 1 and 8 concurrent clients through the Engine, on a bench86m-shaped
// Q4_K_M file (forge gen --preset bench86m --quant q4_k_m), with
// continuous batching and with the single-sequence path. Each client asks
// for 32 tokens (end-of-generation ignored) after a short prompt. The four
// cases run in turn within every iteration, so that a machine shared with
// other work slows them alike and the ratios hold. The aim on the
// CPU: 8 batched clients ≥ 3× one client.
func BenchmarkEngineClients(b *testing.B) {
	path := filepath.Join(b.TempDir(), "bench86m-q4km.gguf")
	if err := synth.WriteFile(context.Background(), path, synth.Options{Shape: synth.Presets["bench86m"], Mix: synth.MixQ4_KM}); err != nil {
		b.Fatal(err)
	}
	const tokens = 32
	engines := map[string]*Engine{}
	for _, mode := range []string{"batched", "single"} {
		e := NewEngine(EngineOptions{SingleSequence: mode == "single", Resolve: func(n string) (string, error) {
			_, err := os.Stat(n)
			return n, err
		}})
		defer e.Close()
		// Load (every weight resident) and warm up outside the timing.
		l, err := e.Acquire(context.Background(), path)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Model().Resident().Wait(context.Background()); err != nil {
			b.Fatal(err)
		}
		l.Release()
		if _, err := e.Generate(context.Background(), EngineRequest{Model: path, Prompt: "warm up", MaxTokens: 2, IgnoreEOG: true}); err != nil {
			b.Fatal(err)
		}
		engines[mode] = e
	}
	run := func(e *Engine, clients int) (int, time.Duration) {
		start := time.Now()
		var wg sync.WaitGroup
		var mu sync.Mutex
		total := 0
		for c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := e.Generate(context.Background(), EngineRequest{Model: path, Prompt: fmt.Sprintf("Client %d says once upon a time", c), MaxTokens: tokens, IgnoreEOG: true})
				if err != nil {
					b.Error(err)
					return
				}
				mu.Lock()
				total += len(res.Tokens)
				mu.Unlock()
			}()
		}
		wg.Wait()
		return total, time.Since(start)
	}
	type acc struct {
		n int
		d time.Duration
	}
	cases := []struct {
		mode    string
		clients int
	}{{"batched", 1}, {"batched", 8}, {"single", 1}, {"single", 8}}
	sums := make([]acc, len(cases))
	for b.Loop() {
		for i, c := range cases {
			n, d := run(engines[c.mode], c.clients)
			sums[i].n += n
			sums[i].d += d
		}
	}
	rate := func(i int) float64 { return float64(sums[i].n) / sums[i].d.Seconds() }
	for i, c := range cases {
		b.ReportMetric(rate(i), fmt.Sprintf("%s%d-tok/s", c.mode, c.clients))
	}
	b.ReportMetric(rate(1)/rate(0), "batched8/1-x")
	b.ReportMetric(rate(3)/rate(2), "single8/1-x")
}
