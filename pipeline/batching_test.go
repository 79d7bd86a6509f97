package pipeline

import (
	"context"
	"errors"
	"github.com/forge-llm/forge/pipeline/tokenizer"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/pipeline/sample"
)

// TestBatchingMatchesSingle: for every load strategy, on a Q4_0, an F32
// and a K-quant model, ten concurrent requests of mixed prompt lengths
// (greedy and seeded sampling, joining at different times) through a
// batching model give exactly the tokens the single-sequence Generate
// gives each of them; afterwards no block is held.
func TestBatchingMatchesSingle(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	files := []string{"stories260K-Q4_0.gguf", "stories260K-F32.gguf", "synth-kq-Q4_K_M.gguf"}
	strategies := []Strategy{Prefetch, Eager, Lazy, HostF32}
	for _, file := range files {
		path := testmodels.Path(t, file)
		for _, strat := range strategies {
			t.Run(file+"/"+strat.String(), func(t *testing.T) {
				ctx := context.Background()
				single, err := Open(ctx, path, Options{Threads: 2, Strategy: strat})
				if err != nil {
					t.Fatal(err)
				}
				defer single.Close()
				batched, err := Open(ctx, path, Options{Threads: 2, Strategy: strat, Batching: Batching{On: true, Seqs: 8, BlockSize: 8}})
				if err != nil {
					t.Fatal(err)
				}
				defer batched.Close()
				rng := rand.New(rand.NewPCG(11, uint64(len(file))))
				vocab := single.Config().Vocab
				type job struct {
					o    GenerateOptions
					want []int32
				}
				var jobs []*job
				for i := range 10 {
					p := make([]int32, 1+rng.IntN(60))
					for k := range p {
						p[k] = int32(1 + rng.IntN(vocab-1))
					}
					j := &job{o: GenerateOptions{PromptIDs: p, MaxTokens: 4 + rng.IntN(8), IgnoreEOG: true}}
					if i%2 == 1 {
						j.o.Sampling = sample.Params{Temp: 0.9, TopK: 20, TopP: 0.9, Seed: uint64(i) * 77}
					}
					res, err := single.Generate(ctx, "", j.o)
					if err != nil {
						t.Fatal(err)
					}
					j.want = res.Tokens
					jobs = append(jobs, j)
				}
				got := make([][]int32, len(jobs))
				errs := make([]error, len(jobs))
				started := make(chan struct{}, len(jobs))
				var wg sync.WaitGroup
				for i, j := range jobs {
					if i >= 4 {
						<-started
					}
					wg.Add(1)
					go func() {
						defer wg.Done()
						o := j.o
						once := sync.OnceFunc(func() { started <- struct{}{} })
						o.OnToken = func(Token) error { once(); return nil }
						res, err := batched.Generate(ctx, "", o)
						once()
						got[i], errs[i] = res.Tokens, err
					}()
				}
				wg.Wait()
				for i, j := range jobs {
					if errs[i] != nil {
						t.Errorf("request %d: %v", i, errs[i])
					}
					if !slices.Equal(got[i], j.want) {
						t.Errorf("request %d (prompt %d, seed %d): batched %v, single %v", i, len(j.o.PromptIDs), j.o.Sampling.Seed, got[i], j.want)
					}
				}
				if st := batched.BatchStats(); st.Held != 0 || st.Steps == 0 {
					t.Errorf("batch stats after the requests: %+v", st)
				}
			})
		}
	}
}

// hiddenBatcher hides the CPU backend's kernels.Batcher (a GPU backend
// without one looks like this).
type hiddenBatcher struct{ kernels.Backend }

