package actors

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/forge-llm/forge/actors/progress"
	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/gguf/testmodels"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// eventFence is a fence of a pending device event (its id) for the
// future tests.
type eventFence uintptr

func (eventFence) Done() bool                     { return false }
func (eventFence) Wait(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
func (f eventFence) Event() uintptr               { return uintptr(f) }

func TestFutureStates(t *testing.T) {
	f := newFuture("layer 1")
	if st, _ := f.State(); st != Pending {
		t.Fatalf("new future is %v", st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	if err := f.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait on a pending future: %v", err)
	}
	if !f.enqueue(doneFence{}) || f.enqueue(doneFence{}) {
		t.Fatal("enqueue must succeed exactly once")
	}
	fence, err := f.WaitEnqueued(context.Background())
	if err != nil || fence == nil || !fence.Done() {
		t.Fatalf("WaitEnqueued: %v %v", fence, err)
	}
	if !f.resolve() || f.resolve() || f.fail(errors.New("late")) {
		t.Fatal("resolve must succeed once and fail must not undo it")
	}
	if err := f.Wait(context.Background()); err != nil {
		t.Fatalf("Wait on a resident future: %v", err)
	}

	// A unit enqueued behind a device event no longer hands the event out
	// once resident: its copies have landed, nothing needs to wait on them.
	e := newFuture("layer 3")
	e.enqueue(eventFence(7))
	if fence, err := e.WaitEnqueued(context.Background()); err != nil || fence.Event() != 7 {
		t.Fatalf("WaitEnqueued on an enqueued future: event %v, %v", fence.Event(), err)
	}
	e.resolve()
	if fence, err := e.WaitEnqueued(context.Background()); err != nil || fence.Event() != 0 || !fence.Done() {
		t.Fatalf("WaitEnqueued on a resident future: event %v, %v", fence.Event(), err)
	}

	g := newFuture("layer 2")
	cause := errors.New("boom")
	if !g.fail(cause) || g.resolve() {
		t.Fatal("fail must win over a later resolve")
	}
	if err := g.Wait(context.Background()); !errors.Is(err, cause) {
		t.Fatalf("Wait on a failed future: %v", err)
	}
	if _, err := g.WaitEnqueued(context.Background()); !errors.Is(err, cause) {
		t.Fatalf("WaitEnqueued on a failed future: %v", err)
	}
}

// TestBusNeverBlocks: a subscriber that does not read does not slow the
// publisher; one that reads gets every event in order.
func TestBusNeverBlocks(t *testing.T) {
	s := startSystem(t, "stories260K-F32.gguf", Config{})
	defer s.Close()
	idle := s.Bus().Subscribe() // never read until the end
	reader := s.Bus().Subscribe()
	const n = 100000
	got := make(chan int)
	go func() {
		k := 0
		for e := range reader.C {
			if tok, ok := e.(progress.Token); ok && tok.Req == 999 {
				if tok.Index != k {
					t.Errorf("event %d arrived as %d", tok.Index, k)
				}
				k++
				if k == n {
					break
				}
			}
		}
		got <- k
	}()
	start := time.Now()
	for i := range n {
		s.Bus().Publish(progress.Token{Req: 999, Index: i})
	}
	t.Logf("published %d events in %v with one idle subscriber", n, time.Since(start))
	if k := <-got; k != n {
		t.Errorf("reader got %d events, want %d", k, n)
	}
	reader.Close()
	idle.Close()
}

// startSystem starts a pipeline on a bundled model.
func startSystem(t *testing.T, name string, cfg Config) *System {
	t.Helper()
	f, err := gguf.Open(testmodels.Path(t, name))
	if err != nil {
		t.Fatal(err)
	}
	n, ok := f.Uint("llama.block_count")
	if !ok {
		t.Fatal("no block count")
	}
	cfg.File, cfg.Layers = f, int(n)
	s, err := Start(context.Background(), cfg)
	if err != nil {
		f.Close()
		t.Fatal(err)
	}
	return s
}

// TestLoadOrder: the loader reads the globals first (embedding, output
// norm, head), then blocks in order; every future resolves.
func TestLoadOrder(t *testing.T) {
	s := startSystem(t, "stories260K-Q4_0.gguf", Config{Readers: 1})
	sub := s.Bus().Subscribe()
	if err := s.Resident().Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.Close()
	var reads []progress.TensorRead
	for e := range sub.C {
		if r, ok := e.(progress.TensorRead); ok {
			reads = append(reads, r)
		}
	}
	if len(reads) != len(s.plan.ByName) {
		t.Fatalf("%d tensors read, want %d", len(reads), len(s.plan.ByName))
	}
	for i, want := range []string{"token_embd.weight", "output_norm.weight", "output.weight"} {
		if reads[i].Tensor != want {
			t.Errorf("read %d is %s, want %s", i, reads[i].Tensor, want)
		}
	}
	for i := 1; i < len(reads); i++ {
		if reads[i].Layer < reads[i-1].Layer {
			t.Errorf("%s (layer %d) read after %s (layer %d)", reads[i].Tensor, reads[i].Layer, reads[i-1].Tensor, reads[i-1].Layer)
		}
	}
}

// TestLazyLoadsOnce: 64 goroutines asking for the same layer under lazy
// get it loaded once; other layers stay pending.
func TestLazyLoadsOnce(t *testing.T) {
	var mu sync.Mutex
	reads := map[string]int{}
	s := startSystem(t, "stories260K-Q4_0.gguf", Config{Strategy: Lazy, Hooks: Hooks{
		Read: func(ctx context.Context, tensor string, off, n int64) error {
			mu.Lock()
			reads[tensor]++
			mu.Unlock()
			time.Sleep(time.Millisecond) // widen the window for duplicates
			return nil
		}}})
	defer s.Close()
	if err := s.Ready().Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var failed atomic.Int32
	start := make(chan struct{})
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if err := s.WaitLayer(context.Background(), 2); err != nil {
				failed.Add(1)
			}
		}()
	}
	close(start)
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d waiters failed", n)
	}
	mu.Lock()
	defer mu.Unlock()
	u := s.plan.Layer(2)
	for _, tn := range u.Tensors {
		if reads[tn.Name()] != tn.chunks {
			t.Errorf("%s read %d times, want %d (its chunks)", tn.Name(), reads[tn.Name()], tn.chunks)
		}
	}
	for name, n := range reads {
		if strings.HasPrefix(name, "blk.") && !strings.HasPrefix(name, "blk.2.") {
			t.Errorf("%s read %d times although no one asked for its layer", name, n)
		}
	}
	for i := range s.plan.Layers() {
		st, _ := s.LayerFuture(i).State()
		if want := map[bool]State{true: Resident, false: Pending}[i == 2]; st != want {
			t.Errorf("layer %d is %v, want %v", i, st, want)
		}
	}
}

