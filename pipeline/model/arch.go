package model

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
)

// archs is the architecture registry: every architecture forge runs is one
// file of this package declaring an Arch, and one line here. Loading, the
// shape checks, the weights view of the pipeline, the memory estimate and
// `forge gen`'s presets all read the architecture's table from here (see
// docs/DESIGN.md, "Adding an architecture").
var archs = map[string]*Arch{
	"llama":    &llamaArch,
	"qwen2":    &qwen2Arch,
	"qwen3":    &qwen3Arch,
	"qwen3moe": &qwen3moeArch,
	"phi3":     &phi3Arch,
	"gemma2":   &gemma2Arch,
	"gemma3":   &gemma3Arch,
	"gpt-oss":  &gptossArch,
}

// Arch is one architecture: how its hyper-parameters come from a GGUF
// file's metadata, which tensors a block has, and the block's math.
type Arch struct {
	Name string
	// Configure maps the architecture's own metadata onto c, after the
	// keys every architecture shares (embedding_length, block_count, …)
	// have filled it. nil: nothing beyond those.
	Configure func(c *Config, md Metadata) error
	// Block lists one block's tensors for a model of shape c, in the
	// order llama.cpp's converter writes them; names without the
	// "blk.<i>." prefix.
	Block func(c Config) []TensorSpec
	// Globals lists the architecture's tensors outside the blocks beyond
	// those every architecture has (GlobalTensors); nil: none.
	Globals func(c Config) []TensorSpec
	// Layer runs one block (see layerFunc).
	Layer layerFunc
	// Meta adds the metadata keys of the architecture's own that a model of
	// shape s carries (`forge gen` writes them; Configure reads them back).
	// nil: none.
	Meta func(s Shape, add func(key string, v gguf.Value))
	// Presets are real models' shapes of this architecture, and small ones
	// for tests, by the name `forge gen --preset` takes.
	Presets map[string]Shape
	// Requires, when set, refuses a backend that lacks an op the
	// architecture needs (one beyond kernels.Backend), before anything is
	// allocated; nil: every backend runs it.
	Requires func(be kernels.Backend) error
}

// Lookup returns the registered architecture called name.
func Lookup(name string) (*Arch, error) {
	a, ok := archs[name]
	if !ok {
		return nil, fmt.Errorf("architecture %q is not supported (%s)", name, strings.Join(ArchNames(), ", "))
	}
	return a, nil
}

// ArchNames lists the registered architectures in alphabetical order.
func ArchNames() []string { return slices.Sorted(maps.Keys(archs)) }

// Presets gathers every architecture's presets, by name.
func Presets() map[string]Shape {
	all := map[string]Shape{}
	for _, a := range archs {
		for name, s := range a.Presets {
			if _, dup := all[name]; dup {
				panic("model: preset " + name + " is declared twice")
			}
			s.Arch = a.Name
			all[name] = s
		}
	}
	return all
}

// Metadata is what Configure reads: a GGUF file's key-value pairs
// (*gguf.File), or a shape's before it is written.
type Metadata interface {
	Lookup(key string) (gguf.Value, bool)
}

// metaMap is Metadata held in a map (a Shape's, see Shape.Config).
type metaMap map[string]gguf.Value

func (m metaMap) Lookup(key string) (gguf.Value, bool) { v, ok := m[key]; return v, ok }

// metaUint reads an unsigned integer key; ok is false when absent or of
// another type.
func metaUint(md Metadata, key string) (uint64, bool) {
	if md == nil {
		return 0, false
	}
	v, ok := md.Lookup(key)
	if !ok {
		return 0, false
	}
	return v.Uint()
}

// metaFloat reads a float key.
func metaFloat(md Metadata, key string) (float64, bool) {
	if md == nil {
		return 0, false
	}
	v, ok := md.Lookup(key)
	if !ok {
		return 0, false
	}
	return v.Float()
}

// TensorKind says what a tensor's values are, so that `forge gen` draws
// plausible ones.
type TensorKind int

const (
	KindWeight      TensorKind = iota // a matrix
	KindNorm                          // a norm's scale vector, near 1
	KindBias                          // a bias vector, near 0
	KindRopeFreqs                     // rope frequency divisors (≥ 1), Llama 3.1's
	KindRopeFactors                   // LongRoPE's per-frequency divisors (≥ 1), random
)

// TensorSpec is one tensor of an architecture's table: its name, its shape
// as a matrix (Rows = 1 for vectors, which must be F32), and where the
// forward pass finds it.
type TensorSpec struct {
	Name       string // the full name: "blk.3.attn_q.weight", "output.weight"
	Cols, Rows int
	// Optional tensors may be missing from a file: a missing output.weight
	// is a tied head, a missing rope_freqs.weight is plain RoPE.
	Optional bool
	Kind     TensorKind
	Layer    int // the block, -1 outside the blocks
	// Experts, when > 0, makes the tensor 3-D: that many experts' matrices
	// of Rows/Experts rows each, stacked (a file's dims [Cols,
	// Rows/Experts, Experts]); 0: a matrix or vector.
	Experts int
	global  func(*GlobalWeights) **kernels.Weight
	block   func(*LayerWeights) **kernels.Weight
}

// Place stores w where the forward pass reads the tensor: in g for a
// tensor outside the blocks, else in l.
func (s TensorSpec) Place(g *GlobalWeights, l *LayerWeights, w *kernels.Weight) {
	if s.global != nil {
		*s.global(g) = w
		return
	}
	*s.block(l) = w
}

