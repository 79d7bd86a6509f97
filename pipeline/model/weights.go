package model

import (
	"context"
	"fmt"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
)

// GlobalWeights are the tensors outside the blocks. They are resident before
// the model is ready, so reading them never blocks.
type GlobalWeights struct {
	Embed      *kernels.Weight // token_embd   [Vocab][Embd]
	OutputNorm *kernels.Weight // output_norm  [Embd]
	Output     *kernels.Weight // output       [Vocab][Embd]; Embed itself when the head is tied
	RopeFreqs  *kernels.Weight // rope_freqs   [Rope.Dim/2], or nil
	// LongRoPE's frequency divisors (Phi-3 128K): the long ones serve a
	// context beyond Config.RopeOrigCtx, the short ones one within it.
	RopeLong, RopeShort *kernels.Weight // [Rope.Dim/2], or nil
}

// LayerWeights are the tensors of one transformer block: the union of
// every architecture's; an architecture's table (Arch.Block) says which it
// fills, and its layer function reads those.
type LayerWeights struct {
	AttnNorm *kernels.Weight // [Embd]
	Q        *kernels.Weight // [QDim][Embd]
	K        *kernels.Weight // [KVDim][Embd]
	V        *kernels.Weight // [KVDim][Embd]
	QBias    *kernels.Weight // [QDim]  (Config.Bias: Qwen2)
	KBias    *kernels.Weight // [KVDim] (Config.Bias)
	VBias    *kernels.Weight // [KVDim] (Config.Bias)
	QNorm    *kernels.Weight // [HeadDim] (Config.QKNorm: Qwen3)
	KNorm    *kernels.Weight // [HeadDim] (Config.QKNorm)
	O        *kernels.Weight // [Embd][QDim]
	FFNNorm  *kernels.Weight // [Embd]
	Gate     *kernels.Weight // [FF][Embd]
	Up       *kernels.Weight // [FF][Embd]
	Down     *kernels.Weight // [Embd][FF]
	// Gemma's norms after the attention and feed-forward sub-blocks.
	AttnPostNorm *kernels.Weight // [Embd]
	FFNPostNorm  *kernels.Weight // [Embd]
	// Fused tensors (Phi-3): QKV holds Q, K and V's rows one after the
	// other, GateUp the gate's then up's; FinishLayer makes Q, K, V, Gate
	// and Up row views of them (no copy).
	QKV    *kernels.Weight // [QDim+2·KVDim][Embd]
	GateUp *kernels.Weight // [2·FF][Embd]
	// A mixture of experts' feed-forward (Config.Experts > 0; moe.go):
	// the router and the experts' stacked matrices, of which FinishLayer
	// makes Experts, one row view per expert of each.
	GateInp  *kernels.Weight // [Experts][Embd]
	GateExps *kernels.Weight // [Experts·ExpertFF][Embd]
	UpExps   *kernels.Weight // [Experts·ExpertFF][Embd]
	DownExps *kernels.Weight // [Experts·Embd][ExpertFF]
	Experts  []ExpertWeights
	// gpt-oss's biases and attention sinks: the attention output's bias,
	// the router's, and the experts' (one row per expert, which
	// FinishLayer views per expert), and one sink logit per query head.
	OBias                    *kernels.Weight // [Embd]
	GateInpBias              *kernels.Weight // [Experts]
	GateExpsBias, UpExpsBias *kernels.Weight // [Experts][ExpertFF]
	DownExpsBias             *kernels.Weight // [Experts][Embd]
	AttnSinks                *kernels.Weight // [Heads]
	// ExpertReady, when set, blocks until expert e's rows of the stacked
	// tensors are usable (a loader with per-expert readiness hands the
	// block out before its experts arrive) and must return an error,
	// never hang, when they can not arrive or ctx is done. nil: every
	// expert is there with the block.
	ExpertReady func(ctx context.Context, e int) error
	// ExpertsReady, when set beside ExpertReady, reports without blocking
	// whether every expert of the block is usable (ExpertReady would
	// return nil at once for each): a decode step then routes on the
	// device (moe_gpu.go), which cannot wait for one expert. nil with
	// ExpertReady set: not known, so the step routes on the host.
	ExpertsReady func() bool
	// DemandExperts, when set beside ExpertReady, asks for every expert of
	// es to be loaded before the rest of the load, without waiting: the op
	// calls it with all the experts its router chose before it waits for
	// the first, so their copies travel together instead of one expert's
	// round trip after another's.
	DemandExperts func(es []int)
	// ExpertUsed, when set, is told after each step's mixture that the
	// router sent tokens of its rows to expert e: the one count of
	// routing (usage profiles), whichever path ran the step (a single
	// request's Forward or a batched step of several sequences). A step
	// that fails in the mixture reports nothing (batch.Scheduler runs it
	// again, so its rows would count twice).
	ExpertUsed func(e, tokens int)
}

// FinishLayer completes a block's weights once its table's tensors are
// placed: the row views of fused tensors. Every Weights implementation
// calls it.
func FinishLayer(c Config, l *LayerWeights) error {
	var err error
	if l.QKV != nil {
		if l.Q, err = rowView(l.QKV, "q", 0, c.QDim()); err == nil {
			if l.K, err = rowView(l.QKV, "k", c.QDim(), c.KVDim()); err == nil {
				l.V, err = rowView(l.QKV, "v", c.QDim()+c.KVDim(), c.KVDim())
			}
		}
	}
	if l.GateUp != nil && err == nil {
		if l.Gate, err = rowView(l.GateUp, "gate", 0, c.FF); err == nil {
			l.Up, err = rowView(l.GateUp, "up", c.FF, c.FF)
		}
	}
	if err == nil {
		err = finishExperts(c, l)
	}
	return err
}

