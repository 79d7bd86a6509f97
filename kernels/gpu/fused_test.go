package gpu

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/conformance"
)

// fusedSame fails unless a (fused) and b (the ops) hold the same bits.
func fusedSame(t *testing.T, what string, a, b []float32) {
	t.Helper()
	if j := sameBits(a, b); j >= 0 {
		t.Fatalf("%s[%d] = %v fused, %v by the ops", what, j, a[j], b[j])
	}
}

// TestPrepareQKVMatchesOps: PrepareQKV then AttentionStoredQ8 give the
// bits of RMSNormPair, RoPE over the queries and keys and AttentionQ8 at
// every position of a 40-token run (each step attends over all the keys
// and values stored before it, so the cache rows must match too), with
// and without the head norms; without them, AttendQKVQ8 (one launch, its
// own cache) gives the same output and 8-bit copy.
func TestPrepareQKVMatchesOps(t *testing.T) {
	b := gpuBackend(t, false)
	rng := rand.New(rand.NewPCG(rand.Uint64(), 42))
	at := kernels.Attn{Heads: 16, KVHeads: 4, HeadDim: 128, Scale: 0.088}
	rope := kernels.Rope{Dim: 128, Base: 1e6, Scale: 1, NeoX: true}
	qDim, kvDim := at.Heads*at.HeadDim, at.KVHeads*at.HeadDim
	for _, norms := range []bool{true, false} {
		var qw, kw *kernels.Weight
		if norms {
			qw = &kernels.Weight{Name: "q_norm", Type: gguf.TypeF32, Cols: at.HeadDim, Rows: 1, Host: f32bytes(randVec(rng, at.HeadDim, 1))}
			kw = &kernels.Weight{Name: "k_norm", Type: gguf.TypeF32, Cols: at.HeadDim, Rows: 1, Host: f32bytes(randVec(rng, at.HeadDim, 1))}
		}
		const ctx = 64
		caches := [2]*kernels.KVCache{}
		for i := range caches {
			var err error
			if caches[i], err = b.NewKVCache(1, ctx, kvDim); err != nil {
				t.Fatal(err)
			}
			defer b.FreeKVCache(caches[i])
		}
		attend, err := b.NewKVCache(1, ctx, kvDim) // AttendQKVQ8's cache (no head norms)
		if err != nil {
			t.Fatal(err)
		}
		defer b.FreeKVCache(attend)
		wo := conformance.RandomWeight(rng, "attn_output", gguf.TypeQ4_K, 256, qDim)
		for pos := range 40 {
			qk := randVec(rng, qDim+kvDim, 2)
			v := randVec(rng, kvDim, 1)
			var outs [2][]float32
			var qs [2][]float32
			var ys [2][]float32 // the output projection on each path's 8-bit copy
			for i, fused := range []bool{true, false} {
				qkt, vt := upload(t, b, qk), upload(t, b, v)
				q, k := qkt.View(0, qDim), qkt.View(qDim, kvDim)
				out := upload(t, b, make([]float32, qDim))
				oq := allocQ8(t, b, 1, qDim)
				var err error
				if fused {
					if err = b.PrepareQKV(q, k, vt, qw, kw, 1e-6, caches[i], 0, pos, rope, at); err == nil {
						_, err = b.AttentionStoredQ8(out, q, caches[i], 0, pos, at, oq)
					}
				} else {
					if norms {
						err = b.RMSNormPair(q, q, qw, at.Heads, k, k, kw, at.KVHeads, 1e-6)
					}
					if err == nil {
						err = b.RoPE(qkt, 1, at.Heads+at.KVHeads, at.HeadDim, pos, rope)
					}
					if err == nil {
						_, err = b.AttentionQ8(out, q, k, vt, caches[i], 0, pos, 1, at, oq)
					}
				}
				if err != nil {
					t.Fatal(err)
				}
				outs[i], qs[i] = download(t, b, out), download(t, b, qkt)
				if !norms {
					y := upload(t, b, make([]float32, 256))
					if err := b.MatMulQ8(y, wo, out, oq, 1); err != nil {
						t.Fatal(err)
					}
					ys[i] = download(t, b, y)
				}
			}
			fusedSame(t, fmt.Sprintf("norms %v, position %d: queries and keys", norms, pos), qs[0], qs[1])
			fusedSame(t, fmt.Sprintf("norms %v, position %d: attention", norms, pos), outs[0], outs[1])
			if norms {
				continue
			}
			// AttendQKVQ8: the same token in one launch, on its own cache
			qkt, vt := upload(t, b, qk), upload(t, b, v)
			q, k := qkt.View(0, qDim), qkt.View(qDim, kvDim)
			out := upload(t, b, make([]float32, qDim))
			oq := allocQ8(t, b, 1, qDim)
			made, ok, err := b.AttendQKVQ8(out, q, k, vt, attend, 0, pos, rope, at, oq)
			if err != nil || !ok || made.Empty() {
				t.Fatalf("position %d: AttendQKVQ8: ok %v, copy made %v, %v", pos, ok, !made.Empty(), err)
			}
			y := upload(t, b, make([]float32, 256))
			if err := b.MatMulQ8(y, wo, out, made, 1); err != nil {
				t.Fatal(err)
			}
			fusedSame(t, fmt.Sprintf("position %d: AttendQKVQ8's attention", pos), download(t, b, out), outs[1])
			fusedSame(t, fmt.Sprintf("position %d: the product on AttendQKVQ8's 8-bit copy", pos), download(t, b, y), ys[1])
		}
	}
}

