package gpu

// TestEmu*: every kernel family run through the wavefront emulator
// (emu/wave.h) at warp 32 and warp 64, with the launches launch.go chooses
// for a gfx1030 (wave32) and a gfx90a (wave64) device, on fresh random
// inputs, compared with the CPU backend by relative error as the
// conformance suite measures it. What this proves and what it cannot:
// emu/wave.h's header comment.

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/conformance"
	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/rocm"
)

var emuDevices = []struct {
	name string
	dev  LaunchDevice
}{{"gfx1030", DeviceGfx1030}, {"gfx90a", DeviceGfx90a}}

// emuRNG is a fresh random source; FORGE_EMU_SEED replays a logged seed.
func emuRNG(t *testing.T) *rand.Rand {
	seed := rand.Uint64()
	if s := os.Getenv("FORGE_EMU_SEED"); s != "" {
		if _, err := fmt.Sscan(s, &seed); err != nil {
			t.Fatalf("FORGE_EMU_SEED=%q: %v", s, err)
		}
	}
	t.Logf("seed %d (FORGE_EMU_SEED replays it)", seed)
	return rand.New(rand.NewPCG(seed, 27))
}

// emuRelErr is ‖got − want‖₂ / ‖want‖₂ in float64; NaN or Inf in got is
// an infinite error.
func emuRelErr(got, want []float32) float64 {
	var num, den float64
	for i := range want {
		g, w := float64(got[i]), float64(want[i])
		if math.IsNaN(g) || math.IsInf(g, 0) {
			return math.Inf(1)
		}
		num += (g - w) * (g - w)
		den += w * w
	}
	if den == 0 {
		return math.Sqrt(num)
	}
	return math.Sqrt(num / den)
}

func emuCheck(t *testing.T, what string, got, want []float32, bound float64) {
	t.Helper()
	if len(got) < len(want) {
		t.Errorf("%s: %d values, want %d", what, len(got), len(want))
		return
	}
	if e := emuRelErr(got[:len(want)], want); !(e <= bound) {
		t.Errorf("%s: relative error %.3g > %.3g", what, e, bound)
	}
}

// cpuRef runs f on a fresh CPU backend.
func cpuRef(t *testing.T, f func(b *cpu.Backend)) {
	t.Helper()
	b := cpu.New(1)
	defer b.Close()
	f(b)
}

func cpuTensor(t *testing.T, b *cpu.Backend, v []float32) kernels.Tensor {
	t.Helper()
	x, err := b.Alloc(len(v))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Write(x, 0, v); err != nil {
		t.Fatal(err)
	}
	return x
}

func cpuRead(t *testing.T, b *cpu.Backend, x kernels.Tensor) []float32 {
	t.Helper()
	v := make([]float32, x.Len)
	if err := b.Read(v, x, 0); err != nil {
		t.Fatal(err)
	}
	return v
}

// cpuMatMul is y [n][w.Rows] = x [n][w.Cols]·wᵀ with the weight decoded
// by the CPU backend (Embed of every row) and the products summed in
// float64: the exact reference the conformance suite's MatMul bounds are
// set against. (The CPU backend's own MatMul rounds x to 8-bit blocks for
// quantized weights, as the GPU kernels do: comparing two such results
// would double the rounding the bound allows for one.)
func cpuMatMul(t *testing.T, w *kernels.Weight, x []float32, n int) []float32 {
	ids := make([]int32, w.Rows)
	for i := range ids {
		ids[i] = int32(i)
	}
	wf := cpuEmbed(t, w, ids)
	y := make([]float32, n*w.Rows)
	for i := range n {
		xr := x[i*w.Cols : (i+1)*w.Cols]
		for r := range w.Rows {
			var s float64
			for c, v := range wf[r*w.Cols : (r+1)*w.Cols] {
				s += float64(v) * float64(xr[c])
			}
			y[i*w.Rows+r] = float32(s)
		}
	}
	return y
}

var emuMatTypes = []gguf.Type{
	gguf.TypeF32, gguf.TypeF16, gguf.TypeBF16,
	gguf.TypeQ4_0, gguf.TypeQ4_1, gguf.TypeQ5_0, gguf.TypeQ5_1, gguf.TypeQ8_0,
	gguf.TypeQ2_K, gguf.TypeQ3_K, gguf.TypeQ4_K, gguf.TypeQ5_K, gguf.TypeQ6_K,
	gguf.TypeIQ4_NL, gguf.TypeIQ4_XS, gguf.TypeMXFP4,
}

