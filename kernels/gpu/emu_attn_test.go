package gpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/forge-llm/forge/dequant"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/conformance"
	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/rocm"
)

// cpuAttention is the CPU backend's attention of the last n of pos0+n
// tokens (q, k, v of all pos0+n tokens), the first pos0 stored before.
func cpuAttention(t *testing.T, q, k, v []float32, pos0, n, ctx int, at kernels.Attn) []float32 {
	qDim, kvDim := at.Heads*at.HeadDim, at.KVHeads*at.HeadDim
	var out []float32
	cpuRef(t, func(b *cpu.Backend) {
		kc, err := b.NewKVCache(1, ctx, kvDim)
		if err != nil {
			t.Fatal(err)
		}
		run := func(p0, m int) kernels.Tensor {
			o, _ := b.Alloc(m * qDim)
			err := b.Attention(o, cpuTensor(t, b, q[p0*qDim:(p0+m)*qDim]), cpuTensor(t, b, k[p0*kvDim:(p0+m)*kvDim]),
				cpuTensor(t, b, v[p0*kvDim:(p0+m)*kvDim]), kc, 0, p0, m, at)
			if err != nil {
				t.Fatal(err)
			}
			return o
		}
		if pos0 > 0 {
			run(0, pos0)
		}
		out = cpuRead(t, b, run(pos0, n))
	})
	return out
}

// f16Round rounds v to f16 and back, as a cache of f16 stores it.
func f16Round(v []float32) []float32 {
	o := make([]float32, len(v))
	for i, x := range v {
		o[i] = dequant.F16ToF32(dequant.F32ToF16(x))
	}
	return o
}

// TestEmuAttention: kv_store and the decode attention (1 and 2 tokens, the
// context split over the blocks planAttnDecodeSplits gives each device,
// the last block of a head merging; one token also quantized for the
// output projection) and the prompt attention, f16 and f32 caches, head
// sizes 128 and 64, grouped queries, with and without attention sinks, at
// both widths, against the CPU
// backend's Attention (with the f16 cache's keys and values rounded for
// it).
func TestEmuAttention(t *testing.T) {
	rng := emuRNG(t)
	cases := []struct {
		pos0, n int
		at      kernels.Attn
	}{
		{0, 1, kernels.Attn{Heads: 8, KVHeads: 2, HeadDim: 128}},
		{300, 1, kernels.Attn{Heads: 8, KVHeads: 2, HeadDim: 128}},
		{100, 2, kernels.Attn{Heads: 4, KVHeads: 4, HeadDim: 64}},
		{0, 11, kernels.Attn{Heads: 8, KVHeads: 2, HeadDim: 128}},
		{37, 20, kernels.Attn{Heads: 4, KVHeads: 1, HeadDim: 64}},
		// gpt-oss's full-attention layers: sinks on the decode shape (one
		// split and several) and the prompt shape.
		{3, 1, kernels.Attn{Heads: 8, KVHeads: 2, HeadDim: 64, Sinks: randomSinks(rng, 8)}},
		{300, 1, kernels.Attn{Heads: 8, KVHeads: 2, HeadDim: 64, Sinks: randomSinks(rng, 8)}},
		{100, 2, kernels.Attn{Heads: 8, KVHeads: 2, HeadDim: 64, Sinks: randomSinks(rng, 8)}},
		{37, 20, kernels.Attn{Heads: 8, KVHeads: 2, HeadDim: 64, Sinks: randomSinks(rng, 8)}},
	}
	const ctx = 512
	for _, ed := range emuDevices {
		t.Run(ed.name, func(t *testing.T) {
			for _, sfx := range []string{"f16", "f32"} {
				for _, c := range cases {
					emuAttnCase(t, rng, ed.dev, sfx, c.pos0, c.n, ctx, c.at)
				}
				// a cache of 64 positions: one split, the block normalises
				// its own output (sink_inv)
				emuAttnCase(t, rng, ed.dev, sfx, 30, 1, 64, kernels.Attn{Heads: 8, KVHeads: 2, HeadDim: 64, Sinks: randomSinks(rng, 8)})
			}
		})
	}
}

