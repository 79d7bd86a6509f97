package pipeline

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/forge-llm/forge/actors"
	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/pipeline/internal/archtest"
	"github.com/forge-llm/forge/pipeline/model"
	"github.com/forge-llm/forge/pipeline/synth"
)

// The tests of expert-granular readiness (issue 21): a mixture's block is
// ready once its attention, norms and router are; each expert loads on its
// own future, and a request waits only for the experts its router picks.

// writeMoE writes a synthetic mixture of the preset for one test.
func writeMoE(t *testing.T, preset string, mix synth.Mix) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), preset+"-"+string(mix)+".gguf")
	if err := synth.WriteFile(context.Background(), path, synth.Options{Shape: synth.Presets[preset], Mix: mix, Seed: 21}); err != nil {
		t.Fatal(err)
	}
	return path
}

// referenceGreedy is the greedy continuation of prompt by the model
// package alone (every weight a view of the file, nothing loaded by the
// actors): what any load order must reproduce.
func referenceGreedy(t *testing.T, path string, prompt []int32, n int) []int32 {
	t.Helper()
	cfg, fw := archtest.OpenWeights(t, path)
	be := cpu.New(2)
	defer be.Close()
	m, err := model.New(be, cfg, fw, model.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var out []int32
	tok, err := m.Greedy(context.Background(), prompt, 0)
	for pos := len(prompt); err == nil; pos++ {
		out = append(out, tok)
		if len(out) == n {
			break
		}
		tok, err = m.Greedy(context.Background(), []int32{tok}, pos)
	}
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// expertKey is one (layer, expert).
type expertKey struct{ layer, expert int }

// expertOfRead is which expert a read of a stacked expert tensor's bytes
// [off, off+n) belongs to (ok false for any other tensor's read): the
// loader reads a stacked tensor expert by expert, counting off from the
// tensor's start (Hooks.Read).
func expertOfRead(t *testing.T, f *gguf.File, tensor string, off int64) (expertKey, bool) {
	ti, ok := f.Tensor(tensor)
	if !ok || !actors.Stacked(ti) {
		return expertKey{}, false
	}
	layer, _, err := gguf.BlockOf(tensor)
	if err != nil {
		t.Error(err)
		return expertKey{}, false
	}
	piece := int64(ti.Size / ti.Dims[2])
	return expertKey{layer, int(off / piece)}, true
}

// routedExperts opens path lazily (a layer, and an expert, load only when
// a request first needs them), runs prompt to its first token and returns
// the experts it loaded: exactly the ones the prompt's router picked, as
// its ExpertRun events say too.
func routedExperts(t *testing.T, path string, prompt []int32) map[expertKey]bool {
	t.Helper()
	return routedExpertsOn(t, path, prompt, "")
}

// routedExpertsOn is routedExperts on a device ("" auto).
func routedExpertsOn(t *testing.T, path string, prompt []int32, device string) map[expertKey]bool {
	t.Helper()
	m, err := Open(context.Background(), path, Options{Strategy: Lazy, Threads: 2, Device: device})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	sub := m.Subscribe()
	defer sub.Close()
	res, err := m.Generate(context.Background(), "", GenerateOptions{PromptIDs: prompt, MaxTokens: 1, IgnoreEOG: true})
	if err != nil {
		t.Fatal(err)
	}
	loaded := map[expertKey]bool{}
	for l := range m.Config().Layers {
		if m.Experts(l) != m.Config().Experts {
			t.Fatalf("layer %d: %d expert futures, want %d", l, m.Experts(l), m.Config().Experts)
		}
		for e := range m.Experts(l) {
			st, err := m.Expert(l, e).State()
			switch {
			case err != nil:
				t.Fatalf("layer %d expert %d: %v", l, e, err)
			case st == UnitResident:
				loaded[expertKey{l, e}] = true
			case st != UnitPending:
				t.Fatalf("layer %d expert %d: %v under lazy after the request", l, e, st)
			}
		}
	}
	m.Close() // the subscription closes after what was published
	ran := map[expertKey]bool{}
	for ev := range sub.C {
		if r, ok := ev.(ExpertRun); ok && r.Req == res.ID {
			ran[expertKey{r.Layer, r.Expert}] = true
		}
	}
	if len(loaded) == 0 || len(loaded) != len(ran) {
		t.Fatalf("lazy: %d experts loaded, %d in the request's expert_run events", len(loaded), len(ran))
	}
	for k := range ran {
		if !loaded[k] {
			t.Fatalf("expert %v ran but was not loaded", k)
		}
	}
	total := m.Config().Layers * m.Config().Experts
	if len(loaded) >= total {
		t.Fatalf("the prompt routed to all %d experts: pick a shorter one", total)
	}
	return loaded
}

// TestExpertUnitsGreedyUnchanged: the tiny mixtures, loaded expert by
// expert under every strategy (and through the asynchronous uploader's
// shape), generate the model package's greedy tokens, and every expert
// future ends resident.
func TestExpertUnitsGreedyUnchanged(t *testing.T) {
	prompt := []int32{1, 5, 9, 14}
	for _, preset := range []string{"tiny-qwen3moe", "tiny-mixtral"} {
		for _, mix := range []synth.Mix{synth.MixF32, synth.MixQ4_KM} {
			path := writeMoE(t, preset, mix)
			want := referenceGreedy(t, path, prompt, 6)
			type run struct {
				name string
				o    Options
			}
			runs := []run{
				{"prefetch", Options{}},
				{"lazy", Options{Strategy: Lazy}},
				{"eager", Options{Strategy: Eager}},
				{"stream", Options{uploader: &actors.StreamUploader{}}},
				{"small-chunks", Options{ChunkBytes: 1000}}, // several chunks per expert
			}
			if mix == synth.MixF32 { // converted to the same F32: the same numbers
				runs = append(runs, run{"host-f32", Options{Strategy: HostF32}})
			}
			for _, r := range runs {
				t.Run(preset+"/"+string(mix)+"/"+r.name, func(t *testing.T) {
					r.o.Threads = 2
					m, err := Open(context.Background(), path, r.o)
					if err != nil {
						t.Fatal(err)
					}
					defer m.Close()
					res, err := m.Generate(context.Background(), "", GenerateOptions{PromptIDs: prompt, MaxTokens: len(want), IgnoreEOG: true})
					if err != nil {
						t.Fatal(err)
					}
					if fmt.Sprint(res.Tokens) != fmt.Sprint(want) {
						t.Fatalf("tokens %v, the model package's %v", res.Tokens, want)
					}
					if r.o.Strategy == Lazy {
						return // only what requests needed is loaded
					}
					if err := m.Resident().Wait(context.Background()); err != nil {
						t.Fatal(err)
					}
					for l := range m.Config().Layers {
						for e := range m.Experts(l) {
							if st, err := m.Expert(l, e).State(); st != UnitResident {
								t.Fatalf("layer %d expert %d: %v (%v) once all is resident", l, e, st, err)
							}
						}
					}
				})
			}
		}
	}
}

// TestFirstTokenBeforeEveryExpert: with the bytes of every expert the
// prompt does not route to held back (their reads block until the first
// token is out), the first token still comes: the request waited only for
// its own experts. The assertion is on the order of events (the first
// token before any held-back expert's ExpertReady), not on times.
func TestFirstTokenBeforeEveryExpert(t *testing.T) {
	path := writeMoE(t, "tiny-qwen3moe", synth.MixQ4_KM)
	prompt := []int32{1, 5, 9}
	firstTokenBeforeEveryExpert(t, path, prompt, "cpu", routedExpertsOn(t, path, prompt, "cpu"), referenceGreedy(t, path, prompt, 1))
}

// firstTokenBeforeEveryExpert is TestFirstTokenBeforeEveryExpert's body on
// device, for a prompt that routes to the experts routed and whose first
// token is want.
func firstTokenBeforeEveryExpert(t *testing.T, path string, prompt []int32, device string, routed map[expertKey]bool, want []int32) {
	t.Helper()

	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gate := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(gate) }) }
	defer open()
	var held sync.Map // expertKey → true: a read that waited at the gate
	hooks := Hooks{Read: func(ctx context.Context, tensor string, off, n int64) error {
		k, ok := expertOfRead(t, f, tensor, off)
		if !ok || routed[k] {
			return nil
		}
		held.Store(k, true)
		select {
		case <-gate:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}}
	// Enough readers that the held-back reads (3 tensors' pieces of each
	// such expert) never take every reader: the routed ones get read.
	m, err := Open(context.Background(), path, Options{Threads: 2, Readers: 128, Hooks: hooks, Device: device})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	sub := m.Subscribe()
	defer sub.Close()
	// A request that waited for a held-back expert would wait until the
	// deadline: it fails instead of hanging the test.
	gctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := m.Generate(gctx, "", GenerateOptions{PromptIDs: prompt, MaxTokens: 1, IgnoreEOG: true})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(res.Tokens) != fmt.Sprint(want) {
		t.Fatalf("tokens %v, want %v", res.Tokens, want)
	}
	pending := 0
	for l := range m.Config().Layers {
		for e := range m.Experts(l) {
			if st, _ := m.Expert(l, e).State(); st != UnitResident {
				pending++
			}
		}
	}
	open()
	if err := m.Resident().Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	m.Close()

	total := m.Config().Layers * m.Config().Experts
	if want := total - len(routed); pending != want {
		t.Fatalf("%d experts pending at the first token, want the %d not routed to", pending, want)
	}
	var readyBefore, readyAfter int
	var bytesIn, bytesAtFirst, bytesAll int64
	firstSeen, allSeen := false, false
	for ev := range sub.C {
		switch e := ev.(type) {
		case ModelReady:
			bytesIn += e.Bytes
		case LayerReady:
			bytesIn += e.Bytes
		case FirstToken:
			firstSeen, bytesAtFirst = true, bytesIn
		case ExpertReady:
			bytesIn += e.Bytes
			k := expertKey{e.Layer, e.Expert}
			switch {
			case !firstSeen && !routed[k]:
				t.Errorf("expert %v, held back, resident before the first token", k)
			case !firstSeen:
				readyBefore++
			default:
				readyAfter++
			}
		case AllResident:
			if !firstSeen {
				t.Error("all resident before the first token")
			}
			allSeen, bytesAll = true, e.Bytes
		}
	}
	if !firstSeen || !allSeen {
		t.Fatalf("events: first token %v, all resident %v", firstSeen, allSeen)
	}
	if readyBefore+readyAfter != total || readyAfter == 0 {
		t.Fatalf("%d expert_ready events before the first token, %d after; %d experts", readyBefore, readyAfter, total)
	}
	n := 0
	held.Range(func(any, any) bool { n++; return true })
	if n != total-len(routed) {
		t.Fatalf("%d experts' reads were held back, want %d", n, total-len(routed))
	}
	if bytesIn != bytesAll {
		t.Fatalf("the ready events add up to %d bytes, all resident is %d", bytesIn, bytesAll)
	}
	t.Logf("%s: %d of %d experts resident at the first token (the %d distinct experts the prompt routed to), %.1f%% of the weights' bytes",
		device, readyBefore, total, len(routed), 100*float64(bytesAtFirst)/float64(bytesAll))
}