// emuVariants are the one-row kernels forced through mvOverrides besides
// the automatic choice ("" here).
var emuVariants = map[gguf.Type][]string{
	gguf.TypeQ4_K: {"p1", "p2", "p4", "r1u1", "r2u1", "r1u2", "r2u2", "q11", "q21", "q12", "q22", "q14",
		"n11", "n21", "n12", "n22", "n14", "g"},
	gguf.TypeQ6_K: {"p1", "p2", "p4", "r1u1", "r2u1", "s1", "s2", "q11", "q21", "q12", "q22", "q14",
		"t1", "t2", "t4", "c1", "c2", "c2@4", "t2@12", "g"},
	gguf.TypeQ4_0: {"b1", "b4", "g"}, gguf.TypeQ4_1: {"b1", "b4", "g"}, gguf.TypeQ5_0: {"b1", "b4", "g"},
	gguf.TypeQ5_1: {"b1", "b4", "g"}, gguf.TypeQ8_0: {"b1", "b4", "g"},
}

// mvCase is one matrix–vector launch plan of a job with its output buffer.
type mvCase struct {
	what string
	y    int // output buffer
	n    int // rows of x
}

// addMatvec adds to job the launches planMatvec/planRows choose for the
// product of n rows of x (buffer xb; xq, xd its 8-bit copy) by weight
// buffer wb, and returns the output buffer.
func addMatvec(job *emuJob, d LaunchDevice, w *kernels.Weight, wb, xb, xq, xd, n int, o mvOverrides) (int, string, error) {
	y := job.zeros(4*n*w.Rows, true)
	if n == 1 {
		p, err := planMatvec(d, w.Type, w.Rows, w.Cols, 1, true, true, o)
		if err != nil {
			return 0, "", err
		}
		switch p.Args {
		case mvArgsQ8:
			job.launch(p.Kernel, rocm.D1(p.Grid), rocm.D1(mvBlock), eP(wb, 0), eP(xq, 0), eP(xd, 0), eP(y, 0), eI(w.Rows), eI(w.Cols))
		case mvArgsFloat:
			job.launch(p.Kernel, rocm.D1(p.Grid), rocm.D1(mvBlock), eP(wb, 0), eP(xb, 0), eP(y, 0), eI(w.Rows), eI(w.Cols))
		default:
			job.launch(p.Kernel, rocm.D1(p.Grid), rocm.D1(mvBlock), eP(wb, 0), eP(xb, 0), eP(y, 0), eI(w.Rows), eI(w.Cols), eI(1))
		}
		return y, fmt.Sprintf("%s grid %d", p.Kernel, p.Grid), nil
	}
	p, err := planRows(d, w.Type, w.Rows, w.Cols, n, true, o.Variant, "")
	if err != nil {
		return 0, "", err
	}
	if p.Args == mvArgsGeneric { // one launch, grid.y over the chunks (mvGeneric)
		grid := rocm.Dim3{X: uint32(p.Grid), Y: uint32(ceilDiv(n, mvMaxN)), Z: 1}
		job.launch(p.Kernel, grid, rocm.D1(mvBlock), eP(wb, 0), eP(xb, 0), eP(y, 0), eI(w.Rows), eI(w.Cols), eI(n))
		return y, fmt.Sprintf("%s grid %d×%d", p.Kernel, grid.X, grid.Y), nil
	}
	for i0 := 0; i0 < n; i0 += p.Group {
		nx := min(p.Group, n-i0)
		job.launch(p.Kernel, rocm.D1(p.Grid), rocm.D1(mvBlock), eP(wb, 0), eP(xq, i0*w.Cols), eP(xd, 4*i0*(w.Cols/32)),
			eP(y, 4*i0*w.Rows), eI(w.Rows), eI(w.Cols), eI(nx))
	}
	return y, fmt.Sprintf("%s ×%d grid %d", p.Kernel, ceilDiv(n, p.Group), p.Grid), nil
}

