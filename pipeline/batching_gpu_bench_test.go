package pipeline

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"testing"
	"time"
)

// TestGPUBatchedDecodeProfile measures one request's decode through the
// batching scheduler and through the single-sequence path on the first
// file of FORGE_BIG_MODEL (no HTTP), and writes a CPU profile of the
// batched run to FORGE_PROFILE_DIR (if set): where the host's time goes
// between the GPU's steps. A measurement: it asserts only that both run.
func TestGPUBatchedDecodeProfile(t *testing.T) {
	paths := os.Getenv("FORGE_BIG_MODEL")
	if paths == "" {
		t.Skip("set FORGE_BIG_MODEL to a GGUF file to profile batched decoding on the GPU")
	}
	needGPU(t)
	path := strings.Split(paths, ",")[0]
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 1))
	for _, batched := range []bool{false, true} {
		o := Options{Device: "gpu"}
		if batched {
			o.Batching = Batching{On: true, GPU: true}
		}
		m, err := Open(ctx, path, o)
		if err != nil {
			t.Fatal(err)
		}
		prompt := make([]int32, 32)
		for i := range prompt {
			prompt[i] = int32(1 + rng.IntN(m.Config().Vocab-1))
		}
		run := func() (time.Duration, int) {
			var first time.Time
			n := 0
			res, err := m.Generate(ctx, "", GenerateOptions{PromptIDs: prompt, MaxTokens: 129, IgnoreEOG: true,
				OnToken: func(Token) error {
					if n == 0 {
						first = time.Now()
					}
					n++
					return nil
				}})
			if err != nil {
				t.Fatal(err)
			}
			return time.Since(first), len(res.Tokens) - 1
		}
		run() // warm-up: weights resident, scheduler built
		var f *os.File
		if dir := os.Getenv("FORGE_PROFILE_DIR"); dir != "" && batched {
			if f, err = os.Create(filepath.Join(dir, "batched-decode.pprof")); err != nil {
				t.Fatal(err)
			}
			pprof.StartCPUProfile(f)
		}
		d, n := run()
		if f != nil {
			pprof.StopCPUProfile()
			f.Close()
		}
		t.Logf("DECODE batched=%v: %d tokens after the first in %v: %.1f tok/s, %.2f ms a token", batched, n, d.Round(time.Millisecond), float64(n)/d.Seconds(), d.Seconds()*1000/float64(n))
		m.Close()
	}
}
