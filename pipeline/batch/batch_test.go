package batch

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/pipeline/generate"
	"github.com/forge-llm/forge/pipeline/internal/archtest"
	"github.com/forge-llm/forge/pipeline/model"
	"github.com/forge-llm/forge/pipeline/sample"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type fixture struct {
	be  *cpu.Backend
	cfg model.Config
	w   model.Weights
}

func open(t *testing.T, file string) *fixture {
	t.Helper()
	cfg, w := archtest.OpenWeights(t, testmodels.Path(t, file))
	be := cpu.New(2)
	t.Cleanup(be.Close)
	return &fixture{be: be, cfg: cfg, w: w}
}

func (fx *fixture) scheduler(t *testing.T, c Config) *Scheduler {
	t.Helper()
	bm, err := model.NewBatched(fx.be, fx.cfg, fx.w, model.BatchOptions{MaxRows: 64 + 16, MaxSeqs: 16})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bm.Close)
	c.Model, c.Backend = bm, fx.be
	if c.Chunk == 0 {
		c.Chunk = 64
	}
	if c.Ctx == 0 {
		c.Ctx = 128
	}
	s, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// alone generates r's tokens through the single-sequence path.
func (fx *fixture) alone(t *testing.T, prompt []int32, p sample.Params, maxTokens, chunk, ctx int) []int32 {
	t.Helper()
	m, err := model.New(fx.be, fx.cfg, fx.w, model.Options{Ctx: ctx, Batch: chunk})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	out, _, err := generate.Run(context.Background(), m, prompt, generate.Options{MaxTokens: maxTokens, Sampler: sample.New(p, fx.cfg.Vocab)})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func randPrompt(rng *rand.Rand, n, vocab int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32(1 + rng.IntN(vocab-1))
	}
	return p
}

// TestBatchedMatchesAlone: ten requests of mixed prompt lengths, greedy
// and seeded sampling, joining at different times, each produce exactly
// the tokens they produce alone through the single-sequence path; every
// block is back when they end.
func TestBatchedMatchesAlone(t *testing.T) {
	for _, file := range []string{"stories260K-Q4_0.gguf", "stories260K-F32.gguf", "synth-kq-Q4_K_M.gguf"} {
		t.Run(file, func(t *testing.T) {
			fx := open(t, file)
			s := fx.scheduler(t, Config{Blocks: 96, BlockSize: 8})
			rng := rand.New(rand.NewPCG(1, 2))
			type job struct {
				prompt []int32
				p      sample.Params
				max    int
				want   []int32
			}
			var jobs []*job
			for i := range 10 {
				j := &job{prompt: randPrompt(rng, 1+rng.IntN(90), fx.cfg.Vocab), max: 6 + rng.IntN(10)}
				if i%2 == 1 {
					j.p = sample.Params{Temp: 0.8, TopK: 40, TopP: 0.95, Seed: uint64(100 + i)}
				}
				j.want = fx.alone(t, j.prompt, j.p, j.max, 64, 128)
				jobs = append(jobs, j)
			}
			ctx := context.Background()
			var wg sync.WaitGroup
			got := make([][]int32, len(jobs))
			errs := make([]error, len(jobs))
			started := make(chan struct{}, len(jobs))
			for i, j := range jobs {
				if i >= 3 {
					<-started // later requests join a batch already running
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					first := true
					res, err := s.Generate(ctx, Request{Prompt: j.prompt, MaxTokens: j.max, Sampler: sample.New(j.p, fx.cfg.Vocab)}, func(int32) error {
						if first {
							first = false
							started <- struct{}{}
						}
						return nil
					})
					got[i], errs[i] = res.Tokens, err
					if first {
						started <- struct{}{}
					}
				}()
			}
			wg.Wait()
			for i, j := range jobs {
				if errs[i] != nil {
					t.Errorf("request %d: %v", i, errs[i])
				}
				if !slices.Equal(got[i], j.want) {
					t.Errorf("request %d (prompt %d, seed %d): batched %v, alone %v", i, len(j.prompt), j.p.Seed, got[i], j.want)
				}
			}
			st := s.Stats()
			if st.Held != 0 || st.Running != 0 {
				t.Errorf("after every request: %d blocks held, %d running", st.Held, st.Running)
			}
			if st.Steps >= int64(totalTokens(got)) {
				t.Errorf("%d steps for %d tokens: the requests never shared a step", st.Steps, totalTokens(got))
			}
		})
	}
}

