package gpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/conformance"
	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/rocm"
)

// q8Check checks the 8-bit copy (codes q, scales d) a fused op made of v:
// q·d reproduces v within the rounding of 8-bit blocks, and every scale is
// max|v|/127 of its block of 32.
func q8Check(t *testing.T, what string, v []float32, q []byte, d []float32) {
	t.Helper()
	deq := make([]float32, len(v))
	for i := range v {
		deq[i] = float32(int8(q[i])) * d[i/32]
	}
	emuCheck(t, what+": 8-bit copy", deq, v, 1e-2)
	for b := 0; b < len(v)/32; b++ {
		var a float32
		for _, x := range v[32*b : 32*b+32] {
			a = max(a, float32(math.Abs(float64(x))))
		}
		if e := math.Abs(float64(d[b] - a/127)); e > 1e-6*float64(a) {
			t.Errorf("%s: block %d scale %g, want %g", what, b, d[b], a/127)
			return
		}
	}
}

// TestEmuOps: quantize_q8, the norms (rmsnorm_row for one row, fused with
// the 8-bit copy, and for a batched step; rmsnorm and add_rmsnorm for a
// prompt), silu_mul(_q8), add, add_bias, rope and rope_at, argmax (the
// sliced long row and per-row), top-k and set_step, at both widths, launched as ops.go
// launches them, against the CPU backend (top-k against a sort).
func TestEmuOps(t *testing.T) {
	rng := emuRNG(t)
	for _, ed := range emuDevices {
		t.Run(ed.name, func(t *testing.T) { emuOps(t, rng, ed.dev.Warp) })
	}
}