// TestEmuMatvec: every matrix–vector family (the automatic one-row
// choice, every forced one-row variant, the generic kernel for several
// rows of x, the multi-row 8-bit kernels planRows picks for 5 and 12 rows)
// for every GPU weight type, at both widths, against the CPU backend's
// MatMul. Rows of 67 leave partial warps and blocks; the capped variants
// also run on a one-CU device so their warps stride over rows; 3840
// columns (15 super-blocks) give the staged Q6_K kernels rows that start
// off 16-byte boundaries and end in a partial run (c{R} falls back to
// t{R}); 2880
// columns of MXFP4 are gpt-oss's expert rows.
func TestEmuMatvec(t *testing.T) {
	rng := emuRNG(t)
	for _, ed := range emuDevices {
		t.Run(ed.name, func(t *testing.T) {
			for _, typ := range emuMatTypes {
				shapes := [][2]int{{67, 4096}}
				if typ == gguf.TypeQ4_K || typ == gguf.TypeQ6_K {
					shapes = append(shapes, [2]int{40, 3840})
				}
				if typ == gguf.TypeMXFP4 {
					shapes = append(shapes, [2]int{40, 2880}) // gpt-oss's experts: rows of 1530 bytes, not 16-byte aligned
				}
				for _, sh := range shapes {
					emuMatvecCase(t, rng, ed.dev, typ, sh[0], sh[1])
				}
			}
		})
	}
}

func emuMatvecCase(t *testing.T, rng *rand.Rand, d LaunchDevice, typ gguf.Type, rows, cols int) {
	const maxN = 12
	w := conformance.RandomWeight(rng, "w", typ, rows, cols)
	x := conformance.RandomVector(rng, maxN*cols, 1)
	var job emuJob
	wb := job.bytes(w.Host)
	xb := job.f32(x)
	xq, xd := job.zeros(maxN*cols, true), job.zeros(4*maxN*cols/32, true)
	job.launch("quantize_q8", rocm.D1(ceilDiv(maxN*cols, 256)), rocm.D1(256), eP(xb, 0), eP(xq, 0), eP(xd, 0), eI(maxN*cols))
	type out struct {
		what string
		y, n int
	}
	var outs []out
	add := func(n int, o mvOverrides, d LaunchDevice, tag string) {
		y, what, err := addMatvec(&job, d, w, wb, xb, xq, xd, n, o)
		if err != nil {
			t.Fatal(err)
		}
		outs = append(outs, out{fmt.Sprintf("%s %d×%d n=%d %s%s", typ, rows, cols, n, what, tag), y, n})
	}
	add(1, mvOverrides{}, d, "")
	for _, v := range emuVariants[typ] {
		add(1, mvOverrides{Variant: v}, d, " (forced "+v+")")
	}
	if typ == gguf.TypeQ4_K || typ == gguf.TypeQ6_K || typ == gguf.TypeQ8_0 {
		one := LaunchDevice{Warp: d.Warp, SMs: 1}
		add(1, mvOverrides{}, one, " (1 CU)")
		add(1, mvOverrides{BlocksPerSM: 1}, one, " (1 block)")
		add(3, mvOverrides{}, one, " (1 CU)")
	}
	// the generic kernel on 3 rows of x
	y3 := job.zeros(4*3*rows, true)
	kt, _ := kernelType(typ)
	job.launch("mv_"+kt, rocm.D1(ceilDiv(rows, mvBlock/d.Warp)), rocm.D1(mvBlock), eP(wb, 0), eP(xb, 0), eP(y3, 0), eI(rows), eI(cols), eI(3))
	outs = append(outs, out{fmt.Sprintf("%s %d×%d n=3 mv_%s", typ, rows, cols, kt), y3, 3})
	// the generic kernel on 12 rows in one launch (grid.y: chunks of 8 and
	// 4) against a launch per chunk: the same bits
	y12, ySep := job.zeros(4*maxN*rows, true), job.zeros(4*maxN*rows, true)
	gx := uint32(ceilDiv(rows, mvBlock/d.Warp))
	job.launch("mv_"+kt, rocm.Dim3{X: gx, Y: 2, Z: 1}, rocm.D1(mvBlock), eP(wb, 0), eP(xb, 0), eP(y12, 0), eI(rows), eI(cols), eI(maxN))
	job.launch("mv_"+kt, rocm.D1(int(gx)), rocm.D1(mvBlock), eP(wb, 0), eP(xb, 0), eP(ySep, 0), eI(rows), eI(cols), eI(mvMaxN))
	job.launch("mv_"+kt, rocm.D1(int(gx)), rocm.D1(mvBlock), eP(wb, 0), eP(xb, 4*mvMaxN*cols), eP(ySep, 4*mvMaxN*rows), eI(rows), eI(cols), eI(maxN-mvMaxN))
	// and on x's first row alone (the one-row path of the generic kernels)
	y1g := job.zeros(4*rows, true)
	job.launch("mv_"+kt, rocm.D1(int(gx)), rocm.D1(mvBlock), eP(wb, 0), eP(xb, 0), eP(y1g, 0), eI(rows), eI(cols), eI(1))
	add(5, mvOverrides{}, d, "")
	add(12, mvOverrides{}, d, "")
	res := runEmu(t, d.Warp, &job)
	if a, b := res.f32(y12), res.f32(ySep); !slices.Equal(a, b) {
		t.Errorf("warp %d: %s %d×%d: mv_%s on 12 rows in one launch differs from a launch per chunk", d.Warp, typ, rows, cols, kt)
	}
	if a, b := res.f32(y1g), res.f32(y12)[:rows]; !slices.Equal(a, b) {
		t.Errorf("warp %d: %s %d×%d: mv_%s on one row of x differs from that row among 12", d.Warp, typ, rows, cols, kt)
	}
	bound := conformance.MatMulBound(typ)
	for _, o := range outs {
		want := cpuMatMul(t, w, x, o.n)
		emuCheck(t, fmt.Sprintf("warp %d: %s", d.Warp, o.what), res.f32(o.y), want, bound)
	}
}