// TestExpertReadErrorFailsOnlyItsRequests: one expert's bytes can not be
// read. Its future fails (alone: the other experts load), a request whose
// router picks it fails with an error naming the layer, the expert and the
// tensor, and a request that does not need it runs to the reference
// tokens. Nothing hangs (TestMain's goleak: nothing is left running).
func TestExpertReadErrorFailsOnlyItsRequests(t *testing.T) {
	path := writeMoE(t, "tiny-qwen3moe", synth.MixQ4_KM)
	promptA := []int32{1, 5, 9}
	routed := routedExperts(t, path, promptA)
	var bad expertKey
	for k := range routed {
		if k.layer == 1 { // the last block: the request ran the first one already
			bad = k
			break
		}
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	errDisk := errors.New("injected: bad sector")
	hooks := Hooks{Read: func(ctx context.Context, tensor string, off, n int64) error {
		if k, ok := expertOfRead(t, f, tensor, off); ok && k == bad {
			return errDisk
		}
		return nil
	}}
	m, err := Open(context.Background(), path, Options{Threads: 2, Hooks: hooks})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()

	// Every future resolves: the bad expert's fails, every other one
	// becomes resident, and so the whole model's fails.
	for l := range m.Config().Layers {
		if err := m.Layer(l).Wait(context.Background()); err != nil {
			t.Fatalf("layer %d: %v", l, err)
		}
		for e := range m.Experts(l) {
			err := m.Expert(l, e).Wait(context.Background())
			if (expertKey{l, e} == bad) != (err != nil) {
				t.Fatalf("layer %d expert %d: %v", l, e, err)
			}
		}
	}
	if err := m.Resident().Wait(context.Background()); !errors.Is(err, errDisk) {
		t.Fatalf("all resident: %v, want the expert's failure", err)
	}

	_, err = m.Generate(context.Background(), "", GenerateOptions{PromptIDs: promptA, MaxTokens: 1, IgnoreEOG: true})
	var le *actors.LoadError
	if !errors.Is(err, errDisk) || !errors.As(err, &le) || le.Layer != bad.layer || le.Expert != bad.expert {
		t.Fatalf("request routed to the bad expert: %v", err)
	}
	msg := err.Error()
	for _, s := range []string{fmt.Sprintf("layer %d expert %d", bad.layer, bad.expert), fmt.Sprintf("blk.%d.ffn_", bad.layer), "_exps.weight", "reading bytes"} {
		if !strings.Contains(msg, s) {
			t.Errorf("error %q does not say %q", msg, s)
		}
	}

	// A prompt that does not route to the bad expert runs.
	ran := false
	for tok := int32(2); tok < 66 && !ran; tok++ {
		p := []int32{tok}
		res, err := m.Generate(context.Background(), "", GenerateOptions{PromptIDs: p, MaxTokens: 1, IgnoreEOG: true})
		if err != nil {
			if !errors.Is(err, errDisk) {
				t.Fatalf("prompt %v: %v, not the bad expert's error", p, err)
			}
			continue // it routed to the bad expert too
		}
		if want := referenceGreedy(t, path, p, 1); fmt.Sprint(res.Tokens) != fmt.Sprint(want) {
			t.Fatalf("prompt %v: tokens %v, want %v", p, res.Tokens, want)
		}
		ran = true
	}
	if !ran {
		t.Fatal("every one-token prompt routed to the bad expert")
	}
}

// TestCancelResolvesEveryExpertFuture: a load cancelled (or a model
// closed) while experts are still on their way fails every future it
// leaves behind: no waiter hangs.
func TestCancelResolvesEveryExpertFuture(t *testing.T) {
	path := writeMoE(t, "tiny-mixtral", synth.MixQ4_KM)
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Expert reads block until the load ends.
	hooks := Hooks{Read: func(ctx context.Context, tensor string, off, n int64) error {
		if _, ok := expertOfRead(t, f, tensor, off); ok {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}}
	for _, how := range []string{"cancel", "close"} {
		t.Run(how, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			m, err := Open(ctx, path, Options{Threads: 2, Hooks: hooks})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			for l := range m.Config().Layers {
				if err := m.Layer(l).Wait(context.Background()); err != nil {
					t.Fatalf("layer %d: %v", l, err)
				}
			}
			if how == "cancel" {
				cancel()
			} else {
				m.Close()
			}
			n := 0
			for l := range m.Config().Layers {
				for e := range m.Experts(l) {
					if err := m.Expert(l, e).Wait(context.Background()); err == nil {
						t.Fatalf("layer %d expert %d resident though its reads never ran", l, e)
					}
					n++
				}
			}
			if n == 0 {
				t.Fatal("no expert futures")
			}
			if err := m.Resident().Wait(context.Background()); err == nil {
				t.Fatal("all resident")
			}
		})
	}
}

// TestExpertProfileOrder: a model opened with ExpertProfiles records,
// at Close, how many tokens its requests routed to each expert under the file's
// identity; the next open of the same file loads those experts before
// the others (read order, one reader); a file with other weights has
// another identity, so the profile does not apply to it.
func TestExpertProfileOrder(t *testing.T) {
	path := writeMoE(t, "tiny-qwen3moe", synth.MixQ4_KM)
	prompt := []int32{1, 5, 9}
	dir := t.TempDir()

	m, err := Open(context.Background(), path, Options{Threads: 2, ExpertProfiles: dir})
	if err != nil {
		t.Fatal(err)
	}
	sub := m.Subscribe()
	res, err := m.Generate(context.Background(), "", GenerateOptions{PromptIDs: prompt, MaxTokens: 1, IgnoreEOG: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	routed := map[expertKey]bool{}
	for ev := range sub.C {
		if r, ok := ev.(ExpertRun); ok && r.Req == res.ID {
			routed[expertKey{r.Layer, r.Expert}] = true
		}
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	id, err := fileIdentity(f)
	if err != nil {
		t.Fatal(err)
	}
	prof, err := loadProfile(dir, id)
	if err != nil || prof == nil {
		t.Fatalf("profile after Close: %v, %v", prof, err)
	}
	shape := synth.Presets["tiny-qwen3moe"]
	for l := range shape.Layers {
		var sum int64
		for e := range shape.Experts {
			if used := prof.uses(l, e) > 0; used != routed[expertKey{l, e}] {
				t.Fatalf("layer %d expert %d: %d tokens recorded, routed by the request: %v", l, e, prof.uses(l, e), routed[expertKey{l, e}])
			}
			sum += prof.uses(l, e)
		}
		// Every layer but the last runs its mixture on the prompt's 3
		// tokens; the last on the one whose logits are read.
		if want := int64(shape.ExpertsUsed * map[bool]int{true: 1, false: len(prompt)}[l == shape.Layers-1]); sum != want {
			t.Fatalf("layer %d: %d (token, expert) uses recorded, want %d", l, sum, want)
		}
	}

	var mu sync.Mutex
	var order []expertKey
	hooks := Hooks{Read: func(ctx context.Context, tensor string, off, n int64) error {
		if k, ok := expertOfRead(t, f, tensor, off); ok {
			mu.Lock()
			if len(order) == 0 || order[len(order)-1] != k {
				order = append(order, k)
			}
			mu.Unlock()
		}
		return nil
	}}
	m2, err := Open(context.Background(), path, Options{Threads: 2, Readers: 1, Hooks: hooks, ExpertProfiles: dir})
	if err != nil {
		t.Fatal(err)
	}
	if err := m2.Resident().Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	m2.Close()
	if len(order) != 2*16 {
		t.Fatalf("experts read in %d runs, want one run of pieces per expert: %v", len(order), order)
	}
	for i, k := range order {
		if (i < len(routed)) != routed[k] {
			t.Fatalf("read order %v: the %d routed experts %v do not come first", order, len(routed), routed)
		}
		// A profile of one prompt: every expert it routed to is hot, and
		// the hot ones load block by block.
		if i > 0 && i < len(routed) && k.layer < order[i-1].layer {
			t.Fatalf("read order %v: the routed experts do not load block by block", order)
		}
	}

	// The same shapes and types, other weights (another seed): only the
	// routers' bytes tell the files apart.
	other := filepath.Join(t.TempDir(), "other.gguf")
	if err := synth.WriteFile(context.Background(), other, synth.Options{Shape: synth.Presets["tiny-qwen3moe"], Mix: synth.MixQ4_KM, Seed: 22}); err != nil {
		t.Fatal(err)
	}
	fo, err := gguf.Open(other)
	if err != nil {
		t.Fatal(err)
	}
	defer fo.Close()
	if oid, err := fileIdentity(fo); err != nil || oid == id {
		t.Fatalf("another file's identity %q (%v), this one's %q", oid, err, id)
	}
}

// TestExpertCopyFailureOnTheStream: the copies of one stacked tensor of
// block 1 fail on the asynchronous uploader's stream (as a GPU reports a
// failed copy at its event): every expert of block 1 fails with an error
// naming the block, the expert and the cause, the blocks themselves are
// resident, every future resolves, and a request, which needs experts of
// block 1 whatever it routes, fails with that error instead of hanging.
func TestExpertCopyFailureOnTheStream(t *testing.T) {
	path := writeMoE(t, "tiny-qwen3moe", synth.MixQ4_KM)
	errCopy := errors.New("injected: device out of memory")
	up := &actors.StreamUploader{Copy: func(tensor string) error {
		if tensor == "blk.1.ffn_down_exps.weight" {
			return errCopy
		}
		return nil
	}}
	m, err := Open(context.Background(), path, Options{Threads: 2, uploader: up})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for l := range m.Config().Layers {
		if err := m.Layer(l).Wait(context.Background()); err != nil {
			t.Fatalf("layer %d: %v", l, err)
		}
		for e := range m.Experts(l) {
			err := m.Expert(l, e).Wait(context.Background())
			var le *actors.LoadError
			switch {
			case l == 0 && err != nil:
				t.Fatalf("layer 0 expert %d: %v", e, err)
			case l == 1 && (!errors.Is(err, errCopy) || !errors.As(err, &le) || le.Layer != 1 || le.Expert != e):
				t.Fatalf("layer 1 expert %d: %v, want the copy's failure", e, err)
			}
		}
	}
	_, err = m.Generate(context.Background(), "", GenerateOptions{PromptIDs: []int32{1, 5}, MaxTokens: 2, IgnoreEOG: true})
	if !errors.Is(err, errCopy) || !strings.Contains(err.Error(), "layer 1 expert ") {
		t.Fatalf("request: %v", err)
	}
}

// TestExpertUnitsBatched: the batching scheduler's steps wait for experts
// the same way (its requests give the model package's tokens while the
// experts still load, held back until the requests are queued).
func TestExpertUnitsBatched(t *testing.T) {
	path := writeMoE(t, "tiny-mixtral", synth.MixQ4_KM)
	prompts := [][]int32{{1, 5, 9}, {2, 7}, {3}}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gate := make(chan struct{})
	hooks := Hooks{Read: func(ctx context.Context, tensor string, off, n int64) error {
		if _, ok := expertOfRead(t, f, tensor, off); ok {
			select {
			case <-gate:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}}
	m, err := Open(context.Background(), path, Options{Threads: 2, Hooks: hooks, Batching: Batching{On: true, Deterministic: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var wg sync.WaitGroup
	got := make([][]int32, len(prompts))
	errs := make([]error, len(prompts))
	for i, p := range prompts {
		wg.Go(func() {
			res, err := m.Generate(context.Background(), "", GenerateOptions{PromptIDs: p, MaxTokens: 4, IgnoreEOG: true})
			got[i], errs[i] = res.Tokens, err
		})
	}
	if st, _ := m.Expert(0, 0).State(); st == UnitResident {
		t.Fatal("an expert resident while its reads are held back")
	}
	close(gate)
	wg.Wait()
	for i, p := range prompts {
		if errs[i] != nil {
			t.Fatalf("prompt %v: %v", p, errs[i])
		}
		if want := referenceGreedy(t, path, p, 4); fmt.Sprint(got[i]) != fmt.Sprint(want) {
			t.Fatalf("prompt %v: tokens %v, want %v", p, got[i], want)
		}
	}
}

// TestProfileOrderHotByBlock: the experts a profile holds as hot (at
// least half an even spread's share of their block's uses) load block by
// block, whatever their counts; the rest follow, most used first.
func TestProfileOrderHotByBlock(t *testing.T) {
	prof := &expertProfile{Uses: [][]int64{
		{1, 1, 0, 0},  // block 0: both used experts hot
		{9, 1, 0, 0},  // block 1: 1 use of 10 is under half of 10/4: cold
		{0, 0, 40, 0}, // block 2: one hot expert
	}}
	p := &actors.Plan{Units: []*actors.Unit{{Layer: 0, Expert: -1}, {Layer: 1, Expert: -1}, {Layer: 2, Expert: -1}}}
	for l := range 3 {
		for e := range 4 {
			p.Units = append(p.Units, &actors.Unit{Layer: l, Expert: e})
		}
	}
	var got [][2]int
	for _, u := range profileOrder(nil, prof)(p) {
		got = append(got, [2]int{u.Layer, u.Expert})
	}
	want := [][2]int{{0, -1}, {1, -1}, {2, -1}, // the blocks first, as planned
		{0, 0}, {0, 1}, {1, 0}, {2, 2}, // hot, block by block (not 2.2 then 1.0 by count)
		{1, 1},                                                 // cold but used
		{0, 2}, {0, 3}, {1, 2}, {1, 3}, {2, 0}, {2, 1}, {2, 3}} // unused, in plan order
	if !slices.Equal(got, want) {
		t.Fatalf("load order\n got %v\nwant %v", got, want)
	}
}