// fakeGen is a Generator that waits on every layer and emits one token per
// layer, to exercise the executor without a model.
type fakeGen struct {
	s      *System
	closed atomic.Bool
}

func (g *fakeGen) Generate(ctx context.Context, prompt []int32, opts struct{}, emit func(int32) error) (string, error) {
	for i := range g.s.plan.Layers() {
		if err := g.s.WaitLayer(ctx, i); err != nil {
			return "", fmt.Errorf("waiting for layer %d: %w", i, err)
		}
		if err := emit(int32(i)); err != nil {
			return "", err
		}
	}
	return "max_tokens", nil
}

func (g *fakeGen) Close() { g.closed.Store(true) }

// TestExecutorQueuesRequests: requests run one at a time in order; the
// generator is closed with the system; a failed layer fails the request
// with a LoadError naming it.
func TestExecutorQueuesRequests(t *testing.T) {
	s := startSystem(t, "stories260K-F32.gguf", Config{Hooks: Hooks{Read: func(ctx context.Context, tensor string, off, n int64) error {
		if strings.HasPrefix(tensor, "blk.3.") {
			return errors.New("injected")
		}
		return nil
	}}})
	g := &fakeGen{s: s}
	ex := StartExecutor(s, func(context.Context) (Generator[struct{}], error) { return g, nil })
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = ex.Submit(context.Background(), Request[struct{}]{Prompt: []int32{1}})
		}()
	}
	wg.Wait()
	for _, err := range errs {
		var le *LoadError
		if !errors.As(err, &le) || le.Layer != 3 || !strings.HasPrefix(le.Tensor, "blk.3.") {
			t.Errorf("request error %v, want a LoadError of layer 3", err)
		}
	}
	s.Close()
	if !g.closed.Load() {
		t.Error("generator not closed")
	}
	if _, err := ex.Submit(context.Background(), Request[struct{}]{Prompt: []int32{1}}); !errors.Is(err, ErrClosed) {
		t.Errorf("Submit after Close: %v", err)
	}
}

