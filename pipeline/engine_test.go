package pipeline

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/pipeline/chat"
	"github.com/forge-llm/forge/pipeline/model"
	"github.com/forge-llm/forge/pipeline/sample"
	"github.com/forge-llm/forge/pipeline/synth"
)

// llama2Template is meta-llama/Llama-2-7b-chat-hf's chat template.
const llama2Template = `{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}`

// chatModel writes a tiny synthetic Llama with stories260K's vocabulary and
// the Llama 2 chat template (the real test models have no template).
func chatModel(t testing.TB) string {
	t.Helper()
	f, err := gguf.Open(testmodels.Path(t, "stories260K-F32.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	voc, err := f.Tokenizer()
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	voc.ChatTemplate = llama2Template
	path := filepath.Join(t.TempDir(), "tiny-chat.gguf")
	if err := synth.WriteFile(context.Background(), path, synth.Options{Shape: synth.Presets["tiny"], Vocab: voc, Seed: 7, Name: "tiny-chat"}); err != nil {
		t.Fatal(err)
	}
	return path
}

func newTestEngine(t *testing.T, o EngineOptions) *Engine {
	t.Helper()
	if o.Resolve == nil {
		o.Resolve = func(name string) (string, error) {
			if _, err := os.Stat(name); err != nil {
				return "", err
			}
			return name, nil
		}
	}
	o.Open.Threads = 1
	e := NewEngine(o)
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Error(err)
		}
	})
	return e
}

func seeded(seed uint64) sample.Params {
	p := sample.Defaults()
	p.Seed = seed
	return p
}

