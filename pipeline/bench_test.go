package pipeline

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/pipeline/synth"
)

// BenchmarkTimeToFirstToken compares the strategies on stories260K with a
// slow disk (each block tensor's read delayed by 2 ms): prefetch starts
// computing as soon as the globals are in and overlaps the rest; eager and
// host-f32 wait for everything; lazy reads each layer when first needed.
func BenchmarkTimeToFirstToken(b *testing.B) {
	path := testmodels.Path(b, "stories260K-Q4_0.gguf")
	slow := Hooks{Read: func(ctx context.Context, tensor string, off, n int64) error {
		if strings.HasPrefix(tensor, "blk.") {
			return sleepCtx(ctx, 2*time.Millisecond)
		}
		return nil
	}}
	for _, s := range []Strategy{Prefetch, Eager, Lazy, HostF32} {
		b.Run(s.String(), func(b *testing.B) {
			var ttft time.Duration
			for b.Loop() {
				start := time.Now()
				m, err := Open(context.Background(), path, Options{Strategy: s, Hooks: slow, Threads: 2})
				if err != nil {
					b.Fatal(err)
				}
				first := time.Duration(0)
				_, err = m.Generate(context.Background(), "", GenerateOptions{PromptIDs: storiesPrompt, MaxTokens: 1,
					OnToken: func(Token) error { first = time.Since(start); return nil }})
				if err != nil {
					b.Fatal(err)
				}
				ttft += first
				m.Close()
			}
			b.ReportMetric(float64(ttft.Microseconds())/float64(b.N)/1000, "ms-ttft")
		})
	}
}

// BenchmarkOpen8B opens a llama3-8b-shaped Q4_K_M file (synthetic, all
// zero: holes in a sparse file) and reports how long Open takes (metadata
// only) and how long until the model is ready (embedding, output norm and
// head resident) and fully resident on the CPU backend.
func BenchmarkOpen8B(b *testing.B) {
	path := filepath.Join(b.TempDir(), "llama3-8b-q4km.gguf")
	if err := synth.WriteFile(context.Background(), path, synth.Options{Shape: synth.Presets["llama3-8b"], Mix: synth.MixQ4_KM, Zero: true}); err != nil {
		b.Fatal(err)
	}
	var open, ready, all time.Duration
	for b.Loop() {
		start := time.Now()
		m, err := Open(context.Background(), path, Options{Threads: 2})
		if err != nil {
			b.Fatal(err)
		}
		open += time.Since(start)
		if err := m.Ready().Wait(context.Background()); err != nil {
			b.Fatal(err)
		}
		ready += time.Since(start)
		if err := m.Resident().Wait(context.Background()); err != nil {
			b.Fatal(err)
		}
		all += time.Since(start)
		m.Close()
	}
	n := float64(b.N)
	b.ReportMetric(float64(open.Microseconds())/n/1000, "ms-open")
	b.ReportMetric(float64(ready.Microseconds())/n/1000, "ms-ready")
	b.ReportMetric(float64(all.Microseconds())/n/1000, "ms-resident")
}

// BenchmarkOverlap shows what prefetching buys when compute per layer is
// not negligible: a synthetic 86M-parameter Llama (12 blocks, Q4_0), a
// 128-token prompt, and a disk that takes 8 ms per block (emulated with a
// read hook; the globals come at page-cache speed). Prefetch overlaps the
// prompt's layer i with the reading of layers i+1…; eager and host-f32
// read everything first; lazy reads each layer when the prompt reaches it.
func BenchmarkOverlap(b *testing.B) {
	path := filepath.Join(b.TempDir(), "bench86m-q4_0.gguf")
	if err := synth.WriteFile(context.Background(), path, synth.Options{Shape: synth.Presets["bench86m"], Mix: synth.MixQ4_0, Seed: 1}); err != nil {
		b.Fatal(err)
	}
	prompt := make([]int32, 128)
	for i := range prompt {
		prompt[i] = int32(3 + i*7%500)
	}
	perTensor := 8 * time.Millisecond / 9 // 9 tensors per block
	slow := Hooks{Read: func(ctx context.Context, tensor string, off, n int64) error {
		if strings.HasPrefix(tensor, "blk.") {
			return sleepCtx(ctx, perTensor)
		}
		return nil
	}}
	for _, s := range []Strategy{Prefetch, Eager, Lazy, HostF32} {
		b.Run(s.String(), func(b *testing.B) {
			var ttft, resident time.Duration
			for b.Loop() {
				start := time.Now()
				m, err := Open(context.Background(), path, Options{Strategy: s, Hooks: slow, Readers: 1})
				if err != nil {
					b.Fatal(err)
				}
				var first time.Duration
				_, err = m.Generate(context.Background(), "", GenerateOptions{PromptIDs: prompt, MaxTokens: 1, IgnoreEOG: true,
					OnToken: func(Token) error { first = time.Since(start); return nil }})
				if err != nil {
					b.Fatal(err)
				}
				ttft += first
				var allAt time.Duration
				sub := m.Subscribe()
				for e := range sub.C {
					if a, ok := e.(AllResident); ok {
						allAt = a.At
						break
					}
				}
				sub.Close()
				resident += allAt
				m.Close()
			}
			n := float64(b.N)
			b.ReportMetric(float64(ttft.Microseconds())/n/1000, "ms-ttft")
			b.ReportMetric(float64(resident.Microseconds())/n/1000, "ms-resident")
		})
	}
}
