package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/forge-llm/forge/actors"
	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/gguf/testmodels"
)

// storiesPrompt is "Once upon a time" with BOS, as the reference has it.
var storiesPrompt = []int32{1, 403, 407, 261, 378}

// find returns the index of the first event matching ok, or -1.
func find(evs []Event, ok func(Event) bool) int {
	for i, e := range evs {
		if ok(e) {
			return i
		}
	}
	return -1
}

func layerReady(l int) func(Event) bool {
	return func(e Event) bool { r, ok := e.(LayerReady); return ok && r.Layer == l }
}

func layerRun(l int) func(Event) bool {
	return func(e Event) bool { r, ok := e.(LayerRun); return ok && r.Layer == l }
}

func isFirstToken(e Event) bool { _, ok := e.(FirstToken); return ok }

// sleepCtx waits d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestPrefetchOverlapsCompute: with a slow loader (every layer's reads
// delayed, and the last layer's held until the request has entered layer
// 0), the trace shows the request running its first layers before the
// last layer is resident, and the first token only after it.
func TestPrefetchOverlapsCompute(t *testing.T) {
	path := testmodels.Path(t, "stories260K-F32.gguf")
	last := 4 // stories260K has 5 blocks
	release := make(chan struct{})
	hooks := Hooks{Read: func(ctx context.Context, tensor string, off, n int64) error {
		if !strings.HasPrefix(tensor, "blk.") {
			return nil
		}
		if err := sleepCtx(ctx, 5*time.Millisecond); err != nil {
			return err
		}
		if strings.HasPrefix(tensor, fmt.Sprintf("blk.%d.", last)) {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}}
	m, err := Open(context.Background(), path, Options{Hooks: hooks, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	sub := m.Subscribe()
	var mu sync.Mutex
	var evs []Event
	collected := make(chan struct{})
	go func() {
		defer close(collected)
		var once sync.Once
		for e := range sub.C {
			mu.Lock()
			evs = append(evs, e)
			mu.Unlock()
			if layerRun(0)(e) {
				once.Do(func() { close(release) })
			}
		}
	}()
	res, err := m.Generate(context.Background(), "", GenerateOptions{PromptIDs: storiesPrompt, MaxTokens: 8})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	<-collected
	if len(res.Tokens) != 8 {
		t.Fatalf("got %d tokens, want 8", len(res.Tokens))
	}
	ready := find(evs, func(e Event) bool { _, ok := e.(ModelReady); return ok })
	started := find(evs, func(e Event) bool { _, ok := e.(RequestStarted); return ok })
	run0, run1 := find(evs, layerRun(0)), find(evs, layerRun(1))
	lastReady := find(evs, layerReady(last))
	first := find(evs, isFirstToken)
	if ready < 0 || started < 0 || run0 < 0 || run1 < 0 || lastReady < 0 || first < 0 {
		t.Fatalf("missing events: ready %d started %d run0 %d run1 %d last-ready %d first %d", ready, started, run0, run1, lastReady, first)
	}
	at := func(i int) time.Duration { return evs[i].When() }
	t.Logf("model ready %v, request started %v, layer 0 run %v, layer 1 run %v, layer %d resident %v, first token %v",
		at(ready), at(started), at(run0), at(run1), last, at(lastReady), at(first))
	if !(ready < started && started < run0 && run0 < run1 && run1 < lastReady && lastReady < first) {
		t.Errorf("event order: ready %d < started %d < layer 0 run %d < layer 1 run %d < last layer resident %d < first token %d does not hold",
			ready, started, run0, run1, lastReady, first)
	}
	if !(at(run0) < at(lastReady) && at(lastReady) <= at(first)) {
		t.Errorf("times: layer 0 ran at %v, last layer resident at %v, first token at %v", at(run0), at(lastReady), at(first))
	}
}

// TestEventOrderPerStrategy: eager and host-f32 start computing only after
// every layer is resident; lazy reads a layer only after the request asked
// for it.
func TestEventOrderPerStrategy(t *testing.T) {
	path := testmodels.Path(t, "stories260K-Q4_0.gguf")
	for _, s := range []Strategy{Eager, HostF32, Lazy} {
		t.Run(s.String(), func(t *testing.T) {
			m, err := Open(context.Background(), path, Options{Strategy: s, Threads: 2})
			if err != nil {
				t.Fatal(err)
			}
			tr := collect(m.Subscribe())
			if _, err := m.Generate(context.Background(), "", GenerateOptions{PromptIDs: storiesPrompt, MaxTokens: 4}); err != nil {
				t.Fatal(err)
			}
			m.Close()
			evs := tr.all()
			all := find(evs, func(e Event) bool { _, ok := e.(AllResident); return ok })
			started := find(evs, func(e Event) bool { _, ok := e.(RequestStarted); return ok })
			if all < 0 || started < 0 {
				t.Fatalf("missing events: all resident %d, request started %d", all, started)
			}
			switch s {
			case Lazy:
				read3 := find(evs, func(e Event) bool { r, ok := e.(TensorRead); return ok && r.Layer == 3 })
				if !(started < read3 && read3 < all) {
					t.Errorf("lazy: request started %d, layer 3 read %d, all resident %d", started, read3, all)
				}
			default:
				if all > started {
					t.Errorf("%s: request started (event %d) before all resident (event %d)", s, started, all)
				}
				if s == HostF32 {
					i := find(evs, func(e Event) bool { c, ok := e.(TensorConverted); return ok && c.To != gguf.TypeF32 })
					if i >= 0 {
						t.Errorf("host-f32 converted to %v: %v", evs[i].(TensorConverted).To, evs[i])
					}
				}
			}
		})
	}
}

// allResolved checks that every future of m resolves (units loading
// before the one that failed may still finish, so it waits; the bound only
// turns a hang into a failure).
func allResolved(t *testing.T, m *Model) {
	t.Helper()
	fs := []*Future{m.Ready(), m.Resident()}
	for i := range m.Config().Layers {
		fs = append(fs, m.Layer(i))
	}
	hang := time.After(10 * time.Second)
	for _, f := range fs {
		select {
		case <-f.Done():
		case <-hang:
			st, _ := f.State()
			t.Errorf("future %s left %s", f.Name(), st)
		}
	}
}

// faultCase opens a model with a fault, runs a request and checks that it
// fails naming what failed, that every future is resolved, and that Close
// returns all memory.
func faultCase(t *testing.T, path string, o Options, want ...string) error {
	t.Helper()
	mem := NewMemory(0)
	if o.Memory != nil {
		mem = o.Memory
	}
	o.Memory = mem
	o.Threads = 2
	m, err := Open(context.Background(), path, o)
	if err != nil {
		t.Fatal(err)
	}
	tr := collect(m.Subscribe())
	_, genErr := m.Generate(context.Background(), "", GenerateOptions{PromptIDs: storiesPrompt, MaxTokens: 8})
	if genErr == nil {
		t.Errorf("request succeeded despite the fault")
	} else {
		for _, w := range want {
			if !strings.Contains(genErr.Error(), w) {
				t.Errorf("request error %q does not name %q", genErr, w)
			}
		}
	}
	if err := m.Resident().Wait(context.Background()); err == nil {
		t.Errorf("Resident resolved despite the fault")
	}
	allResolved(t, m)
	if err := m.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	evs := tr.all()
	if find(evs, func(e Event) bool { _, ok := e.(ErrorEvent); return ok }) < 0 {
		t.Errorf("no error event in the trace")
	}
	if n := mem.InUse(); n != 0 {
		t.Errorf("%d bytes still accounted after Close", n)
	}
	return genErr
}

func TestFaultUnreadableRange(t *testing.T) {
	path := testmodels.Path(t, "stories260K-Q8_0.gguf")
	faultCase(t, path, Options{Hooks: Hooks{Read: func(ctx context.Context, tensor string, off, n int64) error {
		if tensor == "blk.3.ffn_up.weight" {
			return fmt.Errorf("injected EIO")
		}
		return nil
	}}}, "layer 3", "blk.3.ffn_up.weight", "injected EIO")
}

func TestFaultFailedUpload(t *testing.T) {
	path := testmodels.Path(t, "stories260K-Q4_0.gguf")
	faultCase(t, path, Options{Hooks: Hooks{Upload: func(tensor string) error {
		if tensor == "blk.1.attn_q.weight" {
			return fmt.Errorf("injected copy failure")
		}
		return nil
	}}}, "layer 1", "blk.1.attn_q.weight", "injected copy failure")
}

func TestFaultFailedUploadOfGlobals(t *testing.T) {
	path := testmodels.Path(t, "stories260K-Q4_0.gguf")
	faultCase(t, path, Options{Hooks: Hooks{Upload: func(tensor string) error {
		if tensor == "output.weight" {
			return fmt.Errorf("injected copy failure")
		}
		return nil
	}}}, "ready", "output.weight", "injected copy failure")
}

// truncatedCopy copies a bundled model to a temporary file cut inside
// tensor's data, and returns its path.
func truncatedCopy(t *testing.T, name, tensor string) string {
	t.Helper()
	src := testmodels.Path(t, name)
	f, err := gguf.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	ti, ok := f.Tensor(tensor)
	if !ok {
		t.Fatalf("%s has no %s", name, tensor)
	}
	cut := f.DataOffset + int64(ti.Offset) + int64(ti.Size)/2
	f.Close()
	dst := filepath.Join(t.TempDir(), name)
	copyFile(t, src, dst)
	if err := os.Truncate(dst, cut); err != nil {
		t.Fatal(err)
	}
	return dst
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// lastTensor is the tensor whose data ends the file.
func lastTensor(t *testing.T, path string) string {
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	best := &f.Tensors[0]
	for i := range f.Tensors {
		if f.Tensors[i].Offset > best.Offset {
			best = &f.Tensors[i]
		}
	}
	if !strings.HasPrefix(best.Name, "blk.") {
		t.Fatalf("the last tensor of %s is %s, not a block's", path, best.Name)
	}
	return best.Name
}

// TestFaultTruncatedFile: a file cut inside a block's tensor is caught by
// gguf.Open, which checks every tensor's range against the file size, and
// Open fails naming the tensor (no futures exist yet). A file cut after
// Open is TestFaultTruncatedWhileLoading.
func TestFaultTruncatedFile(t *testing.T) {
	name := "stories260K-F32.gguf"
	tensor := lastTensor(t, testmodels.Path(t, name))
	path := truncatedCopy(t, name, tensor)
	m, err := Open(context.Background(), path, Options{})
	if err == nil {
		m.Close()
		t.Fatal("Open succeeded on a truncated file")
	}
	if !strings.Contains(err.Error(), tensor) {
		t.Errorf("Open error %q does not name %s", err, tensor)
	}
}

// TestFaultTruncatedWhileLoading: the file is cut after Open, while the
// loader is reading. Every reader checks the file before it touches a
// chunk (a fault paging in the missing pages is the backstop), so the
// first chunk read after the cut fails its unit, whichever tensor it
// belongs to, with a gguf.ChangedError saying the file was truncated (and
// a request that starts after the cut fails with it at once).
func TestFaultTruncatedWhileLoading(t *testing.T) {
	name := "stories260K-F32.gguf"
	tensor := lastTensor(t, testmodels.Path(t, name))
	path := filepath.Join(t.TempDir(), name)
	copyFile(t, testmodels.Path(t, name), path)
	var once sync.Once
	var truncErr error
	err := faultCase(t, path, Options{Hooks: Hooks{Read: func(ctx context.Context, name string, off, n int64) error {
		if name == tensor {
			once.Do(func() {
				f, err := gguf.Open(path)
				if err != nil {
					truncErr = err
					return
				}
				ti, _ := f.Tensor(tensor)
				cut := f.DataOffset + int64(ti.Offset)
				f.Close()
				// Cut a page before the tensor so its first page is gone.
				truncErr = os.Truncate(path, cut&^4095)
			})
			return truncErr
		}
		return nil
	}}}, "truncated")
	if truncErr != nil {
		t.Fatal(truncErr)
	}
	// Whether the request saw the change at its start or waiting for a
	// failed layer depends on when the cut came; either way it is the
	// typed change.
	if !gguf.MappingBroken(err) {
		t.Errorf("request error %v: want a gguf.ChangedError", err)
	}
}

// TestFaultOutOfMemory: a device too small for the weights fails every
// future with ErrOutOfMemory; one too small for host-f32's F32 copies fails
// at the tensor that no longer fits; one too small for the KV cache fails
// the request.
func TestFaultOutOfMemory(t *testing.T) {
	path := testmodels.Path(t, "stories260K-Q4_0.gguf")
	t.Run("arena", func(t *testing.T) {
		err := faultCase(t, path, Options{Memory: NewMemory(64 << 10)}, "weight arena", "out of memory")
		if !errors.Is(err, actors.ErrOutOfMemory) {
			t.Errorf("error %v is not ErrOutOfMemory", err)
		}
	})
	t.Run("host-f32", func(t *testing.T) {
		err := faultCase(t, path, Options{Strategy: HostF32, Memory: NewMemory(600 << 10)}, "tensor", "out of memory")
		if !errors.Is(err, actors.ErrOutOfMemory) {
			t.Errorf("error %v is not ErrOutOfMemory", err)
		}
		var le *actors.LoadError
		if !errors.As(err, &le) || le.Tensor == "" {
			t.Errorf("error %v does not name a tensor", err)
		}
	})
	t.Run("kv-cache", func(t *testing.T) {
		f, err := gguf.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		var weights int64
		for _, ti := range f.Tensors {
			weights += int64(ti.Size)
		}
		f.Close()
		mem := NewMemory(weights + 1024)
		m, err := Open(context.Background(), path, Options{Memory: mem, Threads: 2})
		if err != nil {
			t.Fatal(err)
		}
		_, err = m.Generate(context.Background(), "", GenerateOptions{PromptIDs: storiesPrompt, MaxTokens: 4})
		if err == nil || !errors.Is(err, actors.ErrOutOfMemory) || !strings.Contains(err.Error(), "KV cache") {
			t.Errorf("request error %v, want out of memory for the KV cache", err)
		}
		m.Close()
		if n := mem.InUse(); n != 0 {
			t.Errorf("%d bytes still accounted after Close", n)
		}
	})
}

// slowReads delays every block read until ctx is done: a load that never
// finishes on its own.
func slowReads(ctx context.Context, tensor string, off, n int64) error {
	if !strings.HasPrefix(tensor, "blk.") {
		return nil
	}
	<-ctx.Done()
	return ctx.Err()
}

// TestCancelMidLoad: cancelling Open's context while layers are loading
// fails the futures still pending and the request waiting on them, quickly;
// Close then releases everything.
func TestCancelMidLoad(t *testing.T) {
	path := testmodels.Path(t, "stories260K-F32.gguf")
	mem := NewMemory(0)
	ctx, cancel := context.WithCancel(context.Background())
	m, err := Open(ctx, path, Options{Hooks: Hooks{Read: slowReads}, Memory: mem, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Ready().Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	genDone := make(chan error, 1)
	started := make(chan struct{})
	sub := m.Subscribe()
	go func() {
		for e := range sub.C {
			if _, ok := e.(RequestStarted); ok {
				close(started)
				break
			}
		}
		sub.Close()
	}()
	go func() {
		_, err := m.Generate(context.Background(), "", GenerateOptions{PromptIDs: storiesPrompt, MaxTokens: 4})
		genDone <- err
	}()
	<-started
	t0 := time.Now()
	cancel()
	err = <-genDone
	dGen := time.Since(t0)
	if err == nil || !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "layer 0") {
		t.Errorf("request error %v, want a cancelled load of layer 0", err)
	}
	err = m.Resident().Wait(context.Background())
	dRes := time.Since(t0)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Resident: %v, want cancelled", err)
	}
	allResolved(t, m)
	t1 := time.Now()
	m.Close()
	dClose := time.Since(t1)
	t.Logf("after cancel: request returned in %v, Resident failed in %v; Close took %v", dGen, dRes, dClose)
	if dGen > time.Second || dRes > time.Second || dClose > time.Second {
		t.Errorf("cancel took too long: request %v, resident %v, close %v (issue asks < 100 ms)", dGen, dRes, dClose)
	}
	if n := mem.InUse(); n != 0 {
		t.Errorf("%d bytes still accounted after Close", n)
	}
}

// TestCancelRequestWaitingForLayer: a request whose own context is
// cancelled while it waits for a layer returns at once.
func TestCancelRequestWaitingForLayer(t *testing.T) {
	path := testmodels.Path(t, "stories260K-F32.gguf")
	m, err := Open(context.Background(), path, Options{Hooks: Hooks{Read: slowReads}, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx, cancel := context.WithCancel(context.Background())
	sub := m.Subscribe()
	go func() {
		for e := range sub.C {
			if _, ok := e.(RequestStarted); ok {
				break
			}
		}
		sub.Close()
		cancel()
	}()
	t0 := time.Now()
	_, err = m.Generate(ctx, "", GenerateOptions{PromptIDs: storiesPrompt, MaxTokens: 4})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("request error %v, want cancelled", err)
	}
	t.Logf("request returned %v after Generate began", time.Since(t0))
	if st, _ := m.Layer(0).State(); st != UnitPending {
		t.Errorf("layer 0 is %v; the request's cancel must not touch the load", st)
	}
}

// TestCancelMidGeneration: cancelling a request between tokens returns
// quickly with the tokens so far; the model stays usable.
func TestCancelMidGeneration(t *testing.T) {
	path := testmodels.Path(t, "synth-kq-Q4_K_M.gguf")
	mem := NewMemory(0)
	m, err := Open(context.Background(), path, Options{Memory: mem, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	tr := collect(m.Subscribe())
	ctx, cancel := context.WithCancel(context.Background())
	var t0 time.Time
	res, err := m.Generate(ctx, "", GenerateOptions{PromptIDs: storiesPrompt, IgnoreEOG: true, OnToken: func(tok Token) error {
		if t0.IsZero() {
			t0 = time.Now()
			cancel()
		}
		return nil
	}})
	d := time.Since(t0)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("request error %v, want cancelled", err)
	}
	t.Logf("request returned %v after cancel, with %d tokens", d, len(res.Tokens))
	if len(res.Tokens) < 1 {
		t.Errorf("the token streamed before the cancel is missing from the result")
	}
	if d > time.Second {
		t.Errorf("cancel took %v (issue asks < 100 ms)", d)
	}
	// The model still serves the next request.
	res, err = m.Generate(context.Background(), "", GenerateOptions{PromptIDs: storiesPrompt, MaxTokens: 3})
	if err != nil || len(res.Tokens) != 3 {
		t.Errorf("next request: %v tokens, %v", res.Tokens, err)
	}
	m.Close()
	if n := mem.InUse(); n != 0 {
		t.Errorf("%d bytes still accounted after Close", n)
	}
	// The executor itself stops at the next layer boundary: its error event
	// for the request says when.
	evs := tr.all()
	i := find(evs, func(e Event) bool { x, ok := e.(ErrorEvent); return ok && x.Req == 1 })
	if i < 0 {
		t.Fatal("no error event for the cancelled request")
	}
	stopped := evs[i].When() - t0.Sub(m.Started())
	t.Logf("the executor stopped the request %v after the cancel", stopped)
	if stopped > time.Second {
		t.Errorf("the executor took %v to stop a cancelled request", stopped)
	}
}

// TestCloseDuringRequest: Close cancels a request in flight and releases
// everything.
func TestCloseDuringRequest(t *testing.T) {
	path := testmodels.Path(t, "stories260K-F32.gguf")
	mem := NewMemory(0)
	m, err := Open(context.Background(), path, Options{Hooks: Hooks{Read: slowReads}, Memory: mem, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := m.Generate(context.Background(), "", GenerateOptions{PromptIDs: storiesPrompt, MaxTokens: 4})
		done <- err
	}()
	if err := m.Ready().Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	m.Close()
	if err := <-done; err == nil {
		t.Errorf("request succeeded across Close")
	}
	if _, err := m.Generate(context.Background(), "", GenerateOptions{PromptIDs: storiesPrompt}); !errors.Is(err, actors.ErrClosed) {
		t.Errorf("Generate after Close: %v, want ErrClosed", err)
	}
	if n := mem.InUse(); n != 0 {
		t.Errorf("%d bytes still accounted after Close", n)
	}
}
