package gpu

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/forge-llm/forge/dequant"
	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/conformance"
	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/rocm"
)

// TestMXFP4Plans: MXFP4 weights take the 8-bit-activation kernels of
// mxfp4.cu at any alignment and any number of blocks (gpt-oss's 90), one
// row (mv_mxfp4_m21, or a forced m{R}{U}), several rows (mv_mxfp4_x8, the
// same family) and the experts (moe_mv_mxfp4_21); "g" still forces the
// generic float kernel, and the rows then take it too.
func TestMXFP4Plans(t *testing.T) {
	for _, ed := range emuDevices {
		wpb := mvBlock / ed.dev.Warp
		for _, aligned := range []bool{true, false} {
			for _, sh := range [][2]int{{2880, 2880}, {5760, 2880}, {2880, 5760}, {37, 2080}} {
				rows, cols := sh[0], sh[1]
				what := fmt.Sprintf("%s %d×%d aligned %v", ed.name, rows, cols, aligned)
				p, err := planMatvec(ed.dev, gguf.TypeMXFP4, rows, cols, 1, aligned, false, mvOverrides{})
				if err != nil {
					t.Fatal(err)
				}
				if want := (mvPlan{"mv_mxfp4_m21", ceilDiv(rows, 2*wpb), mvArgsQ8}); p != want {
					t.Errorf("%s: %+v, want %+v", what, p, want)
				}
				p, _ = planMatvec(ed.dev, gguf.TypeMXFP4, rows, cols, 1, aligned, true, mvOverrides{Variant: "m41", BlocksPerSM: 1})
				if want := (mvPlan{"mv_mxfp4_m41", min(ceilDiv(rows, 4*wpb), ed.dev.SMs), mvArgsQ8}); p != want {
					t.Errorf("%s m41 capped: %+v, want %+v", what, p, want)
				}
				p, _ = planMatvec(ed.dev, gguf.TypeMXFP4, rows, cols, 1, aligned, true, mvOverrides{Variant: "g"})
				if want := (mvPlan{"mv_mxfp4", ceilDiv(rows, wpb), mvArgsGeneric}); p != want {
					t.Errorf("%s g: %+v, want %+v", what, p, want)
				}
				rp, err := planRows(ed.dev, gguf.TypeMXFP4, rows, cols, 12, aligned, "", "")
				if err != nil {
					t.Fatal(err)
				}
				if want := (rowsPlan{"mv_mxfp4_x8", 8, min(ceilDiv(rows, wpb), 8*ed.dev.SMs), mvArgsQ8}); rp != want {
					t.Errorf("%s rows: %+v, want %+v", what, rp, want)
				}
				if rp, _ = planRows(ed.dev, gguf.TypeMXFP4, rows, cols, 12, aligned, "g", ""); rp.Kernel != "mv_mxfp4" {
					t.Errorf("%s rows, g: %s, want mv_mxfp4", what, rp.Kernel)
				}
				mp, err := planMoe(ed.dev.Warp, gguf.TypeMXFP4, cols, aligned)
				if err != nil {
					t.Fatal(err)
				}
				if want := (moePlan{mxfp4Moe, mxfp4MoeR, true}); mp != want {
					t.Errorf("%s experts: %+v, want %+v", what, mp, want)
				}
			}
		}
	}
}

// TestEmuMXFP4Matvec: mxfp4.cu's dense kernels at both widths, launched as
// planMatvec and planRows choose them, on fresh random weights and x:
//   - rows of 90 blocks (gpt-oss, 1530 bytes: 2-byte aligned rows, runs
//     that end short of a warp), 128 (whole runs at both widths), 65 (odd:
//     rows at odd addresses) and 32, the weight also placed 3 and 9 bytes
//     past a 16-byte boundary; rows not a multiple of a block's rows;
//   - each row within 1e-5 of the exact sum of the kernels' own integer
//     terms over the emulator's 8-bit x (any mistake in decoding a code,
//     pairing it with x or scaling a block shows far above that);
//   - every one-row variant (m{R}{U}: R rows per warp, U runs staged at a
//     time; m41 and the automatic one on one multiprocessor with one
//     block, its warps striding over row groups) and every row of
//     mv_mxfp4_x8 (5 and 12 rows of x) bit for bit the automatic one-row
//     kernel on that row of x;
//   - the whole against the CPU backend's MXFP4 MatMul (which rounds x to
//     8-bit blocks too, with f16 scales) and the exact product, within the
//     conformance bound; the generic float kernel too.
func TestEmuMXFP4Matvec(t *testing.T) {
	rng := emuRNG(t)
	for _, ed := range emuDevices {
		t.Run(ed.name, func(t *testing.T) {
			for _, c := range []struct{ rows, cols, off int }{
				{67, 2880, 0}, {29, 2880, 9}, {67, 4096, 0}, {37, 2080, 3}, {21, 1024, 9},
			} {
				emuMXFP4Case(t, rng, ed.dev, c.rows, c.cols, c.off)
			}
		})
	}
}