func emuOps(t *testing.T, rng *rand.Rand, warp int) {
	const cols, eps = 4096, float32(1e-5)
	var job emuJob
	tag := func(s string) string { return fmt.Sprintf("warp %d: %s", warp, s) }

	// quantize_q8 on a vector with a tail block of zeros
	qx := conformance.RandomVector(rng, 1000, 3)
	for i := 960; i < 1000; i++ {
		qx[i] = 0
	}
	qxb := job.f32(qx)
	qq, qd := job.zeros(1000, true), job.zeros(4*ceilDiv(1000, 32), true)
	job.launch("quantize_q8", rocm.D1(ceilDiv(1000, 256)), rocm.D1(256), eP(qxb, 0), eP(qq, 0), eP(qd, 0), eI(1000))

	// rmsnorm_row, one row, with the residual and the 8-bit copy
	wv := conformance.RandomVector(rng, cols, 1)
	nw := job.f32(wv)
	x1 := conformance.RandomVector(rng, cols, 2)
	r1 := conformance.RandomVector(rng, cols, 2)
	x1b, r1b := job.f32(x1), job.f32(r1)
	d1 := job.zeros(4*cols, true)
	q1, s1 := job.zeros(cols, true), job.zeros(4*cols/32, true)
	l, fuse := planNorm(1, cols, true, true)
	if l.Kernel != "rmsnorm_row" || !fuse {
		t.Fatalf("one row of %d: %s (8-bit copy %v), want rmsnorm_row with the copy", cols, l.Kernel, fuse)
	}
	job.launch(l.Kernel, l.Grid, l.Block, eP(d1, 0), eP(x1b, 0), eP(r1b, 0), eP(nw, 0), eI(cols), eF(eps), eP(q1, 0), eP(s1, 0))
	// rmsnorm_row, 5 rows (a batched step), no residual, no copy
	x5 := conformance.RandomVector(rng, 5*cols, 2)
	x5b, d5 := job.f32(x5), job.zeros(4*5*cols, true)
	l, _ = planNorm(5, cols, false, true)
	job.launch(l.Kernel, l.Grid, l.Block, eP(d5, 0), eP(x5b, 0), eNull(), eP(nw, 0), eI(cols), eF(eps), eNull(), eNull())
	// rmsnorm and add_rmsnorm over a prompt of 70 rows of 1000 (past MaxBatchRows)
	const pn, pc = kernels.MaxBatchRows + 6, 1000
	xp := conformance.RandomVector(rng, pn*pc, 2)
	rp := conformance.RandomVector(rng, pn*pc, 2)
	xpb, xpb2, rpb := job.f32(xp), job.f32(xp), job.f32(rp)
	dp, dp2 := job.zeros(4*pn*pc, true), job.zeros(4*pn*pc, true)
	l, _ = planNorm(pn, pc, false, true)
	job.launch(l.Kernel, l.Grid, l.Block, eP(dp, 0), eP(xpb, 0), eP(nw, 0), eI(pc), eF(eps))
	l, _ = planNorm(pn, pc, true, true)
	job.launch(l.Kernel, l.Grid, l.Block, eP(dp2, 0), eP(xpb2, 0), eP(rpb, 0), eP(nw, 0), eI(pc), eF(eps))

	// elementwise
	const en = 14336
	ga, gb := conformance.RandomVector(rng, en, 2), conformance.RandomVector(rng, en, 2)
	gab, gbb := job.f32(ga), job.f32(gb)
	sm, smq := job.zeros(4*en, true), job.zeros(4*en, true)
	sq, sd := job.zeros(en, true), job.zeros(4*en/32, true)
	ad := job.zeros(4*en, true)
	job.launch("silu_mul", grid1(en), rocm.D1(256), eP(sm, 0), eP(gab, 0), eP(gbb, 0), eI(en))
	job.launch("silu_mul_q8", grid1(en), rocm.D1(256), eP(smq, 0), eP(gab, 0), eP(gbb, 0), eI(en), eP(sq, 0), eP(sd, 0))
	job.launch("add", grid1(en), rocm.D1(256), eP(ad, 0), eP(gab, 0), eP(gbb, 0), eI(en))
	const bn, bc = 7, 1000
	bx := conformance.RandomVector(rng, bn*bc, 1)
	bias := conformance.RandomVector(rng, bc, 1)
	bxb, biasb := job.f32(bx), job.f32(bias)
	job.launch("add_bias", grid1(bn*bc), rocm.D1(256), eP(bxb, 0), eP(biasb, 0), eI(bn), eI(bc))

	// rope: 3 tokens at 7, NeoX with frequency divisors and a partial
	// rotation; rope_at: 4 rows at their own positions
	const heads, hd = 4, 128
	rx := conformance.RandomVector(rng, 3*heads*hd, 1)
	rxb, rxb2 := job.f32(rx), job.f32(rx)
	freqs := make([]float32, 32)
	for i := range freqs {
		freqs[i] = 1 + float32(i)/8
	}
	fb := job.f32(freqs)
	ropeN := kernels.Rope{Dim: 64, Base: 500000, Scale: 1, NeoX: true, Freqs: conformance.F32Weight("f", freqs)}
	ropeP := kernels.Rope{Dim: hd, Base: 10000, Scale: 0.5}
	job.launch("rope", grid1(3*heads*32), rocm.D1(256), eP(rxb, 0), eI(3), eI(heads), eI(hd), eI(7), eI(64), eF(500000), eF(1), eP(fb, 0), eI(1), eNull())
	job.launch("rope", grid1(3*heads*64), rocm.D1(256), eP(rxb2, 0), eI(3), eI(heads), eI(hd), eI(7), eI(128), eF(10000), eF(0.5), eNull(), eI(0), eNull())
	ra := conformance.RandomVector(rng, 4*heads*hd, 1)
	rab := job.f32(ra)
	pos := []int32{0, 5, 1000, 99999}
	posb := job.i32(pos)
	job.launch("rope_at", grid1(4*heads*64), rocm.D1(256), eP(rab, 0), eI(4), eI(heads), eI(hd), eP(posb, 0), eI(128), eF(10000), eF(0.5), eNull(), eI(0))

	// argmax: one long row in slices, and three rows
	const vocab = 3*argmaxChunk + 17
	av := conformance.RandomVector(rng, vocab, 1)
	av[vocab-3] = 9 // the winner in the tail slice
	avb := job.f32(av)
	parts, al := planArgmax(1, vocab)
	pp := job.zeros(8*parts, true)
	am := job.zeros(4, true)
	job.launch(al[0].Kernel, al[0].Grid, al[0].Block, eP(avb, 0), eI(vocab), eI(argmaxChunk), eP(pp, 0), eP(pp, 4*parts))
	job.launch(al[1].Kernel, al[1].Grid, al[1].Block, eP(pp, 0), eP(pp, 4*parts), eI(parts), eP(am, 0))
	ar := conformance.RandomVector(rng, 3*1500, 1)
	ar[1500+700], ar[1500+701] = 7, 7 // a tie: the lower index wins
	arb := job.f32(ar)
	amr := job.zeros(12, true)
	_, al = planArgmax(3, 1500)
	job.launch(al[0].Kernel, al[0].Grid, al[0].Block, eP(arb, 0), eP(amr, 0), eI(1500))

	// top-k of 10000 values, k = 40, as TopK chains the steps
	const tkn, tk = 10000, 40
	tv := conformance.RandomVector(rng, tkn, 1)
	tv[17], tv[9000] = 5, 5
	tvb := job.f32(tv)
	var bufs [2][2]int
	for i := range bufs {
		bufs[i][0], bufs[i][1] = job.zeros(4*ceilDiv(tkn, topkChunk)*tk, true), job.zeros(4*ceilDiv(tkn, topkChunk)*tk, true)
	}
	src, srcIdx, count, cur := eP(tvb, 0), eNull(), tkn, 0
	last := bufs[0]
	for {
		blocks := ceilDiv(count, topkChunk)
		job.launch("topk_step", rocm.D1(blocks), rocm.D1(256), src, srcIdx, eI(count), eI(tk), eP(bufs[cur][0], 0), eP(bufs[cur][1], 0))
		last = bufs[cur]
		src, srcIdx, count = eP(bufs[cur][0], 0), eP(bufs[cur][1], 0), blocks*tk
		cur ^= 1
		if blocks == 1 {
			break
		}
	}

	// set_step: the token and position a replayed decode step reads
	st := job.zeros(8, true)
	job.launch("set_step", rocm.D1(1), rocm.D1(32), eP(st, 0), eI(1234), eI(567))

	res := runEmu(t, warp, &job)
	if g := res.i32(st); g[0] != 1234 || g[1] != 567 {
		t.Errorf("%s: %v, want [1234 567]", tag("set_step"), g)
	}

	// quantize_q8
	q8Check(t, tag("quantize_q8"), qx, res.bufs[qq], res.f32(qd))

	cpuRef(t, func(b *cpu.Backend) {
		w := conformance.F32Weight("norm", wv)
		// rmsnorm_row with residual
		xt, rt := cpuTensor(t, b, x1), cpuTensor(t, b, r1)
		dt, _ := b.Alloc(cols)
		if err := addRMSNormCPU(b, dt, xt, rt, w, 1, eps); err != nil {
			t.Fatal(err)
		}
		want := cpuRead(t, b, dt)
		emuCheck(t, tag("rmsnorm_row (residual)"), res.f32(d1), want, 1e-5)
		emuCheck(t, tag("rmsnorm_row: x += r"), res.f32(x1b), cpuRead(t, b, xt), 1e-7)
		q8Check(t, tag("rmsnorm_row"), res.f32(d1), res.bufs[q1], res.f32(s1))
		// batched rows
		x5t := cpuTensor(t, b, x5)
		d5t, _ := b.Alloc(5 * cols)
		if err := b.RMSNorm(d5t, x5t, w, 5, eps); err != nil {
			t.Fatal(err)
		}
		emuCheck(t, tag("rmsnorm_row ×5"), res.f32(d5), cpuRead(t, b, d5t), 1e-5)
		// prompt rows
		wp := conformance.F32Weight("norm", wv[:pc])
		xpt, rpt := cpuTensor(t, b, xp), cpuTensor(t, b, rp)
		dpt, _ := b.Alloc(pn * pc)
		if err := b.RMSNorm(dpt, xpt, wp, pn, eps); err != nil {
			t.Fatal(err)
		}
		emuCheck(t, tag("rmsnorm"), res.f32(dp), cpuRead(t, b, dpt), 1e-5)
		if err := addRMSNormCPU(b, dpt, xpt, rpt, wp, pn, eps); err != nil {
			t.Fatal(err)
		}
		emuCheck(t, tag("add_rmsnorm"), res.f32(dp2), cpuRead(t, b, dpt), 1e-5)
		emuCheck(t, tag("add_rmsnorm: x += r"), res.f32(xpb2), cpuRead(t, b, xpt), 1e-7)
		// elementwise
		gat, gbt := cpuTensor(t, b, ga), cpuTensor(t, b, gb)
		et, _ := b.Alloc(en)
		if err := b.SiLUMul(et, gat, gbt, en); err != nil {
			t.Fatal(err)
		}
		want = cpuRead(t, b, et)
		emuCheck(t, tag("silu_mul"), res.f32(sm), want, 1e-5)
		emuCheck(t, tag("silu_mul_q8"), res.f32(smq), want, 1e-5)
		q8Check(t, tag("silu_mul_q8"), res.f32(smq), res.bufs[sq], res.f32(sd))
		if err := b.Add(et, gat, gbt, en); err != nil {
			t.Fatal(err)
		}
		emuCheck(t, tag("add"), res.f32(ad), cpuRead(t, b, et), 1e-6)
		bxt := cpuTensor(t, b, bx)
		if err := b.AddBias(bxt, conformance.F32Weight("bias", bias), bn); err != nil {
			t.Fatal(err)
		}
		emuCheck(t, tag("add_bias"), res.f32(bxb), cpuRead(t, b, bxt), 1e-6)
		// rope
		rt1, rt2 := cpuTensor(t, b, rx), cpuTensor(t, b, rx)
		if err := b.RoPE(rt1, 3, heads, hd, 7, ropeN); err != nil {
			t.Fatal(err)
		}
		if err := b.RoPE(rt2, 3, heads, hd, 7, ropeP); err != nil {
			t.Fatal(err)
		}
		emuCheck(t, tag("rope (neox, freqs, dim 64)"), res.f32(rxb), cpuRead(t, b, rt1), 1e-5)
		emuCheck(t, tag("rope"), res.f32(rxb2), cpuRead(t, b, rt2), 1e-5)
		for i, p := range pos {
			rt := cpuTensor(t, b, ra[i*heads*hd:(i+1)*heads*hd])
			if err := b.RoPE(rt, 1, heads, hd, int(p), ropeP); err != nil {
				t.Fatal(err)
			}
			// the CPU backend builds angles as ggml does, in float32
			// products: the conformance suite's position-dependent bound
			bound := 1e-6 + float64(p+1)*3e-7
			emuCheck(t, tag(fmt.Sprintf("rope_at row %d (pos %d)", i, p)), res.f32(rab)[i*heads*hd:], cpuRead(t, b, rt), bound)
		}
	})
	// argmax (the CPU backend has none: the first largest value)
	argmax := func(v []float32) int32 {
		m := 0
		for i, x := range v {
			if x > v[m] {
				m = i
			}
		}
		return int32(m)
	}
	if g, w := res.i32(am)[0], argmax(av); g != w {
		t.Errorf("%s: %d, want %d", tag("argmax_slices+parts"), g, w)
	}
	for r := range 3 {
		if g, w := res.i32(amr)[r], argmax(ar[r*1500:(r+1)*1500]); g != w {
			t.Errorf("%s: row %d: %d, want %d", tag("argmax_rows"), r, g, w)
		}
	}
	// top-k against a stable sort (ties: lower index first)
	idx := make([]int32, tkn)
	for i := range idx {
		idx[i] = int32(i)
	}
	slices.SortStableFunc(idx, func(a, b int32) int {
		switch {
		case tv[a] > tv[b]:
			return -1
		case tv[a] < tv[b]:
			return 1
		}
		return 0
	})
	gotV, gotI := res.f32(last[0])[:tk], res.i32(last[1])[:tk]
	for i := range tk {
		if gotI[i] != idx[i] || gotV[i] != tv[idx[i]] {
			t.Errorf("%s: place %d: index %d value %g, want %d %g", tag("topk_step"), i, gotI[i], gotV[i], idx[i], tv[idx[i]])
			break
		}
	}
}