// TestEmuSelf checks the emulator's model on its own kernels
// (emu/selftest.cu): reads from exited lanes are poisoned and counted;
// divergent branches shuffle among their own lanes and the reconverged
// warp meets whole; lanes run one at a time between meeting points, so a
// shared-memory exchange without WARP_SYNC reads stale data and one with
// it reads the fresh values; __syncthreads spans warps; warpSize is WARP.
func TestEmuSelf(t *testing.T) {
	for _, warp := range []int{32, 64} {
		t.Run(fmt.Sprint(warp), func(t *testing.T) {
			var job emuJob
			ex := job.zeros(4*128, false)
			job.launch("st_exit_shfl", rocm.D1(1), rocm.D1(128), eP(ex, 0))
			dv := job.zeros(4*128, false)
			job.launch("st_diverge", rocm.D1(1), rocm.D1(128), eP(dv, 0))
			ls0, ls1 := job.zeros(4*warp, false), job.zeros(4*warp, false)
			job.launch("st_lockstep", rocm.D1(1), rocm.D1(warp), eP(ls0, 0), eI(0))
			job.launch("st_lockstep", rocm.D1(1), rocm.D1(warp), eP(ls1, 0), eI(1))
			sy := job.zeros(4*(3*256+1), false)
			job.launch("st_sync", rocm.D1(3), rocm.D1(256), eP(sy, 0))
			res := runEmuPoison(t, warp, &job, true)
			if want := uint64(128 / 2); res.poison[0] != want {
				t.Errorf("st_exit_shfl: %d poisoned reads, want %d", res.poison[0], want)
			}
			for i, v := range res.f32(ex) {
				if i%warp < warp/2 && !math.IsNaN(float64(v)) {
					t.Errorf("st_exit_shfl: lane %d read %g from an exited lane, want the poison NaN", i, v)
					break
				}
			}
			for i := 1; i < len(res.poison); i++ {
				if res.poison[i] != 0 {
					t.Errorf("launch %d: %d poisoned reads, want 0", i, res.poison[i])
				}
			}
			// st_diverge: v = lane + (lane^1) below half, lane − (lane^2)
			// above, then the warp's sum of v in every lane
			sum := 0
			for l := range warp {
				if l < warp/2 {
					sum += l + (l ^ 1)
				} else {
					sum += l - (l ^ 2)
				}
			}
			for i, v := range res.i32(dv) {
				if int(v) != sum {
					t.Errorf("st_diverge: lane %d: %d, want %d", i, v, sum)
					break
				}
			}
			stale, fresh := res.i32(ls0), res.i32(ls1)
			for l := range warp {
				if want := int32((l+1)%warp + 100); fresh[l] != want {
					t.Errorf("st_lockstep with WARP_SYNC: lane %d read %d, want %d", l, fresh[l], want)
					break
				}
			}
			if stale[0] == 101 {
				t.Errorf("st_lockstep without WARP_SYNC: lane 0 read lane 1's store before lane 1 ran")
			}
			got := res.i32(sy)
			for b := range 3 {
				for i := range 256 {
					if want := int32(255 - i + b); got[b*256+i] != want {
						t.Errorf("st_sync: block %d thread %d: %d, want %d", b, i, got[b*256+i], want)
						return
					}
				}
			}
			if got[3*256] != int32(warp) {
				t.Errorf("warpSize %d, want %d", got[3*256], warp)
			}
		})
	}
}