// TestBatchingFallsBack: with Batching on but a backend that cannot batch,
// requests run through the single-sequence path and give its output.
func TestBatchingFallsBack(t *testing.T) {
	path := testmodels.Path(t, "stories260K-Q4_0.gguf")
	be := cpu.New(2)
	defer be.Close()
	ctx := context.Background()
	want, err := func() ([]int32, error) {
		m, err := Open(ctx, path, Options{Backend: be})
		if err != nil {
			return nil, err
		}
		defer m.Close()
		r, err := m.Generate(ctx, "", GenerateOptions{PromptIDs: []int32{1, 200, 300}, MaxTokens: 6, IgnoreEOG: true})
		return r.Tokens, err
	}()
	if err != nil {
		t.Fatal(err)
	}
	m, err := Open(ctx, path, Options{Backend: hiddenBatcher{be}, Batching: Batching{On: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	r, err := m.Generate(ctx, "", GenerateOptions{PromptIDs: []int32{1, 200, 300}, MaxTokens: 6, IgnoreEOG: true})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(r.Tokens, want) {
		t.Errorf("fallback: %v, want %v", r.Tokens, want)
	}
	if st := m.BatchStats(); st.Steps != 0 {
		t.Errorf("a backend without a Batcher ran %d batched steps", st.Steps)
	}
}

// TestEngineBatchingCancel: eight concurrent engine requests on one model,
// half of them cancelled mid-stream: the others finish with the tokens
// they give alone, and the pool holds nothing once all have ended.
func TestEngineBatchingCancel(t *testing.T) {
	path := testmodels.Path(t, "stories260K-Q4_0.gguf")
	e := newTestEngine(t, EngineOptions{KeepAlive: new(time.Duration(-1))})
	alone := func(seed uint64) []int32 {
		m, err := Open(context.Background(), path, Options{Threads: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		r, err := m.Generate(context.Background(), "Once upon a time", GenerateOptions{MaxTokens: 24, IgnoreEOG: true, Sampling: sample.Params{Temp: 0.8, TopK: 40, Seed: seed}})
		if err != nil {
			t.Fatal(err)
		}
		return r.Tokens
	}
	var wg sync.WaitGroup
	errs := make([]error, 8)
	got := make([][]int32, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			r := EngineRequest{Model: path, Prompt: "Once upon a time", MaxTokens: 24, IgnoreEOG: true,
				Sampling: sample.Params{Temp: 0.8, TopK: 40, Seed: uint64(i)}}
			if i%2 == 1 {
				// Cancelled after its third token, from the generating
				// goroutine (a constraint's Accept), so mid-request
				// whatever the timing of the streamed callbacks.
				r.Constrain = func(tok *tokenizer.Tokenizer, _ *EngineRequest) (Constraint, error) {
					return &cutAfter{n: 3, cut: cancel, mask: allTokens(tok.VocabSize())}, nil
				}
			}
			res, err := e.Generate(ctx, r)
			got[i], errs[i] = res.Tokens, err
		}()
	}
	wg.Wait()
	for i := range 8 {
		if i%2 == 1 {
			if !errors.Is(errs[i], context.Canceled) {
				t.Errorf("cancelled request %d: %v", i, errs[i])
			}
			continue
		}
		if errs[i] != nil {
			t.Fatalf("request %d: %v", i, errs[i])
		}
		if want := alone(uint64(i)); !slices.Equal(got[i], want) {
			t.Errorf("request %d: %v, alone %v", i, got[i], want)
		}
	}
	l, err := e.Acquire(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	if st := l.Model().BatchStats(); st.Held != 0 || st.Running != 0 || st.Steps == 0 {
		t.Errorf("after the requests: %+v", st)
	}
}

// TestBatchingCloseWhileWaiting: a first request waiting for the weights
// (a disk that never answers) does not hold Close up; it fails.
func TestBatchingCloseWhileWaiting(t *testing.T) {
	path := testmodels.Path(t, "stories260K-Q4_0.gguf")
	stuck := Hooks{Read: func(ctx context.Context, tensor string, off, n int64) error {
		<-ctx.Done()
		return ctx.Err()
	}}
	m, err := Open(context.Background(), path, Options{Threads: 1, Hooks: stuck, Batching: Batching{On: true}})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := m.Generate(context.Background(), "", GenerateOptions{PromptIDs: []int32{1, 2}, MaxTokens: 1})
		errc <- err
	}()
	if err := m.Close(); err != nil {
		t.Logf("close: %v", err)
	}
	if err := <-errc; err == nil {
		t.Errorf("a request on a model closed before its weights arrived succeeded")
	}
}