func totalTokens(g [][]int32) int {
	n := 0
	for _, t := range g {
		n += len(t)
	}
	return n
}

// TestCancelFreesBlocks: requests cancelled mid-generation end with their
// context's error and give back every block.
func TestCancelFreesBlocks(t *testing.T) {
	fx := open(t, "stories260K-Q4_0.gguf")
	s := fx.scheduler(t, Config{Blocks: 64, BlockSize: 8, Ctx: 256})
	rng := rand.New(rand.NewPCG(3, 4))
	var wg sync.WaitGroup
	errs := make([]error, 6)
	for i := range errs {
		prompt := randPrompt(rng, 5+3*i, fx.cfg.Vocab)
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			n := 0
			_, errs[i] = s.Generate(ctx, Request{Prompt: prompt}, func(int32) error {
				n++
				if n == 3+i {
					cancel()
				}
				return nil
			})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("request %d: error %v, want context.Canceled", i, err)
		}
	}
	if st := s.Stats(); st.Held != 0 || st.Running != 0 {
		t.Errorf("after cancelling: %d blocks held, %d running", st.Held, st.Running)
	}
	// An error from the token callback ends the request the same way.
	boom := errors.New("boom")
	if _, err := s.Generate(context.Background(), Request{Prompt: []int32{1, 2, 3}}, func(int32) error { return boom }); !errors.Is(err, boom) {
		t.Errorf("callback error: got %v", err)
	}
	if st := s.Stats(); st.Held != 0 {
		t.Errorf("after a failed callback: %d blocks held", st.Held)
	}
}

