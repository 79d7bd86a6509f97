package gpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/conformance"
	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/rocm"
)

// TestEmuMoeRows: moe.cu's gather_rows and mix_rows (rows from the host,
// and mix_rows over one token's slots with no row list, as MixSlots runs
// it), at both widths, against the CPU backend's GatherRows and MixRows,
// bit for bit: rows repeat and come in any order, k from 1 to 8.
func TestEmuMoeRows(t *testing.T) {
	rng := emuRNG(t)
	for _, ed := range emuDevices {
		warp := ed.dev.Warp
		for k := 1; k <= 8; k++ {
			const cols, srcRows = 300, 23 // cols past one block of 256
			n := 1 + rng.IntN(6)
			src := conformance.RandomVector(rng, srcRows*cols, 1)
			gather := make([]int32, 2*n+1)
			for i := range gather {
				gather[i] = int32(rng.IntN(srcRows))
			}
			rows := make([]int32, n*k)
			w := make([]float32, n*k)
			for i := range rows {
				rows[i] = int32(rng.IntN(srcRows))
				w[i] = float32(rng.Float64())
			}
			var job emuJob
			sb := job.f32(src)
			gd := job.zeros(4*len(gather)*cols, true)
			md := job.zeros(4*n*cols, true)
			sd := job.zeros(4*cols, true)
			job.launch("gather_rows", planMoeRows(len(gather), cols), rocm.D1(256), eP(gd, 0), eP(sb, 0), eP(job.i32(gather), 0),
				eI(len(gather)), eI(cols))
			job.launch("mix_rows", planMoeRows(n, cols), rocm.D1(256), eP(md, 0), eP(sb, 0), eP(job.i32(rows), 0),
				eP(job.f32(w), 0), eI(n), eI(k), eI(cols))
			job.launch("mix_rows", planMoeRows(1, cols), rocm.D1(256), eP(sd, 0), eP(sb, 0), eNull(), eP(job.f32(w[:k]), 0),
				eI(1), eI(k), eI(cols))
			res := runEmu(t, warp, &job)
			cpuRef(t, func(b *cpu.Backend) {
				st := cpuTensor(t, b, src)
				g, _ := b.Alloc(len(gather) * cols)
				if err := b.GatherRows(g, st, gather, cols); err != nil {
					t.Fatal(err)
				}
				emuSame(t, fmt.Sprintf("warp %d k %d: gather_rows", warp, k), res.f32(gd), cpuRead(t, b, g))
				m, _ := b.Alloc(n * cols)
				if err := b.MixRows(m, st, rows, w, n, k, cols); err != nil {
					t.Fatal(err)
				}
				emuSame(t, fmt.Sprintf("warp %d k %d: mix_rows", warp, k), res.f32(md), cpuRead(t, b, m))
				seq := make([]int32, k)
				for j := range seq {
					seq[j] = int32(j)
				}
				if err := b.MixRows(m, st, seq, w[:k], 1, k, cols); err != nil {
					t.Fatal(err)
				}
				emuSame(t, fmt.Sprintf("warp %d k %d: mix_rows of slots", warp, k), res.f32(sd), cpuRead(t, b, m.View(0, cols)))
			})
		}
	}
}

// emuSame fails unless got and want hold the same bits.
func emuSame(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) < len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s: value %d is %v, want %v", what, i, got[i], want[i])
		}
	}
}

// routeRef is the host routers of pipeline/model (moe.go's route and
// gptoss.go's routeTopK), written again here: the kernel must pick the
// same experts and weights.
func routeRef(logits []float32, n, experts, k int, mode kernels.Routing) ([]int32, []float32) {
	sel, w := make([]int32, n*k), make([]float32, n*k)
	for t := range n {
		row := logits[t*experts : (t+1)*experts]
		s, ws := sel[t*k:(t+1)*k], w[t*k:(t+1)*k]
		if mode == kernels.RouteSoftmax {
			probs := make([]float32, experts)
			mx := row[0]
			for _, v := range row[1:] {
				mx = max(mx, v)
			}
			var lanes [32]float64 // route_lanes' order: 32 lanes, then a butterfly
			for e, v := range row {
				probs[e] = float32(math.Exp(float64(v - mx)))
				lanes[e%32] += float64(probs[e])
			}
			for o := 16; o > 0; o >>= 1 {
				var n [32]float64
				for l := range lanes {
					n[l] = lanes[l] + lanes[l^o]
				}
				lanes = n
			}
			inv := float32(1 / lanes[0])
			for e := range probs {
				probs[e] *= inv
				if !(probs[e] >= 0) {
					probs[e] = 0
				}
			}
			var total float32
			for j := range k {
				best := -1
				for e, p := range probs {
					if p >= 0 && (best < 0 || p > probs[best]) {
						best = e
					}
				}
				s[j], ws[j] = int32(best), probs[best]
				total += probs[best]
				probs[best] = -1
			}
			total = max(total, 6.103515625e-5)
			for j := range ws {
				ws[j] /= total
			}
			continue
		}
		for j := range k {
			best := -1
			for e, v := range row {
				dup := false
				for _, x := range s[:j] {
					dup = dup || int(x) == e
				}
				if dup {
					continue
				}
				if best < 0 || v > row[best] || (row[best] != row[best] && v == v) {
					best = e
				}
			}
			s[j] = int32(best)
		}
		mx := row[s[0]]
		var sum float32
		for j := range k {
			ws[j] = float32(math.Exp(float64(row[s[j]] - mx)))
			sum += ws[j]
		}
		for j := range ws {
			ws[j] /= sum
		}
	}
	return sel, w
}

