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
// for 32 tokens (end-of-generation ignored) after a short prompt. The
// issue's aim on the CPU: 8 batched clients ≥ 3× one client.
func BenchmarkEngineClients(b *testing.B) {
	path := filepath.Join(b.TempDir(), "bench86m-q4km.gguf")
	if err := synth.WriteFile(context.Background(), path, synth.Options{Shape: synth.Presets["bench86m"], Mix: synth.MixQ4_KM}); err != nil {
		b.Fatal(err)
	}
	const tokens = 32
	for _, single := range []bool{false, true} {
		mode := "batched"
		if single {
			mode = "single"
		}
		e := NewEngine(EngineOptions{SingleSequence: single, Resolve: func(n string) (string, error) {
			_, err := os.Stat(n)
			return n, err
		}})
		// Load (every weight resident) and warm up once outside the timing.
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
		for _, clients := range []int{1, 8} {
			b.Run(fmt.Sprintf("%s/clients=%d", mode, clients), func(b *testing.B) {
				var total int
				var elapsed time.Duration
				for b.Loop() {
					start := time.Now()
					var wg sync.WaitGroup
					var mu sync.Mutex
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
					elapsed += time.Since(start)
				}
				b.ReportMetric(float64(total)/elapsed.Seconds(), "tok/s")
			})
		}
		if err := e.Close(); err != nil {
			b.Fatal(err)
		}
	}
}