// TestPrefixShared: a second request whose prompt extends the first's
// evaluates only what the first did not leave in the cache, and its
// output is what it gets alone.
func TestPrefixShared(t *testing.T) {
	fx := open(t, "stories260K-F32.gguf")
	s := fx.scheduler(t, Config{Blocks: 64, BlockSize: 8, ModelID: "stories"})
	rng := rand.New(rand.NewPCG(5, 6))
	common := randPrompt(rng, 37, fx.cfg.Vocab)
	ctx := context.Background()
	a, err := s.Generate(ctx, Request{Prompt: common, MaxTokens: 4}, nil)
	if err != nil {
		t.Fatal(err)
	}
	before := s.Stats()
	if before.Cached == 0 {
		t.Fatalf("no block cached after the first request: %+v", before)
	}
	second := append(slices.Clone(common), randPrompt(rng, 10, fx.cfg.Vocab)...)
	b, err := s.Generate(ctx, Request{Prompt: second, MaxTokens: 8}, nil)
	if err != nil {
		t.Fatal(err)
	}
	after := s.Stats()
	computed := after.PromptComputed - before.PromptComputed
	if b.CachedTokens != 32 || computed != int64(len(second)-32) {
		t.Errorf("second request: %d prompt tokens from the cache, %d computed; want 32 and %d", b.CachedTokens, computed, len(second)-32)
	}
	if want := fx.alone(t, second, sample.Params{}, 8, 64, 128); !slices.Equal(b.Tokens, want) {
		t.Errorf("with a shared prefix: %v, alone %v", b.Tokens, want)
	}
	if want := fx.alone(t, common, sample.Params{}, 4, 64, 128); !slices.Equal(a.Tokens, want) {
		t.Errorf("first request: %v, alone %v", a.Tokens, want)
	}
	// The same prompt again: all but its last block come from the cache.
	c, err := s.Generate(ctx, Request{Prompt: common, MaxTokens: 4}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.CachedTokens != 32 || !slices.Equal(c.Tokens, a.Tokens) {
		t.Errorf("repeat: %d cached tokens, %v; want 32 and %v", c.CachedTokens, c.Tokens, a.Tokens)
	}
	if st := s.Stats(); st.Held != 0 {
		t.Errorf("%d blocks held after the requests", st.Held)
	}
}

// TestEvictionUnderPressure: in a small pool, cached prefix blocks are
// taken back for new requests; every request succeeds and nothing leaks.
func TestEvictionUnderPressure(t *testing.T) {
	fx := open(t, "stories260K-Q4_0.gguf")
	s := fx.scheduler(t, Config{Blocks: 12, BlockSize: 4, ModelID: "m"})
	rng := rand.New(rand.NewPCG(7, 8))
	ctx := context.Background()
	first := randPrompt(rng, 20, fx.cfg.Vocab)
	if _, err := s.Generate(ctx, Request{Prompt: first, MaxTokens: 4}, nil); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Cached < 4 {
		t.Fatalf("%d blocks cached after a 24-position request", st.Cached)
	}
	for i := range 5 {
		p := randPrompt(rng, 25, fx.cfg.Vocab)
		res, err := s.Generate(ctx, Request{Prompt: p, MaxTokens: 8}, nil)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if want := fx.alone(t, p, sample.Params{}, 8, 64, 128); !slices.Equal(res.Tokens, want) {
			t.Errorf("request %d: %v, alone %v", i, res.Tokens, want)
		}
	}
	// The first prompt's blocks were evicted: nothing comes from the cache.
	res, err := s.Generate(ctx, Request{Prompt: first, MaxTokens: 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.CachedTokens != 0 {
		t.Errorf("%d tokens of an evicted prefix came from the cache", res.CachedTokens)
	}
	if st := s.Stats(); st.Held != 0 || st.Cached+st.Held > st.Blocks {
		t.Errorf("stats after the requests: %+v", st)
	}
}

// TestPoolExhausted: a prompt that can never fit fails at once; a sequence
// that outgrows a pool held by others fails with ErrPoolExhausted while
// the others finish.
func TestPoolExhausted(t *testing.T) {
	fx := open(t, "stories260K-Q4_0.gguf")
	s := fx.scheduler(t, Config{Blocks: 6, BlockSize: 4, Ctx: 256})
	ctx := context.Background()
	if _, err := s.Generate(ctx, Request{Prompt: make([]int32, 30)}, nil); !errors.Is(err, ErrPoolExhausted) {
		t.Errorf("a 30-token prompt in 24 positions: %v", err)
	}
	// Two requests that each want 20+ positions: 24 positions in all.
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = s.Generate(ctx, Request{Prompt: []int32{1, int32(2 + i), 3}, MaxTokens: 40}, nil)
		}()
	}
	wg.Wait()
	exhausted := 0
	for _, err := range errs {
		if errors.Is(err, ErrPoolExhausted) {
			exhausted++
		} else if err != nil {
			t.Errorf("unexpected error %v", err)
		}
	}
	if exhausted == 0 {
		t.Errorf("two 43-position sequences in a 24-position pool: no ErrPoolExhausted")
	}
	if st := s.Stats(); st.Held != 0 {
		t.Errorf("%d blocks held after the requests", st.Held)
	}
}

// TestCloseEndsRequests: Close ends running and queued requests with
// ErrClosed and leaves no goroutine behind (goleak in TestMain).
func TestCloseEndsRequests(t *testing.T) {
	fx := open(t, "stories260K-Q4_0.gguf")
	s := fx.scheduler(t, Config{Blocks: 64, BlockSize: 8, Ctx: 256, MaxSeqs: 2})
	var wg sync.WaitGroup
	errs := make([]error, 4)
	started := make(chan struct{}, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			once := sync.OnceFunc(func() { started <- struct{}{} })
			_, errs[i] = s.Generate(context.Background(), Request{Prompt: []int32{1, int32(5 + i)}}, func(int32) error { once(); return nil })
			once()
		}()
	}
	<-started
	s.Close()
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("request %d: %v, want ErrClosed", i, err)
		}
	}
	if _, err := s.Submit(context.Background(), Request{Prompt: []int32{1}}); !errors.Is(err, ErrClosed) {
		t.Errorf("submit after close: %v", err)
	}
}