// TestEmuMoeRoute: moe_route for both rules, 1 to 8 experts of 8 to 512
// per token, against the host routers, ids exactly and weights to the
// bit. Logits drawn from few values make ties (the lower expert wins);
// one token's logits hold a NaN and an infinity.
func TestEmuMoeRoute(t *testing.T) {
	rng := emuRNG(t)
	for _, ed := range emuDevices {
		warp := ed.dev.Warp
		for _, mode := range []kernels.Routing{kernels.RouteSoftmax, kernels.RouteTopKSoftmax} {
			var job emuJob
			type out struct {
				what    string
				ids, w  int
				logits  []float32
				n, e, k int
			}
			var outs []out
			for _, e := range []int{8, 60, 128, 256, 512} {
				for k := 1; k <= 8; k++ {
					n := 1 + rng.IntN(3)
					logits := conformance.RandomVector(rng, n*e, 3)
					if k%3 == 0 { // ties
						for i := range logits {
							logits[i] = float32(rng.IntN(4))
						}
					}
					if k == 5 && e == 60 {
						logits[7] = float32(math.NaN())
						logits[11] = float32(math.Inf(1))
					}
					ids, w := job.zeros(4*n*k, true), job.zeros(4*n*k, true)
					job.launch("moe_route", rocm.D1(n), rocm.D1(warp), eP(job.f32(logits), 0), eP(ids, 0), eP(w, 0),
						eI(e), eI(k), eI(int(mode)))
					outs = append(outs, out{fmt.Sprintf("warp %d rule %d: %d tokens, top-%d of %d", warp, mode, n, k, e), ids, w, logits, n, e, k})
				}
			}
			res := runEmu(t, warp, &job)
			for _, o := range outs {
				sel, w := routeRef(o.logits, o.n, o.e, o.k, mode)
				got := res.i32(o.ids)
				for i := range sel {
					if got[i] != sel[i] {
						t.Fatalf("%s: ids %v, want %v", o.what, got[:len(sel)], sel)
					}
				}
				emuSame(t, o.what+": weights", res.f32(o.w), w)
			}
		}
	}
}

// TestEmuMoeMatvec: the experts' products (moe_mv_*: Q4_K, Q6_K, the
// 32-element block types on 8-bit x (mv_b32_q8's family where b32Fits,
// mxfp4.cu's staged one elsewhere), the generic float kernels for the
// rest) over a table of E experts (up to 128, built by moe_table over one
// stack) and k = 1…8 chosen ids (repeats included), gate and up as two
// tables on one shared input and down on one input row per slot, each
// output row bit for bit the one-row MatMul kernel's (planMatvec's
// choice) for that expert.
func TestEmuMoeMatvec(t *testing.T) {
	rng := emuRNG(t)
	for _, ed := range emuDevices {
		d := ed.dev
		for _, c := range []struct {
			typ              gguf.Type
			experts, rows, k int
			cols             int
		}{
			{gguf.TypeQ4_K, 128, 40, 8, 512},
			{gguf.TypeQ4_K, 9, 67, 3, 256},
			{gguf.TypeQ6_K, 16, 33, 5, 2048},
			{gguf.TypeQ6_K, 4, 24, 1, 768},
			{gguf.TypeQ6_K, 6, 20, 7, 256},
			{gguf.TypeQ8_0, 12, 24, 4, 2048}, // 8-bit blocks at both widths
			{gguf.TypeQ4_0, 10, 16, 6, 1024}, // 8-bit blocks at warp 32, staged (mxfp4.cu) at 64
			{gguf.TypeQ8_0, 8, 24, 2, 768},   // staged: 24 blocks are no whole run
			{gguf.TypeQ5_K, 5, 16, 2, 512},
			{gguf.TypeF32, 6, 16, 3, 96},
		} {
			emuMoeMatvecCase(t, rng, d, c.typ, c.experts, c.rows, c.cols, c.k)
		}
	}
}

