package generate

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/gguf/ggufedit"
	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/pipeline/internal/archtest"
	"github.com/forge-llm/forge/pipeline/model"
	"github.com/forge-llm/forge/pipeline/sample"
)

// openPath opens a model file on the CPU backend.
func openPath(t *testing.T, path string) *model.Model {
	t.Helper()
	cfg, w := archtest.OpenWeights(t, path)
	be := cpu.New(2)
	t.Cleanup(be.Close)
	m, err := model.New(be, cfg, w, model.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

// TestNonFiniteLogitsEndTheRun: a model whose output norm is +Inf (so no
// logit is finite) fails with sample.ErrNonFinite at the prompt, greedy or
// sampled, and returns no tokens: it used to panic in the sampler's
// softmax (sampled) or emit argmaxes of garbage (greedy).
func TestNonFiniteLogitsEndTheRun(t *testing.T) {
	p := filepath.Join(t.TempDir(), "nan.gguf")
	err := ggufedit.Copy(testmodels.Path(t, "stories260K-F32.gguf"), p, ggufedit.Edit{Tensor: func(ti *gguf.TensorInfo, b []byte) {
		if ti.Name == "output_norm.weight" {
			for i := 0; i+4 <= len(b); i += 4 {
				binary.LittleEndian.PutUint32(b[i:], math.Float32bits(float32(math.Inf(1))))
			}
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	m := openPath(t, p)
	for _, sp := range []sample.Params{{}, sample.Defaults(), {Temp: 1, MinP: 1}} {
		ids, _, err := Run(context.Background(), m, []int32{1, 403, 407}, Options{MaxTokens: 4, Sampler: sample.New(sp, m.Cfg.Vocab)})
		if !errors.Is(err, sample.ErrNonFinite) || !strings.Contains(err.Error(), "prompt") {
			t.Errorf("%+v: %v, want sample.ErrNonFinite at the prompt", sp, err)
		}
		if len(ids) != 0 {
			t.Errorf("%+v: %d tokens", sp, len(ids))
		}
	}
}

// TestCancelIsInterrupted: cancelling mid-generation returns the tokens
// so far and an error that says interrupted and wraps context.Canceled,
// not the wait the cancellation cut short ("waiting for layer 2" with
// every layer resident, issue 17 item 14).
func TestCancelIsInterrupted(t *testing.T) {
	m, _ := open(t, "stories260K-F32.gguf", model.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n := 0
	ids, st, err := Run(ctx, m, []int32{1, 403, 407}, Options{OnToken: func(int32) error {
		if n++; n == 5 {
			cancel()
		}
		return nil
	}})
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "interrupted at position 7 after 5 tokens") || strings.Contains(err.Error(), "layer") {
		t.Fatalf("cancelled run: %v", err)
	}
	if len(ids) != 5 || st.Generated != 5 {
		t.Errorf("%d tokens returned, %d counted, want 5", len(ids), st.Generated)
	}
}
