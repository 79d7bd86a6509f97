package pipeline

import (
	"context"
	"fmt"
	"sync"

	"github.com/forge-llm/forge/actors"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/pipeline/model"
)

// weights serves the forward pass its tensors from the pipeline: the
// globals are resident before the executor builds the model, and Layer
// waits on layer i's readiness future (loading it first under lazy).
type weights struct {
	sys *actors.System
	be  kernels.Backend
	cfg model.Config
	g   model.GlobalWeights

	// countUse counts each expert's routed tokens (LayerWeights.ExpertUsed)
	// for the usage profiles; without profiles it stays off, which lets a
	// GPU route a mixture's decode steps on the device.
	countUse bool

	mu     sync.Mutex
	layers []*model.LayerWeights // built on first use
}

func newWeights(sys *actors.System, be kernels.Backend, cfg model.Config, countUse bool) (*weights, error) {
	w := &weights{sys: sys, be: be, cfg: cfg, countUse: countUse, layers: make([]*model.LayerWeights, cfg.Layers)}
	for _, s := range model.GlobalTensors(cfg) {
		if t, ok := sys.Weight(s.Name); ok {
			s.Place(&w.g, nil, t)
		} else if !s.Optional {
			return nil, fmt.Errorf("pipeline: tensor %q is not resident", s.Name)
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
	for _, s := range model.LayerTensors(w.cfg, i) {
		if t, ok := w.sys.Weight(s.Name); ok {
			s.Place(nil, lw, t)
		} else if !s.Optional {
			return nil, fmt.Errorf("pipeline: layer %d: tensor %q is not resident", i, s.Name)
		}
	}
	if err := model.FinishLayer(w.cfg, lw); err != nil {
		return nil, fmt.Errorf("pipeline: layer %d: %w", i, err)
	}
	if w.sys.Experts(i) > 0 {
		lw.ExpertReady = func(ctx context.Context, e int) error { return w.expert(ctx, i, e) }
		lw.ExpertsReady = func() bool { return w.sys.ExpertsResident(i) == w.sys.Experts(i) }
		lw.DemandExperts = func(es []int) { w.sys.DemandExperts(i, es) }
		if w.countUse {
			lw.ExpertUsed = func(e, tokens int) { w.sys.AddExpertUse(i, e, int64(tokens)) }
		}
	}
	w.layers[i] = lw
	return lw, nil
}

// expert waits for expert e of layer i as Layer waits for a layer: on a
// GPU until its copies are queued (the stream waits on their event), on
// the CPU until resident. The block's view of its stacked tensors exists
// from the block's readiness on; this guards the expert's rows of it.
func (w *weights) expert(ctx context.Context, i, e int) error {
	sw, ok := w.be.(streamWaiter)
	if !ok {
		return w.sys.WaitExpert(ctx, i, e)
	}
	fence, err := w.sys.ExpertFence(ctx, i, e)
	if err != nil {
		return err
	}
	if ev := fence.Event(); ev != 0 {
		if err := sw.WaitEvent(ev); err != nil {
			return fmt.Errorf("pipeline: layer %d expert %d: waiting for its copies: %w", i, e, err)
		}
	}
	return nil
}
