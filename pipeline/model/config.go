// Package model holds the architectures forge runs, one file each,
// registered in arch.go: the Llama family (llama.go: Llama 2/3, TinyLlama,
// Mistral) and Qwen2 (qwen2.go). Each is written once against
// kernels.Backend, so the CPU and GPU backends run the same model code; the
// model code itself does no arithmetic on activations.
//
// A Model owns its KV cache and one scratch allocation, carved into named
// buffers sized for the largest batch, so a forward step allocates nothing.
// It reads layer i's weights through Weights.Layer, which may block: the
// loading pipeline hands layers over as they arrive and the forward pass
// waits per layer.
package model

import (
	"fmt"
	"math"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
)

// Config is what the forward pass needs to know about a model's shape.
type Config struct {
	Arch    string // a registered architecture (arch.go)
	Embd    int    // model width (d_model)
	FF      int    // feed-forward hidden width
	Layers  int
	Heads   int // query heads
	KVHeads int // key/value heads (grouped-query attention when < Heads)
	HeadDim int
	Vocab   int
	Ctx     int // training context length
	NormEps float32
	// Rope is the rotary embedding; Rope.Freqs is filled from the weights
	// (Llama 3.1's rope_freqs.weight) when the file has it.
	Rope kernels.Rope
	// Bias is true when Q, K and V projections carry biases (Qwen2).
	Bias bool
	// QKNorm is true when each head of the queries and keys is RMS-normed
	// before RoPE (Qwen3, Gemma 3).
	QKNorm bool
	// Window, when > 0, is the sliding attention window (Mistral: every
	// layer; Gemma: the local layers, see SWAPattern).
	Window int
	// SWAPattern, when > 0, interleaves local (windowed) and global layers
	// as llama.cpp does: layer l is local when l % SWAPattern <
	// SWAPattern-1 (Gemma 2: 2, every other layer; Gemma 3: 6, five local
	// then one global). 0: every layer is local when Window > 0.
	SWAPattern int
	// RopeBaseLocal, when > 0, is the RoPE frequency base of the local
	// layers (Gemma 3: 10000, the global ones use Rope.Base).
	RopeBaseLocal float32
	// AttnSoftcap and FinalSoftcap, when > 0, cap the attention scores and
	// the output logits at c·tanh(x/c) (Gemma 2).
	AttnSoftcap, FinalSoftcap float32
	// EmbedScale, when > 0, multiplies the token embeddings (Gemma: √Embd).
	EmbedScale float32
	// RopeOrigCtx, when > 0, is LongRoPE's original context (Phi-3 128K):
	// a model whose context exceeds it rotates with the long factors, else
	// with the short ones. RopeAttnFactor, when > 0, scales the rotated
	// queries and keys (LongRoPE's attention factor).
	RopeOrigCtx    int
	RopeAttnFactor float32
	// AttnScale, when > 0, replaces the attention score scale 1/√HeadDim
	// (Gemma: 1/√query_pre_attn_scalar).
	AttnScale float32
	// Experts, when > 0, makes every block's feed-forward a mixture of
	// that many experts (expert_count), ExpertsUsed of them (the router's
	// top-k, expert_used_count) run per token, each ExpertFF wide (moe.go).
	Experts, ExpertsUsed, ExpertFF int
	// YaRNFactor, when > 0, is YaRN's context extension factor over
	// YaRNOrigCtx positions (gpt-oss): per-frequency divisors blend
	// interpolation and extrapolation (yarn.go), and the attention scale
	// carries YaRN's magnitude correction.
	YaRNFactor  float32
	YaRNOrigCtx int
	// Sinks: each block has one attention sink logit per query head
	// (attn_sinks.weight, kernels.Attn.Sinks; gpt-oss).
	Sinks bool
	// SwiGLUAlpha and SwiGLULimit, when > 0, make the experts' activation
	// gpt-oss's clamped SwiGLU (kernels.SwiGLUOAIer).
	SwiGLUAlpha, SwiGLULimit float32
}

// QDim is the width of the query projection, Heads·HeadDim.
func (c Config) QDim() int { return c.Heads * c.HeadDim }

// KVDim is the width of a key or value row, KVHeads·HeadDim.
func (c Config) KVDim() int { return c.KVHeads * c.HeadDim }

// Attn is the attention description the backend needs (a global layer's:
// see LayerAttn).
func (c Config) Attn() kernels.Attn {
	a := kernels.Attn{Heads: c.Heads, KVHeads: c.KVHeads, HeadDim: c.HeadDim, Scale: float32(1 / math.Sqrt(float64(c.HeadDim))),
		Softcap: c.AttnSoftcap}
	if c.AttnScale > 0 {
		a.Scale = c.AttnScale
	}
	if c.SWAPattern == 0 {
		a.Window = c.Window
	}
	return a
}