func emuMoeMatvecCase(t *testing.T, rng *rand.Rand, d LaunchDevice, typ gguf.Type, experts, rows, cols, k int) {
	what := fmt.Sprintf("warp %d %s: %d experts of %d×%d, k %d", d.Warp, typ, experts, rows, cols, k)
	var job emuJob
	// two stacks (gate, up), their experts also one buffer each for the
	// reference launches
	var stacks [2][]*kernels.Weight
	var tables [2]int
	for s := range stacks {
		var all []byte
		for range experts {
			w := conformance.RandomWeight(rng, "w", typ, rows, cols)
			stacks[s] = append(stacks[s], w)
			all = append(all, w.Host...)
		}
		tables[s] = job.zeros(8*experts, true)
		job.launch("moe_table", grid1(experts), rocm.D1(256), eP(tables[s], 0), eP(job.bytes(all), 0),
			eI(len(all)/experts), eI(experts))
	}
	ids := make([]int32, k)
	for j := range ids {
		ids[j] = int32(rng.IntN(experts))
	}
	if k > 2 {
		ids[2] = ids[0] // a repeat
	}
	idb := job.i32(ids)
	// shared: x [cols]; per slot: xs [k][cols]
	x := conformance.RandomVector(rng, cols, 1)
	xs := conformance.RandomVector(rng, k*cols, 1)
	xb, xsb := job.f32(x), job.f32(xs)
	xq, xd := job.zeros(cols, true), job.zeros(4*cols/32, true)
	xsq, xsd := job.zeros(k*cols, true), job.zeros(4*k*cols/32, true)
	job.launch("quantize_q8", rocm.D1(ceilDiv(cols, 256)), rocm.D1(256), eP(xb, 0), eP(xq, 0), eP(xd, 0), eI(cols))
	job.launch("quantize_q8", rocm.D1(ceilDiv(k*cols, 256)), rocm.D1(256), eP(xsb, 0), eP(xsq, 0), eP(xsd, 0), eI(k*cols))
	pl, err := planMoe(d.Warp, typ, cols, true)
	if err != nil {
		t.Fatal(err)
	}
	xargs := func(shared bool) []emuArg {
		switch {
		case pl.Q8 && shared:
			return []emuArg{eP(xq, 0), eP(xd, 0)}
		case pl.Q8:
			return []emuArg{eP(xsq, 0), eP(xsd, 0)}
		case shared:
			return []emuArg{eP(xb, 0)}
		}
		return []emuArg{eP(xsb, 0)}
	}
	g2 := rocm.Dim3{X: uint32(ceilDiv(rows, mvBlock/d.Warp*pl.R)), Y: uint32(2 * k), Z: 1}
	y0, y1 := job.zeros(4*k*rows, true), job.zeros(4*k*rows, true)
	args := append([]emuArg{eP(tables[0], 0), eP(tables[1], 0), eP(y0, 0), eP(y1, 0), eP(idb, 0)}, xargs(true)...)
	job.launch(pl.Kernel, g2, rocm.D1(mvBlock), append(args, eI(rows), eI(cols), eI(k), eI(0))...)
	g1 := rocm.Dim3{X: g2.X, Y: uint32(k), Z: 1}
	yd := job.zeros(4*k*rows, true)
	args = append([]emuArg{eP(tables[0], 0), eNull(), eP(yd, 0), eNull(), eP(idb, 0)}, xargs(false)...)
	job.launch(pl.Kernel, g1, rocm.D1(mvBlock), append(args, eI(rows), eI(cols), eI(k), eI(cols))...)
	// the references: the one-row kernel per slot
	type ref struct{ y, at, slot int }
	var refs []ref
	for j, e := range ids {
		for s := range 2 {
			w := stacks[s][e]
			y, _, err := addMatvec(&job, d, w, job.bytes(w.Host), xb, xq, xd, 1, mvOverrides{})
			if err != nil {
				t.Fatal(err)
			}
			refs = append(refs, ref{y, []int{y0, y1}[s], j})
		}
		w := stacks[0][e]
		// the slot's input row, quantized alone
		xj := job.f32(xs[j*cols : (j+1)*cols])
		qj, dj := job.zeros(cols, true), job.zeros(4*cols/32, true)
		job.launch("quantize_q8", rocm.D1(ceilDiv(cols, 256)), rocm.D1(256), eP(xj, 0), eP(qj, 0), eP(dj, 0), eI(cols))
		y, _, err := addMatvec(&job, d, w, job.bytes(w.Host), xj, qj, dj, 1, mvOverrides{})
		if err != nil {
			t.Fatal(err)
		}
		refs = append(refs, ref{y, yd, j})
	}
	res := runEmu(t, d.Warp, &job)
	what += " (" + pl.Kernel + ")"
	for _, rf := range refs {
		got := res.f32(rf.at)[rf.slot*rows : (rf.slot+1)*rows]
		emuSame(t, fmt.Sprintf("%s: slot %d (expert %d)", what, rf.slot, ids[rf.slot]), got, res.f32(rf.y)[:rows])
	}
	// and the whole against the CPU's MatMul, within the 8-bit bound
	want := cpuMatMul(t, stacks[1][ids[k-1]], x, 1)
	emuCheck(t, what+": up of the last slot vs the CPU", res.f32(y1)[(k-1)*rows:k*rows], want, conformance.MatMulBound(typ))
}