// TestPrepareQKVRefusesBadInput: PrepareQKV and AttendQKVQ8 refuse a
// position past the cache's context and a key of the wrong size, each
// with an error naming the op and what is wrong.
func TestPrepareQKVRefusesBadInput(t *testing.T) {
	b := gpuBackend(t, false)
	at := kernels.Attn{Heads: 4, KVHeads: 2, HeadDim: 64, Scale: 0.125}
	rope := kernels.Rope{Dim: 64, Base: 10000, Scale: 1}
	const ctx = 16
	kc, err := b.NewKVCache(1, ctx, at.KVHeads*at.HeadDim)
	if err != nil {
		t.Fatal(err)
	}
	defer b.FreeKVCache(kc)
	q := upload(t, b, make([]float32, at.Heads*at.HeadDim))
	k := upload(t, b, make([]float32, at.KVHeads*at.HeadDim))
	short := upload(t, b, make([]float32, at.KVHeads*at.HeadDim/2))
	out := upload(t, b, make([]float32, at.Heads*at.HeadDim))
	oq := allocQ8(t, b, 1, at.Heads*at.HeadDim)
	for _, c := range []struct {
		what string
		k    kernels.Tensor
		pos  int
		want string
	}{{"position past the context", k, ctx, "outside the context"}, {"short key", short, 3, ": k"}} {
		err := b.PrepareQKV(q, c.k, k, nil, nil, 1e-6, kc, 0, c.pos, rope, at)
		if err == nil || !strings.Contains(err.Error(), "prepare qkv") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("PrepareQKV, %s: %v, want an error naming prepare qkv and %q", c.what, err, c.want)
		}
		_, ok, err := b.AttendQKVQ8(out, q, c.k, k, kc, 0, c.pos, rope, at, oq)
		if ok || err == nil || !strings.Contains(err.Error(), "attend qkv") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("AttendQKVQ8, %s: ok %v, %v, want an error naming attend qkv and %q", c.what, ok, err, c.want)
		}
	}
}