func emuAttnCase(t *testing.T, rng *rand.Rand, d LaunchDevice, sfx string, pos0, n, ctx int, at kernels.Attn) {
	at.Scale = float32(1 / math.Sqrt(float64(at.HeadDim)))
	qDim, kvDim, tot := at.Heads*at.HeadDim, at.KVHeads*at.HeadDim, pos0+n
	q := conformance.RandomVector(rng, tot*qDim, 1)
	k := conformance.RandomVector(rng, tot*kvDim, 1)
	v := conformance.RandomVector(rng, tot*kvDim, 1)
	es := 2
	if sfx == "f32" {
		es = 4
	}
	var job emuJob
	kc, vc := job.zeros(ctx*kvDim*es, false), job.zeros(ctx*kvDim*es, false)
	kb, vb := job.f32(k), job.f32(v)
	qb := job.f32(q[pos0*qDim:])
	out := job.zeros(4*n*qDim, true)
	// the earlier tokens, then the new ones, as two Attention calls store them
	if pos0 > 0 {
		job.launch("kv_store_"+sfx, grid1(pos0*kvDim), rocm.D1(256), eP(kc, 0), eP(vc, 0), eP(kb, 0), eP(vb, 0), eI(pos0), eI(kvDim), eI(0), eNull())
	}
	job.launch("kv_store_"+sfx, grid1(n*kvDim), rocm.D1(256), eP(kc, 0), eP(vc, 0), eP(kb, 4*pos0*kvDim), eP(vb, 4*pos0*kvDim), eI(n), eI(kvDim), eI(pos0), eNull())
	what := ""
	oq, od := -1, -1
	if n <= 2 {
		minSplit := 64 * (pos0 % 2) // both ways: splits of at least 64 positions, or none
		l, splits, splitLen := planAttnDecode(d, sfx, at.Heads, n, pos0, ctx, minSplit)
		part, count := eNull(), eNull()
		if splits > 1 {
			part = eP(job.zeros(4*n*at.Heads*splits*(at.HeadDim+2), true), 0)
			count = eP(job.zeros(4*n*at.Heads, false), 0)
		}
		oqa, oda := eNull(), eNull()
		if n == 1 && at.HeadDim%32 == 0 {
			oq, od = job.zeros(qDim, true), job.zeros(4*qDim/32, true)
			oqa, oda = eP(oq, 0), eP(od, 0)
		}
		job.launch(l.Kernel, l.Grid, l.Block,
			eP(out, 0), part, eP(qb, 0), eP(kc, 0), eP(vc, 0), eI(at.Heads), eI(at.KVHeads), eI(at.HeadDim), eI(pos0),
			eF(at.Scale), eI(splitLen), eNull(), count, oqa, oda, emuSinks(&job, at), eI(minSplit))
		what = fmt.Sprintf("attn_decode_%s %d splits of at least %d", sfx, splits, minSplit)
	} else {
		l := planAttnPrompt(sfx, at.Heads, n)
		job.launch(l.Kernel, l.Grid, l.Block,
			eP(out, 0), eP(qb, 0), eP(kc, 0), eP(vc, 0), eI(n), eI(at.Heads), eI(at.KVHeads), eI(at.HeadDim), eI(pos0), eF(at.Scale),
			emuSinks(&job, at))
		what = "attn_prompt_" + sfx
	}
	res := runEmu(t, d.Warp, &job)
	kr, vr, bound := k, v, 2e-5
	if sfx == "f16" {
		kr, vr = f16Round(k), f16Round(v)
	}
	want := cpuAttention(t, q, kr, vr, pos0, n, ctx, at)
	tag := fmt.Sprintf("warp %d: %s pos0 %d n %d heads %d/%d×%d sinks %v", d.Warp, what, pos0, n, at.Heads, at.KVHeads, at.HeadDim, at.Sinks != nil)
	got := res.f32(out)
	emuCheck(t, tag, got, want, bound)
	if oq >= 0 {
		q8Check(t, tag, got, res.bufs[oq], res.f32(od))
	}
}

// TestEmuPagedAttention: kv_store_paged, attn_paged and attn_paged_fine
// over shuffled block tables and attn_paged_merge for a step of two sequences (one decoding at
// position 300, one starting with 5 rows), both cache types, at both
// widths, against the CPU backend's Attention over each sequence alone;
// plain, and (f16) with gpt-oss's sliding window and attention sinks (a
// window of 100, which cuts the long row's first split, with sinks; a
// window of 3, which the short sequence's rows cross).
func TestEmuPagedAttention(t *testing.T) {
	rng := emuRNG(t)
	for _, ed := range emuDevices {
		for _, sfx := range []string{"f16", "f32"} {
			ats := []kernels.Attn{{Heads: 8, KVHeads: 2, HeadDim: 128}}
			if sfx == "f16" {
				ats = append(ats, kernels.Attn{Heads: 8, KVHeads: 2, HeadDim: 64, Window: 100, Sinks: randomSinks(rng, 8)},
					kernels.Attn{Heads: 8, KVHeads: 2, HeadDim: 64, Window: 3})
			}
			for _, at := range ats {
				at.Scale = float32(1 / math.Sqrt(float64(at.HeadDim)))
				emuPagedCase(t, rng, ed.dev.Warp, sfx, at)
			}
		}
	}
}