func emuMXFP4Case(t *testing.T, rng *rand.Rand, d LaunchDevice, rows, cols, off int) {
	vars := append(mxfp4VariantList(), mvOverrides{Variant: "m41", BlocksPerSM: 1})
	emuStagedCase(t, rng, d, gguf.TypeMXFP4, rows, cols, off, vars, mxfp4Q8Ref)
}

// emuStagedCase is one case of mxfp4.cu's staged dense kernels for weight
// type typ (see TestEmuMXFP4Matvec, TestEmuB32StagedMatvec): a random
// rows×cols weight placed off bytes past a 16-byte boundary, 12 rows of x;
// each row within 1e-5 of ref (the exact sum of the kernels' own integer
// terms), the forced one-row variants vars, the automatic one on one
// multiprocessor with one block and planRows' kernels for 5 and 12 rows
// bit for bit the automatic one-row kernel, the whole against the CPU
// backend's MatMul and the exact product within the conformance bound, and
// the generic float kernel too. planMatvec must choose a kernel of
// mxfp4.cu (mv_{type}_m…).
func emuStagedCase(t *testing.T, rng *rand.Rand, d LaunchDevice, typ gguf.Type, rows, cols, off int, vars []mvOverrides,
	ref func(w *kernels.Weight, q []byte, d []float32) []float32) {
	const maxN = 12
	kt, _ := kernelType(typ)
	what := fmt.Sprintf("warp %d %s %d×%d at +%d", d.Warp, typ, rows, cols, off)
	w := conformance.RandomWeight(rng, "w", typ, rows, cols)
	x := conformance.RandomVector(rng, maxN*cols, 1)
	var job emuJob
	wb := job.bytes(append(make([]byte, off), w.Host...))
	xb := job.f32(x)
	xq, xd := job.zeros(maxN*cols, true), job.zeros(4*maxN*cols/32, true)
	job.launch("quantize_q8", rocm.D1(ceilDiv(maxN*cols, 256)), rocm.D1(256), eP(xb, 0), eP(xq, 0), eP(xd, 0), eI(maxN*cols))
	aligned := off%16 == 0
	one := func(dev LaunchDevice, o mvOverrides, v int) (int, string) {
		p, err := planMatvec(dev, typ, rows, cols, 1, aligned, true, o)
		if err != nil {
			t.Fatal(err)
		}
		if p.Args != mvArgsQ8 || !strings.HasPrefix(p.Kernel, "mv_"+kt+"_m") {
			t.Fatalf("%s: %+v is not a staged kernel on 8-bit x", what, p)
		}
		y := job.zeros(4*rows, true)
		job.launch(p.Kernel, rocm.D1(p.Grid), rocm.D1(mvBlock), eP(wb, off), eP(xq, v*cols), eP(xd, 4*v*(cols/32)), eP(y, 0),
			eI(rows), eI(cols))
		return y, fmt.Sprintf("%s grid %d", p.Kernel, p.Grid)
	}
	// the automatic one-row kernel on every row of x: the reference bits
	auto := make([]int, maxN)
	for v := range auto {
		auto[v], _ = one(d, mvOverrides{}, v)
	}
	type variant struct {
		y    int
		what string
	}
	var outs []variant
	for _, o := range vars {
		y, k := one(d, o, 0)
		outs = append(outs, variant{y, k})
	}
	y, k := one(LaunchDevice{Warp: d.Warp, SMs: 1}, mvOverrides{BlocksPerSM: 1}, 0)
	outs = append(outs, variant{y, k + " (1 CU, 1 block)"})
	// several rows of x
	type rowsOut struct {
		y, n   int
		kernel string
	}
	var multi []rowsOut
	for _, n := range []int{5, maxN} {
		p, err := planRows(d, typ, rows, cols, n, aligned, "", "")
		if err != nil {
			t.Fatal(err)
		}
		y := job.zeros(4*n*rows, true)
		for i0 := 0; i0 < n; i0 += p.Group {
			nx := min(p.Group, n-i0)
			job.launch(p.Kernel, rocm.D1(p.Grid), rocm.D1(mvBlock), eP(wb, off), eP(xq, i0*cols), eP(xd, 4*i0*(cols/32)),
				eP(y, 4*i0*rows), eI(rows), eI(cols), eI(nx))
		}
		multi = append(multi, rowsOut{y, n, p.Kernel})
	}
	// the generic float kernel, row 0 of x
	yg := job.zeros(4*rows, true)
	job.launch("mv_"+kt, rocm.D1(ceilDiv(rows, mvBlock/d.Warp)), rocm.D1(mvBlock), eP(wb, off), eP(xb, 0), eP(yg, 0),
		eI(rows), eI(cols), eI(1))
	res := runEmu(t, d.Warp, &job)

	codes, scales := res.bufs[xq], res.f32(xd)
	got := make([]float32, maxN*rows)
	for v := range maxN {
		g := res.f32(auto[v])[:rows]
		copy(got[v*rows:], g)
		want := ref(w, codes[v*cols:(v+1)*cols], scales[v*cols/32:(v+1)*cols/32])
		emuCheck(t, fmt.Sprintf("%s: x row %d vs the exact sum of its 8-bit terms", what, v), g, want, 1e-5)
	}
	for _, vr := range outs {
		emuSame(t, fmt.Sprintf("%s: %s", what, vr.what), res.f32(vr.y)[:rows], got[:rows])
	}
	for _, m := range multi {
		emuSame(t, fmt.Sprintf("%s: %s, %d rows of x", what, m.kernel, m.n), res.f32(m.y)[:m.n*rows], got[:m.n*rows])
	}
	bound := conformance.MatMulBound(typ)
	emuCheck(t, what+": vs the exact product", got, cpuMatMul(t, w, x, maxN), bound)
	emuCheck(t, what+": mv_"+kt+" (generic) vs the exact product", res.f32(yg), cpuMatMul(t, w, x[:cols], 1), bound)
	cpuRef(t, func(b *cpu.Backend) {
		xt := cpuTensor(t, b, x)
		yt, err := b.Alloc(maxN * rows)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.MatMul(yt, w, xt, maxN); err != nil {
			t.Fatal(err)
		}
		emuCheck(t, what+": vs the CPU backend's MatMul", got, cpuRead(t, b, yt), bound)
	})
}