// TestEmuMoeAddBias: moe_add_bias adds each slot's expert's bias row,
// found through a table moe_table built over one stack of E rows, at both
// warp widths, against float32 adds done here (the AddBias rounding: one
// add per value), ids repeated and out of order.
func TestEmuMoeAddBias(t *testing.T) {
	rng := emuRNG(t)
	for _, ed := range emuDevices {
		const experts, cols = 32, 300 // cols past one block of 256
		for k := 1; k <= 8; k++ {
			bias := conformance.RandomVector(rng, experts*cols, 1)
			dst := conformance.RandomVector(rng, k*cols, 1)
			ids := make([]int32, k)
			for j := range ids {
				ids[j] = int32(rng.IntN(experts))
			}
			if k > 2 {
				ids[k-1] = ids[0]
			}
			raw := make([]byte, 4*len(bias))
			for i, v := range bias {
				binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(v))
			}
			var job emuJob
			table := job.zeros(8*experts, false)
			job.launch("moe_table", grid1(experts), rocm.D1(256), eP(table, 0), eP(job.bytes(raw), 0), eI(4*cols), eI(experts))
			db := job.f32(dst)
			job.launch("moe_add_bias", rocm.Dim3{X: uint32(ceilDiv(cols, 256)), Y: uint32(k), Z: 1}, rocm.D1(256),
				eP(db, 0), eP(table, 0), eP(job.i32(ids), 0), eI(k), eI(cols))
			res := runEmu(t, ed.dev.Warp, &job)
			want := make([]float32, len(dst))
			for j, e := range ids {
				for c := range cols {
					want[j*cols+c] = dst[j*cols+c] + bias[int(e)*cols+c]
				}
			}
			emuSame(t, fmt.Sprintf("warp %d k %d: moe_add_bias", ed.dev.Warp, k), res.f32(db), want)
		}
	}
}

// TestEmuMixAddNorm: mix_add_rmsnorm_row gives the bits of mix_rows (one
// token's k slots) then rmsnorm_row with that residual, the 8-bit copy
// included, at both widths.
func TestEmuMixAddNorm(t *testing.T) {
	rng := emuRNG(t)
	const eps = float32(1e-6)
	for _, ed := range emuDevices {
		t.Run(ed.name, func(t *testing.T) {
			for _, c := range []struct{ k, cols int }{{8, 2048}, {4, 2880}, {2, 256}} {
				var job emuJob
				src := job.f32(conformance.RandomVector(rng, c.k*c.cols, 1))
				w := job.f32(conformance.RandomVector(rng, c.k, 1))
				nw := job.f32(conformance.RandomVector(rng, c.cols, 1))
				x := conformance.RandomVector(rng, c.cols, 2)
				l, _ := planNorm(1, c.cols, true, true)
				// fused
				fx, fr, fd := job.f32(x), job.zeros(4*c.cols, true), job.zeros(4*c.cols, true)
				fq, fs := job.zeros(c.cols, true), job.zeros(4*c.cols/32, true)
				job.launch("mix_add_rmsnorm_row", l.Grid, l.Block, eP(fd, 0), eP(fx, 0), eP(fr, 0), eP(src, 0), eP(w, 0), eI(c.k),
					eP(nw, 0), eI(c.cols), eF(eps), eP(fq, 0), eP(fs, 0))
				// mix_rows, then rmsnorm_row with the residual
				sx, sr, sd := job.f32(x), job.zeros(4*c.cols, true), job.zeros(4*c.cols, true)
				sq, ss := job.zeros(c.cols, true), job.zeros(4*c.cols/32, true)
				job.launch("mix_rows", planMoeRows(1, c.cols), rocm.D1(256), eP(sr, 0), eP(src, 0), eNull(), eP(w, 0), eI(1), eI(c.k), eI(c.cols))
				job.launch(l.Kernel, l.Grid, l.Block, eP(sd, 0), eP(sx, 0), eP(sr, 0), eP(nw, 0), eI(c.cols), eF(eps), eP(sq, 0), eP(ss, 0))
				res := runEmu(t, ed.dev.Warp, &job)
				for _, p := range [][3]any{{fx, sx, "x"}, {fr, sr, "weighted sum"}, {fd, sd, "norm"}, {fq, sq, "codes"}, {fs, ss, "scales"}} {
					if !slices.Equal(res.bufs[p[0].(int)], res.bufs[p[1].(int)]) {
						t.Errorf("%d slots of %d: %s of mix_add_rmsnorm_row differs from mix_rows then rmsnorm_row", c.k, c.cols, p[2])
					}
				}
			}
		})
	}
}

