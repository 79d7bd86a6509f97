package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/pipeline"
	"github.com/forge-llm/forge/pipeline/synth"
)

// soakDuration is FORGE_SOAK (a Go duration), 3 s by default so that CI
// runs the soak briefly; run it long by hand:
//
//	FORGE_SOAK=10m go test -run Soak -timeout 20m ./cmd/forge
func soakDuration(t *testing.T) time.Duration {
	s := os.Getenv("FORGE_SOAK")
	if s == "" {
		return 3 * time.Second
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("FORGE_SOAK=%q: %v", s, err)
	}
	return d
}

// soakSample is the process's goroutines and live heap after a GC.
type soakSample struct {
	goroutines int
	heap       uint64
}

func measure() soakSample {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return soakSample{goroutines: runtime.NumGoroutine(), heap: ms.HeapAlloc}
}

// chatModelShape writes a synthetic model of a preset shape with
// stories260K's vocabulary and the Llama 2 chat template.
func chatModelShape(t *testing.T, shape string, seed uint64) string {
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
	path := filepath.Join(t.TempDir(), shape+".gguf")
	if err := synth.WriteFile(context.Background(), path, synth.Options{Shape: synth.Presets[shape], Vocab: voc, Seed: seed}); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestServeSoak runs mixed requests — streaming and plain chat and
// completions, requests cancelled mid-stream, malformed requests, load
// progress streams, model listings — against three models with a short
// keep-alive and a budget that holds only two, so models load, expire
// and are evicted all the time. Between a warm-up and the end, with every
// model unloaded both times, goroutines and the live heap must not grow;
// a fixed request must keep giving the same text throughout.
func TestServeSoak(t *testing.T) {
	leakCheck(t)
	dur := soakDuration(t)
	models := map[string]string{
		"chat":  chatModelShape(t, "tiny", 21),
		"qwen":  chatModelShape(t, "tiny-qwen2", 22),
		"story": testmodels.Path(t, "stories260K-Q4_K_M.gguf"),
	}
	// Measure what each takes, to set a budget for two of the three.
	sizes := map[string]int64{}
	{
		eng := pipeline.NewEngine(pipeline.EngineOptions{Resolve: func(n string) (string, error) { return n, nil }, Open: pipeline.Options{Threads: 1}})
		for id, p := range models {
			l, err := eng.Acquire(t.Context(), p)
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Model().Resident().Wait(t.Context()); err != nil {
				t.Fatal(err)
			}
			// One request builds the batching scheduler (its KV pool).
			if _, err := l.Model().Generate(t.Context(), "", pipeline.GenerateOptions{PromptIDs: []int32{1}, MaxTokens: 1}); err != nil {
				t.Fatal(err)
			}
			st, _ := eng.StatusOf(p)
			l.Release()
			sizes[id] = max(st.MemoryBytes, 1)
		}
		eng.Close()
	}
	budget := max(sizes["chat"]+sizes["qwen"], sizes["chat"]+sizes["story"], sizes["qwen"]+sizes["story"]) + 1024
	cfg := serveConfig{engine: pipeline.EngineOptions{KeepAlive: new(50 * time.Millisecond), Budget: budget}}
	for id, p := range models {
		cfg.models = append(cfg.models, modelArg{id: id, name: p})
	}
	ts := startServer(t, cfg)

	var counts [8]atomic.Int64 // per kind of request
	var failures atomic.Int64
	fail := func(format string, args ...any) {
		if failures.Add(1) <= 10 {
			t.Errorf(format, args...)
		}
	}
	fixed := chatBody("chat", 424242, "Tell me about the sea", 8)
	want, _, err := ts.streamChat(t.Context(), fixed, nil)
	if err != nil {
		t.Fatal(err)
	}
	one := func(r *rand.Rand) {
		ctx := t.Context()
		kind := r.IntN(len(counts))
		counts[kind].Add(1)
		switch kind {
		case 0: // streaming chat on either chat model
			m := []string{"chat", "qwen"}[r.IntN(2)]
			if _, _, err := ts.streamChat(ctx, chatBody(m, r.IntN(1000), "Hello there", 4+r.IntN(12)), nil); err != nil {
				fail("stream chat %s: %v", m, err)
			}
		case 1: // plain completion
			resp, err := ts.post(ctx, "/v1/completions", map[string]any{"model": "story", "prompt": "Once upon a time", "max_tokens": 1 + r.IntN(16), "seed": r.IntN(100), "stop": []string{"."}})
			if err != nil {
				fail("completion: %v", err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				fail("completion: status %d", resp.StatusCode)
			}
		case 2: // cancelled mid-stream
			cctx, cancel := context.WithCancel(ctx)
			b := chatBody("chat", r.IntN(1000), "Go on", 10000)
			b["ignore_eos"] = true
			n := 1 + r.IntN(5)
			ts.streamChat(cctx, b, func(string) {
				if n--; n == 0 {
					cancel()
				}
			})
			cancel()
		case 3: // malformed
			body := []string{`{"model":"chat","messages":[]}`, `{`, `{"model":"chat","messages":[{"role":"user","content":"x"}],"temperature":9}`, `{"model":"nope","prompt":"x"}`}[r.IntN(4)]
			path := []string{"/v1/chat/completions", "/v1/completions"}[r.IntN(2)]
			resp, err := ts.post(ctx, path, body)
			if err != nil {
				fail("malformed: %v", err)
				return
			}
			var e apiError
			json.NewDecoder(resp.Body).Decode(&e)
			resp.Body.Close()
			if resp.StatusCode < 400 || resp.StatusCode >= 500 || e.Error.Message == "" {
				fail("malformed %s %s: %d %+v", path, body, resp.StatusCode, e)
			}
		case 4: // listings
			var list struct{ Data []modelObject }
			if ts.getJSON(t, "/v1/models", &list); len(list.Data) != 3 {
				fail("models: %+v", list)
			}
			var h map[string]any
			ts.getJSON(t, "/health", &h)
		case 5: // load progress, read to the end or dropped early
			m := []string{"chat", "qwen", "story"}[r.IntN(3)]
			cctx, cancel := context.WithCancel(ctx)
			defer cancel()
			resp, err := ts.post(cctx, "/forge/load", map[string]string{"model": m})
			if err != nil {
				fail("load: %v", err)
				return
			}
			sc := bufio.NewScanner(resp.Body)
			lines := r.IntN(40)
			for i := 0; sc.Scan() && (lines > 30 || i < lines); i++ {
			}
			cancel()
			resp.Body.Close()
		case 6: // a fixed request, checked against its first answer
			got, _, err := ts.streamChat(ctx, chatBody("chat", 424242, "Tell me about the sea", 8), nil)
			if err != nil || got != want {
				fail("fixed request: %q, %v; want %q", got, err, want)
			}
		case 7: // a completion with a client that hangs up before the answer
			cctx, cancel := context.WithTimeout(ctx, time.Duration(r.IntN(3))*time.Millisecond)
			resp, err := ts.post(cctx, "/v1/completions", map[string]any{"model": "qwen", "prompt": "x", "max_tokens": 50})
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			cancel()
		}
	}
	// settle waits until every model has unloaded (keep-alive 50 ms) and
	// the server's connections are idle, then measures.
	settle := func() soakSample {
		ts.client.Transport.(interface{ CloseIdleConnections() }).CloseIdleConnections()
		for {
			var st struct {
				Models      []pipeline.ModelStatus
				MemoryBytes int64 `json:"memory_bytes"`
			}
			ts.getJSON(t, "/forge/status", &st)
			busy := st.MemoryBytes != 0
			for _, m := range st.Models {
				busy = busy || m.Active > 0
			}
			if !busy {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		ts.client.Transport.(interface{ CloseIdleConnections() }).CloseIdleConnections()
		time.Sleep(100 * time.Millisecond) // let closed connections' goroutines exit
		return measure()
	}
	run := func(d time.Duration, seed uint64, report bool) {
		const workers = 6
		deadline := time.Now().Add(d)
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(seed, uint64(w)))
				for time.Now().Before(deadline) && t.Context().Err() == nil {
					one(r)
				}
			})
		}
		if report {
			// Log the figures every so often during a long soak.
			every := max(d/10, time.Second)
			stop := make(chan struct{})
			go func() {
				tk := time.NewTicker(every)
				defer tk.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tk.C:
						s := measure()
						var total int64
						for i := range counts {
							total += counts[i].Load()
						}
						t.Logf("soak: %d requests, %d goroutines, heap %.1f MiB", total, s.goroutines, float64(s.heap)/(1<<20))
					}
				}
			}()
			wg.Wait()
			close(stop)
			return
		}
		wg.Wait()
	}

	run(max(dur/10, 500*time.Millisecond), 1, false) // warm-up: every path once, pools filled
	before := settle()
	run(dur, 2, dur >= time.Minute)
	after := settle()

	var kinds []string
	var total int64
	for i := range counts {
		kinds = append(kinds, fmt.Sprint(counts[i].Load()))
		total += counts[i].Load()
	}
	t.Logf("soak %v: %d requests (by kind: %s); goroutines %d → %d; live heap %.2f MiB → %.2f MiB",
		dur, total, strings.Join(kinds, " "), before.goroutines, after.goroutines, float64(before.heap)/(1<<20), float64(after.heap)/(1<<20))
	if after.goroutines > before.goroutines {
		t.Errorf("goroutines grew: %d → %d", before.goroutines, after.goroutines)
	}
	// The live heap may wander by what pools and caches hold; growth
	// with the number of requests would be a leak.
	if after.heap > before.heap+before.heap/2+4<<20 {
		t.Errorf("live heap grew: %d → %d bytes", before.heap, after.heap)
	}
}
