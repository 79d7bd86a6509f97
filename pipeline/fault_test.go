package pipeline

import (
	"context"
	"errors"
	"github.com/forge-llm/forge/pipeline/tokenizer"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/gguf/testmodels"
)

// copyModel copies a bundled model into dir under name, so that a test can
// truncate or overwrite it while it is served.
func copyModel(t *testing.T, from, dir, name string) string {
	t.Helper()
	b, err := os.ReadFile(testmodels.Path(t, from))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func halve(t *testing.T, path string) {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, st.Size()/2); err != nil {
		t.Fatal(err)
	}
}

// A served model file truncated (a download, or `forge gen -o` writing
// over it: os.Create truncates first) or rewritten in place: the next
// request fails with an error wrapping the change, where reading the
// weights would have killed the process with SIGBUS. A truncation in the
// middle of a request (between two tokens) faults in the CPU kernels; that
// request fails with the fault, located in the file, and the model stays
// broken.
func TestGenerateOnChangedFile(t *testing.T) {
	prompt := GenerateOptions{PromptIDs: []int32{1, 403, 407}, MaxTokens: 8, IgnoreEOG: true}
	open := func(t *testing.T, path string) *Model {
		t.Helper()
		m, err := Open(context.Background(), path, Options{Threads: 4})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		if _, err := m.Generate(context.Background(), "", prompt); err != nil {
			t.Fatal(err)
		}
		return m
	}
	t.Run("truncated between requests", func(t *testing.T) {
		path := copyModel(t, "stories260K-Q4_0.gguf", t.TempDir(), "m.gguf")
		m := open(t, path)
		halve(t, path)
		_, err := m.Generate(context.Background(), "", prompt)
		var ce *gguf.ChangedError
		if !errors.Is(err, gguf.ErrFileChanged) || !errors.As(err, &ce) || ce.File != path {
			t.Fatalf("request after truncation: %v", err)
		}
	})
	t.Run("rewritten in place", func(t *testing.T) {
		path := copyModel(t, "stories260K-Q4_0.gguf", t.TempDir(), "m.gguf")
		m := open(t, path)
		other, err := os.ReadFile(testmodels.Path(t, "stories260K-Q8_0.gguf"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, other, 0o644); err != nil { // O_TRUNC, as gen -o
			t.Fatal(err)
		}
		if _, err := m.Generate(context.Background(), "", prompt); !errors.Is(err, gguf.ErrFileChanged) {
			t.Fatalf("request after the file was rewritten: %v", err)
		}
	})
	t.Run("truncated mid-request", func(t *testing.T) {
		path := copyModel(t, "stories260K-Q4_0.gguf", t.TempDir(), "m.gguf")
		m := open(t, path)
		o := prompt
		n := 0
		o.OnToken = func(Token) error {
			if n++; n == 2 {
				halve(t, path)
			}
			return nil
		}
		res, err := m.Generate(context.Background(), "", o)
		var fe *gguf.FaultError
		if !errors.As(err, &fe) || fe.File != path || fe.Offset < 0 || !strings.Contains(err.Error(), "weight") {
			t.Fatalf("request truncated mid-way: %v", err)
		}
		if len(res.Tokens) != 2 {
			t.Errorf("%d tokens before the fault, want 2", len(res.Tokens))
		}
		if _, err := m.Generate(context.Background(), "", prompt); !gguf.MappingBroken(err) {
			t.Fatalf("request after the fault: %v", err)
		}
	})
}

// Two models in an engine; one's file is truncated. Its next request fails
// (naming the model, not the host path, while wrapping the typed cause),
// it is unloaded and reports failed with the reason, and the other keeps
// generating. The same for a fault in the middle of a request.
func TestEngineModelFileChanged(t *testing.T) {
	for _, mid := range []bool{false, true} {
		name := map[bool]string{false: "between requests", true: "mid-request"}[mid]
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			a := copyModel(t, "stories260K-Q4_0.gguf", dir, "a.gguf")
			b := copyModel(t, "stories260K-Q8_0.gguf", dir, "b.gguf")
			e := newTestEngine(t, EngineOptions{})
			if err := e.Add("a", a); err != nil {
				t.Fatal(err)
			}
			if err := e.Add("b", b); err != nil {
				t.Fatal(err)
			}
			req := func(id string) EngineRequest {
				return EngineRequest{Model: id, Prompt: "Once upon a time", MaxTokens: 8, IgnoreEOG: true}
			}
			for _, id := range []string{"a", "b"} {
				if _, err := e.Generate(context.Background(), req(id)); err != nil {
					t.Fatal(err)
				}
			}
			ra := req("a")
			if mid {
				// The file is cut between the second and third tokens, on
				// the goroutine that generates (a constraint's Accept runs
				// there), so the fault lands mid-request whatever the
				// timing: a streamed callback runs apart from the steps and
				// may come after the last one.
				ra.MaxTokens = 16
				ra.Constrain = func(tok *tokenizer.Tokenizer, _ *EngineRequest) (Constraint, error) {
					return &cutAfter{n: 2, cut: func() { halve(t, a) }, mask: allTokens(tok.VocabSize())}, nil
				}
			} else {
				halve(t, a)
			}
			_, err := e.Generate(context.Background(), ra)
			var mf *ModelFailedError
			if !errors.As(err, &mf) || mf.Model != "a" || !gguf.MappingBroken(err) {
				t.Fatalf("request on the changed model: %v", err)
			}
			if mid && !errors.Is(err, gguf.ErrMappingFault) {
				t.Errorf("mid-request: %v, want the fault", err)
			}
			if strings.Contains(err.Error(), dir) {
				t.Errorf("the client's error names the host path: %v", err)
			}
			st, _ := e.StatusOf("a")
			if st.State != StateFailed || st.Err == "" || strings.Contains(st.Err, dir) || st.Path != "" || st.Active != 0 {
				t.Errorf("status of the changed model: %+v", st)
			}
			res, err := e.Generate(context.Background(), req("b"))
			if err != nil || len(res.Tokens) == 0 {
				t.Fatalf("the other model after the failure: %v (%d tokens)", err, len(res.Tokens))
			}
			if st, _ := e.StatusOf("b"); st.State != StateResident && st.State != StateReady {
				t.Errorf("status of the other model: %+v", st)
			}
			// The next request loads the file anew: here it is cut short,
			// so the load fails; the engine lives on.
			if _, err := e.Generate(context.Background(), req("a")); err == nil {
				t.Error("a request loaded the truncated file")
			}
		})
	}
}