// TestEmuRouterFused: moe_router_f32 gives the logits of mv_f32 (and
// add_bias) and the routing of moe_route, both rules, at both widths,
// with its rows wide and not, one after another (its last block
// resets the count for the next launch).
func TestEmuRouterFused(t *testing.T) {
	rng := emuRNG(t)
	for _, ed := range emuDevices {
		t.Run(ed.name, func(t *testing.T) {
			for _, c := range []struct {
				experts, cols, k, mode int
				bias                   bool
			}{{128, 2048, 8, 0, false}, {32, 2880, 4, 1, true}, {8, 256, 2, 0, false}} {
				var job emuJob
				gate := job.f32(conformance.RandomVector(rng, c.experts*c.cols, 1))
				bias := eNull()
				if c.bias {
					bias = eP(job.f32(conformance.RandomVector(rng, c.experts, 1)), 0)
				}
				l, err := planMatvec(ed.dev, gguf.TypeF32, c.experts, c.cols, 1, false, false, mvOverrides{})
				if err != nil {
					t.Fatal(err)
				}
				count := job.zeros(4, false)
				var fused, plain [4][3]int // logits, ids, weights of four tokens
				for i := range 4 {         // moe_router_f32's rows wide (odd tokens) and not
					wide := i & 1
					x := job.f32(conformance.RandomVector(rng, c.cols, 1))
					fused[i] = [3]int{job.zeros(4*c.experts, true), job.zeros(4*c.k, true), job.zeros(4*c.k, true)}
					job.launch("moe_router_f32", rocm.D1(l.Grid), rocm.D1(mvBlock), eP(gate, 0), eP(x, 0), bias, eP(fused[i][0], 0),
						eI(c.experts), eI(c.cols), eP(fused[i][1], 0), eP(fused[i][2], 0), eI(c.k), eI(c.mode), eP(count, 0), eI(wide))
					plain[i] = [3]int{job.zeros(4*c.experts, true), job.zeros(4*c.k, true), job.zeros(4*c.k, true)}
					job.launch(l.Kernel, rocm.D1(l.Grid), rocm.D1(mvBlock), eP(gate, 0), eP(x, 0), eP(plain[i][0], 0), eI(c.experts), eI(c.cols), eI(1))
					if c.bias {
						job.launch("add_bias", grid1(c.experts), rocm.D1(256), eP(plain[i][0], 0), bias, eI(1), eI(c.experts))
					}
					job.launch("moe_route", rocm.D1(1), rocm.D1(ed.dev.Warp), eP(plain[i][0], 0), eP(plain[i][1], 0), eP(plain[i][2], 0),
						eI(c.experts), eI(c.k), eI(c.mode))
				}
				res := runEmu(t, ed.dev.Warp, &job)
				for i := range 4 {
					for j, what := range []string{"logits", "ids", "weights"} {
						if !slices.Equal(res.bufs[fused[i][j]], res.bufs[plain[i][j]]) {
							t.Errorf("%+v, token %d: %s of moe_router_f32 differ from the ops'", c, i, what)
						}
					}
				}
				if got := res.i32(count)[0]; got != 0 {
					t.Errorf("%+v: count left at %d", c, got)
				}
			}
		})
	}
}