// addRMSNormCPU is AddRMSNorm on the CPU backend: x += r, then RMSNorm.
func addRMSNormCPU(b *cpu.Backend, dst, x, r kernels.Tensor, w *kernels.Weight, n int, eps float32) error {
	if err := b.Add(x, x, r, n*w.Cols); err != nil {
		return err
	}
	return b.RMSNorm(dst, x, w, n, eps)
}

// TestEmuNormPair: rmsnorm_row2 over the query and key heads of a decode
// step (32 and 4 rows of 128, a tiny model's 4 and 2 of 96) gives every
// row the bits rmsnorm_row gives it, launched as RMSNormPair and RMSNorm
// launch them, at both widths.
func TestEmuNormPair(t *testing.T) {
	rng := emuRNG(t)
	const eps = float32(1e-6)
	for _, ed := range emuDevices {
		t.Run(ed.name, func(t *testing.T) {
			for _, c := range []struct{ na, nb, cols int }{{32, 4, 128}, {4, 2, 96}, {64, 8, 128}} {
				var job emuJob
				wa := job.f32(conformance.RandomVector(rng, c.cols, 1))
				wb := job.f32(conformance.RandomVector(rng, c.cols, 1))
				xa := conformance.RandomVector(rng, c.na*c.cols, 2)
				xb := conformance.RandomVector(rng, c.nb*c.cols, 2)
				pa, pb := job.f32(xa), job.f32(xb)
				la, _ := planNorm(c.na, c.cols, false, false)
				job.launch("rmsnorm_row2", rocm.D1(c.na+c.nb), la.Block, eP(pa, 0), eP(pa, 0), eP(wa, 0), eI(c.na), eP(pb, 0), eP(pb, 0), eP(wb, 0), eI(c.cols), eF(eps))
				sa, sb := job.f32(xa), job.f32(xb)
				lb, _ := planNorm(c.nb, c.cols, false, false)
				job.launch(la.Kernel, la.Grid, la.Block, eP(sa, 0), eP(sa, 0), eNull(), eP(wa, 0), eI(c.cols), eF(eps), eNull(), eNull())
				job.launch(lb.Kernel, lb.Grid, lb.Block, eP(sb, 0), eP(sb, 0), eNull(), eP(wb, 0), eI(c.cols), eF(eps), eNull(), eNull())
				res := runEmu(t, ed.dev.Warp, &job)
				if !slices.Equal(res.bufs[pa], res.bufs[sa]) || !slices.Equal(res.bufs[pb], res.bufs[sb]) {
					t.Errorf("%d and %d rows of %d: rmsnorm_row2 differs from rmsnorm_row", c.na, c.nb, c.cols)
				}
				if slices.Equal(res.f32(pa), xa) {
					t.Errorf("%d rows of %d: not normalised", c.na, c.cols)
				}
			}
		})
	}
}

