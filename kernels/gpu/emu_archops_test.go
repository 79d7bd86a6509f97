package gpu

import (
	"fmt"
	"math"
	"testing"

	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/conformance"
	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/rocm"
)

// TestEmuArchOps: archops.cu's gelu_mul, scale_f32, softcap_f32 and the
// attention with a sliding window and a score soft-cap (attn_ext, f16 and
// f32 caches, 1 and 9 tokens), and with gpt-oss's attention sinks (with
// and without a window), at both widths, launched as archops.go launches
// them, against the CPU backend.
func TestEmuArchOps(t *testing.T) {
	rng := emuRNG(t)
	const n = 5000
	for _, ed := range emuDevices {
		warp := ed.dev.Warp
		ga, gb := conformance.RandomVector(rng, n, 2), conformance.RandomVector(rng, n, 2)
		// gelu's negative tail, where 1 + tanh cancels in float32
		tail := []float32{-9, -6, -4.5, -3.2}
		copy(ga, tail)
		for i := range tail {
			gb[i] = 1
		}
		var job emuJob
		gab, gbb := job.f32(ga), job.f32(gb)
		gm, sc := job.zeros(4*n, true), job.zeros(4*n, true)
		cp := job.f32(ga)
		job.launch("gelu_mul", grid1(n), rocm.D1(256), eP(gm, 0), eP(gab, 0), eP(gbb, 0), eI(n))
		job.launch("scale_f32", grid1(n), rocm.D1(256), eP(sc, 0), eP(gab, 0), eF(0.37), eI(n))
		job.launch("softcap_f32", grid1(n), rocm.D1(256), eP(cp, 0), eF(1.5), eI(n))
		res := runEmu(t, warp, &job)
		cpuRef(t, func(b *cpu.Backend) {
			at, bt := cpuTensor(t, b, ga), cpuTensor(t, b, gb)
			dt, _ := b.Alloc(n)
			if err := b.GELUMul(dt, at, bt, n); err != nil {
				t.Fatal(err)
			}
			want := cpuRead(t, b, dt)
			emuCheck(t, fmt.Sprintf("warp %d: gelu_mul", warp), res.f32(gm), want, 1e-5)
			for i, x := range tail { // each alone: a whole vector's error would hide them
				emuCheck(t, fmt.Sprintf("warp %d: gelu_mul at %g", warp, x), res.f32(gm)[i:i+1], want[i:i+1], 1e-5)
			}
			if err := b.Scale(dt, at, 0.37, n); err != nil {
				t.Fatal(err)
			}
			emuCheck(t, fmt.Sprintf("warp %d: scale_f32", warp), res.f32(sc), cpuRead(t, b, dt), 1e-6)
			if err := b.Softcap(at, 1.5, n); err != nil {
				t.Fatal(err)
			}
			emuCheck(t, fmt.Sprintf("warp %d: softcap_f32", warp), res.f32(cp), cpuRead(t, b, at), 1e-5)
		})
		for _, sfx := range []string{"f16", "f32"} {
			for _, c := range []struct{ pos0, n int }{{40, 1}, {3, 9}} {
				at := kernels.Attn{Heads: 8, KVHeads: 2, HeadDim: 128, Window: 16, Softcap: 20}
				at.Scale = float32(1 / math.Sqrt(128))
				emuAttnExtCase(t, warp, sfx, c.pos0, c.n, at, rng.Uint64())
				// gpt-oss's layers: sinks with a window (even layers) and
				// without one (odd layers), head size 64.
				for _, window := range []int{8, 0} {
					at := kernels.Attn{Heads: 8, KVHeads: 2, HeadDim: 64, Window: window, Scale: 0.125 * 1.29}
					at.Sinks = randomSinks(rng, at.Heads)
					emuAttnExtCase(t, warp, sfx, c.pos0, c.n, at, rng.Uint64())
				}
			}
		}
	}
}

func emuAttnExtCase(t *testing.T, warp int, sfx string, pos0, n int, at kernels.Attn, seed uint64) {
	const ctx = 64
	rng := emuSeeded(seed)
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
	job.launch("kv_store_"+sfx, grid1(tot*kvDim), rocm.D1(256), eP(kc, 0), eP(vc, 0), eP(job.f32(k), 0), eP(job.f32(v), 0),
		eI(tot), eI(kvDim), eI(0), eNull())
	out := job.zeros(4*n*qDim, true)
	l := planAttnExt(sfx, at.Heads, n)
	job.launch(l.Kernel, l.Grid, l.Block, eP(out, 0), eP(job.f32(q[pos0*qDim:]), 0), eP(kc, 0), eP(vc, 0), eI(at.Heads),
		eI(at.KVHeads), eI(at.HeadDim), eI(pos0), eF(at.Scale), eI(at.Window), eF(at.Softcap), eNull(), emuSinks(&job, at))
	res := runEmu(t, warp, &job)
	kr, vr := k, v
	if sfx == "f16" {
		kr, vr = f16Round(k), f16Round(v)
	}
	want := cpuAttention(t, q, kr, vr, pos0, n, ctx, at)
	emuCheck(t, fmt.Sprintf("warp %d: %s pos0 %d n %d window %d cap %g sinks %v", warp, l.Kernel, pos0, n, at.Window, at.Softcap, at.Sinks != nil),
		res.f32(out), want, 2e-5)
}