// rowView is rows [r0, r0+rows) of w as a weight of its own, sharing w's
// bytes: a slice of w.Host and an offset into w.Dev, whichever w has.
func rowView(w *kernels.Weight, part string, r0, rows int) (*kernels.Weight, error) {
	rb, err := w.Type.RowBytes(uint64(w.Cols))
	if err != nil {
		return nil, fmt.Errorf("model: %s: %w", w.Name, err)
	}
	if r0 < 0 || rows <= 0 || r0+rows > w.Rows {
		return nil, fmt.Errorf("model: %s: rows [%d, %d) outside its %d", w.Name, r0, r0+rows, w.Rows)
	}
	v := &kernels.Weight{Name: w.Name + "[" + part + "]", Type: w.Type, Cols: w.Cols, Rows: rows}
	off, n := r0*int(rb), rows*int(rb)
	if w.Host != nil {
		if off+n > len(w.Host) {
			return nil, fmt.Errorf("model: %s: %d bytes, rows [%d, %d) need %d", w.Name, len(w.Host), r0, r0+rows, off+n)
		}
		v.Host = w.Host[off : off+n]
	}
	if w.Dev != 0 {
		v.Dev = w.Dev + uintptr(off)
	}
	return v, nil
}

// Weights hands the forward pass its tensors. Layer may block until layer i
// is usable (the prefetching loader completes layers in order while the
// executor already runs) and must return an error, never hang, when the
// layer can not arrive or ctx is done.
type Weights interface {
	Globals() *GlobalWeights
	Layer(ctx context.Context, i int) (*LayerWeights, error)
}

// FileWeights serves every tensor straight from a mapped GGUF file: each
// Weight's Host is a zero-copy view of the file, which is what the CPU
// backend reads. Nothing blocks.
type FileWeights struct {
	g      GlobalWeights
	layers []LayerWeights
}

// NewFileWeights builds the weights of a model from f, checking every
// tensor of the architecture's table (arch.go) for type and shape against
// cfg. The views stay valid until f is closed.
func NewFileWeights(f *gguf.File, cfg Config) (*FileWeights, error) {
	fw := &FileWeights{layers: make([]LayerWeights, cfg.Layers)}
	for _, s := range Tensors(cfg) {
		ti, err := checkTensor(f, s)
		if err != nil {
			return nil, err
		}
		if ti == nil {
			continue // optional and absent
		}
		data, err := f.TensorData(ti)
		if err != nil {
			return nil, err
		}
		var l *LayerWeights
		if s.Layer >= 0 {
			l = &fw.layers[s.Layer]
		}
		s.Place(&fw.g, l, &kernels.Weight{Name: s.Name, Type: ti.Type, Cols: s.Cols, Rows: s.Rows, Host: data})
	}
	if fw.g.Output == nil {
		fw.g.Output = fw.g.Embed // tied head
	}
	for i := range fw.layers {
		if err := FinishLayer(cfg, &fw.layers[i]); err != nil {
			return nil, err
		}
	}
	return fw, nil
}

// Globals returns the embedding, output norm and LM head.
func (fw *FileWeights) Globals() *GlobalWeights { return &fw.g }

// Layer returns block i's tensors.
func (fw *FileWeights) Layer(ctx context.Context, i int) (*LayerWeights, error) {
	if i < 0 || i >= len(fw.layers) {
		return nil, fmt.Errorf("model: layer %d out of range [0, %d)", i, len(fw.layers))
	}
	return &fw.layers[i], nil
}

// The fields of LayerWeights as the architectures' tables name them.
var (
	fAttnNorm layerField = func(l *LayerWeights) **kernels.Weight { return &l.AttnNorm }
	fQ        layerField = func(l *LayerWeights) **kernels.Weight { return &l.Q }
	fK        layerField = func(l *LayerWeights) **kernels.Weight { return &l.K }
	fV        layerField = func(l *LayerWeights) **kernels.Weight { return &l.V }
	fQBias    layerField = func(l *LayerWeights) **kernels.Weight { return &l.QBias }
	fKBias    layerField = func(l *LayerWeights) **kernels.Weight { return &l.KBias }
	fVBias    layerField = func(l *LayerWeights) **kernels.Weight { return &l.VBias }
	fQNorm    layerField = func(l *LayerWeights) **kernels.Weight { return &l.QNorm }
	fKNorm    layerField = func(l *LayerWeights) **kernels.Weight { return &l.KNorm }
	fO        layerField = func(l *LayerWeights) **kernels.Weight { return &l.O }
	fFFNNorm  layerField = func(l *LayerWeights) **kernels.Weight { return &l.FFNNorm }
	fGate     layerField = func(l *LayerWeights) **kernels.Weight { return &l.Gate }
	fUp       layerField = func(l *LayerWeights) **kernels.Weight { return &l.Up }
	fDown     layerField = func(l *LayerWeights) **kernels.Weight { return &l.Down }
	fAttnPost layerField = func(l *LayerWeights) **kernels.Weight { return &l.AttnPostNorm }
	fFFNPost  layerField = func(l *LayerWeights) **kernels.Weight { return &l.FFNPostNorm }
	fQKV      layerField = func(l *LayerWeights) **kernels.Weight { return &l.QKV }
	fGateUp   layerField = func(l *LayerWeights) **kernels.Weight { return &l.GateUp }
)