// TestPreemption: four requests that fit the pool one or two at a time but
// not together: the latest admitted give their blocks back when the
// others grow, wait, and are evaluated again; every request finishes
// with exactly the tokens it produces alone, and nothing leaks.
func TestPreemption(t *testing.T) {
	for _, file := range []string{"stories260K-Q4_0.gguf", "synth-kq-Q4_K_M.gguf"} {
		t.Run(file, func(t *testing.T) {
			fx := open(t, file)
			rng := rand.New(rand.NewPCG(9, 10))
			type job struct {
				prompt []int32
				p      sample.Params
				want   []int32
			}
			var jobs []*job
			for i := range 4 {
				j := &job{prompt: randPrompt(rng, 3+2*i, fx.cfg.Vocab)}
				if i%2 == 1 {
					j.p = sample.Params{Temp: 1, TopK: 30, Seed: uint64(i)}
				}
				j.want = fx.alone(t, j.prompt, j.p, 22, 64, 256)
				jobs = append(jobs, j)
			}
			// The first step waits at its first layer until all four are
			// queued, so that they run together; their streams are read
			// afterwards (the loop never waits for a reader).
			gate := make(chan struct{})
			fx.w = gatedWeights{Weights: fx.w, gate: gate}
			s := fx.scheduler(t, Config{Blocks: 14, BlockSize: 4, Ctx: 256})
			streams := make([]*Stream, len(jobs))
			for i, j := range jobs {
				st, err := s.Submit(context.Background(), Request{Prompt: j.prompt, MaxTokens: 22, Sampler: sample.New(j.p, fx.cfg.Vocab)})
				if err != nil {
					t.Fatal(err)
				}
				streams[i] = st
			}
			close(gate)
			got := make([][]int32, len(jobs))
			errs := make([]error, len(jobs))
			for i, st := range streams {
				for {
					id, ok := st.Next(context.Background())
					if !ok {
						break
					}
					got[i] = append(got[i], id)
				}
				_, errs[i] = st.Result()
			}
			for i, j := range jobs {
				if errs[i] != nil {
					t.Errorf("request %d: %v", i, errs[i])
				}
				if !slices.Equal(got[i], j.want) {
					t.Errorf("request %d: %v, alone %v", i, got[i], j.want)
				}
			}
			st := s.Stats()
			if st.Preempted == 0 {
				t.Errorf("no sequence was preempted: %+v", st)
			}
			if st.Held != 0 || st.Running != 0 {
				t.Errorf("after the requests: %+v", st)
			}
		})
	}
}

// gatedWeights holds every layer back until gate closes.
type gatedWeights struct {
	model.Weights
	gate chan struct{}
}

