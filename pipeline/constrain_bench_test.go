package pipeline

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/pipeline/constrain"
	"github.com/forge-llm/forge/pipeline/sample"
	"github.com/forge-llm/forge/pipeline/synth"
)

func add(a, b constrain.Stats) constrain.Stats {
	return constrain.Stats{Masks: a.Masks + b.Masks, Walks: a.Walks + b.Walks, Compute: a.Compute + b.Compute, Blocked: a.Blocked + b.Blocked}
}

// TestConstrainedDecodeCost measures what constrained decoding costs:
// 16 sequences decoding together through the batching scheduler, with
// and without a JSON Schema each (16 different schemas of the suite),
// both sampled, rounds alternating after a warm-up (mask caches warm).
// 16 workers each keep a request running until they have generated
// 16 × FORGE_BENCH_TOKENS together, so 16 sequences share every step in
// both modes (but for the prompt steps of new requests). It logs
// milliseconds per step and per token and the constrained overhead, and
// checks that every constrained output validates.
//
// CPU (here): FORGE_BENCH_CONSTRAIN=1 go test ./pipeline -run ConstrainedDecodeCost -v
// (a synthetic model with random weights and Llama 2's 32000-token
// vocabulary, bundled in gguf/testdata/tokenizer).
// GPU: FORGE_BIG_MODEL=/tmp/l8.gguf pipeline.test -test.run ConstrainedDecodeCost -test.v
// (the first file of FORGE_BIG_MODEL on the GPU; FORGE_DEVICE overrides
// the device, FORGE_BENCH_TOKENS the tokens per worker and round, and
// FORGE_BENCH_GREEDY=1 makes both modes greedy: unconstrained, the GPU
// then reduces each row on the device, which a constrained row cannot).
func TestConstrainedDecodeCost(t *testing.T) {
	big := os.Getenv("FORGE_BIG_MODEL")
	if big == "" && os.Getenv("FORGE_BENCH_CONSTRAIN") == "" {
		t.Skip("a measurement: set FORGE_BENCH_CONSTRAIN=1 (CPU, synthetic model) or FORGE_BIG_MODEL (GPU)")
	}
	ctx := context.Background()
	device, perWorker := "cpu", 64
	var path string
	if big != "" {
		path, device, perWorker = strings.Split(big, ",")[0], "gpu", 192
	} else {
		shape := synth.Presets["tiny"]
		shape.Embd, shape.FF, shape.Layers, shape.Vocab, shape.Ctx = 512, 1024, 4, 32000, 1024
		path = filepath.Join(t.TempDir(), "bench.gguf")
		voc, err := synth.VocabFromFile(testmodels.Path(t, "tokenizer/ggml-vocab-llama-spm.gguf"))
		if err != nil {
			t.Fatal(err)
		}
		if err := synth.WriteFile(ctx, path, synth.Options{Shape: shape, Vocab: voc, Seed: 3, Name: "bench"}); err != nil {
			t.Fatal(err)
		}
	}
	if d := os.Getenv("FORGE_DEVICE"); d != "" {
		device = d
	}
	if n := os.Getenv("FORGE_BENCH_TOKENS"); n != "" {
		fmt.Sscan(n, &perWorker)
	}
	const workers = 16
	greedy := os.Getenv("FORGE_BENCH_GREEDY") != ""
	how := "sampled"
	if greedy {
		how = "greedy"
	}
	m, err := Open(ctx, path, Options{Device: device, Batching: Batching{On: true, GPU: true, Seqs: workers}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	schemas := loadTestSchemas(t)
	var mu sync.Mutex
	invalid := 0
	// A round runs 16 workers, each sending requests back to back (160
	// tokens at most; a constrained one ends when its JSON is complete),
	// and stops them all once they generated 16 × perWorker tokens
	// together: until then every worker had a sequence in the batch.
	//
	// Constrained requests end when their JSON is complete; the next
	// unconstrained round gives each request the length its counterpart
	// had, so both see the same turnover of requests (prompt steps).
	lengths := make([][]int, workers)
	round := func(constrained bool, seed uint64) (time.Duration, int, int64) {
		prev := lengths
		if constrained {
			lengths = make([][]int, workers)
		}
		rctx, stop := context.WithCancel(ctx)
		defer stop()
		steps0 := m.BatchStats().Steps
		var tokens atomic.Int64
		target := int64(workers * perWorker)
		var wg sync.WaitGroup
		start := time.Now()
		var d time.Duration
		var steps int64
		var once sync.Once
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for r := 0; rctx.Err() == nil; r++ {
					s := schemas[(w+r)%len(schemas)]
					p := seeded(seed + uint64(w*1000+r))
					if greedy {
						p = sample.Params{}
					}
					o := GenerateOptions{MaxTokens: 160, Sampling: p,
						OnToken: func(Token) error {
							if tokens.Add(1) == target {
								once.Do(func() {
									d, steps = time.Since(start), m.BatchStats().Steps-steps0
									stop()
								})
							}
							return nil
						}}
					if constrained {
						o.Grammar = s.g
					} else {
						o.IgnoreEOG = true
						if r < len(prev[w]) {
							o.MaxTokens = prev[w][r]
						}
					}
					res, err := m.Generate(rctx, "Answer in JSON:", o)
					if rctx.Err() != nil {
						return
					}
					if err != nil {
						t.Error(err)
						return
					}
					if constrained {
						lengths[w] = append(lengths[w], max(1, len(res.Tokens)))
						if err := validateJSON(s, res.Text); err != nil {
							t.Log(err)
							mu.Lock()
							invalid++
							mu.Unlock()
						}
					}
				}
			}()
		}
		wg.Wait()
		return d, int(target), steps
	}
	round(false, 1) // warm-up: weights resident, scheduler built
	round(true, 2)  // and the mask caches
	var tot [2]struct {
		d      time.Duration
		tokens int
		steps  int64
	}
	var cs constrain.Stats
	for i := range 4 {
		c := i % 2
		before := constrain.ReadStats()
		d, n, s := round(c == 1, uint64(10+i))
		if c == 1 {
			cs = add(cs, constrain.ReadStats().Sub(before))
		}
		tot[c].d += d
		tot[c].tokens += n
		tot[c].steps += s
	}
	ms := func(d time.Duration, n int64) float64 { return d.Seconds() * 1000 / float64(n) }
	for c, name := range []string{"unconstrained", "constrained"} {
		x := tot[c]
		t.Logf("CONSTRAIN %s on %s: %d tokens in %d steps (%.1f a step), %.2f ms a step, %.3f ms a token", name, device, x.tokens, x.steps, float64(x.tokens)/float64(x.steps), ms(x.d, x.steps), ms(x.d, int64(x.tokens)))
	}
	overhead := ms(tot[1].d, int64(tot[1].tokens))/ms(tot[0].d, int64(tot[0].tokens)) - 1
	t.Logf("CONSTRAIN end to end: constrained %+.1f%% time a token against unconstrained (16 sequences, %s, the same request lengths)", overhead*100, how)
	t.Logf("CONSTRAIN masks: %d served, %d vocabulary walks, %v computing (in the background, overlapping the steps), %v blocked in the step loop = %.2f%% of the constrained decode time",
		cs.Masks, cs.Walks, cs.Compute.Round(time.Millisecond), cs.Blocked.Round(time.Microsecond), 100*cs.Blocked.Seconds()/tot[1].d.Seconds())
	if invalid > 0 {
		t.Errorf("%d constrained outputs did not validate", invalid)
	}
}