// Concurrent requests, each with its own seed, give what each gives alone.
func TestEngineConcurrentMatchesAlone(t *testing.T) {
	path := testmodels.Path(t, "stories260K-F32.gguf")
	e := newTestEngine(t, EngineOptions{})
	const n = 8
	req := func(i int) EngineRequest {
		return EngineRequest{Model: path, Prompt: "Once upon a time", MaxTokens: 24, Sampling: seeded(uint64(100 + i))}
	}
	alone := make([]string, n)
	for i := range n {
		res, err := e.Generate(t.Context(), req(i))
		if err != nil {
			t.Fatal(err)
		}
		alone[i] = res.Text
	}
	got := make([]string, n)
	streamed := make([]strings.Builder, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			r := req(i)
			r.OnText = func(d string) error { streamed[i].WriteString(d); return nil }
			res, err := e.Generate(t.Context(), r)
			if err != nil {
				errs <- err
				return
			}
			got[i] = res.Text
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	distinct := map[string]bool{}
	for i := range n {
		if got[i] != alone[i] || streamed[i].String() != alone[i] {
			t.Errorf("request %d: concurrent %q, streamed %q, alone %q", i, got[i], streamed[i].String(), alone[i])
		}
		distinct[alone[i]] = true
	}
	if len(distinct) < 2 {
		t.Errorf("all seeds gave the same text %q: the test checks nothing", alone[0])
	}
	st, _ := e.StatusOf(path)
	if st.State != StateResident || st.Active != 0 || st.MemoryBytes == 0 {
		t.Errorf("status after requests: %+v", st)
	}
}

// With keep-alive 0 a model unloads as soon as it is idle and the memory
// accounting returns to where it started.
func TestEngineKeepAliveZero(t *testing.T) {
	path := testmodels.Path(t, "stories260K-Q8_0.gguf")
	e := newTestEngine(t, EngineOptions{KeepAlive: new(time.Duration(0))})
	if e.InUse() != 0 {
		t.Fatalf("in use before: %d", e.InUse())
	}
	var during int64
	_, err := e.Generate(t.Context(), EngineRequest{Model: path, Prompt: "Hello", MaxTokens: 4,
		OnText: func(string) error { during = e.InUse(); return nil }})
	if err != nil {
		t.Fatal(err)
	}
	if during == 0 {
		t.Error("nothing accounted while generating")
	}
	if got := e.InUse(); got != 0 {
		t.Errorf("in use after: %d", got)
	}
	if st, _ := e.StatusOf(path); st.State != StateUnloaded || st.MemoryBytes != 0 {
		t.Errorf("status: %+v", st)
	}
}

// A positive keep-alive unloads after the idle time, not before the last
// request ends.
func TestEngineKeepAliveTimer(t *testing.T) {
	path := testmodels.Path(t, "stories260K-Q8_0.gguf")
	e := newTestEngine(t, EngineOptions{KeepAlive: new(20 * time.Millisecond)})
	if _, err := e.Generate(t.Context(), EngineRequest{Model: path, Prompt: "Hi", MaxTokens: 2}); err != nil {
		t.Fatal(err)
	}
	if st, _ := e.StatusOf(path); st.ExpiresAt.IsZero() {
		t.Errorf("no expiry scheduled: %+v", st)
	}
	for {
		st, _ := e.StatusOf(path)
		if st.State == StateUnloaded {
			break
		}
		select {
		case <-t.Context().Done():
			t.Fatal("never unloaded")
		case <-time.After(5 * time.Millisecond):
		}
	}
	if e.InUse() != 0 {
		t.Errorf("in use after expiry: %d", e.InUse())
	}
	// Forever: a negative keep-alive never schedules an expiry.
	if err := e.SetKeepAlive(path, -1); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Generate(t.Context(), EngineRequest{Model: path, Prompt: "Hi", MaxTokens: 2}); err != nil {
		t.Fatal(err)
	}
	if st, _ := e.StatusOf(path); !st.ExpiresAt.IsZero() || st.State == StateUnloaded {
		t.Errorf("keep forever: %+v", st)
	}
}

// Loading a model past the budget evicts the least recently used idle one.
func TestEngineBudgetEvictsLRU(t *testing.T) {
	a := testmodels.Path(t, "stories260K-F32.gguf")
	b := testmodels.Path(t, "stories260K-Q8_0.gguf")
	c := testmodels.Path(t, "stories260K-Q4_0.gguf")
	o := Options{Batching: Batching{On: true}} // as the engine opens them
	ea, _, err := estimate(a, o)
	if err != nil {
		t.Fatal(err)
	}
	eb, _, _ := estimate(b, o)
	ec, _, _ := estimate(c, o)
	// Room for b and c together, not for a with either.
	budget := max(eb+ec, ea) + 1<<16
	if ea+min(eb, ec) <= budget {
		t.Fatalf("estimates %d %d %d do not make the test", ea, eb, ec)
	}
	e := newTestEngine(t, EngineOptions{Budget: budget, KeepAlive: new(time.Duration(-1))})
	gen := func(p string) { t.Helper(); useModel(t, e, p) }
	state := func(p string) ModelState { st, _ := e.StatusOf(p); return st.State }
	gen(b)
	gen(c)
	gen(b) // c is now the least recently used
	if state(b) != StateResident || state(c) != StateResident {
		t.Fatalf("b %s, c %s", state(b), state(c))
	}
	gen(a)
	if state(b) != StateEvicted || state(c) != StateEvicted || state(a) != StateResident {
		t.Errorf("after a: a %s, b %s, c %s", state(a), state(b), state(c))
	}
	if e.InUse() > budget {
		t.Errorf("in use %d over budget %d", e.InUse(), budget)
	}
	gen(c)
	if state(a) != StateEvicted || state(c) != StateResident {
		t.Errorf("after c: a %s, c %s", state(a), state(c))
	}
	// A busy model is never evicted: while a lease holds c, a does not fit.
	l, err := e.Acquire(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := e.Acquire(cancelled, a); !errors.Is(err, ErrBudget) || !errors.Is(err, context.Canceled) {
		t.Errorf("a over a busy c, not waiting: %v", err)
	}
	// A load waits for the busy model to go idle, then evicts it.
	got := make(chan error, 1)
	go func() {
		la, err := e.Acquire(t.Context(), a)
		if err == nil {
			err = la.Model().Resident().Wait(t.Context())
			la.Release()
		}
		got <- err
	}()
	l.Release()
	if err := <-got; err != nil {
		t.Fatalf("a after c went idle: %v", err)
	}
	if state(c) != StateEvicted || state(a) != StateResident {
		t.Errorf("after waiting: a %s, c %s", state(a), state(c))
	}
	// A model bigger than the whole budget is refused up front.
	small := newTestEngine(t, EngineOptions{Budget: ea / 2})
	if _, err := small.Acquire(t.Context(), a); !errors.Is(err, ErrBudget) {
		t.Errorf("too big: %v", err)
	}
}

// Cancelling a running request lets the next queued one start at once.
func TestEngineCancelFreesSlot(t *testing.T) {
	path := chatModel(t)
	e := newTestEngine(t, EngineOptions{})
	b := EngineRequest{Model: path, Prompt: "the second", MaxTokens: 8, Sampling: seeded(2)}
	alone, err := e.Generate(t.Context(), b)
	if err != nil {
		t.Fatal(err)
	}
	ctxA, cancelA := context.WithCancel(t.Context())
	started, bQueued := make(chan struct{}), make(chan struct{})
	// a's callback waits on bQueued: a failing test must still let it go,
	// or Close would wait for a forever.
	letAGo := sync.OnceFunc(func() { close(bQueued) })
	t.Cleanup(letAGo)
	var aTokens int
	aDone := make(chan error, 1)
	go func() {
		var once sync.Once
		_, err := e.Generate(ctxA, EngineRequest{Model: path, Prompt: "the first", MaxTokens: 200, IgnoreEOG: true, Sampling: seeded(1),
			OnText: func(string) error {
				aTokens++
				once.Do(func() { close(started); <-bQueued }) // a is mid-stream until b waits behind it
				return nil
			}})
		aDone <- err
	}()
	<-started
	bDone := make(chan EngineResult, 1)
	bErr := make(chan error, 1)
	go func() {
		r, err := e.Generate(t.Context(), b)
		bDone <- r
		bErr <- err
	}()
	for {
		if st, _ := e.StatusOf(path); st.Active == 2 {
			break
		}
		select {
		case r := <-bDone:
			t.Fatalf("b ended while a held the model: %+v %v", r, <-bErr)
		case <-time.After(time.Millisecond):
		}
	}
	letAGo()
	cancelA()
	if err := <-aDone; !errors.Is(err, context.Canceled) {
		t.Errorf("a: %v", err)
	}
	got := <-bDone
	if err := <-bErr; err != nil {
		t.Fatal(err)
	}
	if got.Text != alone.Text {
		t.Errorf("b after a cancelled: %q, alone %q", got.Text, alone.Text)
	}
	if aTokens >= 200 {
		t.Errorf("a ran to its end (%d tokens) before b", aTokens)
	}
}

func TestEngineChat(t *testing.T) {
	path := chatModel(t)
	e := newTestEngine(t, EngineOptions{})
	msgs := []chat.Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Tell me a story"}}
	res, err := e.Generate(t.Context(), EngineRequest{Model: path, Messages: msgs, MaxTokens: 6, Sampling: seeded(3)})
	if err != nil {
		t.Fatal(err)
	}
	// The prompt is the rendered template, tokenized with BOS once.
	lease, err := e.Acquire(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release()
	ids, err := chatPrompt(t.Context(), lease.Model(), msgs, nil)
	if err != nil {
		t.Fatal(err)
	}
	tok, _ := lease.Model().Tokenizer(t.Context())
	if ids[0] != tok.BOS() || ids[1] == tok.BOS() || res.PromptTokens != len(ids) {
		t.Errorf("prompt ids %v (BOS %d), result %d prompt tokens", ids[:3], tok.BOS(), res.PromptTokens)
	}
	want := "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nTell me a story [/INST]"
	if got := tok.Decode(ids); !strings.Contains(want, strings.TrimSpace(got)) && got != want {
		t.Logf("decoded prompt %q", got)
	}
	// A model without a template says so.
	plain := testmodels.Path(t, "stories260K-F32.gguf")
	if _, err := e.Generate(t.Context(), EngineRequest{Model: plain, Messages: msgs}); !errors.Is(err, chat.ErrNoTemplate) {
		t.Errorf("no template: %v", err)
	}
	// Unknown models are errors, not registrations.
	if _, err := e.Generate(t.Context(), EngineRequest{Model: "no/such/model"}); !errors.Is(err, ErrUnknownModel) {
		t.Errorf("unknown: %v", err)
	}
	if _, ok := e.StatusOf("no/such/model"); ok {
		t.Error("unknown model registered")
	}
}

func TestEngineStopStrings(t *testing.T) {
	path := testmodels.Path(t, "stories260K-F32.gguf")
	e := newTestEngine(t, EngineOptions{})
	full, err := e.Generate(t.Context(), EngineRequest{Model: path, Prompt: "Once upon a time", MaxTokens: 40})
	if err != nil {
		t.Fatal(err)
	}
	words := strings.Fields(full.Text)
	if len(words) < 6 {
		t.Fatalf("too short: %q", full.Text)
	}
	stop := " " + words[4]
	cut := full.Text[:strings.Index(full.Text, stop)]
	var streamed strings.Builder
	res, err := e.Generate(t.Context(), EngineRequest{Model: path, Prompt: "Once upon a time", MaxTokens: 40, Stop: []string{"zzz", stop},
		OnText: func(d string) error { streamed.WriteString(d); return nil }})
	if err != nil {
		t.Fatal(err)
	}
	if res.Text != cut || streamed.String() != cut || res.FinishReason != "stop" {
		t.Errorf("stop %q: text %q streamed %q finish %s; want %q", stop, res.Text, streamed.String(), res.FinishReason, cut)
	}
	if full.FinishReason != "length" && full.Stop == "max_tokens" {
		t.Errorf("finish %s for stop %s", full.FinishReason, full.Stop)
	}
}

func TestStopper(t *testing.T) {
	cases := []struct {
		stops  []string
		pieces []string
		want   []string // deltas per piece, then the flush
		text   string
	}{
		{nil, []string{"ab", "c"}, []string{"ab", "c", ""}, "abc"},
		{[]string{"END"}, []string{"xE", "N", "D", "y"}, []string{"x", "", "", "", ""}, "x"},
		{[]string{"END"}, []string{"xE", "N", "o"}, []string{"x", "", "ENo", ""}, "xENo"},
		{[]string{"END"}, []string{"xEN"}, []string{"x", "EN"}, "xEN"},
		{[]string{"b", "abc"}, []string{"aab"}, []string{"aa", ""}, "aa"},
	}
	for i, c := range cases {
		s := &stopper{stops: c.stops}
		var got []string
		for _, p := range c.pieces {
			d, _ := s.add(p)
			got = append(got, d)
		}
		got = append(got, s.flush())
		if fmt.Sprintf("%q", got) != fmt.Sprintf("%q", c.want) || s.text() != c.text {
			t.Errorf("case %d: deltas %q text %q; want %q %q", i, got, s.text(), c.want, c.text)
		}
	}
}

// Close cancels running requests and frees every model.
func TestEngineCloseCancels(t *testing.T) {
	path := chatModel(t)
	e := NewEngine(EngineOptions{Resolve: func(n string) (string, error) { return n, nil }, Open: Options{Threads: 1}})
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		var once sync.Once
		_, err := e.Generate(context.Background(), EngineRequest{Model: path, Prompt: "x", MaxTokens: 200,
			OnText: func(string) error { once.Do(func() { close(started) }); return nil }})
		done <- err
	}()
	<-started
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err == nil {
		t.Error("request survived Close")
	}
	if e.InUse() != 0 {
		t.Errorf("in use after Close: %d", e.InUse())
	}
	if _, err := e.Generate(context.Background(), EngineRequest{Model: path, Prompt: "x"}); !errors.Is(err, ErrEngineClosed) {
		t.Errorf("after Close: %v", err)
	}
}

// useModel makes p the most recently used model of e: a short request,
// then a lease held until every weight is resident (so that the model's
// memory is all in place when the test measures it).
func useModel(t *testing.T, e *Engine, p string) {
	t.Helper()
	if _, err := e.Generate(t.Context(), EngineRequest{Model: p, Prompt: "Hi", MaxTokens: 2}); err != nil {
		t.Fatal(err)
	}
	l, err := e.Acquire(t.Context(), p)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	if err := l.Model().Resident().Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestEstimateCountsGPUCacheAsF16: before a load measures it, a model
// bound for a GPU is charged its KV cache (or batching pool) at f16, as
// the GPU stores it (gpu.KV), and a CPU one at F32 (cpu.KV); "auto",
// outside an Engine that has opened its device, as the CPU (planBackend).
func TestEstimateCountsGPUCacheAsF16(t *testing.T) {
	path := testmodels.Path(t, "stories260K-F32.gguf")
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := model.ConfigFromFile(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []Batching{{}, {On: true, GPU: true, Seqs: 8}} {
		cpuEst, _, err := estimate(path, Options{Device: "cpu", Batching: b})
		if err != nil {
			t.Fatal(err)
		}
		gpuEst, _, err := estimate(path, Options{Device: "gpu:0", Batching: b})
		if err != nil {
			t.Fatal(err)
		}
		autoEst, _, _ := estimate(path, Options{Device: "auto", Batching: b})
		positions := ctxPositions(cfg, Options{})
		if b.On {
			_, blocks, bs := b.poolShape(positions)
			positions = blocks * bs
		}
		f32 := kvBytes(cfg.Layers, positions, cfg.KVDim())
		if cpuEst-gpuEst != f32/2 || autoEst != cpuEst {
			t.Errorf("batching %+v: cpu %d, gpu %d, auto %d: want the gpu's %d (half the F32 cache of %d) less, auto as the cpu",
				b, cpuEst, gpuEst, autoEst, f32/2, f32)
		}
	}
}