// TestEmu8B runs the decode products of Llama 3 8B at their full shapes
// (the output projection excepted: 525M weights) with the launches planned
// for gfx90a and gfx1030 (TestLaunchPlans8B: grids capped per CU, so
// warps stride over rows; ffn_down staged at both widths),
// the grouped Q4_K kernel over attn_q and attn_k, the multi-row kernels
// for a step of 5 rows on ffn_gate, and the decode attention at 32/8
// heads of 128 with the splits planned per device, against the CPU
// backend.
func TestEmu8B(t *testing.T) {
	if testing.Short() {
		t.Skip("the 8B shapes take tens of seconds in the emulator")
	}
	rng := emuRNG(t)
	ws := map[string]*kernels.Weight{}
	for _, m := range llama8B {
		if m.name != "output" {
			ws[m.name] = conformance.RandomWeight(rng, m.name, m.typ, m.rows, m.cols)
		}
	}
	x4 := conformance.RandomVector(rng, 5*4096, 1)
	x14 := conformance.RandomVector(rng, 14336, 1)
	refs := map[string][]float32{} // the references, computed once for both devices
	ref := func(name string, n int) []float32 {
		key := fmt.Sprint(name, n)
		if refs[key] == nil {
			w, x := ws[name], x4
			if w.Cols == 14336 {
				x = x14
			}
			refs[key] = cpuMatMul(t, w, x, n)
		}
		return refs[key]
	}
	for _, ed := range emuDevices {
		t.Run(ed.name, func(t *testing.T) {
			var job emuJob
			xb4, xb14 := job.f32(x4), job.f32(x14)
			xq4, xd4 := job.zeros(5*4096, true), job.zeros(4*5*4096/32, true)
			xq14, xd14 := job.zeros(14336, true), job.zeros(4*14336/32, true)
			job.launch("quantize_q8", rocm.D1(ceilDiv(5*4096, 256)), rocm.D1(256), eP(xb4, 0), eP(xq4, 0), eP(xd4, 0), eI(5*4096))
			job.launch("quantize_q8", rocm.D1(ceilDiv(14336, 256)), rocm.D1(256), eP(xb14, 0), eP(xq14, 0), eP(xd14, 0), eI(14336))
			type out struct {
				name, what string
				y, n       int
			}
			var outs []out
			wbs := map[string]int{}
			for _, m := range llama8B {
				w := ws[m.name]
				if w == nil {
					continue
				}
				wb := job.bytes(w.Host)
				wbs[m.name] = wb
				xb, xq, xd := xb4, xq4, xd4
				if w.Cols == 14336 {
					xb, xq, xd = xb14, xq14, xd14
				}
				y, what, err := addMatvec(&job, ed.dev, w, wb, xb, xq, xd, 1, mvOverrides{})
				if err != nil {
					t.Fatal(err)
				}
				outs = append(outs, out{m.name, what, y, 1})
			}
			y, what, err := addMatvec(&job, ed.dev, ws["ffn_gate"], wbs["ffn_gate"], xb4, xq4, xd4, 5, mvOverrides{})
			if err != nil {
				t.Fatal(err)
			}
			outs = append(outs, out{"ffn_gate", what, y, 5})
			// mv_q4_k_n12m over attn_q and attn_k (a third slot of 0 rows)
			wq, wk := ws["attn_q"], ws["attn_k"]
			yq, yk := job.zeros(4*wq.Rows, true), job.zeros(4*wk.Rows, true)
			grid := planQ4KMulti(ed.dev, wq.Rows+wk.Rows, 0)
			job.launch("mv_q4_k_n12m", rocm.D1(grid), rocm.D1(mvBlock), eP(wbs["attn_q"], 0), eP(yq, 0), eI(wq.Rows),
				eP(wbs["attn_k"], 0), eP(yk, 0), eI(wk.Rows), eNull(), eNull(), eI(0), eP(xq4, 0), eP(xd4, 0), eI(4096))
			outs = append(outs, out{"attn_q", "mv_q4_k_n12m", yq, 1}, out{"attn_k", "mv_q4_k_n12m", yk, 1})
			res := runEmu(t, ed.dev.Warp, &job)
			for _, o := range outs {
				w := ws[o.name]
				emuCheck(t, fmt.Sprintf("warp %d: %s %s %d×%d n=%d: %s", ed.dev.Warp, o.name, w.Type, w.Rows, w.Cols, o.n, o.what),
					res.f32(o.y), ref(o.name, o.n), conformance.MatMulBound(w.Type))
			}
			emuAttnCase(t, rng, ed.dev, "f16", 1000, 1, 8192, kernels.Attn{Heads: 32, KVHeads: 8, HeadDim: 128})
		})
	}
}

// emuSeeded is a random source from a seed drawn from a logged one.
func emuSeeded(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 27)) }