// Local reports whether layer l attends through the sliding window.
func (c Config) Local(l int) bool {
	if c.Window <= 0 {
		return false
	}
	return c.SWAPattern == 0 || l%c.SWAPattern < c.SWAPattern-1
}

// LayerAttn is layer l's attention: Attn, with the window on local layers.
func (c Config) LayerAttn(l int) kernels.Attn {
	a := c.Attn()
	if c.Local(l) {
		a.Window = c.Window
	}
	return a
}

// LayerRope is layer l's rotary embedding: Rope, with the local base (and
// no position scaling) on local layers where the model has one.
func (c Config) LayerRope(l int) kernels.Rope {
	r := c.Rope
	if c.RopeBaseLocal > 0 && c.Local(l) {
		// Gemma 3's local layers: their own base, and none of the global
		// layers' position scaling.
		r.Base, r.Scale = c.RopeBaseLocal, 1
	}
	return r
}

// ConfigFromFile reads the model shape from a GGUF file's metadata.
func ConfigFromFile(f *gguf.File) (Config, error) {
	gc, err := f.Config()
	if err != nil {
		return Config{}, err
	}
	// Every value is checked before anything is sized by it: a hostile
	// block_count or a NaN epsilon is an error here, not an allocation or
	// a row of NaN logits later.
	if err := gc.Validate(f.Path); err != nil {
		return Config{}, err
	}
	if err := checkBlocks(f, gc.Arch, gc.BlockCount); err != nil {
		return Config{}, err
	}
	c, err := configFromMeta(gc, f)
	if err != nil {
		return Config{}, fmt.Errorf("model: %s: %w", f.Path, err)
	}
	if c.Vocab == 0 {
		if t, ok := f.Tensor("token_embd.weight"); ok && len(t.Dims) == 2 && t.Dims[1] <= gguf.MaxVocab {
			c.Vocab = int(t.Dims[1])
		}
	}
	if err := c.check(); err != nil {
		return Config{}, fmt.Errorf("%w (%s)", err, f.Path)
	}
	return c, nil
}

// maxHeadDim bounds attention.key_length (the largest published head is
// 256 wide).
const maxHeadDim = 1 << 12

// checkBlocks makes sure the file holds tensors for exactly the blocks
// 0 … blockCount-1 that its metadata announces. It sizes nothing by
// blockCount: the set it builds has at most one entry per tensor.
func checkBlocks(f *gguf.File, arch string, blockCount int) error {
	seen := map[int]bool{}
	for i := range f.Tensors {
		l, inBlock, err := gguf.BlockOf(f.Tensors[i].Name)
		if err != nil {
			return fmt.Errorf("model: %s: %w", f.Path, err)
		}
		if !inBlock {
			continue
		}
		if l >= blockCount {
			return fmt.Errorf("model: %s: %s.block_count = %d but the file has tensor %q", f.Path, arch, blockCount, f.Tensors[i].Name)
		}
		seen[l] = true
	}
	if len(seen) != blockCount {
		return fmt.Errorf("model: %s: %s.block_count = %d but the file has tensors for %d blocks", f.Path, arch, blockCount, len(seen))
	}
	return nil
}

// configFrom maps gguf's generic configuration onto an architecture, with
// no metadata beyond it.
func configFrom(gc gguf.Config) (Config, error) { return configFromMeta(gc, nil) }

// configFromMeta maps gguf's generic configuration onto an architecture,
// then lets the architecture read its own keys from md (nil: none).
func configFromMeta(gc gguf.Config, md Metadata) (Config, error) {
	a, err := Lookup(gc.Arch)
	if err != nil {
		return Config{}, err
	}
	c := Config{
		Arch:    gc.Arch,
		Embd:    gc.EmbeddingLength,
		FF:      gc.FeedForwardLength,
		Layers:  gc.BlockCount,
		Heads:   gc.HeadCount,
		KVHeads: gc.HeadCountKV,
		Vocab:   gc.VocabSize,
		Ctx:     gc.ContextLength,
		NormEps: gc.NormEps,
	}
	if c.Heads > 0 {
		c.HeadDim = c.Embd / c.Heads
	}
	c.Rope.Dim = gc.RopeDim
	c.Rope.Base = gc.RopeFreqBase
	c.Rope.Scale = 1
	yarn := false
	switch gc.RopeScalingType {
	case "", "none":
	case "linear":
		if gc.RopeScalingFactor > 0 {
			c.Rope.Scale = 1 / gc.RopeScalingFactor
		}
	case "yarn":
		yarn = true // the architecture reads its keys (Configure), or it is refused below
	default:
		// YaRN and LongRoPE change the attention math, not just positions.
		return Config{}, fmt.Errorf("rope scaling %q is not supported (none, linear, rope_freqs)", gc.RopeScalingType)
	}
	// llama.cpp takes the head size from attention.key_length when given
	// (models whose heads are not Embd/Heads wide).
	if kl, ok := metaUint(md, gc.Arch+".attention.key_length"); ok && kl > 0 {
		if kl > maxHeadDim {
			return Config{}, fmt.Errorf("%s.attention.key_length = %d: must be at most %d", gc.Arch, kl, maxHeadDim)
		}
		c.HeadDim = int(kl)
		if _, ok := metaUint(md, gc.Arch+".rope.dimension_count"); !ok {
			c.Rope.Dim = c.HeadDim
		}
	}
	if a.Configure != nil {
		if err := a.Configure(&c, md); err != nil {
			return Config{}, fmt.Errorf("%s: %w", a.Name, err)
		}
	}
	if yarn && c.YaRNFactor == 0 {
		return Config{}, fmt.Errorf("rope scaling \"yarn\" is not supported for %s", a.Name)
	}
	return c, nil
}