// Dims is the tensor's shape as a GGUF file stores it (ggml order: the
// row length first): [Cols, Rows/Experts, Experts] for a 3-D tensor of
// experts, [Cols, Rows] otherwise (what `forge gen` writes; for those,
// checkTensor accepts any dims of the same row length and row count).
func (s TensorSpec) Dims() []uint64 {
	if s.Experts > 0 {
		return []uint64{uint64(s.Cols), uint64(s.Rows / s.Experts), uint64(s.Experts)}
	}
	return []uint64{uint64(s.Cols), uint64(s.Rows)}
}

// layerField is where a block tensor goes in LayerWeights.
type layerField = func(*LayerWeights) **kernels.Weight

// mat, vec declare a block's matrix and F32 vector tensors (Kind norm or
// bias) for an Arch.Block table.
func mat(name string, cols, rows int, f layerField) TensorSpec {
	return TensorSpec{Name: name, Cols: cols, Rows: rows, Kind: KindWeight, block: f}
}

func vec(name string, n int, kind TensorKind, f layerField) TensorSpec {
	return TensorSpec{Name: name, Cols: n, Rows: 1, Kind: kind, block: f}
}

// globalT declares a tensor outside the blocks.
func globalT(name string, cols, rows int, kind TensorKind, optional bool, f func(*GlobalWeights) **kernels.Weight) TensorSpec {
	return TensorSpec{Name: name, Cols: cols, Rows: rows, Kind: kind, Optional: optional, Layer: -1, global: f}
}

// GlobalTensors are the tensors outside the blocks: those every
// architecture shares (the embedding, rope_freqs (optional), the output
// norm and the LM head (optional: tied to the embedding when absent)),
// then the architecture's own (Arch.Globals).
func GlobalTensors(c Config) []TensorSpec {
	g := []TensorSpec{
		globalT("token_embd.weight", c.Embd, c.Vocab, KindWeight, false, func(g *GlobalWeights) **kernels.Weight { return &g.Embed }),
		globalT("rope_freqs.weight", c.Rope.Dim/2, 1, KindRopeFreqs, true, func(g *GlobalWeights) **kernels.Weight { return &g.RopeFreqs }),
		globalT("output_norm.weight", c.Embd, 1, KindNorm, false, func(g *GlobalWeights) **kernels.Weight { return &g.OutputNorm }),
		globalT("output.weight", c.Embd, c.Vocab, KindWeight, true, func(g *GlobalWeights) **kernels.Weight { return &g.Output }),
	}
	if a, err := Lookup(c.Arch); err == nil && a.Globals != nil {
		g = append(g, a.Globals(c)...)
	}
	return g
}

// LayerTensors are block i's tensors, from the architecture's table.
func LayerTensors(c Config, i int) []TensorSpec {
	a, err := Lookup(c.Arch)
	if err != nil {
		return nil // ConfigFromFile accepted only registered architectures
	}
	specs := a.Block(c)
	for k := range specs {
		specs[k].Name = gguf.BlockTensor(i, specs[k].Name)
		specs[k].Layer = i
	}
	return specs
}

// Tensors is the whole table of a model of shape c, in the order
// llama.cpp's converter writes a file: the embedding and rope_freqs, the
// blocks, the output norm and head.
func Tensors(c Config) []TensorSpec {
	g := GlobalTensors(c)
	all := slices.Clone(g[:2])
	all = append(all, g[4:]...) // the architecture's own, before the blocks
	for i := range c.Layers {
		all = append(all, LayerTensors(c, i)...)
	}
	return append(all, g[2:4]...)
}

// CheckShapes checks every tensor of c's table against f's tensor index
// (metadata only: no tensor data is touched, so a truncated file passes
// here and fails where its data is read, naming the tensor).
func CheckShapes(f *gguf.File, c Config) error {
	for _, s := range Tensors(c) {
		if _, err := checkTensor(f, s); err != nil {
			return err
		}
	}
	return nil
}

// checkTensor finds s in f and checks its shape and, for a vector, that it
// is F32; nil without error for a missing optional tensor.
func checkTensor(f *gguf.File, s TensorSpec) (*gguf.TensorInfo, error) {
	ti, ok := f.Tensor(s.Name)
	if !ok {
		if s.Optional {
			return nil, nil
		}
		return nil, fmt.Errorf("model: %s: tensor %q missing", f.Path, s.Name)
	}
	if s.Experts > 0 {
		if want := s.Dims(); !slices.Equal(ti.Dims, want) {
			return nil, fmt.Errorf("model: %s: tensor %q has shape %v, want %v (%d experts)", f.Path, s.Name, ti.Dims, want, s.Experts)
		}
	}
	if len(ti.Dims) == 0 || int(ti.Dims[0]) != s.Cols || int(ti.Rows()) != s.Rows {
		return nil, fmt.Errorf("model: %s: tensor %q has shape %v, want [%d %d]", f.Path, s.Name, ti.Dims, s.Cols, s.Rows)
	}
	if (s.Rows == 1 || s.Kind == KindBias || s.Kind == KindNorm) && ti.Type != gguf.TypeF32 {
		return nil, fmt.Errorf("model: %s: tensor %q is %v, want F32", f.Path, s.Name, ti.Type)
	}
	return ti, nil
}
