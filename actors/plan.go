package actors

import (
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"sync/atomic"

	"github.com/forge-llm/forge/actors/progress"
	"github.com/forge-llm/forge/gguf"
)

// Tensor is one tensor of the load plan: where it is in the file, what the
// backend will hold it as, and how far along it is. Its counters are
// touched by the actor that owns that stage only (see the field comments).
type Tensor struct {
	Info  *gguf.TensorInfo
	Layer int // progress.Globals or block index
	unit  *Unit

	// To is the type the backend consumes (Info.Type for a pass-through) and
	// OutBytes its size in that type; set by Plan.Convert.
	To       gguf.Type
	OutBytes int64
	// ArenaOff is the tensor's offset in the uploader's weight arena, set by
	// the uploader's Reserve (it lays out the arena).
	ArenaOff int64

	src       []byte       // view of the tensor's bytes in the mapped file (set by the loader)
	chunks    int          // number of read chunks (set by the loader)
	read      int          // chunks read (loader actor)
	converted atomic.Int32 // chunks converted (dequantizer workers)
	uploaded  int          // chunks uploaded (uploader actor)
}

// PassThrough reports whether the backend reads the file's bytes as they are.
func (t *Tensor) PassThrough() bool { return t.To == t.Info.Type }

// Name is the tensor's GGUF name.
func (t *Tensor) Name() string { return t.Info.Name }

// Unit is what one readiness future stands for: the globals (embedding,
// output norm, LM head and other tensors outside the blocks) or one block.
type Unit struct {
	idx     int // position in Plan.Units (load priority)
	Layer   int // progress.Globals or block index
	Tensors []*Tensor
	Bytes   int64 // file bytes of its tensors
	Future  *Future

	uploaded int // tensors uploaded (uploader actor)
	queued   bool
}

// Name is how errors and logs name the unit.
func (u *Unit) Name() string {
	if u.Layer == progress.Globals {
		return "globals (embedding, output norm, LM head)"
	}
	return "layer " + strconv.Itoa(u.Layer)
}

// Plan is the tensor index of a model grouped into units in load order:
// the globals first (token_embd, output_norm, output — a tied head has no
// output tensor and reuses the embedding), then blocks 0…N-1, each in file
// order so reads go forward through the file.
type Plan struct {
	Units  []*Unit // [0] is the globals, [1+i] is block i
	ByName map[string]*Tensor
	Bytes  int64 // file bytes of every planned tensor
}

// globalOrder ranks the tensors that make the model ready.
var globalOrder = map[string]int{"token_embd.weight": 0, "output_norm.weight": 1, "output.weight": 2}

// NewPlan groups f's tensors for a model of the given number of blocks.
// Tensors of blocks past that number are left out (not loaded).
func NewPlan(f *gguf.File, layers int) (*Plan, error) {
	if layers <= 0 {
		return nil, fmt.Errorf("actors: %s: %d layers", f.Path, layers)
	}
	p := &Plan{Units: make([]*Unit, layers+1), ByName: map[string]*Tensor{}}
	p.Units[0] = &Unit{idx: 0, Layer: progress.Globals, Future: newFuture("ready")}
	for i := range layers {
		p.Units[1+i] = &Unit{idx: 1 + i, Layer: i, Future: newFuture("layer " + strconv.Itoa(i))}
	}
	for i := range f.Tensors {
		ti := &f.Tensors[i]
		layer := progress.Globals
		l, inBlock, err := gguf.BlockOf(ti.Name)
		if err != nil {
			return nil, fmt.Errorf("actors: %s: %w", f.Path, err)
		}
		if inBlock {
			if l >= layers {
				slog.Debug("actors: tensor outside the model's blocks is not loaded", "tensor", ti.Name, "layers", layers)
				continue
			}
			layer = l
		}
		u := p.Units[1+layer]
		t := &Tensor{Info: ti, Layer: layer, unit: u, To: ti.Type, OutBytes: int64(ti.Size)}
		u.Tensors = append(u.Tensors, t)
		u.Bytes += int64(ti.Size)
		p.Bytes += int64(ti.Size)
		p.ByName[ti.Name] = t
	}
	if _, ok := p.ByName["token_embd.weight"]; !ok {
		return nil, fmt.Errorf("actors: %s: tensor %q missing", f.Path, "token_embd.weight")
	}
	for _, u := range p.Units {
		sort.SliceStable(u.Tensors, func(a, b int) bool {
			ra, oka := globalOrder[u.Tensors[a].Name()]
			rb, okb := globalOrder[u.Tensors[b].Name()]
			switch {
			case oka && okb:
				return ra < rb
			case oka != okb:
				return oka
			}
			return u.Tensors[a].Info.Offset < u.Tensors[b].Info.Offset
		})
		if len(u.Tensors) == 0 {
			return nil, fmt.Errorf("actors: %s: %s has no tensors", f.Path, u.Name())
		}
	}
	return p, nil
}

// Convert sets every tensor's target type through c.
func (p *Plan) Convert(c Converter) error {
	for _, u := range p.Units {
		for _, t := range u.Tensors {
			if len(t.Info.Dims) == 0 {
				return fmt.Errorf("actors: tensor %q has no dimensions", t.Name())
			}
			to, err := c.Target(t.Info)
			if err != nil {
				return fmt.Errorf("actors: tensor %q: %w", t.Name(), err)
			}
			n, err := to.RowBytes(t.Info.Dims[0])
			if err != nil {
				return fmt.Errorf("actors: tensor %q as %s: %w", t.Name(), to, err)
			}
			t.To, t.OutBytes = to, int64(n)*int64(t.Info.Rows())
		}
	}
	return nil
}

// Layer returns block i's unit.
func (p *Plan) Layer(i int) *Unit { return p.Units[1+i] }

// Layers is the number of blocks.
func (p *Plan) Layers() int { return len(p.Units) - 1 }