func emuPagedCase(t *testing.T, rng *rand.Rand, warp int, sfx string, at kernels.Attn) {
	qDim, kvDim := at.Heads*at.HeadDim, at.KVHeads*at.HeadDim
	const bs, blocks, long = 16, 40, 300
	es := 2
	if sfx == "f32" {
		es = 4
	}
	// sequence 0: long+1 tokens, sequence 1: 5
	lens := []int{long + 1, 5}
	var qs, ks, vs [2][]float32
	for s, l := range lens {
		qs[s] = conformance.RandomVector(rng, l*qDim, 1)
		ks[s] = conformance.RandomVector(rng, l*kvDim, 1)
		vs[s] = conformance.RandomVector(rng, l*kvDim, 1)
	}
	perm := rng.Perm(blocks)
	tabs := [][]int32{{}, {}}
	next := 0
	for s, l := range lens {
		for range ceilDiv(l, bs) {
			tabs[s] = append(tabs[s], int32(perm[next]))
			next++
		}
	}
	var job emuJob
	kc, vc := job.zeros(blocks*bs*kvDim*es, false), job.zeros(blocks*bs*kvDim*es, false)
	tabsFlat := append(append([]int32{}, tabs[0]...), tabs[1]...)
	toffb := job.i32([]int32{0, int32(len(tabs[0]))})
	tabsb := job.i32(tabsFlat)
	// the long sequence's first 300 positions, stored by an earlier step
	pre := make([]int32, long)
	for i := range pre {
		pre[i] = int32(i)
	}
	prePos, preSeq := job.i32(pre), job.i32(make([]int32, long))
	job.launch("kv_store_paged_"+sfx, grid1(long*kvDim), rocm.D1(256), eP(kc, 0), eP(vc, 0),
		eP(job.f32(ks[0][:long*kvDim]), 0), eP(job.f32(vs[0][:long*kvDim]), 0), eI(long), eI(kvDim), eI(bs),
		eP(prePos, 0), eP(preSeq, 0), eP(toffb, 0), eP(tabsb, 0))
	// the step: row 0 = sequence 0 at 300, rows 1…5 = sequence 1 at 0…4
	const n = 6
	pos := []int32{long, 0, 1, 2, 3, 4}
	seq := []int32{0, 1, 1, 1, 1, 1}
	stepQ := append(append([]float32{}, qs[0][long*qDim:]...), qs[1]...)
	stepK := append(append([]float32{}, ks[0][long*kvDim:]...), ks[1]...)
	stepV := append(append([]float32{}, vs[0][long*kvDim:]...), vs[1]...)
	posb, seqb := job.i32(pos), job.i32(seq)
	job.launch("kv_store_paged_"+sfx, grid1(n*kvDim), rocm.D1(256), eP(kc, 0), eP(vc, 0),
		eP(job.f32(stepK), 0), eP(job.f32(stepV), 0), eI(n), eI(kvDim), eI(bs), eP(posb, 0), eP(seqb, 0), eP(toffb, 0), eP(tabsb, 0))
	// attn_paged (splits of 256 positions) and attn_paged_fine (16
	// splits by each row's length), each with the merge
	qb := job.f32(stepQ)
	var outs [2]int
	var names [2]string
	for fi := range outs {
		splits, attnL, mergeL := planPaged(sfx, at.Heads, n, long)
		if fi == 1 {
			splits, attnL, mergeL = planPagedFine(sfx, at.Heads, n)
		}
		part := job.zeros(4*n*at.Heads*splits*(at.HeadDim+2), true)
		outs[fi], names[fi] = job.zeros(4*n*qDim, true), attnL.Kernel
		job.launch(attnL.Kernel, attnL.Grid, attnL.Block,
			eP(part, 0), eP(qb, 0), eP(kc, 0), eP(vc, 0), eI(at.Heads), eI(at.KVHeads), eI(at.HeadDim),
			eF(at.Scale), eI(bs), eP(posb, 0), eP(seqb, 0), eP(toffb, 0), eP(tabsb, 0), eI(at.Window))
		job.launch(mergeL.Kernel, mergeL.Grid, mergeL.Block,
			eP(outs[fi], 0), eP(part, 0), eI(at.Heads), eI(at.HeadDim), eI(splits), emuSinks(&job, at))
	}
	res := runEmu(t, warp, &job)
	for fi, out := range outs {
		got := res.f32(out)
		for s, l := range lens {
			kr, vr, bound := ks[s], vs[s], 2e-5
			if sfx == "f16" {
				kr, vr = f16Round(kr), f16Round(vr)
			}
			p0, m, row := long, 1, 0
			if s == 1 {
				p0, m, row = 0, 5, 1
			}
			want := cpuAttention(t, qs[s], kr, vr, p0, m, ctxFor(l), at)
			emuCheck(t, fmt.Sprintf("warp %d: %s sequence %d window %d sinks %v", warp, names[fi], s, at.Window, at.Sinks != nil),
				got[row*qDim:], want, bound)
		}
	}
}

