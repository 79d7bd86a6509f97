package gpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/conformance"
	"github.com/forge-llm/forge/rocm"
)

// piecesSeq is one sequence of a merged step: rows at positions pos0 …
// pos0+n−1 after a prefix of pos0 positions already in the pool; with
// moved, its last row sits at the end of the layout (as planGroups puts
// the rows that go on to the output head).
type piecesSeq struct {
	pos0, n int
	moved   bool
}

// TestEmuPrefillPieces runs the pieces kernels (attn_prefill_pieces_*,
// several sequences' prompt pieces in one launch, through prefillTiles'
// tiles) on the emulator and checks that every row gets the bits the
// one-piece kernel gives it with its piece launched alone: the plain path
// at wave32 and wave64 (the HIP kernels), and at warp 32 the sm_80 path
// (prefill_pipe on the emulator's mma.sync, ldmatrix and cp.async), whole
// and in the split form with attn.cu's merge. The pieces start deep in
// and near the start of their sequences, one is a lone row, and the
// moved last rows are tiles of one row; gpt-oss's sliding window and sinks
// too. The merged output is checked against the CPU backend as well.
func TestEmuPrefillPieces(t *testing.T) {
	rng := emuRNG(t)
	seqs := []piecesSeq{{150, 70, true}, {0, 45, true}, {90, 5, false}, {200, 1, false}, {17, 66, true}}
	type kcase struct {
		warp         int
		alone, multi string // one-piece and pieces kernels, %d the head size
		split        bool
	}
	var cases []kcase
	for _, ed := range emuDevices {
		cases = append(cases, kcase{ed.dev.Warp, "attn_prefill_f16_d%d", "attn_prefill_pieces_f16_d%d", false})
	}
	cases = append(cases, kcase{32, "attn_prefill_emu_f16_d%d", "attn_prefill_emupieces_f16_d%d", false},
		kcase{32, "attn_prefill_emusplit_f16_d%d", "attn_prefill_emupiecessplit_f16_d%d", true})
	ats := []kernels.Attn{
		{Heads: 8, KVHeads: 2, HeadDim: 128},
		{Heads: 4, KVHeads: 4, HeadDim: 64, Window: 40, Sinks: randomSinks(rng, 4)},
	}
	for _, kc := range cases {
		for _, at := range ats {
			at.Scale = float32(1 / math.Sqrt(float64(at.HeadDim)))
			emuPiecesCase(t, rng, kc.warp, fmt.Sprintf(kc.alone, at.HeadDim), fmt.Sprintf(kc.multi, at.HeadDim), kc.split, at, seqs)
		}
	}
}

