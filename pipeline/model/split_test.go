package model

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/cpu"
)

// splitParts cuts [0, layers) at the given layers, one backend a part.
func splitParts(bes []kernels.Backend, w Weights, layers int, cuts ...int) []Part {
	bounds := append(append([]int{0}, cuts...), layers)
	parts := make([]Part, len(bounds)-1)
	for k := range parts {
		parts[k] = Part{Backend: bes[k%len(bes)], Weights: w, Lo: bounds[k], Hi: bounds[k+1]}
	}
	return parts
}

// peerCPU is a CPU backend that copies activations from another CPU
// backend directly, as a GPU does from its peer: the split takes the
// PeerCopier path instead of the host's.
type peerCPU struct {
	*cpu.Backend
	copies int
}

func (p *peerCPU) CopyPeer(dst kernels.Tensor, src kernels.Backend, s kernels.Tensor) (bool, error) {
	if s.Host == nil || dst.Host == nil {
		return false, nil
	}
	copy(dst.Host, s.Host)
	p.copies++
	return true, nil
}

// TestSplitGreedy: the same model split by layers over two (and three)
// CPU backends gives the single-backend greedy tokens and logits, bit for
// bit (each layer runs the same ops on the same values), for the prompt
// in one step, in several steps, and for decode; through the host and
// through a peer copy.
func TestSplitGreedy(t *testing.T) {
	// (Synthetic shapes, Qwen2's biases and tied head among them, are split
	// in pipeline's TestSplitOpen: synth imports this package, so its
	// tests here cannot make those files.)
	for _, name := range []string{"stories260K-Q4_K_M.gguf", "stories260K-F32.gguf", "stories260K-Q8_0.gguf"} {
		t.Run(name, func(t *testing.T) {
			path := testmodels.Path(t, name)
			_, cfg, w := openWeights(t, path)
			one := cpu.New(2)
			t.Cleanup(one.Close)
			prompt := []int32{1, 403, 407, 261, 378, 9, 13}
			// All logits: every row of the prompt's step.
			ref, err := New(one, cfg, w, Options{Ctx: 64, AllLogits: true})
			if err != nil {
				t.Fatal(err)
			}
			all, err := ref.Forward(context.Background(), prompt, 0)
			if err != nil {
				t.Fatal(err)
			}
			all = slices.Clone(all)
			ref.Close()
			m, err := NewSplit(cfg, splitParts([]kernels.Backend{one, one}, w, cfg.Layers, cfg.Layers/2), Options{Ctx: 64, AllLogits: true})
			if err != nil {
				t.Fatal(err)
			}
			got, err := m.Forward(context.Background(), prompt, 0)
			if err != nil || !slices.Equal(got, all) {
				t.Fatalf("all logits of a split step differ (err %v)", err)
			}
			m.Close()
			for _, o := range []Options{{Ctx: 64}, {Ctx: 64, Batch: 3}} {
				ref, err := New(one, cfg, w, o)
				if err != nil {
					t.Fatal(err)
				}
				wantIDs, wantFirst := greedy(t, ref, prompt, 24)
				ref.Close()

				a, b := cpu.New(2), cpu.New(2)
				t.Cleanup(a.Close)
				t.Cleanup(b.Close)
				pa, pb := &peerCPU{Backend: cpu.New(2)}, &peerCPU{Backend: cpu.New(2)}
				t.Cleanup(pa.Close)
				t.Cleanup(pb.Close)
				cases := []struct {
					name    string
					parts   []Part
					viaHost bool
				}{
					{"half", splitParts([]kernels.Backend{a, b}, w, cfg.Layers, cfg.Layers/2), true},
					{"first", splitParts([]kernels.Backend{a, b}, w, cfg.Layers, 1), true},
					{"last", splitParts([]kernels.Backend{a, b}, w, cfg.Layers, cfg.Layers-1), true},
					{"three", splitParts([]kernels.Backend{a, b, a}, w, cfg.Layers, 1, 2), true},
					{"peer", splitParts([]kernels.Backend{pa, pb}, w, cfg.Layers, cfg.Layers/2), false},
				}
				for _, c := range cases {
					if c.parts[len(c.parts)-1].Lo >= cfg.Layers {
						continue // more parts than this model has layers
					}
					m, err := NewSplit(cfg, c.parts, o)
					if err != nil {
						t.Fatalf("%s: %v", c.name, err)
					}
					if m.Parts() != len(c.parts) {
						t.Fatalf("%s: %d parts, want %d", c.name, m.Parts(), len(c.parts))
					}
					got, first := greedy(t, m, prompt, 24)
					if !slices.Equal(got, wantIDs) {
						t.Fatalf("%s %+v: greedy ids\n got %v\nwant %v", c.name, o, got, wantIDs)
					}
					if !slices.Equal(first, wantFirst) {
						t.Fatalf("%s %+v: first-step logits differ from the single backend's", c.name, o)
					}
					if via := m.HostCrossings() > 0; via != c.viaHost {
						t.Fatalf("%s: %d crossings through the host, want some: %v", c.name, m.HostCrossings(), c.viaHost)
					}
					// Greedy (the argmax path) agrees too, from a fresh cache.
					id, err := m.Greedy(context.Background(), prompt, 0)
					if err != nil || id != wantIDs[0] {
						t.Fatalf("%s: Greedy = %d, %v; want %d", c.name, id, err, wantIDs[0])
					}
					m.Close()
				}
				if pa.copies == 0 || pb.copies == 0 {
					t.Fatal("the peer path was never taken")
				}
			}
		})
	}
}