// mxfp4Q8Ref is w's rows against one row of 8-bit x (codes q, scales d)
// summed exactly (float64) from the kernels' terms: per block,
// e8m0_half(e)·dx·Σ kvalues_mxfp4[code]·qx.
func mxfp4Q8Ref(w *kernels.Weight, q []byte, d []float32) []float32 {
	nb := w.Cols / 32
	out := make([]float32, w.Rows)
	for r := range w.Rows {
		var acc float64
		for b := range nb {
			blk := w.Host[(r*nb+b)*17 : (r*nb+b+1)*17]
			var s int64
			for j := range 16 {
				c := blk[1+j]
				s += int64(dequant.KValuesMXFP4[c&15])*int64(int8(q[32*b+j])) +
					int64(dequant.KValuesMXFP4[c>>4])*int64(int8(q[32*b+j+16]))
			}
			acc += float64(dequant.E8M0ToF32Half(blk[0])) * float64(d[b]) * float64(s)
		}
		out[r] = float32(acc)
	}
	return out
}

// TestEmuMXFP4Experts: moe_mv_mxfp4_21 at both widths through
// emuMoeMatvecCase (emu_moe_test.go): gate and up of k slots on a shared
// x and down on one x row per slot, each slot's rows bit for bit the
// one-row kernel's (mv_mxfp4_m21) for its expert, the last against the
// exact product. gpt-oss's shape (32 experts of 2880 columns, 4 per
// token), 65-block rows (experts and rows at odd addresses), and k = 8
// with a repeated id.
func TestEmuMXFP4Experts(t *testing.T) {
	rng := emuRNG(t)
	for _, ed := range emuDevices {
		for _, c := range []struct{ experts, rows, cols, k int }{
			{32, 45, 2880, 4}, {6, 21, 2080, 3}, {12, 10, 1024, 8},
		} {
			emuMoeMatvecCase(t, rng, ed.dev, gguf.TypeMXFP4, c.experts, c.rows, c.cols, c.k)
		}
	}
}

// mxfp4VariantList is mxfp4Variants in a fixed order.
func mxfp4VariantList() []mvOverrides {
	var out []mvOverrides
	for _, v := range []string{"m11", "m21", "m41", "m13"} {
		if !mxfp4Variants[v] {
			panic("mxfp4Variants lacks " + v)
		}
		out = append(out, mvOverrides{Variant: v})
	}
	if len(out) != len(mxfp4Variants) {
		panic("mxfp4VariantList is not mxfp4Variants")
	}
	return out
}