func (g gatedWeights) Layer(ctx context.Context, i int) (*model.LayerWeights, error) {
	select {
	case <-g.gate:
		return g.Weights.Layer(ctx, i)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// TestNoPrefixCache: with the prefix cache off every prompt is computed in
// full, and the tokens are those of the same request with it on (on the
// CPU every row's numbers are the same whichever way they were computed).
func TestNoPrefixCache(t *testing.T) {
	fx := open(t, "stories260K-F32.gguf")
	on := fx.scheduler(t, Config{Blocks: 64, BlockSize: 8, ModelID: "stories"})
	off := fx.scheduler(t, Config{Blocks: 64, BlockSize: 8, ModelID: "stories", NoPrefixCache: true})
	rng := rand.New(rand.NewPCG(8, 9))
	common := randPrompt(rng, 37, fx.cfg.Vocab)
	second := append(slices.Clone(common), randPrompt(rng, 10, fx.cfg.Vocab)...)
	ctx := context.Background()
	for _, s := range []*Scheduler{on, off} {
		if _, err := s.Generate(ctx, Request{Prompt: common, MaxTokens: 4}, nil); err != nil {
			t.Fatal(err)
		}
	}
	before := off.Stats()
	b, err := off.Generate(ctx, Request{Prompt: second, MaxTokens: 8}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if computed := off.Stats().PromptComputed - before.PromptComputed; b.CachedTokens != 0 || computed != int64(len(second)) {
		t.Errorf("prefix cache off: %d tokens from the cache, %d computed; want 0 and %d", b.CachedTokens, computed, len(second))
	}
	c, err := on.Generate(ctx, Request{Prompt: second, MaxTokens: 8}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.CachedTokens == 0 || !slices.Equal(b.Tokens, c.Tokens) {
		t.Errorf("cache on: %d cached, %v; cache off: %v", c.CachedTokens, c.Tokens, b.Tokens)
	}
}

// TestReplayPreempted: with ReplayPreempted a preempted sequence is
// computed again in the pieces it first ran in: every row of a request's
// prompt lies in a piece that starts at a multiple of Chunk and ends at
// the next one or at the prompt's end, and every generated token is a
// row of its own, however often the request was preempted (so a GPU
// multiplies each row with the kernels it used alone). Without it the
// same steps run a preempted request's prompt and generated tokens as one
// piece (the test's control). Tokens equal the single-sequence path's
// either way on the CPU.
func TestReplayPreempted(t *testing.T) {
	for _, replay := range []bool{true, false} {
		t.Run(fmt.Sprintf("replay=%v", replay), func(t *testing.T) {
			fx := open(t, "stories260K-Q4_0.gguf")
			rng := rand.New(rand.NewPCG(9, 10))
			const chunk, maxTokens = 4, 22
			type job struct {
				prompt, want []int32
				p            sample.Params
			}
			var jobs []*job
			for i := range 4 {
				j := &job{prompt: randPrompt(rng, 3+2*i, fx.cfg.Vocab)}
				if i%2 == 1 {
					j.p = sample.Params{Temp: 1, TopK: 30, Seed: uint64(i)}
				}
				j.want = fx.alone(t, j.prompt, j.p, maxTokens, chunk, 256)
				jobs = append(jobs, j)
			}
			gate := make(chan struct{})
			fx.w = gatedWeights{Weights: fx.w, gate: gate}
			s := fx.scheduler(t, Config{Blocks: 14, BlockSize: 4, Ctx: 256, Chunk: chunk, NoPrefixCache: true, ReplayPreempted: replay})
			type row struct {
				pos0 int
				toks []int32
			}
			var rows []row // written on the loop goroutine, read after every stream ended
			s.onStep = func(rs []model.SeqRows) {
				for _, r := range rs {
					rows = append(rows, row{r.Pos0, slices.Clone(r.Tokens)})
				}
			}
			streams := make([]*Stream, len(jobs))
			for i, j := range jobs {
				st, err := s.Submit(context.Background(), Request{Prompt: j.prompt, MaxTokens: maxTokens, Sampler: sample.New(j.p, fx.cfg.Vocab)})
				if err != nil {
					t.Fatal(err)
				}
				streams[i] = st
			}
			close(gate)
			full := make([][]int32, len(jobs))
			for i, st := range streams {
				full[i] = slices.Clone(jobs[i].prompt)
				for {
					id, ok := st.Next(context.Background())
					if !ok {
						break
					}
					full[i] = append(full[i], id)
				}
				res, err := st.Result()
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				if !slices.Equal(res.Tokens, jobs[i].want) {
					t.Errorf("request %d: %v, alone %v", i, res.Tokens, jobs[i].want)
				}
			}
			if st := s.Stats(); st.Preempted == 0 {
				t.Fatalf("no sequence was preempted: %+v", st)
			}
			// Each row belongs to the request whose tokens it repeats at
			// its position (random prompts: one request only).
			seen := make([]map[int]int, len(jobs)) // position -> times computed
			crossing, twice := 0, 0
			for _, r := range rows {
				owner := -1
				for i, f := range full {
					if r.pos0+len(r.toks) <= len(f) && slices.Equal(f[r.pos0:r.pos0+len(r.toks)], r.toks) {
						owner = i
					}
				}
				if owner < 0 {
					t.Fatalf("a row at %d (%d tokens) matches no request", r.pos0, len(r.toks))
				}
				if seen[owner] == nil {
					seen[owner] = map[int]int{}
				}
				for p := r.pos0; p < r.pos0+len(r.toks); p++ {
					seen[owner][p]++
					if p >= len(jobs[owner].prompt) && seen[owner][p] == 2 {
						twice++
					}
				}
				np := len(jobs[owner].prompt)
				if r.pos0 < np && r.pos0+len(r.toks) > np {
					crossing++
				}
				if !replay {
					continue
				}
				switch {
				case r.pos0 < np && (r.pos0%chunk != 0 || len(r.toks) != min(chunk, np-r.pos0)):
					t.Errorf("request %d: a prompt piece of %d tokens at %d; want pieces of %d from 0 up to the prompt's end %d", owner, len(r.toks), r.pos0, chunk, np)
				case r.pos0 >= np && len(r.toks) != 1:
					t.Errorf("request %d: generated positions %d…%d in one piece; want one row each", owner, r.pos0, r.pos0+len(r.toks)-1)
				}
			}
			t.Logf("%d generated positions computed again, %d pieces across a prompt's end", twice, crossing)
			if twice == 0 {
				t.Errorf("no generated token was computed again: the test did not preempt a decoding sequence")
			}
			if replay && crossing != 0 || !replay && crossing == 0 {
				t.Errorf("replay=%v: %d pieces across a prompt's end", replay, crossing)
			}
		})
	}
}

// TestStepRows: prompts submitted together share steps up to the step's
// prompt-token budget (StepRows), each piece still at most Chunk tokens;
// a piece that does not fit what is left waits for the next step. With
// the budget at one chunk (the default) every step holds one piece. The
// tokens equal the single-sequence path's either way (the CPU).
func TestStepRows(t *testing.T) {
	fx := open(t, "stories260K-Q4_0.gguf")
	rng := rand.New(rand.NewPCG(11, 12))
	const chunk, maxTokens = 16, 4
	var prompts, want [][]int32
	for i := range 5 {
		p := randPrompt(rng, 20+3*i, fx.cfg.Vocab)
		prompts = append(prompts, p)
		want = append(want, fx.alone(t, p, sample.Params{}, maxTokens, chunk, 128))
	}
	for _, stepRows := range []int{0, 48} {
		t.Run(fmt.Sprintf("steprows=%d", stepRows), func(t *testing.T) {
			gate := make(chan struct{})
			fx := *fx
			fx.w = gatedWeights{Weights: fx.w, gate: gate}
			s := fx.scheduler(t, Config{Blocks: 64, BlockSize: 4, Chunk: chunk, StepRows: stepRows, NoPrefixCache: true})
			var steps [][]int // each step's prompt piece lengths (the loop goroutine's, read after the streams end)
			s.onStep = func(rs []model.SeqRows) {
				var pieces []int
				for _, r := range rs {
					if len(r.Tokens) > 1 {
						pieces = append(pieces, len(r.Tokens))
					}
				}
				steps = append(steps, pieces)
			}
			var streams []*Stream
			for _, p := range prompts {
				st, err := s.Submit(context.Background(), Request{Prompt: p, MaxTokens: maxTokens, Sampler: sample.New(sample.Params{}, fx.cfg.Vocab)})
				if err != nil {
					t.Fatal(err)
				}
				streams = append(streams, st)
			}
			close(gate)
			for i, st := range streams {
				for {
					if _, ok := st.Next(context.Background()); !ok {
						break
					}
				}
				res, err := st.Result()
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(res.Tokens, want[i]) {
					t.Errorf("request %d: %v, alone %v", i, res.Tokens, want[i])
				}
			}
			budget := max(stepRows, chunk)
			most := 0
			for i, pieces := range steps {
				sum := 0
				for _, n := range pieces {
					if n > chunk {
						t.Fatalf("step %d: a piece of %d tokens, chunk %d", i, n, chunk)
					}
					sum += n
				}
				if sum > budget {
					t.Fatalf("step %d: pieces %v, %d tokens over the budget of %d", i, pieces, sum, budget)
				}
				most = max(most, len(pieces))
			}
			// one piece a step with a budget of one chunk; several (at least
			// budget/chunk whole chunks) with more
			if (stepRows == 0 && most != 1) || (stepRows > 0 && most < budget/chunk) {
				t.Errorf("at most %d pieces shared a step (budget %d, chunk %d): %v", most, budget, chunk, steps)
			}
		})
	}
}