func emuPiecesCase(t *testing.T, rng *rand.Rand, warp int, alone, multi string, split bool, at kernels.Attn, seqs []piecesSeq) {
	const bs = 16
	hd := at.HeadDim
	qDim, kvDim := at.Heads*hd, at.KVHeads*hd
	what := fmt.Sprintf("warp %d: %s against %s, D %d window %d sinks %v", warp, multi, alone, hd, at.Window, at.Sinks != nil)
	var job emuJob
	// each sequence's queries, keys and values at every position, and its
	// block table (the blocks of all sequences shuffled in one pool)
	var qs, ks, vs [][]float32
	var toff, tabs []int32
	blocks := 0
	for _, s := range seqs {
		blocks += ceilDiv(s.pos0+s.n, bs)
	}
	perm := rng.Perm(blocks + 3)
	for _, s := range seqs {
		tot := s.pos0 + s.n
		qs = append(qs, conformance.RandomVector(rng, tot*qDim, 1))
		ks = append(ks, conformance.RandomVector(rng, tot*kvDim, 1))
		vs = append(vs, conformance.RandomVector(rng, tot*kvDim, 1))
		toff = append(toff, int32(len(tabs)))
		for range ceilDiv(tot, bs) {
			tabs = append(tabs, int32(perm[len(tabs)]))
		}
	}
	kc, vc := job.zeros((blocks+3)*bs*kvDim*2, false), job.zeros((blocks+3)*bs*kvDim*2, false)
	toffb, tabsb := job.i32(toff), job.i32(tabs)
	for si, s := range seqs {
		tot := s.pos0 + s.n
		pos, seq := make([]int32, tot), make([]int32, tot)
		for i := range pos {
			pos[i], seq[i] = int32(i), int32(si)
		}
		job.launch("kv_store_paged_f16", grid1(tot*kvDim), rocm.D1(256), eP(kc, 0), eP(vc, 0), eP(job.f32(ks[si]), 0), eP(job.f32(vs[si]), 0),
			eI(tot), eI(kvDim), eI(bs), eP(job.i32(pos), 0), eP(job.i32(seq), 0), eP(toffb, 0), eP(tabsb, 0))
	}
	// sinks join the one-piece kernel, or the merge in the split form
	kernelSinks := func() emuArg {
		if split {
			return eNull()
		}
		return emuSinks(&job, at)
	}
	// finish turns a launch's output (the merge's parts in the split form)
	// into out's rows.
	finish := func(out, dst, n, zs int) {
		if split {
			job.launch("attn_paged_merge", rocm.Dim3{X: uint32(at.Heads), Y: uint32(n), Z: 1}, rocm.D1(128),
				eP(out, 0), eP(dst, 0), eI(at.Heads), eI(hd), eI(zs), emuSinks(&job, at))
		}
	}
	splits := func(end int) int {
		if split {
			return ceilDiv(end, emuSplit)
		}
		return 0
	}
	partOr := func(out, n, zs int) int {
		if split {
			return job.zeros(4*n*at.Heads*zs*(hd+2), true)
		}
		return out
	}
	// each piece alone
	outs := make([]int, len(seqs))
	for si, s := range seqs {
		outs[si] = job.zeros(4*s.n*qDim, true)
		zs := splits(s.pos0 + s.n)
		dst := partOr(outs[si], s.n, zs)
		l := planPrefill(alone, at.Heads, s.n, zs)
		job.launch(l.Kernel, l.Grid, l.Block, eP(dst, 0), eP(job.f32(qs[si][s.pos0*qDim:]), 0), eP(kc, 0), eP(vc, 0),
			eI(s.n), eI(at.Heads), eI(at.KVHeads), eF(at.Scale), eI(bs), eI(s.pos0), eI(si), eP(toffb, 0), eP(tabsb, 0),
			eI(at.Window), kernelSinks())
		finish(outs[si], dst, s.n, zs)
	}
	// all of them in one launch, the moved last rows at the end
	var pos, seq []int32
	var qm []float32
	add := func(si, lo, hi int) {
		s := seqs[si]
		for r := lo; r < hi; r++ {
			pos, seq = append(pos, int32(s.pos0+r)), append(seq, int32(si))
			qm = append(qm, qs[si][(s.pos0+r)*qDim:(s.pos0+r+1)*qDim]...)
		}
	}
	maxEnd := 0
	for si, s := range seqs {
		hi := s.n
		if s.moved {
			hi--
		}
		add(si, 0, hi)
		maxEnd = max(maxEnd, s.pos0+s.n)
	}
	for si, s := range seqs {
		if s.moved {
			add(si, s.n-1, s.n)
		}
	}
	n := len(pos)
	tiles, runs := prefillTiles(nil, pos, seq)
	if !piecesLayout(n, runs) {
		t.Fatalf("%s: a layout of %d rows in %d runs would not take the pieces kernel", what, n, runs)
	}
	merged := job.zeros(4*n*qDim, true)
	zs := splits(maxEnd)
	dst := partOr(merged, n, zs)
	l := planPrefillTiles(multi, at.Heads, len(tiles)/4, zs)
	job.launch(l.Kernel, l.Grid, l.Block, eP(dst, 0), eP(job.f32(qm), 0), eP(kc, 0), eP(vc, 0),
		eI(at.Heads), eI(at.KVHeads), eF(at.Scale), eI(bs), eP(job.i32(tiles), 0), eP(toffb, 0), eP(tabsb, 0),
		eI(at.Window), kernelSinks())
	finish(merged, dst, n, zs)
	res := runEmu(t, warp, &job)

	got := res.f32(merged)
	wantSeq := make([][]float32, len(seqs))
	for si, s := range seqs {
		wantSeq[si] = cpuAttention(t, qs[si], f16Round(ks[si]), f16Round(vs[si]), s.pos0, s.n, s.pos0+s.n, at)
	}
	var want []float32
	for r := range n {
		si, p := int(seq[r]), int(pos[r])
		a := res.f32(outs[si])[(p-seqs[si].pos0)*qDim:][:qDim]
		for j, x := range a {
			if math.Float32bits(x) != math.Float32bits(got[r*qDim+j]) {
				t.Errorf("%s: row %d (sequence %d, position %d) element %d is %g, its piece alone %g", what, r, si, p, j, got[r*qDim+j], x)
				return
			}
		}
		want = append(want, wantSeq[si][(p-seqs[si].pos0)*qDim:][:qDim]...)
	}
	// (the tensor paths round the query and the probabilities to f16)
	emuCheck(t, what, got, want, 4e-3)
}
