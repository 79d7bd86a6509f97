package actors

import (
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
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

	// A piece is expert Expert's rows of a stacked expert tensor (a 3-D
	// ffn_*_exps tensor): it is loaded by its expert's unit, on its own
	// future, but placed inside Parent's allocation, OutBase bytes (in the
	// target type) from its start and FileBase bytes into its file range,
	// so the views the model takes of Parent need no copy. Expert is -1
	// and Parent nil for every other tensor.
	Expert   int
	Parent   *Tensor
	OutBase  int64
	FileBase int64

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

// Placement is where t's bytes live: in its own allocation (t, 0) or, for
// a piece, inside its parent's at the given offset (target-type bytes).
func (t *Tensor) Placement() (*Tensor, int64) {
	if t.Parent != nil {
		return t.Parent, t.OutBase
	}
	return t, 0
}

// Unit is what one readiness future stands for: the globals (embedding,
// output norm, LM head and other tensors outside the blocks), one block's
// tensors but its experts (attention, norms, router), or one expert of
// one block (its rows of the block's stacked expert tensors).
type Unit struct {
	idx    int // position in Plan.Units (load priority)
	Layer  int // progress.Globals or block index
	Expert int // the expert of an expert unit; -1 for the others
	// Tensors are what the unit loads: whole tensors, or an expert unit's
	// pieces.
	Tensors []*Tensor
	// Stacked are a block unit's stacked expert tensors: their bytes come
	// with the expert units (as pieces), their allocation and their
	// Weight (a view the model slices per expert) with this unit, so the
	// model can take its views once the block is resident and wait per
	// expert for the rows it uses.
	Stacked []*Tensor
	Bytes   int64 // file bytes of its tensors
	Future  *Future

	uploaded int // tensors uploaded (uploader actor)
	queued   bool
	// dead: an expert unit failed (it alone: see System.fail); demanded:
	// a request asked for it first (System.demand).
	dead, demanded atomic.Bool
	// uses counts the tokens routed to an expert unit (System.AddExpertUse).
	uses atomic.Int64
}

// Name is how errors and logs name the unit.
func (u *Unit) Name() string {
	if u.Layer == progress.Globals {
		return "globals (embedding, output norm, LM head)"
	}
	if u.Expert >= 0 {
		return "layer " + strconv.Itoa(u.Layer) + " expert " + strconv.Itoa(u.Expert)
	}
	return "layer " + strconv.Itoa(u.Layer)
}

// IsExpert reports whether u is one expert's unit.
func (u *Unit) IsExpert() bool { return u.Expert >= 0 }

// Placed lists the tensors of u that own an allocation, which uploaders
// lay out in Reserve and whose Weight u's Flush makes visible: its whole
// tensors and its stacked ones (an expert unit's pieces live inside their
// parents and have neither).
func (u *Unit) Placed() []*Tensor {
	if u.IsExpert() {
		return nil
	}
	if len(u.Stacked) == 0 {
		return u.Tensors
	}
	return append(append(make([]*Tensor, 0, len(u.Tensors)+len(u.Stacked)), u.Tensors...), u.Stacked...)
}

// Plan is the tensor index of a model grouped into units in load order:
// the globals first (token_embd, output_norm, output — a tied head has no
// output tensor and reuses the embedding), then blocks 0…N-1, each in file
// order so reads go forward through the file, then the experts of a
// mixture's blocks, one unit per (block, expert), block by block and by
// expert index within one (Config.Order or ExpertOrder may choose
// another order).
//
// A block's stacked expert tensors (3-D ffn_*_exps, one matrix per
// expert) are split: expert e's rows of each are one piece, and the
// pieces of expert e are its unit. The rest of the block (attention,
// norms, router) is the block's unit, so a request runs a block's
// attention and router as soon as they are resident and waits only for
// the experts the router picks.
type Plan struct {
	Units  []*Unit // [0] is the globals, [1+i] is block i, then the expert units
	ByName map[string]*Tensor
	Bytes  int64 // file bytes of every planned tensor

	experts [][]*Unit // [block][expert]
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
	p.Units[0] = &Unit{idx: 0, Layer: progress.Globals, Expert: -1, Future: newFuture("ready")}
	for i := range layers {
		p.Units[1+i] = &Unit{idx: 1 + i, Layer: i, Expert: -1, Future: newFuture("layer " + strconv.Itoa(i))}
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
		t := &Tensor{Info: ti, Layer: layer, unit: u, To: ti.Type, OutBytes: int64(ti.Size), Expert: -1}
		u.Tensors = append(u.Tensors, t)
		u.Bytes += int64(ti.Size)
		p.Bytes += int64(ti.Size)
		p.ByName[ti.Name] = t
	}
	if _, ok := p.ByName["token_embd.weight"]; !ok {
		return nil, fmt.Errorf("actors: %s: tensor %q missing", f.Path, "token_embd.weight")
	}
	if err := p.splitExperts(f); err != nil {
		return nil, err
	}
	for _, u := range p.Units[:1+layers] {
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

// Convert sets every tensor's target type through c. A piece takes its
// parent's type (conversion is per tensor, not per expert).
func (p *Plan) Convert(c Converter) error {
	for _, u := range p.Units {
		for _, t := range u.Placed() { // a block's stacked tensors among them; pieces below
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
	for _, us := range p.experts {
		for _, u := range us {
			for _, t := range u.Tensors {
				par := t.Parent
				n, err := par.To.RowBytes(par.Info.Dims[0])
				if err != nil {
					return fmt.Errorf("actors: tensor %q as %s: %w", par.Name(), par.To, err)
				}
				t.To, t.OutBytes = par.To, int64(n)*int64(t.Info.Rows())
				t.OutBase = int64(t.Expert) * t.OutBytes
			}
		}
	}
	return nil
}

// Layer returns block i's unit.
func (p *Plan) Layer(i int) *Unit { return p.Units[1+i] }

// Layers is the number of blocks.
func (p *Plan) Layers() int {
	if p.experts == nil { // a plan made by hand (a split's per-device share)
		return len(p.Units) - 1
	}
	return len(p.experts)
}

// Experts is block i's expert units, by expert index (none for a dense
// block).
func (p *Plan) Experts(i int) []*Unit { return p.experts[i] }

// Expert returns block i's expert e unit, or nil.
func (p *Plan) Expert(i, e int) *Unit {
	if i < 0 || i >= len(p.experts) || e < 0 || e >= len(p.experts[i]) {
		return nil
	}
	return p.experts[i][e]
}

// Stacked reports whether a block's tensor is a stacked expert tensor the
// plan splits into per-expert pieces: 3-D, one matrix per expert along
// the last dimension, named as llama.cpp names them (ffn_gate_exps,
// ffn_up_exps, ffn_down_exps). A mixture's 2-D per-expert tensors (gpt-oss
// biases) stay with the block. The CLI counts a load's tensors by it.
func Stacked(ti *gguf.TensorInfo) bool {
	return len(ti.Dims) == 3 && ti.Dims[2] >= 2 && strings.Contains(ti.Name, "_exps.")
}

// splitExperts moves each block's stacked expert tensors out of its unit
// into per-expert units (appended to p.Units, block by block, expert by
// expert): expert e's piece of a tensor is its rows [e·R, (e+1)·R), R =
// Dims[1], a contiguous byte range of the file.
func (p *Plan) splitExperts(f *gguf.File) error {
	layers := len(p.Units) - 1
	p.experts = make([][]*Unit, layers)
	for i := range layers {
		u := p.Units[1+i]
		keep := u.Tensors[:0]
		for _, t := range u.Tensors {
			if Stacked(t.Info) {
				u.Stacked = append(u.Stacked, t)
				continue
			}
			keep = append(keep, t)
		}
		u.Tensors = keep
		if len(u.Stacked) == 0 {
			continue
		}
		sort.SliceStable(u.Stacked, func(a, b int) bool { return u.Stacked[a].Info.Offset < u.Stacked[b].Info.Offset })
		n := int(u.Stacked[0].Info.Dims[2])
		units := make([]*Unit, n)
		for e := range units {
			units[e] = &Unit{idx: len(p.Units), Layer: i, Expert: e,
				Future: newFuture("layer " + strconv.Itoa(i) + " expert " + strconv.Itoa(e))}
			p.Units = append(p.Units, units[e])
		}
		for _, par := range u.Stacked {
			ti := par.Info
			if int(ti.Dims[2]) != n {
				return fmt.Errorf("actors: %s: layer %d: %s has %d experts, %s %d", f.Path, i, ti.Name, ti.Dims[2], u.Stacked[0].Name(), n)
			}
			rows := ti.Dims[1]
			pieceBytes := rows * ti.RowBytes()
			if pieceBytes*uint64(n) != ti.Size {
				return fmt.Errorf("actors: %s: tensor %q: %d bytes are not %d experts of %d", f.Path, ti.Name, ti.Size, n, pieceBytes)
			}
			u.Bytes -= int64(ti.Size)
			for e, eu := range units {
				info := &gguf.TensorInfo{Name: ti.Name, Dims: []uint64{ti.Dims[0], rows}, Type: ti.Type,
					Offset: ti.Offset + uint64(e)*pieceBytes, Size: pieceBytes}
				eu.Tensors = append(eu.Tensors, &Tensor{Info: info, Layer: i, unit: eu, To: ti.Type, OutBytes: int64(pieceBytes),
					Expert: e, Parent: par, OutBase: int64(e) * int64(pieceBytes), FileBase: int64(e) * int64(pieceBytes)})
				eu.Bytes += int64(pieceBytes)
			}
		}
		p.experts[i] = units
	}
	return nil
}

// settle places every piece inside its parent once Reserve laid the
// parents out (ArenaOff -1, an allocation of its own, stays -1).
func (p *Plan) settle() {
	for _, us := range p.experts {
		for _, u := range us {
			for _, t := range u.Tensors {
				t.ArenaOff = -1
				if t.Parent.ArenaOff >= 0 {
					t.ArenaOff = t.Parent.ArenaOff + t.OutBase
				}
			}
		}
	}
}
