package actors

import (
	"bytes"
	"context"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/forge-llm/forge/actors/progress"
	"github.com/forge-llm/forge/gguf"
)

// writeMixture writes a two-block file whose blocks hold a router, a norm
// and two stacked expert tensors of 4 experts (F32 and Q8_0, 3 rows per
// expert), every tensor's bytes distinct.
func writeMixture(t *testing.T) string {
	t.Helper()
	type spec struct {
		name string
		typ  gguf.Type
		dims []uint64
	}
	specs := []spec{{"token_embd.weight", gguf.TypeF32, []uint64{32, 8}}, {"output_norm.weight", gguf.TypeF32, []uint64{32}}}
	for _, b := range []string{"blk.0.", "blk.1."} {
		specs = append(specs,
			spec{b + "attn_norm.weight", gguf.TypeF32, []uint64{32}},
			spec{b + "ffn_gate_inp.weight", gguf.TypeF32, []uint64{32, 4}},
			spec{b + "ffn_up_exps.weight", gguf.TypeF32, []uint64{32, 3, 4}},
			spec{b + "ffn_down_exps.weight", gguf.TypeQ8_0, []uint64{32, 3, 4}})
	}
	var buf bytes.Buffer
	w := gguf.NewWriter(&buf)
	if err := w.AddString("general.architecture", "test"); err != nil {
		t.Fatal(err)
	}
	for _, s := range specs {
		if err := w.AddTensor(s.name, s.typ, s.dims...); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.WriteHeader(); err != nil {
		t.Fatal(err)
	}
	for i, ti := range w.Tensors() {
		data := make([]byte, ti.Size)
		if ti.Type == gguf.TypeF32 {
			for j := range len(data) / 4 {
				binary.LittleEndian.PutUint32(data[4*j:], math.Float32bits(float32(1000*i+j)))
			}
		} else { // Q8_0 blocks: an F16 scale of 1, then distinct int8s
			for blk := range len(data) / 34 {
				binary.LittleEndian.PutUint16(data[34*blk:], 0x3c00)
				for k := range 32 {
					data[34*blk+2+k] = byte(i + blk + k)
				}
			}
		}
		if err := w.WriteTensorData(ti.Name, data); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "mixture.gguf")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestPlanSplitsExperts: each block's stacked expert tensors leave its
// unit for one unit per expert (after every block, block by block, by
// expert index), each piece expert e's rows, a byte range of the file
// that follows the previous expert's; the bytes add up.
func TestPlanSplitsExperts(t *testing.T) {
	f, err := gguf.Open(writeMixture(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p, err := NewPlan(f, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Units) != 1+2+2*4 || p.Layers() != 2 {
		t.Fatalf("%d units, %d layers", len(p.Units), p.Layers())
	}
	var sum int64
	for i, u := range p.Units {
		sum += u.Bytes
		if u.idx != i {
			t.Fatalf("unit %d has index %d", i, u.idx)
		}
	}
	if sum != p.Bytes {
		t.Fatalf("units hold %d bytes, the plan %d", sum, p.Bytes)
	}
	for l := range 2 {
		lu := p.Layer(l)
		if len(lu.Tensors) != 2 || len(lu.Stacked) != 2 || len(lu.Placed()) != 4 {
			t.Fatalf("layer %d: %d tensors, %d stacked", l, len(lu.Tensors), len(lu.Stacked))
		}
		for e, u := range p.Experts(l) {
			if u != p.Units[3+4*l+e] || u.Layer != l || u.Expert != e || p.Expert(l, e) != u || len(u.Placed()) != 0 {
				t.Fatalf("layer %d expert %d: unit %s at %d", l, e, u.Name(), u.idx)
			}
			for k, pc := range u.Tensors {
				par := lu.Stacked[k]
				piece := par.Info.Size / 4
				if pc.Parent != par || pc.Info.Offset != par.Info.Offset+uint64(e)*piece || pc.Info.Size != piece ||
					pc.Info.Rows() != 3 || pc.FileBase != int64(e)*int64(piece) || pc.OutBase != pc.FileBase {
					t.Fatalf("layer %d expert %d: piece of %s at %d+%d, base %d", l, e, par.Name(), pc.Info.Offset, pc.Info.Size, pc.OutBase)
				}
			}
		}
	}
	if p.Expert(0, 4) != nil || p.Expert(2, 0) != nil {
		t.Fatal("an expert out of range has a unit")
	}
}

// TestExpertPiecesLandInTheirTensor: under every uploader and conversion,
// the pieces land where the stacked tensor's Weight expects them: its
// bytes once every expert is resident are the file's (the F32 tensor
// converted to F32 is a copy). The experts resolve after every block
// (plan order, one reader) where units land as they are flushed; the
// stream uploader's land as their fences' waiters report, in no set
// order, so there only the counts are checked.
func TestExpertPiecesLandInTheirTensor(t *testing.T) {
	path := writeMixture(t)
	cases := map[string]func() Config{
		"mapped":     func() Config { return Config{} },
		"arena":      func() Config { return Config{Converter: Conversion{AllF32: true}} },
		"per-tensor": func() Config { return Config{Strategy: HostF32} },
		"stream":     func() Config { return Config{Uploader: &StreamUploader{}} },
	}
	for name, cfgOf := range cases {
		t.Run(name, func(t *testing.T) {
			f, err := gguf.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			cfg := cfgOf()
			cfg.File, cfg.Layers, cfg.Readers, cfg.ChunkBytes = f, 2, 1, 100
			s, err := Start(context.Background(), cfg)
			if err != nil {
				f.Close()
				t.Fatal(err)
			}
			defer s.Close()
			if err := s.Resident().Wait(context.Background()); err != nil {
				t.Fatal(err)
			}
			// Subscribed once everything is resident: the bus's history
			// must hold the experts' events as it holds the blocks'.
			sub := s.Bus().Subscribe()
			for l := range 2 {
				if s.Experts(l) != 4 || s.ExpertsResident(l) != 4 {
					t.Fatalf("layer %d: %d of %d experts resident", l, s.ExpertsResident(l), s.Experts(l))
				}
				for _, name := range []string{"ffn_up_exps.weight", "ffn_down_exps.weight"} {
					name = "blk." + string(rune('0'+l)) + "." + name
					w, ok := s.Weight(name)
					ti, _ := f.Tensor(name)
					if !ok || w.Rows != 12 || w.Cols != 32 {
						t.Fatalf("%s: %v", name, w)
					}
					if ti.Type != gguf.TypeF32 && w.Type != ti.Type {
						continue // converted to F32: not the file's bytes
					}
					want, err := f.TensorData(ti)
					if err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(w.Host, want) {
						t.Fatalf("%s: the placed bytes are not the file's", name)
					}
				}
			}
			s.Close()
			blocks, experts := 0, 0
			for ev := range sub.C {
				switch e := ev.(type) {
				case progress.LayerReady:
					// An asynchronous uploader's units land as their fences'
					// waiters report back, in no set order; the others land
					// in load order.
					if experts > 0 && name != "stream" {
						t.Fatalf("layer %d ready after an expert", e.Layer)
					}
					blocks++
				case progress.ExpertReady:
					if blocks < 2 && name != "stream" {
						t.Fatalf("layer %d expert %d ready before every block", e.Layer, e.Expert)
					}
					experts++
				}
			}
			if blocks != 2 || experts != 8 {
				t.Fatalf("%d layer_ready, %d expert_ready events", blocks, experts)
			}
		})
	}
}
