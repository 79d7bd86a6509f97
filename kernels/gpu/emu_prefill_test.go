package gpu

import (
	"fmt"
	"math"
	"testing"

	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/conformance"
	"github.com/forge-llm/forge/rocm"
)

// TestEmuPrefillTensor runs prefill.cu's sm_80 path (prefill_pipe: mma.sync
// fragments, ldmatrix, the two-stage cp.async pipeline) on the emulator's
// models of those operations (attn_prefill_emu_*, warp 32), and in its
// v1 cases the first sm_80 path (prefill_mma, which the H100 has run), a
// check of the emulator's mma.sync model itself: prompt pieces
// over prefixes that span several chunks, block sizes that do and do not
// divide a chunk, a partial last tile whose last warps hold no rows,
// grouped queries, and gpt-oss's sliding window and attention sinks. Each piece is checked against the CPU backend (the
// query and the probabilities are rounded to f16 for the products, hence
// the bound), and the same rows cut into smaller pieces must give the same
// bits (batch invariance).
//
// The split form (attn_prefill_emusplit_*, the default on the device) runs
// with the emulator's PP_SPLIT of emuSplit positions, so that its short
// prefixes span several splits, and attn.cu's merge.
func TestEmuPrefillTensor(t *testing.T) {
	rng := emuRNG(t)
	cases := []struct {
		at         kernels.Attn
		bs, pos0   int
		n          int
		cuts       []int
		blocksMore int
		v1         bool // prefill_mma, the H100-proven path, on the same models
		split      bool // the split form (the default on the device) and attn.cu's merge
	}{
		{kernels.Attn{Heads: 8, KVHeads: 2, HeadDim: 128}, 16, 150, 70, []int{33, 2}, 3, false, false},
		{kernels.Attn{Heads: 4, KVHeads: 4, HeadDim: 64}, 24, 37, 100, []int{64, 9}, 2, false, false},
		{kernels.Attn{Heads: 4, KVHeads: 1, HeadDim: 128}, 32, 0, 45, []int{20}, 1, false, false},
		// gpt-oss's layers: a window of 40 (its rows' windows start inside
		// the piece and inside chunks) with sinks, and sinks alone.
		{kernels.Attn{Heads: 8, KVHeads: 2, HeadDim: 64, Window: 40, Sinks: randomSinks(rng, 8)}, 16, 150, 70, []int{33}, 3, false, false},
		{kernels.Attn{Heads: 8, KVHeads: 2, HeadDim: 64, Sinks: randomSinks(rng, 8)}, 16, 150, 70, []int{33}, 3, false, false},
		{kernels.Attn{Heads: 8, KVHeads: 2, HeadDim: 64, Window: 40, Sinks: randomSinks(rng, 8)}, 16, 150, 70, []int{33}, 3, true, false},
		{kernels.Attn{Heads: 8, KVHeads: 2, HeadDim: 128}, 16, 150, 70, []int{33}, 3, true, false},
		// the split form, with the sinks folded in by the merge
		{kernels.Attn{Heads: 8, KVHeads: 2, HeadDim: 128}, 16, 150, 70, []int{33, 2}, 3, false, true},
		{kernels.Attn{Heads: 4, KVHeads: 4, HeadDim: 64}, 24, 37, 100, []int{64, 9}, 2, false, true},
		{kernels.Attn{Heads: 8, KVHeads: 2, HeadDim: 64, Window: 40, Sinks: randomSinks(rng, 8)}, 16, 150, 70, []int{33}, 3, false, true},
	}
	for _, c := range cases {
		at := c.at
		hd := at.HeadDim
		at.Scale = float32(1 / math.Sqrt(float64(hd)))
		qDim, kvDim, tot := at.Heads*hd, at.KVHeads*hd, c.pos0+c.n
		name := fmt.Sprintf("attn_prefill_emu_f16_d%d", hd)
		switch {
		case c.split:
			name = fmt.Sprintf("attn_prefill_emusplit_f16_d%d", hd)
		case c.v1:
			name = fmt.Sprintf("attn_prefill_emuv1_f16_d%d", hd)
		}
		what := fmt.Sprintf("%s heads %d/%d bs %d pos0 %d n %d window %d sinks %v", name, at.Heads, at.KVHeads, c.bs, c.pos0, c.n,
			at.Window, at.Sinks != nil)
		q := conformance.RandomVector(rng, tot*qDim, 1)
		k := conformance.RandomVector(rng, tot*kvDim, 1)
		v := conformance.RandomVector(rng, tot*kvDim, 1)
		nb := ceilDiv(tot, c.bs)
		blocks := nb + c.blocksMore
		perm := rng.Perm(blocks)
		tab := make([]int32, nb)
		for i := range tab {
			tab[i] = int32(perm[i])
		}
		var job emuJob
		kc, vc := job.zeros(blocks*c.bs*kvDim*2, false), job.zeros(blocks*c.bs*kvDim*2, false)
		toffb, tabsb := job.i32([]int32{0}), job.i32(tab)
		pos := make([]int32, tot)
		for i := range pos {
			pos[i] = int32(i)
		}
		posb, seqb := job.i32(pos), job.i32(make([]int32, tot))
		job.launch("kv_store_paged_f16", grid1(tot*kvDim), rocm.D1(256), eP(kc, 0), eP(vc, 0),
			eP(job.f32(k), 0), eP(job.f32(v), 0), eI(tot), eI(kvDim), eI(c.bs), eP(posb, 0), eP(seqb, 0), eP(toffb, 0), eP(tabsb, 0))
		qb := job.f32(q)
		// piece launches its kernel on rows [lo, hi) of the piece into out
		// (at those rows' offsets).
		piece := func(out, lo, hi int) {
			n := hi - lo
			if !c.split {
				l := planPrefill(name, at.Heads, n, 0)
				job.launch(l.Kernel, l.Grid, l.Block, eP(out, 4*lo*qDim), eP(qb, 4*(c.pos0+lo)*qDim), eP(kc, 0), eP(vc, 0),
					eI(n), eI(at.Heads), eI(at.KVHeads), eF(at.Scale), eI(c.bs), eI(c.pos0+lo), eI(0), eP(toffb, 0), eP(tabsb, 0),
					eI(at.Window), emuSinks(&job, at))
				return
			}
			// the split form: parts of emuSplit positions, then attn.cu's
			// merge, which folds the sinks in
			zs := ceilDiv(c.pos0+hi, emuSplit)
			part := job.zeros(4*n*at.Heads*zs*(hd+2), true)
			l := planPrefill(name, at.Heads, n, zs)
			job.launch(l.Kernel, l.Grid, l.Block, eP(part, 0), eP(qb, 4*(c.pos0+lo)*qDim), eP(kc, 0), eP(vc, 0),
				eI(n), eI(at.Heads), eI(at.KVHeads), eF(at.Scale), eI(c.bs), eI(c.pos0+lo), eI(0), eP(toffb, 0), eP(tabsb, 0),
				eI(at.Window), eNull())
			job.launch("attn_paged_merge", rocm.Dim3{X: uint32(at.Heads), Y: uint32(n), Z: 1}, rocm.D1(128),
				eP(out, 4*lo*qDim), eP(part, 0), eI(at.Heads), eI(hd), eI(zs), emuSinks(&job, at))
		}
		whole := job.zeros(4*c.n*qDim, true)
		piece(whole, 0, c.n)
		cut := make([]int, len(c.cuts))
		for i, size := range c.cuts {
			cut[i] = job.zeros(4*c.n*qDim, true)
			for lo := 0; lo < c.n; lo += size {
				piece(cut[i], lo, min(c.n, lo+size))
			}
		}
		// The unsplit form, which normalises as the merge does: a row whose
		// positions all lie in the first split gets the split form's bits.
		unsplit := -1
		if c.split && at.Sinks == nil && c.pos0 < emuSplit {
			unsplit = job.zeros(4*c.n*qDim, true)
			l := planPrefill(fmt.Sprintf("attn_prefill_emu_f16_d%d", hd), at.Heads, c.n, 0)
			job.launch(l.Kernel, l.Grid, l.Block, eP(unsplit, 0), eP(qb, 4*c.pos0*qDim), eP(kc, 0), eP(vc, 0),
				eI(c.n), eI(at.Heads), eI(at.KVHeads), eF(at.Scale), eI(c.bs), eI(c.pos0), eI(0), eP(toffb, 0), eP(tabsb, 0),
				eI(at.Window), eNull())
		}
		res := runEmu(t, 32, &job)
		if unsplit >= 0 {
			a, b := res.f32(whole), res.f32(unsplit)
			for j := range (emuSplit - c.pos0) * qDim {
				if math.Float32bits(a[j]) != math.Float32bits(b[j]) {
					t.Errorf("%s: row %d element %d: split form %g, unsplit %g", what, j/qDim, j%qDim, a[j], b[j])
					break
				}
			}
		}
		want := cpuAttention(t, q, f16Round(k), f16Round(v), c.pos0, c.n, tot, at)
		emuCheck(t, what, res.f32(whole), want, 4e-3)
		got := res.f32(whole)
		for i, size := range c.cuts {
			parts := res.f32(cut[i])
			for j := range got {
				if math.Float32bits(got[j]) != math.Float32bits(parts[j]) {
					t.Errorf("%s: in pieces of %d, row %d element %d is %g, in one piece %g", what, size, j/qDim, j%qDim, parts[j], got[j])
					break
				}
			}
		}
	}
}

// emuSplit is prefill.cu's PP_SPLIT under the emulator.
const emuSplit = 64