// check rejects a shape the forward pass cannot run: missing or
// non-positive sizes, sizes beyond gguf's bounds, and epsilon, RoPE base
// and scale that are not finite and positive (any of them makes every
// logit NaN).
func (c Config) check() error {
	pos := func(v float32) bool { return v > 0 && !math.IsInf(float64(v), 1) } // false for NaN
	switch {
	case c.Embd <= 0 || c.Layers <= 0 || c.Heads <= 0 || c.KVHeads <= 0 || c.FF <= 0 || c.Vocab <= 0 || c.HeadDim <= 0:
		return fmt.Errorf("model: incomplete config %+v", c)
	case c.Embd > gguf.MaxEmbedding || c.Layers > gguf.MaxBlockCount || c.Heads > gguf.MaxHeads || c.KVHeads > gguf.MaxHeads ||
		c.FF > gguf.MaxFeedForward || c.Vocab > gguf.MaxVocab || c.HeadDim > maxHeadDim || c.Ctx > gguf.MaxContext || c.Ctx < 0:
		return fmt.Errorf("model: config %+v exceeds the supported sizes", c)
	case !pos(c.NormEps) || c.NormEps > 1:
		return fmt.Errorf("model: rms epsilon %v must be a finite number in (0, 1]", c.NormEps)
	case !pos(c.Rope.Base):
		return fmt.Errorf("model: rope freq_base %v must be a finite number > 0", c.Rope.Base)
	case !pos(c.Rope.Scale):
		return fmt.Errorf("model: rope scale %v must be a finite number > 0", c.Rope.Scale)
	case c.Heads%c.KVHeads != 0:
		return fmt.Errorf("model: %d query heads are not a multiple of %d KV heads", c.Heads, c.KVHeads)
	case c.Window < 0 || c.SWAPattern < 0 || !(c.AttnSoftcap >= 0) || !(c.FinalSoftcap >= 0) || !(c.EmbedScale >= 0) ||
		!(c.AttnScale >= 0) || !(c.RopeBaseLocal >= 0) || c.RopeOrigCtx < 0 || !(c.RopeAttnFactor >= 0) ||
		math.IsInf(float64(c.AttnSoftcap+c.FinalSoftcap+c.EmbedScale+c.AttnScale+c.RopeBaseLocal+c.RopeAttnFactor), 0):
		return fmt.Errorf("model: window %d, pattern %d, soft-caps %v/%v, scales %v/%v, local rope base %v: must be finite and ≥ 0",
			c.Window, c.SWAPattern, c.AttnSoftcap, c.FinalSoftcap, c.EmbedScale, c.AttnScale, c.RopeBaseLocal)
	case !(c.YaRNFactor >= 0) || math.IsInf(float64(c.YaRNFactor), 0) || c.YaRNOrigCtx < 0 || c.YaRNOrigCtx > gguf.MaxContext ||
		(c.YaRNFactor > 0 && c.YaRNOrigCtx == 0):
		return fmt.Errorf("model: yarn factor %v over %d positions: must be finite, ≥ 0, with an original context", c.YaRNFactor, c.YaRNOrigCtx)
	case !(c.SwiGLUAlpha >= 0) || !(c.SwiGLULimit >= 0) || math.IsInf(float64(c.SwiGLUAlpha+c.SwiGLULimit), 0):
		return fmt.Errorf("model: swiglu alpha %v and limit %v must be finite and ≥ 0", c.SwiGLUAlpha, c.SwiGLULimit)
	case c.Rope.Dim <= 0 || c.Rope.Dim > c.HeadDim || c.Rope.Dim%2 != 0:
		return fmt.Errorf("model: rope dimension %d does not fit head size %d", c.Rope.Dim, c.HeadDim)
	}
	return nil
}
