package gpu

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/forge-llm/forge/dequant"
	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
)

// b32Types are the 32-element block types of the staged kernels.
var b32Types = []gguf.Type{gguf.TypeQ4_0, gguf.TypeQ4_1, gguf.TypeQ5_0, gguf.TypeQ5_1, gguf.TypeQ8_0}

// TestB32StagedPlans: a 32-element block weight that b32Fits refuses (90
// blocks a row, gpt-oss's output and attention; 65; 16-byte aligned or
// not) takes mxfp4.cu's staged family for one row (mv_{type}_m21, a forced
// m11, capped), several rows (mv_{type}_mx8) and the experts
// (moe_mv_{type}_m21); one that fits keeps mv_b32_q8's family (b2, x8,
// moe _b) on both; "g" forces the generic float kernel for one row and
// several rows alike.
func TestB32StagedPlans(t *testing.T) {
	for _, ed := range emuDevices {
		wpb := mvBlock / ed.dev.Warp
		for _, typ := range b32Types {
			kt, _ := kernelType(typ)
			for _, c := range []struct {
				rows, cols int
				aligned    bool
			}{{201088, 2880, true}, {4096, 2880, false}, {37, 2080, true}, {64, 4096, false}} {
				rows, cols := c.rows, c.cols
				what := fmt.Sprintf("%s %s %d×%d aligned %v", ed.name, typ, rows, cols, c.aligned)
				if b32Fits(ed.dev.Warp, typ, cols, c.aligned) {
					t.Fatalf("%s: b32Fits", what)
				}
				p, err := planMatvec(ed.dev, typ, rows, cols, 1, c.aligned, false, mvOverrides{})
				if err != nil {
					t.Fatal(err)
				}
				if want := (mvPlan{"mv_" + kt + "_m21", ceilDiv(rows, 2*wpb), mvArgsQ8}); p != want {
					t.Errorf("%s: %+v, want %+v", what, p, want)
				}
				p, _ = planMatvec(ed.dev, typ, rows, cols, 1, c.aligned, true, mvOverrides{Variant: "m11", BlocksPerSM: 1})
				if want := (mvPlan{"mv_" + kt + "_m11", min(ceilDiv(rows, wpb), ed.dev.SMs), mvArgsQ8}); p != want {
					t.Errorf("%s m11 capped: %+v, want %+v", what, p, want)
				}
				p, _ = planMatvec(ed.dev, typ, rows, cols, 1, c.aligned, true, mvOverrides{Variant: "g"})
				if want := (mvPlan{"mv_" + kt, ceilDiv(rows, wpb), mvArgsGeneric}); p != want {
					t.Errorf("%s g: %+v, want %+v", what, p, want)
				}
				if f := rowFamily(ed.dev.Warp, typ, cols, c.aligned, ""); f != "x8" {
					t.Errorf("%s: row family %q, want x8", what, f)
				}
				rp, err := planRows(ed.dev, typ, rows, cols, 12, c.aligned, "", "")
				if err != nil {
					t.Fatal(err)
				}
				if want := (rowsPlan{"mv_" + kt + "_mx8", 8, min(ceilDiv(rows, wpb), 8*ed.dev.SMs), mvArgsQ8}); rp != want {
					t.Errorf("%s rows: %+v, want %+v", what, rp, want)
				}
				if rp, _ = planRows(ed.dev, typ, rows, cols, 12, c.aligned, "g", ""); rp.Kernel != "mv_"+kt {
					t.Errorf("%s rows, g: %s, want mv_%s", what, rp.Kernel, kt)
				}
				mp, err := planMoe(ed.dev.Warp, typ, cols, c.aligned)
				if err != nil {
					t.Fatal(err)
				}
				if want := (moePlan{"moe_mv_" + kt + "_m21", 2, true}); mp != want {
					t.Errorf("%s experts: %+v, want %+v", what, mp, want)
				}
			}
			// whole runs at both widths, aligned: mv_b32_q8's family
			p, _ := planMatvec(ed.dev, typ, 4096, 4096, 1, true, true, mvOverrides{})
			rp, _ := planRows(ed.dev, typ, 4096, 4096, 5, true, "", "")
			mp, _ := planMoe(ed.dev.Warp, typ, 4096, true)
			if p.Kernel != "mv_"+kt+"_b2" || rp.Kernel != "mv_"+kt+"_x8" || mp.Kernel != "moe_mv_"+kt+"_b" {
				t.Errorf("%s %s 4096 columns: %s, %s, %s; want mv_b32_q8's family", ed.name, typ, p.Kernel, rp.Kernel, mp.Kernel)
			}
		}
	}
}