// failingLayers fails layer bad, as a second device's weights that never
// arrive do.
type failingLayers struct {
	Weights
	bad int
	err error
}

func (f failingLayers) Layer(ctx context.Context, i int) (*LayerWeights, error) {
	if i == f.bad {
		return nil, f.err
	}
	return f.Weights.Layer(ctx, i)
}

// TestSplitErrors: a bad split is refused with the part named; an error
// or a cancellation on the second part ends the step with that error.
func TestSplitErrors(t *testing.T) {
	_, cfg, w := openWeights(t, testmodels.Path(t, "stories260K-F32.gguf"))
	a, b := cpu.New(1), cpu.New(1)
	t.Cleanup(a.Close)
	t.Cleanup(b.Close)
	for _, parts := range [][]Part{
		{{Backend: a, Weights: w, Lo: 0, Hi: 2}, {Backend: b, Weights: w, Lo: 3, Hi: cfg.Layers}},
		{{Backend: a, Weights: w, Lo: 0, Hi: 2}, {Backend: b, Weights: w, Lo: 2, Hi: 2}},
		{{Backend: a, Weights: w, Lo: 0, Hi: 2}},
		{{Backend: a, Weights: w, Lo: 0, Hi: 2}, {Backend: nil, Weights: w, Lo: 2, Hi: cfg.Layers}},
	} {
		if _, err := NewSplit(cfg, parts, Options{Ctx: 16}); err == nil || !strings.Contains(err.Error(), "split part") {
			t.Fatalf("split %+v: err = %v, want a refusal", parts, err)
		}
	}

	boom := errors.New("device 1 lost")
	m, err := NewSplit(cfg, []Part{
		{Backend: a, Weights: w, Lo: 0, Hi: 2},
		{Backend: b, Weights: failingLayers{Weights: w, bad: 3, err: boom}, Lo: 2, Hi: cfg.Layers},
	}, Options{Ctx: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.Forward(context.Background(), []int32{1, 2}, 0); !errors.Is(err, boom) || !strings.Contains(err.Error(), "layer 3") {
		t.Fatalf("Forward = %v, want the second part's error naming layer 3", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := m.Forward(ctx, []int32{1}, 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Forward = %v", err)
	}
}
