package gpu

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/conformance"
	"github.com/forge-llm/forge/rocm"
)

// TestEmuAttnDecodeRope: attn_decode_rope (RoPE and the cache store inside
// the decode attention) gives the bytes of qkv_prep then attn_decode, in
// the output, its 8-bit copy and the cache, at wave32 and wave64, for a
// first position, one inside a split and one with many splits, grouped
// queries and NeoX and interleaved rotation over part of the head.
func TestEmuAttnDecodeRope(t *testing.T) {
	rng := emuRNG(t)
	at := kernels.Attn{Heads: 8, KVHeads: 2, HeadDim: 64, Scale: 0.125}
	qDim, kvDim, ctx := at.Heads*at.HeadDim, at.KVHeads*at.HeadDim, 512
	for _, ed := range emuDevices {
		for _, c := range []struct {
			pos, dim, neox int
		}{{0, 64, 1}, {37, 64, 0}, {300, 32, 1}} {
			t.Run(fmt.Sprintf("%s/pos%d", ed.name, c.pos), func(t *testing.T) {
				hist := conformance.RandomVector(rng, 2*(c.pos+1)*kvDim, 1)
				q := conformance.RandomVector(rng, qDim, 1)
				k, v := conformance.RandomVector(rng, kvDim, 1), conformance.RandomVector(rng, kvDim, 1)
				var job emuJob
				hb := job.f32(hist)
				var caches [2][2]int
				var outs, oqs, ods [2]int
				l, splits, splitLen := planAttnDecode(ed.dev, "f16", at.Heads, 1, c.pos, ctx, 0)
				nl, _ := planNorm(1, at.HeadDim, false, false)
				for i := range 2 {
					kc, vc := job.zeros(ctx*kvDim*2, false), job.zeros(ctx*kvDim*2, false)
					caches[i] = [2]int{kc, vc}
					if c.pos > 0 { // the earlier positions' keys and values
						job.launch("kv_store_f16", grid1(c.pos*kvDim), rocm.D1(256), eP(kc, 0), eP(vc, 0), eP(hb, 0),
							eP(hb, 4*(c.pos+1)*kvDim), eI(c.pos), eI(kvDim), eI(0), eNull())
					}
					qb, kb, vb := job.f32(q), job.f32(k), job.f32(v)
					outs[i] = job.zeros(4*qDim, true)
					oqs[i], ods[i] = job.zeros(qDim, true), job.zeros(4*qDim/32, true)
					part, count := eNull(), eNull()
					if splits > 1 {
						part = eP(job.zeros(4*at.Heads*splits*(at.HeadDim+2), true), 0)
						count = eP(job.zeros(4*at.Heads, false), 0)
					}
					args := []emuArg{eP(outs[i], 0), part, eP(qb, 0), eP(kc, 0), eP(vc, 0), eI(at.Heads), eI(at.KVHeads),
						eI(at.HeadDim), eI(c.pos), eF(at.Scale), eI(splitLen), eNull(), count, eP(oqs[i], 0), eP(ods[i], 0),
						eNull(), eI(0)}
					if i == 0 { // the ops
						job.launch("qkv_prep_f16", rocm.D1(at.Heads+at.KVHeads), nl.Block, eP(qb, 0), eP(kb, 0), eP(vb, 0),
							eNull(), eNull(), eI(at.Heads), eI(at.KVHeads), eI(at.HeadDim), eF(1e-6), eP(kc, 0), eP(vc, 0),
							eI(c.pos), eNull(), eI(c.dim), eF(10000), eF(1), eNull(), eI(c.neox))
						job.launch(l.Kernel, l.Grid, l.Block, args...)
						continue
					}
					args = append(args, eP(kb, 0), eP(vb, 0), eI(c.dim), eF(10000), eF(1), eNull(), eI(c.neox))
					job.launch("attn_decode_rope_f16", l.Grid, l.Block, args...)
				}
				res := runEmu(t, ed.dev.Warp, &job)
				q8Check(t, "attn_decode_rope", res.f32(outs[1]), res.bufs[oqs[1]], res.f32(ods[1])) // written, and its copy
				for _, p := range []struct {
					what string
					a, b int
				}{{"output", outs[0], outs[1]}, {"8-bit codes", oqs[0], oqs[1]}, {"8-bit scales", ods[0], ods[1]},
					{"key cache", caches[0][0], caches[1][0]}, {"value cache", caches[0][1], caches[1][1]}} {
					if !bytes.Equal(res.bufs[p.a], res.bufs[p.b]) {
						t.Errorf("%s (%d splits): attn_decode_rope and qkv_prep + attn_decode differ", p.what, splits)
					}
				}
			})
		}
	}
}
