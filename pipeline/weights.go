package pipeline

import (
	"context"
	"fmt"
	"sync"

	"github.com/forge-llm/forge/actors"
	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/pipeline/model"
)

// spec is one tensor an architecture needs: its name and shape as a matrix
// (rows = 1 for vectors), and where it goes in the model's weight structs.
type spec struct {
	name       string
	cols, rows int
	optional   bool
	global     func(*model.GlobalWeights) **kernels.Weight
	layer      func(*model.LayerWeights) **kernels.Weight
}

// globalSpecs are the tensors outside the blocks. A missing output.weight
// is a tied head: the embedding serves.
func globalSpecs(c model.Config) []spec {
	return []spec{
		{name: "token_embd.weight", cols: c.Embd, rows: c.Vocab, global: func(g *model.GlobalWeights) **kernels.Weight { return &g.Embed }},
		{name: "output_norm.weight", cols: c.Embd, rows: 1, global: func(g *model.GlobalWeights) **kernels.Weight { return &g.OutputNorm }},
		{name: "output.weight", cols: c.Embd, rows: c.Vocab, optional: true, global: func(g *model.GlobalWeights) **kernels.Weight { return &g.Output }},
		{name: "rope_freqs.weight", cols: c.Rope.Dim / 2, rows: 1, optional: true, global: func(g *model.GlobalWeights) **kernels.Weight { return &g.RopeFreqs }},
	}
}

// layerSpecs are block i's tensors (Llama family and Qwen2).
func layerSpecs(c model.Config, i int) []spec {
	p := fmt.Sprintf("blk.%d.", i)
	f := func(name string, cols, rows int, optional bool, field func(*model.LayerWeights) **kernels.Weight) spec {
		return spec{name: p + name, cols: cols, rows: rows, optional: optional, layer: field}
	}
	return []spec{
		f("attn_norm.weight", c.Embd, 1, false, func(l *model.LayerWeights) **kernels.Weight { return &l.AttnNorm }),
		f("attn_q.weight", c.Embd, c.QDim(), false, func(l *model.LayerWeights) **kernels.Weight { return &l.Q }),
		f("attn_k.weight", c.Embd, c.KVDim(), false, func(l *model.LayerWeights) **kernels.Weight { return &l.K }),
		f("attn_v.weight", c.Embd, c.KVDim(), false, func(l *model.LayerWeights) **kernels.Weight { return &l.V }),
		f("attn_q.bias", c.QDim(), 1, !c.Bias, func(l *model.LayerWeights) **kernels.Weight { return &l.QBias }),
		f("attn_k.bias", c.KVDim(), 1, !c.Bias, func(l *model.LayerWeights) **kernels.Weight { return &l.KBias }),
		f("attn_v.bias", c.KVDim(), 1, !c.Bias, func(l *model.LayerWeights) **kernels.Weight { return &l.VBias }),
		f("attn_output.weight", c.QDim(), c.Embd, false, func(l *model.LayerWeights) **kernels.Weight { return &l.O }),
		f("ffn_norm.weight", c.Embd, 1, false, func(l *model.LayerWeights) **kernels.Weight { return &l.FFNNorm }),
		f("ffn_gate.weight", c.Embd, c.FF, false, func(l *model.LayerWeights) **kernels.Weight { return &l.Gate }),
		f("ffn_up.weight", c.Embd, c.FF, false, func(l *model.LayerWeights) **kernels.Weight { return &l.Up }),
		f("ffn_down.weight", c.FF, c.Embd, false, func(l *model.LayerWeights) **kernels.Weight { return &l.Down }),
	}
}

// checkShapes checks every tensor the architecture needs against the
// file's tensor index (metadata only: no tensor data is touched, so a
// truncated file passes here and fails in the loader, naming the tensor).
func checkShapes(f *gguf.File, c model.Config) error {
	all := globalSpecs(c)
	for i := range c.Layers {
		all = append(all, layerSpecs(c, i)...)
	}
	for _, s := range all {
		ti, ok := f.Tensor(s.name)
		if !ok {
			if s.optional {
				continue
			}
			return fmt.Errorf("pipeline: %s: tensor %q missing", f.Path, s.name)
		}
		if len(ti.Dims) == 0 || int(ti.Dims[0]) != s.cols || int(ti.Rows()) != s.rows {
			return fmt.Errorf("pipeline: %s: tensor %q has shape %v, want [%d %d]", f.Path, s.name, ti.Dims, s.cols, s.rows)
		}
		if s.rows == 1 && ti.Type != gguf.TypeF32 {
			return fmt.Errorf("pipeline: %s: tensor %q is %v, want F32", f.Path, s.name, ti.Type)
		}
	}
	return nil
}

// weights serves the forward pass its tensors from the pipeline: the
// globals are resident before the executor builds the model, and Layer
// waits on layer i's readiness future (loading it first under lazy).
type weights struct {
	sys *actors.System
	be  kernels.Backend
	cfg model.Config
	g   model.GlobalWeights

	mu     sync.Mutex
	layers []*model.LayerWeights // built on first use
}

func newWeights(sys *actors.System, be kernels.Backend, cfg model.Config) (*weights, error) {
	w := &weights{sys: sys, be: be, cfg: cfg, layers: make([]*model.LayerWeights, cfg.Layers)}
	for _, s := range globalSpecs(cfg) {
		if t, ok := sys.Weight(s.name); ok {
			*s.global(&w.g) = t
		} else if !s.optional {
			return nil, fmt.Errorf("pipeline: tensor %q is not resident", s.name)
		}
	}
	if w.g.Output == nil {
		w.g.Output = w.g.Embed // tied head
	}
	return w, nil
}

// Globals implements model.Weights.
func (w *weights) Globals() *model.GlobalWeights { return &w.g }

// streamWaiter is a backend that can make its compute stream wait on a
// device event (a GPU): it needs a layer only enqueued, not resident.
type streamWaiter interface {
	WaitEvent(event uintptr) error
}

// Layer implements model.Weights.
func (w *weights) Layer(ctx context.Context, i int) (*model.LayerWeights, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if sw, ok := w.be.(streamWaiter); ok {
		fence, err := w.sys.LayerFence(ctx, i)
		if err != nil {
			return nil, err
		}
		if ev := fence.Event(); ev != 0 {
			if err := sw.WaitEvent(ev); err != nil {
				return nil, fmt.Errorf("pipeline: layer %d: waiting for its copies: %w", i, err)
			}
		}
	} else if err := w.sys.WaitLayer(ctx, i); err != nil {
		return nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if lw := w.layers[i]; lw != nil {
		return lw, nil
	}
	lw := &model.LayerWeights{}
	for _, s := range layerSpecs(w.cfg, i) {
		if t, ok := w.sys.Weight(s.name); ok {
			*s.layer(lw) = t
		} else if !s.optional {
			return nil, fmt.Errorf("pipeline: layer %d: tensor %q is not resident", i, s.name)
		}
	}
	w.layers[i] = lw
	return lw, nil
}