// TestMixAddRMSNormMatchesOps: MixAddRMSNormQ8 gives the bits of
// MixSlots then AddRMSNormQ8: the weighted sum, the residual stream, the
// normalised row and its 8-bit copy (read through a product on it).
func TestMixAddRMSNormMatchesOps(t *testing.T) {
	b := gpuBackend(t, false)
	rng := rand.New(rand.NewPCG(rand.Uint64(), 43))
	for _, c := range []struct{ k, cols int }{{8, 2048}, {4, 3072}} {
		nw := &kernels.Weight{Name: "ffn_norm", Type: gguf.TypeF32, Cols: c.cols, Rows: 1, Host: f32bytes(randVec(rng, c.cols, 1))}
		wm := conformance.RandomWeight(rng, "w", gguf.TypeQ4_K, 256, c.cols)
		src, w, x := randVec(rng, c.k*c.cols, 1), randVec(rng, c.k, 1), randVec(rng, c.cols, 2)
		var got [2][4][]float32
		for i, fused := range []bool{true, false} {
			st, wt, xt := upload(t, b, src), upload(t, b, w), upload(t, b, x)
			r, dst, y := upload(t, b, make([]float32, c.cols)), upload(t, b, make([]float32, c.cols)), upload(t, b, make([]float32, 256))
			q := allocQ8(t, b, 1, c.cols)
			var err error
			var made kernels.Q8
			if fused {
				made, err = b.MixAddRMSNormQ8(dst, xt, r, st, wt, c.k, nw, 1e-6, q)
			} else if err = b.MixSlots(r, st, wt, 1, c.k, c.cols); err == nil {
				made, err = b.AddRMSNormQ8(dst, xt, r, nw, 1, 1e-6, q)
			}
			if err == nil {
				if made.Empty() {
					t.Fatalf("fused %v: no 8-bit copy made", fused)
				}
				err = b.MatMulQ8(y, wm, dst, made, 1)
			}
			if err != nil {
				t.Fatal(err)
			}
			got[i] = [4][]float32{download(t, b, r), download(t, b, xt), download(t, b, dst), download(t, b, y)}
		}
		for j, what := range []string{"weighted sum", "x", "norm", "product on the 8-bit copy"} {
			fusedSame(t, what, got[0][j], got[1][j])
		}
	}
}

// TestRouteFusedMatchesOps: RouteFused gives the logits, ids and weights
// of MatMul, AddBias and RouteTopK, both rules, over several launches (the
// count its last block resets).
func TestRouteFusedMatchesOps(t *testing.T) {
	sb := gpuBackend(t, false)
	for _, tune := range []decodeTuning{defaultTuning, {}, {routeWide: true}} {
		b, err := New(sb.w, Options{})
		if err != nil {
			t.Fatal(err)
		}
		b.tune = tune
		routeFusedMatchesOps(t, b, tune)
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func routeFusedMatchesOps(t *testing.T, b *Backend, tune decodeTuning) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 44))
	for _, c := range []struct {
		experts, cols, k int
		rule             kernels.Routing
		bias             bool
	}{{128, 2048, 8, kernels.RouteSoftmax, false}, {32, 2880, 4, kernels.RouteTopKSoftmax, true}} {
		gate := &kernels.Weight{Name: "ffn_gate_inp", Type: gguf.TypeF32, Cols: c.cols, Rows: c.experts, Host: f32bytes(randVec(rng, c.experts*c.cols, 1))}
		var bias *kernels.Weight
		if c.bias {
			bias = &kernels.Weight{Name: "ffn_gate_inp_bias", Type: gguf.TypeF32, Cols: c.experts, Rows: 1, Host: f32bytes(randVec(rng, c.experts, 1))}
		}
		for step := range 5 {
			x := randVec(rng, c.cols, 1)
			var got [2][3][]float32
			for i, fused := range []bool{true, false} {
				xt := upload(t, b, x)
				logits, ids, w := upload(t, b, make([]float32, c.experts)), upload(t, b, make([]float32, c.k)), upload(t, b, make([]float32, c.k))
				var err error
				if fused {
					var ok bool
					if ok, err = b.RouteFused(ids, w, logits, xt, gate, bias, c.k, c.rule); !ok && err == nil {
						t.Fatal("RouteFused declined an F32 gate")
					}
				} else if err = b.MatMul(logits, gate, xt, 1); err == nil {
					if bias != nil {
						err = b.AddBias(logits, bias, 1)
					}
					if err == nil {
						err = b.RouteTopK(ids, w, logits, 1, c.experts, c.k, c.rule)
					}
				}
				if err != nil {
					t.Fatal(err)
				}
				got[i] = [3][]float32{download(t, b, logits), download(t, b, ids), download(t, b, w)}
			}
			for j, what := range []string{"logits", "ids", "weights"} {
				fusedSame(t, fmt.Sprintf("%+v, %d experts, step %d: %s", tune, c.experts, step, what), got[0][j], got[1][j])
			}
		}
	}
}
