package actors

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/forge-llm/forge/actors/progress"
	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/gguf/testmodels"
)

// tempModel copies a test model into the test's temporary directory, so
// that the test can truncate it, and returns the copy's path.
func tempModel(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(testmodels.Path(t, name))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func startFile(t *testing.T, path string, cfg Config) *System {
	t.Helper()
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := f.Uint("llama.block_count")
	cfg.File, cfg.Layers = f, int(n)
	s, err := Start(context.Background(), cfg)
	if err != nil {
		f.Close()
		t.Fatal(err)
	}
	return s
}

// allResolve waits for every future of s and returns the error of each
// block's (they must all resolve: no waiter may hang on a broken file).
func allResolve(t *testing.T, s *System) []error {
	t.Helper()
	ctx := context.Background()
	_ = s.Ready().Wait(ctx)
	_ = s.Resident().Wait(ctx)
	errs := make([]error, s.Plan().Layers())
	for i := range errs {
		errs[i] = s.LayerFuture(i).Wait(ctx)
	}
	return errs
}

// TestLazyLoadAfterTruncation: a lazily loaded model whose file is cut to
// half before its blocks are read. The reader's fstat check sees the
// change before touching a page: the first block demanded fails with a
// *gguf.ChangedError inside its LoadError, every later future fails with
// it, and the process lives on (goleak checks the actors are gone).
func TestLazyLoadAfterTruncation(t *testing.T) {
	path := tempModel(t, "stories260K-Q4_0.gguf")
	s := startFile(t, path, Config{Strategy: Lazy})
	defer s.Close()
	if err := s.Ready().Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(path)
	if err := os.Truncate(path, st.Size()/2); err != nil {
		t.Fatal(err)
	}
	err := s.WaitLayer(context.Background(), 0)
	var le *LoadError
	if !errors.Is(err, gguf.ErrFileChanged) || !errors.As(err, &le) || le.Layer != 0 || le.Tensor == "" {
		t.Fatalf("layer 0 after truncation: %v", err)
	}
	for i, err := range allResolve(t, s) {
		if !errors.Is(err, gguf.ErrFileChanged) {
			t.Errorf("layer %d: %v, want the change", i, err)
		}
	}
	if err := s.Ready().Err(); err != nil {
		t.Errorf("the globals, loaded before the change, failed: %v", err)
	}
}

// faultingConverter truncates the model file just before its first
// conversion: the reader has already paged the chunk in and checked the
// file, so the converter's read of the mapping is what faults.
type faultingConverter struct {
	Conversion
	path  string
	at    int64
	fired atomic.Bool
}

func (c *faultingConverter) Convert(from, to gguf.Type, src, dst []byte) error {
	if !c.fired.Swap(true) {
		if err := os.Truncate(c.path, c.at); err != nil {
			return err
		}
	}
	return c.Conversion.Convert(from, to, src, dst)
}

// TestConverterFault: the file is truncated between the reader and the
// dequantizer (host-f32 converts every tensor). The converter's SIGBUS
// becomes the unit's error, a *gguf.FaultError located in the file, and
// every future resolves.
func TestConverterFault(t *testing.T) {
	path := tempModel(t, "stories260K-Q4_0.gguf")
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	dataAt := f.DataOffset
	f.Close()
	conv := &faultingConverter{Conversion: Conversion{AllF32: true}, path: path, at: 0}
	// One chunk in flight: the globals' first chunk is the one that faults,
	// before any reader could see the change.
	s := startFile(t, path, Config{Strategy: HostF32, Converter: conv, Readers: 1, MaxInflight: 1})
	defer s.Close()
	errs := allResolve(t, s)
	err = s.Resident().Err()
	var fe *gguf.FaultError
	var le *LoadError
	if !errors.As(err, &le) || le.Layer != progress.Globals {
		t.Fatalf("Resident after a fault in the converter: %v, want the globals' load error", err)
	}
	// The fault is recorded before the chunk leaves flight, so the reader
	// the loader lets go next finds the unit dropped: its check of the
	// truncated file never becomes the unit's error (it once did, when the
	// chunk left first).
	if !errors.As(err, &fe) {
		t.Fatalf("Resident after a fault in the converter: %v, want the fault", err)
	}
	if fe.File != path || fe.Offset < dataAt || !strings.Contains(err.Error(), "converting") {
		t.Errorf("fault of %v located at %q offset %d, want the globals' conversion in %s past %d", err, fe.File, fe.Offset, path, dataAt)
	}
	for i, err := range errs {
		if err == nil {
			t.Errorf("layer %d resolved from a truncated file", i)
		}
	}
}

// faultGen stands for a CPU generator: it reads a weight straight from the
// mapping, the way the kernels do, with the fault made an error; cut, when
// set, truncates the file first (a `forge gen -o` over it mid-request).
type faultGen struct {
	s   *System
	cut func()
}

func (g *faultGen) Generate(ctx context.Context, prompt []int32, opts struct{}, emit func(int32) error) (string, error) {
	if err := g.s.WaitLayer(ctx, 1); err != nil {
		return "", err
	}
	w, ok := g.s.Weight("blk.1.ffn_up.weight")
	if !ok {
		return "", errors.New("no weight")
	}
	if g.cut != nil {
		g.cut()
	}
	var sum byte
	if err := gguf.CatchFault(func() {
		for i := 0; i < len(w.Host); i += 512 {
			sum += w.Host[i]
		}
	}); err != nil {
		return "", err
	}
	return "max_tokens", emit(int32(sum))
}

func (g *faultGen) Close() {}

// TestExecutorBrokenFile: a request checks the file before it runs; a
// fault during a request is located in the file and breaks the model for
// every later request.
func TestExecutorBrokenFile(t *testing.T) {
	t.Run("changed before", func(t *testing.T) {
		path := tempModel(t, "stories260K-Q4_0.gguf")
		s := startFile(t, path, Config{})
		defer s.Close()
		ex := StartExecutor(s, func(context.Context) (Generator[struct{}], error) { return &faultGen{s: s}, nil })
		if _, err := ex.Submit(context.Background(), Request[struct{}]{Prompt: []int32{1}}); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(path, 100); err != nil {
			t.Fatal(err)
		}
		_, err := ex.Submit(context.Background(), Request[struct{}]{Prompt: []int32{1}})
		if !errors.Is(err, gguf.ErrFileChanged) || !errors.Is(s.Broken(), gguf.ErrFileChanged) {
			t.Fatalf("request after truncation: %v (broken: %v)", err, s.Broken())
		}
		// What was still loading fails with it; what was resident stays.
		if err := s.Ready().Err(); err != nil {
			t.Errorf("resident globals failed: %v", err)
		}
	})
	t.Run("fault during", func(t *testing.T) {
		path := tempModel(t, "stories260K-Q4_0.gguf")
		s := startFile(t, path, Config{})
		defer s.Close()
		var cut atomic.Bool
		g := &faultGen{s: s}
		g.cut = func() {
			if cut.Load() {
				if err := os.Truncate(path, 100); err != nil {
					t.Error(err)
				}
			}
		}
		ex := StartExecutor(s, func(context.Context) (Generator[struct{}], error) { return g, nil })
		if _, err := ex.Submit(context.Background(), Request[struct{}]{Prompt: []int32{1}}); err != nil {
			t.Fatal(err)
		}
		cut.Store(true)
		_, err := ex.Submit(context.Background(), Request[struct{}]{Prompt: []int32{1}})
		var fe *gguf.FaultError
		if !errors.As(err, &fe) || fe.File != path || fe.Offset <= 100 {
			t.Fatalf("request faulting mid-way: %v", err)
		}
		cut.Store(false)
		if _, err := ex.Submit(context.Background(), Request[struct{}]{Prompt: []int32{1}}); !errors.Is(err, gguf.ErrMappingFault) {
			t.Fatalf("request after the fault: %v, want the model broken", err)
		}
	})
}