func ctxFor(l int) int { return max(l, 16) }

// TestEmuPrefill: the paged prefill attention of a prompt piece
// (prefill.cu, the plain path HIP compiles) of 70 rows at positions
// 150…219 of one sequence (two tiles of prefillRows, the second partial)
// over a shuffled block table, head sizes 64 and 128, and gpt-oss's
// window and sinks, at both widths, against the CPU backend's Attention.
func TestEmuPrefill(t *testing.T) {
	rng := emuRNG(t)
	for _, ed := range emuDevices {
		for _, hd := range []int{64, 128} {
			at := kernels.Attn{Heads: 4, KVHeads: 2, HeadDim: hd}
			at.Scale = float32(1 / math.Sqrt(float64(hd)))
			emuPrefillCase(t, rng, ed.dev.Warp, at)
		}
		// gpt-oss's layers (head size 64): a window of 40 (shorter than
		// the piece: its rows' windows start inside it) with sinks, and
		// sinks alone.
		for _, window := range []int{40, 0} {
			at := kernels.Attn{Heads: 4, KVHeads: 2, HeadDim: 64, Window: window, Sinks: randomSinks(rng, 4), Scale: 0.125}
			emuPrefillCase(t, rng, ed.dev.Warp, at)
		}
	}
}

func emuPrefillCase(t *testing.T, rng *rand.Rand, warp int, at kernels.Attn) {
	const bs, blocks, pos0, n = 16, 20, 150, 70
	hd := at.HeadDim
	qDim, kvDim, tot := at.Heads*hd, at.KVHeads*hd, pos0+n
	q := conformance.RandomVector(rng, tot*qDim, 1)
	k := conformance.RandomVector(rng, tot*kvDim, 1)
	v := conformance.RandomVector(rng, tot*kvDim, 1)
	perm := rng.Perm(blocks)
	tab := make([]int32, ceilDiv(tot, bs))
	for i := range tab {
		tab[i] = int32(perm[i])
	}
	var job emuJob
	kc, vc := job.zeros(blocks*bs*kvDim*2, false), job.zeros(blocks*bs*kvDim*2, false)
	toffb, tabsb := job.i32([]int32{0}), job.i32(tab)
	pos := make([]int32, tot)
	for i := range pos {
		pos[i] = int32(i)
	}
	posb, seqb := job.i32(pos), job.i32(make([]int32, tot))
	// the prefix (an earlier step), then the piece
	for _, r := range [][2]int{{0, pos0}, {pos0, n}} {
		job.launch("kv_store_paged_f16", grid1(r[1]*kvDim), rocm.D1(256), eP(kc, 0), eP(vc, 0),
			eP(job.f32(k[r[0]*kvDim:(r[0]+r[1])*kvDim]), 0), eP(job.f32(v[r[0]*kvDim:(r[0]+r[1])*kvDim]), 0),
			eI(r[1]), eI(kvDim), eI(bs), eP(posb, 4*r[0]), eP(seqb, 0), eP(toffb, 0), eP(tabsb, 0))
	}
	out := job.zeros(4*n*qDim, true)
	l := planPrefill(fmt.Sprintf("attn_prefill_f16_d%d", hd), at.Heads, n, 0)
	job.launch(l.Kernel, l.Grid, l.Block, eP(out, 0), eP(job.f32(q[pos0*qDim:]), 0), eP(kc, 0), eP(vc, 0),
		eI(n), eI(at.Heads), eI(at.KVHeads), eF(at.Scale), eI(bs), eI(pos0), eI(0), eP(toffb, 0), eP(tabsb, 0),
		eI(at.Window), emuSinks(&job, at))
	res := runEmu(t, warp, &job)
	want := cpuAttention(t, q, f16Round(k), f16Round(v), pos0, n, tot, at)
	emuCheck(t, fmt.Sprintf("warp %d: %s pos0 %d n %d D %d window %d sinks %v", warp, l.Kernel, pos0, n, hd, at.Window, at.Sinks != nil),
		res.f32(out), want, 2e-5)
}