// TestEmuB32StagedMatvec: the staged 32-element block kernels at both
// widths through emuStagedCase (emu_mxfp4_test.go), for every type: rows
// of 90 blocks (gpt-oss's 2880 columns: rows 2- or 4-byte aligned, runs
// short of a warp), 65 (odd), 33 and 128 blocks with the weight 3, 9 or 2
// bytes past a 16-byte boundary (so b32Fits refuses it), rows not a
// multiple of a block's rows; each row within 1e-5 of the exact sum of
// its 8-bit terms, m11, m21 capped and mv_{type}_mx8 (5 and 12 rows of x)
// bit for bit the automatic one-row kernel, all within the conformance
// bound of the CPU backend's MatMul. Q8_0, Q5_0 and Q4_0 (gpt-oss's and
// the common ones) take every shape; Q4_1 and Q5_1 two.
func TestEmuB32StagedMatvec(t *testing.T) {
	rng := emuRNG(t)
	vars := []mvOverrides{{Variant: "m11"}, {Variant: "m21"}, {Variant: "m21", BlocksPerSM: 1}}
	for _, ed := range emuDevices {
		t.Run(ed.name, func(t *testing.T) {
			for _, typ := range b32Types {
				cases := []struct{ rows, cols, off int }{{67, 2880, 0}, {29, 2880, 9}, {37, 2080, 3}, {21, 1056, 2}, {19, 4096, 9}}
				if typ == gguf.TypeQ4_1 || typ == gguf.TypeQ5_1 {
					cases = cases[1:3]
				}
				for _, c := range cases {
					emuStagedCase(t, rng, ed.dev, typ, c.rows, c.cols, c.off, vars, b32Q8Ref)
				}
			}
		})
	}
}

// TestEmuB32StagedExperts: moe_mv_{type}_m21 at both widths through
// emuMoeMatvecCase (emu_moe_test.go), each slot's rows bit for bit the
// one-row kernel's (mv_{type}_m21) for its expert: rows of 90 and 65
// blocks.
func TestEmuB32StagedExperts(t *testing.T) {
	rng := emuRNG(t)
	for _, ed := range emuDevices {
		for _, c := range []struct {
			typ                    gguf.Type
			experts, rows, cols, k int
		}{{gguf.TypeQ8_0, 8, 21, 2880, 4}, {gguf.TypeQ5_0, 6, 19, 2080, 3}, {gguf.TypeQ4_1, 5, 10, 2880, 2}} {
			emuMoeMatvecCase(t, rng, ed.dev, c.typ, c.experts, c.rows, c.cols, c.k)
		}
	}
}

// b32Q8Ref is w's rows (a 32-element block type) against one row of
// 8-bit x (codes q, scales d) summed exactly (float64) from the kernels'
// terms: per block d·dx·Σ (c − z)·qx (Q4_0, Q5_0, Q8_0: z = 8, 16, 0) or
// dx·(d·Σ c·qx + m·Σ qx) (Q4_1, Q5_1), c the block's codes.
func b32Q8Ref(w *kernels.Weight, q []byte, d []float32) []float32 {
	bb, nb := w.Type.BlockBytes(), w.Cols/32
	out := make([]float32, w.Rows)
	for r := range w.Rows {
		var acc float64
		for b := range nb {
			blk := w.Host[(r*nb+b)*bb : (r*nb+b+1)*bb]
			f16 := func(o int) float64 { return float64(dequant.F16ToF32(binary.LittleEndian.Uint16(blk[o:]))) }
			var codes [32]int64
			var dw, m float64
			hasMin := false
			switch w.Type {
			case gguf.TypeQ8_0:
				dw = f16(0)
				for j := range 32 {
					codes[j] = int64(int8(blk[2+j]))
				}
			default:
				nib, hi, z := 2, uint32(0), int64(8)
				switch w.Type {
				case gguf.TypeQ4_1:
					nib, hasMin, z = 4, true, 0
				case gguf.TypeQ5_0:
					nib, hi, z = 6, binary.LittleEndian.Uint32(blk[2:]), 16
				case gguf.TypeQ5_1:
					nib, hi, hasMin, z = 8, binary.LittleEndian.Uint32(blk[4:]), true, 0
				}
				dw = f16(0)
				if hasMin {
					m = f16(2)
				}
				for j := range 16 {
					codes[j] = int64(blk[nib+j]&15|byte((hi>>j)&1)<<4) - z
					codes[j+16] = int64(blk[nib+j]>>4|byte((hi>>(j+16))&1)<<4) - z
				}
			}
			var s, sx int64
			for j := range 32 {
				s += codes[j] * int64(int8(q[32*b+j]))
				sx += int64(int8(q[32*b+j]))
			}
			acc += float64(d[b]) * (dw*float64(s) + m*float64(sx))
		}
		out[r] = float32(acc)
	}
	return out
}
