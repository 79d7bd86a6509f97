package gpu

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/forge-llm/forge/dequant"
	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/conformance"
	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/rocm"
)

// cpuEmbed decodes rows ids of w on the CPU backend.
func cpuEmbed(t *testing.T, w *kernels.Weight, ids []int32) []float32 {
	var out []float32
	cpuRef(t, func(b *cpu.Backend) {
		dt, _ := b.Alloc(len(ids) * w.Cols)
		if err := b.Embed(dt, w, ids); err != nil {
			t.Fatal(err)
		}
		out = cpuRead(t, b, dt)
	})
	return out
}

func f16Values(b []byte) []float32 {
	v := make([]float32, len(b)/2)
	for i := range v {
		v[i] = dequant.F16ToF32(binary.LittleEndian.Uint16(b[2*i:]))
	}
	return v
}

// TestEmuDequant: for every GPU weight type, deq32 (the whole weight to
// f32), deq16 (to f16 rows of kpad, the GEMM operand) and embed (chosen
// rows), then the prompt path of a Q4_K and an F16 weight (deq16,
// f32_to_f16, gemm_f16 and gemm_f16_lds, the FMA kernels AMD runs) at both
// widths, against the CPU backend's Embed and MatMul.
func TestEmuDequant(t *testing.T) {
	rng := emuRNG(t)
	for _, ed := range emuDevices {
		t.Run(ed.name, func(t *testing.T) {
			warp := ed.dev.Warp
			for _, typ := range emuMatTypes {
				rows, cols := 37, 512
				if typ.BlockSize() == 1 {
					cols = 1000
				}
				if typ == gguf.TypeMXFP4 {
					cols = 2880 // gpt-oss's experts: 90 blocks, rows not 16-byte aligned
				}
				kt, _ := kernelType(typ)
				w := conformance.RandomWeight(rng, "w", typ, rows, cols)
				kpad := (cols + 31) &^ 31
				items16, items32 := dequantItems(typ, rows, cols, kpad)
				ids := []int32{5, 0, 36, 5}
				var job emuJob
				wb := job.bytes(w.Host)
				o32, o16 := job.zeros(4*rows*cols, true), job.zeros(2*rows*kpad, true)
				idb, emb := job.i32(ids), job.zeros(4*len(ids)*cols, true)
				job.launch("deq32_"+kt, grid1(items32), rocm.D1(256), eP(wb, 0), eP(o32, 0), eI(rows), eI(cols))
				job.launch("deq16_"+kt, grid1(items16), rocm.D1(256), eP(wb, 0), eP(o16, 0), eI(rows), eI(cols), eI(kpad))
				job.launch("embed_"+kt, rocm.D1(len(ids)), rocm.D1(128), eP(wb, 0), eP(idb, 0), eI(int(ids[0])), eP(emb, 0), eI(cols))
				res := runEmu(t, warp, &job)
				all := make([]int32, rows)
				for i := range all {
					all[i] = int32(i)
				}
				want := cpuEmbed(t, w, all)
				tag := func(s string) string { return fmt.Sprintf("warp %d: %s %s %d×%d", warp, s, typ, rows, cols) }
				emuCheck(t, tag("deq32"), res.f32(o32), want, 1e-7)
				h := f16Values(res.bufs[o16])
				got16 := make([]float32, 0, rows*cols)
				for r := range rows {
					got16 = append(got16, h[r*kpad:r*kpad+cols]...)
					for c := cols; c < kpad; c++ {
						if h[r*kpad+c] != 0 {
							t.Errorf("%s: row %d pad column %d is %g, want 0", tag("deq16"), r, c, h[r*kpad+c])
						}
					}
				}
				emuCheck(t, tag("deq16"), got16, want, 1e-3)
				emuCheck(t, tag("embed"), res.f32(emb), cpuEmbed(t, w, ids), 1e-7)
			}
			emuGEMM(t, rng, warp)
		})
	}
}

// emuGEMM runs the prompt path: the weight to f16 (deq16), x to f16
// (f32_to_f16), then C = X·Wᵀ by gemm_f16 and gemm_f16_lds, for 20 and 130
// rows (a partial and a second tile row), as Backend.gemm launches them.
func emuGEMM(t *testing.T, r *rand.Rand, warp int) {
	for _, c := range []struct {
		typ        string
		rows, cols int
		n          int
	}{{"q4_k", 200, 512, 20}, {"f16", 130, 1000, 130}} {
		typ := emuMatTypes[0]
		for _, tt := range emuMatTypes {
			if k, _ := kernelType(tt); k == c.typ {
				typ = tt
			}
		}
		w := conformance.RandomWeight(r, "w", typ, c.rows, c.cols)
		x := conformance.RandomVector(r, c.n*c.cols, 1)
		kpad := (c.cols + 31) &^ 31
		items, _ := dequantItems(typ, c.rows, c.cols, kpad)
		var job emuJob
		wb, xb := job.bytes(w.Host), job.f32(x)
		wh, xh := job.zeros(2*c.rows*kpad, true), job.zeros(2*c.n*kpad, true)
		y1, y2 := job.zeros(4*c.n*c.rows, true), job.zeros(4*c.n*c.rows, true)
		job.launch("deq16_"+c.typ, grid1(items), rocm.D1(256), eP(wb, 0), eP(wh, 0), eI(c.rows), eI(c.cols), eI(kpad))
		job.launch("f32_to_f16", grid1(c.n*kpad), rocm.D1(256), eP(xb, 0), eP(xh, 0), eI(c.n), eI(c.cols), eI(kpad))
		for i, k := range []string{"gemm_f16", "gemm_f16_lds"} {
			y := []int{y1, y2}[i]
			l := planGEMM(k, c.rows, c.n)
			job.launch(l.Kernel, l.Grid, l.Block, eP(wh, 0), eP(xh, 0), eP(y, 0), eI(c.rows), eI(c.n), eI(kpad))
		}
		res := runEmu(t, warp, &job)
		want := cpuMatMul(t, w, x, c.n)
		for i, k := range []string{"gemm_f16", "gemm_f16_lds"} {
			emuCheck(t, fmt.Sprintf("warp %d: %s %s %d×%d n=%d", warp, k, typ, c.rows, c.cols, c.n),
				res.f32([]int{y1, y2}[i]), want, conformance.MatMulBound(typ))
		}
	}
}