// TestEnqueuedBeforeResident: with an asynchronous uploader, a unit is
// Enqueued once its copies are queued and Resident only when the stream
// reaches its fence; LayerFence returns at Enqueued with a fence that is
// not done yet.
func TestEnqueuedBeforeResident(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	up := &StreamUploader{Copy: func(tensor string) error {
		if strings.HasPrefix(tensor, "blk.1.") {
			once.Do(func() { <-release }) // the stream stalls at layer 1's first copy
		}
		return nil
	}}
	s := startSystem(t, "stories260K-Q4_0.gguf", Config{Uploader: up, Readers: 1})
	defer s.Close()
	fence, err := s.LayerFence(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := s.LayerFuture(1).State(); st != Enqueued || fence.Done() {
		t.Fatalf("layer 1 is %v with fence done %v while its copies are stalled", st, fence.Done())
	}
	if _, ok := s.Weight("blk.1.attn_q.weight"); ok {
		t.Error("a weight of layer 1 is visible before its fence")
	}
	close(release)
	if err := fence.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Resident().Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.LayerFuture(1).State(); st != Resident {
		t.Errorf("layer 1 is %v after its fence", st)
	}
}

// TestSplitFailureResolvesEverything: a tensor whose bytes can not be
// viewed (here: a file read through io.ReaderAt, without a mapping) fails
// its unit when the loader reaches it, and every future resolves.
func TestSplitFailureResolvesEverything(t *testing.T) {
	path := testmodels.Path(t, "stories260K-Q4_0.gguf")
	osf, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer osf.Close()
	st, _ := osf.Stat()
	f, err := gguf.OpenReaderAt(osf, st.Size(), path)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Start(context.Background(), Config{File: f, Layers: 5})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	err = s.Resident().Wait(context.Background())
	var le *LoadError
	if !errors.As(err, &le) || le.Layer != progress.Globals || le.Tensor != "token_embd.weight" {
		t.Fatalf("Resident: %v, want a LoadError of token_embd.weight", err)
	}
	for i := range 5 {
		if err := s.LayerFuture(i).Wait(context.Background()); err == nil {
			t.Errorf("layer %d resolved without its globals", i)
		}
	}
}

// TestBusBounded: an idle subscriber holds at most progress.MaxQueued events; the
// rest are counted as dropped.
func TestBusBounded(t *testing.T) {
	s := startSystem(t, "stories260K-F32.gguf", Config{})
	defer s.Close()
	idle := s.Bus().Subscribe()
	defer idle.Close()
	for i := range progress.MaxQueued + 10 {
		s.Bus().Publish(progress.Token{Req: 999, Index: i})
	}
	if d := idle.Dropped(); d < 10 {
		t.Fatalf("dropped %d events, want at least 10", d)
	}
}
