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
}

// LayerWeights are the tensors of one transformer block.
type LayerWeights struct {
	AttnNorm *kernels.Weight // [Embd]
	Q        *kernels.Weight // [QDim][Embd]
	K        *kernels.Weight // [KVDim][Embd]
	V        *kernels.Weight // [KVDim][Embd]
	QBias    *kernels.Weight // [QDim]  (Qwen2 only)
	KBias    *kernels.Weight // [KVDim] (Qwen2 only)
	VBias    *kernels.Weight // [KVDim] (Qwen2 only)
	O        *kernels.Weight // [Embd][QDim]
	FFNNorm  *kernels.Weight // [Embd]
	Gate     *kernels.Weight // [FF][Embd]
	Up       *kernels.Weight // [FF][Embd]
	Down     *kernels.Weight // [Embd][FF]
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
// tensor's type and shape against cfg. The views stay valid until f is
// closed.
func NewFileWeights(f *gguf.File, cfg Config) (*FileWeights, error) {
	fw := &FileWeights{layers: make([]LayerWeights, cfg.Layers)}
	var err error
	// get finds a tensor and checks its shape; rows = 1 for vectors.
	get := func(name string, cols, rows int, optional bool) *kernels.Weight {
		if err != nil {
			return nil
		}
		ti, ok := f.Tensor(name)
		if !ok {
			if !optional {
				err = fmt.Errorf("model: %s: tensor %q missing", f.Path, name)
			}
			return nil
		}
		if len(ti.Dims) == 0 || int(ti.Dims[0]) != cols || int(ti.Rows()) != rows {
			err = fmt.Errorf("model: %s: tensor %q has shape %v, want [%d %d]", f.Path, name, ti.Dims, cols, rows)
			return nil
		}
		if rows == 1 && ti.Type != gguf.TypeF32 {
			err = fmt.Errorf("model: %s: tensor %q is %v, want F32", f.Path, name, ti.Type)
			return nil
		}
		data, e := f.TensorData(ti)
		if e != nil {
			err = e
			return nil
		}
		return &kernels.Weight{Name: name, Type: ti.Type, Cols: cols, Rows: rows, Host: data}
	}
	c := cfg
	fw.g.Embed = get("token_embd.weight", c.Embd, c.Vocab, false)
	fw.g.OutputNorm = get("output_norm.weight", c.Embd, 1, false)
	fw.g.Output = get("output.weight", c.Embd, c.Vocab, true)
	if fw.g.Output == nil {
		fw.g.Output = fw.g.Embed // tied head
	}
	fw.g.RopeFreqs = get("rope_freqs.weight", c.Rope.Dim/2, 1, true)
	for i := range fw.layers {
		p := fmt.Sprintf("blk.%d.", i)
		l := &fw.layers[i]
		l.AttnNorm = get(p+"attn_norm.weight", c.Embd, 1, false)
		l.Q = get(p+"attn_q.weight", c.Embd, c.QDim(), false)
		l.K = get(p+"attn_k.weight", c.Embd, c.KVDim(), false)
		l.V = get(p+"attn_v.weight", c.Embd, c.KVDim(), false)
		l.QBias = get(p+"attn_q.bias", c.QDim(), 1, !c.Bias)
		l.KBias = get(p+"attn_k.bias", c.KVDim(), 1, !c.Bias)
		l.VBias = get(p+"attn_v.bias", c.KVDim(), 1, !c.Bias)
		l.O = get(p+"attn_output.weight", c.QDim(), c.Embd, false)
		l.FFNNorm = get(p+"ffn_norm.weight", c.Embd, 1, false)
		l.Gate = get(p+"ffn_gate.weight", c.Embd, c.FF, false)
		l.Up = get(p+"ffn_up.weight", c.Embd, c.FF, false)
		l.Down = get(p+"ffn_down.weight", c.FF, c.Embd, false)
	}
	if err != nil {
		return nil, err
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