// TestEmuQKVPrep: qkv_prep (a decode step's head norms, RoPE and cache
// store in one launch) gives the bits of rmsnorm_row2, rope over the
// adjacent queries and keys, and kv_store, at both widths: with and
// without the norms, NeoX and plain rotation, a partial rotation with
// frequency divisors, f16 and f32 caches, positions from the host and
// from the device.
func TestEmuQKVPrep(t *testing.T) {
	rng := emuRNG(t)
	const eps = float32(1e-6)
	type tc struct {
		nq, nk, D, dim, pos int
		norm, neox, freqs   bool
		posp                bool
		sfx                 string
	}
	cases := []tc{
		{32, 4, 128, 128, 7, true, true, false, false, "f16"}, // Qwen3-MoE's heads
		{8, 2, 96, 96, 0, true, true, false, true, "f32"},
		{8, 8, 64, 64, 300, false, false, false, false, "f16"}, // Llama: no norms, pairs (2i, 2i+1)
		{4, 2, 64, 32, 41, false, true, true, true, "f16"},     // partial rotation, divisors
	}
	for _, ed := range emuDevices {
		t.Run(ed.name, func(t *testing.T) {
			for _, c := range cases {
				const ctx = 512
				var job emuJob
				kvDim := c.nk * c.D
				q := conformance.RandomVector(rng, c.nq*c.D, 2)
				kv := conformance.RandomVector(rng, 2*kvDim, 2) // k then v, adjacent like a model's q, k, v
				qk := append(append([]float32(nil), q...), kv[:kvDim]...)
				v := kv[kvDim:]
				norms := []emuArg{eNull(), eNull()}
				var wq, wk int
				if c.norm {
					wq, wk = job.f32(conformance.RandomVector(rng, c.D, 1)), job.f32(conformance.RandomVector(rng, c.D, 1))
					norms = []emuArg{eP(wq, 0), eP(wk, 0)}
				}
				freqs := eNull()
				if c.freqs {
					f := make([]float32, c.dim/2)
					for i := range f {
						f[i] = 1 + 3*rng.Float32()
					}
					freqs = eP(job.f32(f), 0)
				}
				es := 2
				if c.sfx == "f32" {
					es = 4
				}
				pos, posp := eI(c.pos), eNull()
				if c.posp {
					pos, posp = eI(0), eP(job.i32([]int32{int32(c.pos)}), 0)
				}
				neox := 0
				if c.neox {
					neox = 1
				}
				// the fused launch
				fqk, fv := job.f32(qk), job.f32(v)
				fkc, fvc := job.zeros(ctx*kvDim*es, false), job.zeros(ctx*kvDim*es, false)
				l, _ := planNorm(1, c.D, false, false)
				job.launch("qkv_prep_"+c.sfx, rocm.D1(c.nq+c.nk), l.Block, eP(fqk, 0), eP(fqk, 4*c.nq*c.D), eP(fv, 0),
					norms[0], norms[1], eI(c.nq), eI(c.nk), eI(c.D), eF(eps), eP(fkc, 0), eP(fvc, 0), pos, posp,
					eI(c.dim), eF(1e6), eF(1), freqs, eI(neox))
				// the three launches it replaces
				sqk, sv := job.f32(qk), job.f32(v)
				skc, svc := job.zeros(ctx*kvDim*es, false), job.zeros(ctx*kvDim*es, false)
				if c.norm {
					job.launch("rmsnorm_row2", rocm.D1(c.nq+c.nk), l.Block, eP(sqk, 0), eP(sqk, 0), norms[0], eI(c.nq),
						eP(sqk, 4*c.nq*c.D), eP(sqk, 4*c.nq*c.D), norms[1], eI(c.D), eF(eps))
				}
				job.launch("rope", grid1((c.nq+c.nk)*c.dim/2), rocm.D1(256), eP(sqk, 0), eI(1), eI(c.nq+c.nk), eI(c.D), pos,
					eI(c.dim), eF(1e6), eF(1), freqs, eI(neox), posp)
				job.launch("kv_store_"+c.sfx, grid1(kvDim), rocm.D1(256), eP(skc, 0), eP(svc, 0), eP(sqk, 4*c.nq*c.D), eP(sv, 0),
					eI(1), eI(kvDim), pos, posp)
				res := runEmu(t, ed.dev.Warp, &job)
				for _, p := range [][2]int{{fqk, sqk}, {fkc, skc}, {fvc, svc}} {
					if !slices.Equal(res.bufs[p[0]], res.bufs[p[1]]) {
						t.Errorf("%+v: qkv_prep differs from the three launches (buffer %d)", c, p[0])
					}
				}
				if slices.Equal(res.f32(fqk), qk) {
					t.Errorf("%+v: queries and keys untouched", c)
				}
				row := res.bufs[fkc][c.pos*kvDim*es : (c.pos+1)*kvDim*es]
				if slices.Equal(row, make([]byte, len(row))) {
					t.Errorf("%+v: nothing stored at position %d", c, c.pos)
				}
			}
		})
	}
}