// A lazily loaded model whose file is cut before its blocks were read: the
// request fails with the change at its start, and every readiness future
// resolves (the blocks never demanded fail with it instead of staying
// pending forever); TestMain's goleak checks nothing is left running.
func TestLazyModelTruncatedBeforeLayers(t *testing.T) {
	path := copyModel(t, "stories260K-Q4_0.gguf", t.TempDir(), "m.gguf")
	m, err := Open(context.Background(), path, Options{Strategy: Lazy, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Ready().Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	halve(t, path)
	_, err = m.Generate(context.Background(), "", GenerateOptions{PromptIDs: []int32{1, 403}, MaxTokens: 4})
	if !errors.Is(err, gguf.ErrFileChanged) {
		t.Fatalf("request after truncation: %v", err)
	}
	for i := range m.Config().Layers {
		if err := m.Layer(i).Wait(context.Background()); !errors.Is(err, gguf.ErrFileChanged) {
			t.Errorf("layer %d: %v, want the change", i, err)
		}
	}
	if err := m.Resident().Wait(context.Background()); !errors.Is(err, gguf.ErrFileChanged) {
		t.Errorf("Resident: %v", err)
	}
	if err := m.Ready().Err(); err != nil {
		t.Errorf("the globals, resident before the cut: %v", err)
	}
}

// cutAfter is a constraint that allows every token and calls cut once n
// tokens were generated: a hook on the generating goroutine.
type cutAfter struct {
	n, seen int
	cut     func()
	mask    []uint64
}

func (c *cutAfter) Allowed() ([]uint64, error) { return c.mask, nil }

func (c *cutAfter) Accept(int32) error {
	if c.seen++; c.seen == c.n {
		c.cut()
	}
	return nil
}

func (c *cutAfter) Close() {}

// allTokens is a constraint mask allowing each of n tokens.
func allTokens(n int) []uint64 {
	m := make([]uint64, (n+63)/64)
	for i := range n {
		m[i/64] |= 1 << (i % 64)
	}
	return m
}
