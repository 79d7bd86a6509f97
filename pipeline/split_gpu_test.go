package pipeline

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf/testmodels"
)

// splitGPUDevice is the split the GPU tests run: two contexts on the one
// card by default (the whole split path on one GPU); FORGE_SPLIT_DEVICE
// names another ("gpu:0,1" on a machine with two).
func splitGPUDevice() string {
	if d := os.Getenv("FORGE_SPLIT_DEVICE"); d != "" {
		return d
	}
	return "gpu:0,0"
}

// TestGPUSplitTokens: a model split over two GPU devices (two contexts of
// one card, or two cards) through Open gives the single GPU's greedy
// tokens: stories260K, a K-quant synth model with rope_freqs (a global
// each device needs its own copy of) and a Qwen2 one with a tied head,
// under each strategy and several splits; every device's memory is back
// where it started.
func TestGPUSplitTokens(t *testing.T) {
	needGPU(t)
	dev := splitGPUDevice()
	before := deviceFree(t)
	prompt := []int32{1, 403, 407, 261, 378, 9, 13}
	for _, file := range []string{"stories260K-Q4_K_M.gguf", "stories260K-Q8_0.gguf", "tiny-freqs", "tiny-qwen2"} {
		t.Run(file, func(t *testing.T) {
			path := synthOrBundled(t, file)
			want, _ := splitGenerate(t, path, Options{Device: "gpu"}, prompt)
			for _, st := range []Strategy{Prefetch, Eager, Lazy} {
				for _, split := range [][]float64{nil, {1, 1}, {1, 3}} {
					got, m := splitGenerate(t, path, Options{Device: dev, Strategy: st, Split: split}, prompt)
					if !slices.Equal(got, want) {
						t.Fatalf("%s split %v over %s: tokens\n got %v\nwant %v", st, split, dev, got, want)
					}
					if n := len(m.Devices()); n != 2 {
						t.Fatalf("%d devices", n)
					}
					if !strings.Contains(m.String(), "gpu:") {
						t.Fatalf("String() = %q", m.String())
					}
					if err := m.Close(); err != nil {
						t.Fatal(err)
					}
				}
			}
			t.Logf("%s over %s: %d tokens equal the single GPU's", file, dev, len(want))
		})
	}
	checkDeviceFree(t, before)
}

// TestGPUSplitFaults: an upload failing on the second device fails the
// request with it and resolves every future; nothing is left on the
// devices.
func TestGPUSplitFaults(t *testing.T) {
	needGPU(t)
	path := testmodels.Path(t, "stories260K-Q4_0.gguf")
	before := deviceFree(t)
	boom := errors.New("injected copy failure on the second device")
	m, err := Open(context.Background(), path, Options{Device: splitGPUDevice(), Split: []float64{1, 1}, Hooks: Hooks{
		Upload: func(tensor string) error {
			if strings.HasPrefix(tensor, "blk.3.") {
				return boom
			}
			return nil
		},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Generate(context.Background(), "", GenerateOptions{PromptIDs: []int32{1, 403}, MaxTokens: 4}); !errors.Is(err, boom) {
		t.Errorf("request: %v, want the injected failure", err)
	}
	for i := range m.Config().Layers {
		if err := m.Layer(i).Wait(context.Background()); i >= 3 && !errors.Is(err, boom) {
			t.Errorf("layer %d: %v", i, err)
		}
	}
	if err := m.Close(); err != nil {
		t.Logf("close: %v", err)
	}
	checkDeviceFree(t, before)
}
