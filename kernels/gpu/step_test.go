package gpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/conformance"
	"github.com/forge-llm/forge/rocm"
)

// stepBufs are the buffers of one copy of the small decode step below.
type stepBufs struct {
	x, xb, y1, y2, h, z, q, k, v, att, o kernels.Tensor
	xbQ, hQ, attQ                        kernels.Q8 // the 8-bit copies of xb, h and att
	kv                                   *kernels.KVCache
}

// TestStepGraphMatchesOps records a decode-shaped step (embedding of one
// token, RMSNorm, Q4_K and Q6_K products on the same input, SiLU·mul, a
// product on its output, RoPE of queries and keys, attention over a
// growing cache, a residual add fused with a norm) and replays it at every
// position of a 300-position context with fresh tokens and values, against
// the same ops queued one by one on a second set of buffers and a second
// cache. Positions come from the device in the replays, so the rotation
// and the attention's length must follow them; the kernels and grids are
// the same either way, so the outputs must be equal.
// The fused 8-bit quantization must give the products exactly what
// quantize_q8 gives them: the products are compared with a third copy run
// without the fused kernels.
//
// It runs with the decode kernels' default ways and with decode attention
// splits of at least 64 positions (EnvDecodeTuning's minsplit).
func TestStepGraphMatchesOps(t *testing.T) {
	for _, tune := range []decodeTuning{defaultTuning, {attnMinSplit: 64}} {
		t.Run(fmt.Sprintf("minsplit=%d", tune.attnMinSplit), func(t *testing.T) { stepGraphMatchesOps(t, tune) })
	}
}

func stepGraphMatchesOps(t *testing.T, tune decodeTuning) {
	sb := gpuBackend(t, true)
	b, err := New(sb.w, Options{KVF32: true})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	plain, err := New(sb.w, Options{KVF32: true})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	plain.noFuse = true
	plain.overlap = false // and each kernel after the last: b's graph and ops are overlapped on Hopper
	b.tune, plain.tune = tune, tune
	before := rocm.Live()

	rng := rand.New(rand.NewPCG(rand.Uint64(), 11))
	const embd, ff, ctxLen, vocab = 512, 1024, 300, 64
	at := kernels.Attn{Heads: 8, KVHeads: 2, HeadDim: 64, Scale: 0.125}
	rope := kernels.Rope{Dim: 64, Base: 10000, Scale: 1}
	kvDim := at.KVHeads * at.HeadDim
	table := conformance.RandomWeight(rng, "embd", gguf.TypeQ4_K, vocab, embd)
	norm := &kernels.Weight{Name: "norm", Type: gguf.TypeF32, Cols: embd, Rows: 1, Host: f32bytes(randVec(rng, embd, 1))}
	w1 := conformance.RandomWeight(rng, "w1", gguf.TypeQ4_K, ff, embd)
	w2 := conformance.RandomWeight(rng, "w2", gguf.TypeQ6_K, ff, embd)
	w3 := conformance.RandomWeight(rng, "w3", gguf.TypeQ4_K, embd, ff)
	wq := conformance.RandomWeight(rng, "wq", gguf.TypeQ6_K, at.Heads*at.HeadDim, embd)
	wk := conformance.RandomWeight(rng, "wk", gguf.TypeQ4_K, kvDim, embd)
	wo := conformance.RandomWeight(rng, "wo", gguf.TypeQ6_K, embd, at.Heads*at.HeadDim)

	mk := func(bk *Backend) *stepBufs {
		s := &stepBufs{}
		for _, p := range []struct {
			t *kernels.Tensor
			n int
		}{{&s.x, embd}, {&s.xb, embd}, {&s.y1, ff}, {&s.y2, ff}, {&s.h, ff}, {&s.z, embd},
			{&s.q, at.Heads * at.HeadDim}, {&s.k, kvDim}, {&s.v, kvDim}, {&s.att, at.Heads * at.HeadDim}, {&s.o, embd}} {
			var err error
			if *p.t, err = bk.Alloc(p.n); err != nil {
				t.Fatal(err)
			}
			tt := *p.t
			t.Cleanup(func() { bk.Free(tt) })
		}
		var err error
		if s.kv, err = bk.NewKVCache(1, ctxLen, kvDim); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { bk.FreeKVCache(s.kv) })
		s.xbQ, s.hQ, s.attQ = allocQ8(t, bk, 1, embd), allocQ8(t, bk, 1, ff), allocQ8(t, bk, 1, at.Heads*at.HeadDim)
		return s
	}
	// step queues the ops; v is written by the host before each step (it
	// stands for a product's output). The norm, SiLU·mul and attention
	// quantize their outputs on the side where the backend fuses (b), and
	// the products read those copies; plain's products quantize.
	step := func(bk *Backend, s *stepBufs, tok int32, pos int) error {
		ids := []int32{tok}
		var xq, hq, aq kernels.Q8
		for _, op := range []func() error{
			func() error { return bk.Embed(s.x, table, ids) },
			func() (err error) { xq, err = bk.RMSNormQ8(s.xb, s.x, norm, 1, 1e-5, s.xbQ); return err },
			func() error { return wantQ8(bk, "rmsnorm", xq) },
			func() error { return bk.MatMulQ8(s.y1, w1, s.xb, xq, 1) },
			func() error { return bk.MatMulQ8(s.y2, w2, s.xb, xq, 1) },
			func() error { return bk.MatMulQ8(s.q, wq, s.xb, xq, 1) },
			func() error { return bk.MatMulQ8(s.k, wk, s.xb, xq, 1) },
			func() (err error) { hq, err = bk.SiLUMulQ8(s.h, s.y1, s.y2, ff, s.hQ); return err },
			func() error { return wantQ8(bk, "silu·mul", hq) },
			func() error { return bk.MatMulQ8(s.z, w3, s.h, hq, 1) },
			func() error { return bk.RoPE(s.q, 1, at.Heads, at.HeadDim, pos, rope) },
			func() error { return bk.RoPE(s.k, 1, at.KVHeads, at.HeadDim, pos, rope) },
			func() (err error) {
				aq, err = bk.AttentionQ8(s.att, s.q, s.k, s.v, s.kv, 0, pos, 1, at, s.attQ)
				return err
			},
			func() error { return wantQ8(bk, "attention", aq) },
			func() error { return bk.MatMulQ8(s.o, wo, s.att, aq, 1) },
			func() error { return bk.AddRMSNorm(s.xb, s.x, s.z, norm, 1, 1e-5) }, // x += z; xb = norm(x)
		} {
			if err := op(); err != nil {
				return err
			}
		}
		return nil
	}
	sg, sp, sf := mk(b), mk(b), mk(plain)
	var g kernels.StepGraph
	worst := map[string]float64{}
	for pos := range ctxLen {
		tok := int32(rng.IntN(vocab))
		v := randVec(rng, kvDim, 1)
		for _, c := range []struct {
			bk *Backend
			s  *stepBufs
		}{{b, sg}, {b, sp}, {plain, sf}} {
			if err := c.bk.Write(c.s.v, 0, v); err != nil {
				t.Fatal(err)
			}
		}
		switch {
		case g == nil:
			if g, err = b.CaptureStep(tok, pos, func() error { return step(b, sg, tok, pos) }); err != nil {
				t.Fatal(err)
			}
			// The driver recorded every kernel (the check CaptureStep
			// makes, which a HIP runtime that runs work during capture
			// fails): one node per launch, none missing.
			if n, want := g.(*stepGraph).g.Nodes(), b.step.launches; n < want || want == 0 {
				t.Fatalf("captured graph has %d nodes for %d launches", n, want)
			}
		default:
			if err := b.RunStep(g, tok, pos); err != nil {
				t.Fatalf("pos %d: %v", pos, err)
			}
		}
		if err := step(b, sp, tok, pos); err != nil {
			t.Fatal(err)
		}
		if err := step(plain, sf, tok, pos); err != nil {
			t.Fatal(err)
		}
		for _, o := range []struct {
			name        string
			got, want   kernels.Tensor
			gotB, wantB *Backend
			bound       float64
		}{
			{"x", sg.x, sp.x, b, b, 0},
			{"y1", sg.y1, sf.y1, b, plain, 0}, // fused vs quantize_q8: exact
			{"y2", sg.y2, sf.y2, b, plain, 0},
			{"z", sg.z, sf.z, b, plain, 0},
			{"o", sg.o, sf.o, b, plain, 0}, // the attention's fused copy vs quantize_q8
			{"k", sg.k, sp.k, b, b, 0},
			{"q", sg.q, sp.q, b, b, 0},
			{"att", sg.att, sp.att, b, b, 0}, // the same grid: exact
			{"xb", sg.xb, sp.xb, b, b, 0},
		} {
			got, want := download(t, o.gotB, o.got), download(t, o.wantB, o.want)
			e := relNorm(got, f64(want))
			if e > worst[o.name] || math.IsNaN(e) {
				worst[o.name] = e
			}
			if !(e <= o.bound) {
				t.Fatalf("pos %d: %s of the replayed step differs from the ops by %.3g (bound %g)", pos, o.name, e, o.bound)
			}
		}
	}
	t.Logf("worst relative difference over %d positions: %v", ctxLen, worst)
	b.FreeStep(g)
	if err := b.RunStep(g, 0, 0); err == nil {
		t.Error("RunStep of a freed graph succeeded")
	}
	if got := rocm.Live(); got.Graphs != before.Graphs {
		t.Errorf("live graphs %d after FreeStep, %d before", got.Graphs, before.Graphs)
	}
}

// TestStepCaptureRefusesHostIO: a step that reads back or writes host data
// cannot be recorded; the capture fails with an error, the stream leaves
// capture mode and the backend keeps working.
func TestStepCaptureRefusesHostIO(t *testing.T) {
	b := gpuBackend(t, false)
	x := upload(t, b, []float32{1, 2, 3, 4})
	y, err := b.Alloc(4)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free(y)
	out := make([]float32, 4)
	_, err = b.CaptureStep(0, 0, func() error {
		if err := b.Add(y, x, x, 4); err != nil {
			return err
		}
		return b.Read(out, y, 0)
	})
	if err == nil {
		t.Fatal("capturing a step that reads back succeeded")
	}
	t.Logf("capture refused: %v", err)
	if err := b.Add(y, x, x, 4); err != nil {
		t.Fatal(err)
	}
	got := download(t, b, y)
	for i, v := range got {
		if v != float32(2*(i+1)) {
			t.Fatalf("after a refused capture: y = %v", got)
		}
	}
}

func f64(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// TestArgmaxOneRow checks the one-row argmax (two launches over slices for
// a long row, as the greedy decode takes it) against the host: random rows,
// a tie planted at two places (the lower index wins), a row of -inf.
func TestArgmaxOneRow(t *testing.T) {
	b := gpuBackend(t, false)
	rng := rand.New(rand.NewPCG(rand.Uint64(), 12))
	for _, cols := range []int{128256, 32000, 2*argmaxChunk + 5, 37} {
		for trial := range 3 {
			x := randVec(rng, cols, 3)
			switch trial {
			case 1: // a tie for the maximum
				i, j := rng.IntN(cols), rng.IntN(cols)
				x[i], x[j] = 100, 100
			case 2:
				for i := range x {
					x[i] = float32(math.Inf(-1))
				}
			}
			best := 0
			for c := range x {
				if x[c] > x[best] {
					best = c
				}
			}
			got, err := b.Argmax(upload(t, b, x), 1, cols)
			if err != nil {
				t.Fatal(err)
			}
			if int(got[0]) != best {
				t.Errorf("argmax of %d values (trial %d): got %d, want %d", cols, trial, got[0], best)
			}
		}
	}
}

// TestMatMulsEqualsMatMul: MatMuls (one launch for the Q4_K weights of one
// input, MatMul for the others) gives exactly what one MatMul per weight
// gives, for Q/K/V-like and gate/up-like sets, one row and several.
func TestMatMulsEqualsMatMul(t *testing.T) {
	b := gpuBackend(t, false)
	rng := rand.New(rand.NewPCG(rand.Uint64(), 13))
	sets := [][]struct {
		typ        gguf.Type
		rows, cols int
	}{
		{{gguf.TypeQ4_K, 4096, 4096}, {gguf.TypeQ4_K, 1024, 4096}, {gguf.TypeQ6_K, 1024, 4096}},
		{{gguf.TypeQ4_K, 4096, 4096}, {gguf.TypeQ4_K, 1024, 4096}, {gguf.TypeQ4_K, 1024, 4096}},
		{{gguf.TypeQ4_K, 3000, 2048}, {gguf.TypeQ4_K, 3000, 2048}},
		{{gguf.TypeQ6_K, 512, 1024}, {gguf.TypeQ4_K, 300, 1024}},
		{{gguf.TypeQ6_K, 120, 2816}, {gguf.TypeQ4_K, 300, 2816}, {gguf.TypeQ4_K, 200, 2816}}, // 11 super-blocks a row
	}
	for si, set := range sets {
		for _, n := range []int{1, 3} {
			ws := make([]*kernels.Weight, len(set))
			var got, want []kernels.Tensor
			for i, s := range set {
				ws[i] = conformance.RandomWeight(rng, "w", s.typ, s.rows, s.cols)
				w := ws[i]
				t.Cleanup(func() { b.FreeWeight(w) })
				for _, l := range []*[]kernels.Tensor{&got, &want} {
					d, err := b.Alloc(n * s.rows)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { b.Free(d) })
					*l = append(*l, d)
				}
			}
			x := upload(t, b, randVec(rng, n*set[0].cols, 1))
			if err := b.MatMuls(got, ws, x, n); err != nil {
				t.Fatal(err)
			}
			for i, w := range ws {
				if err := b.MatMul(want[i], w, x, n); err != nil {
					t.Fatal(err)
				}
			}
			for i := range ws {
				g, w := download(t, b, got[i]), download(t, b, want[i])
				for j := range w {
					if g[j] != w[j] {
						t.Fatalf("set %d, %d rows, weight %d (%v %d×%d): element %d = %g, MatMul gives %g",
							si, n, i, set[i].typ, set[i].rows, set[i].cols, j, g[j], w[j])
					}
				}
			}
		}
	}
}

// TestCheckCaptured is the capture check on its own: a graph with fewer
// nodes than launches (an empty one, from a runtime that ran the kernels
// during capture) is refused, naming both counts.
func TestCheckCaptured(t *testing.T) {
	if err := checkCaptured(12, 12); err != nil {
		t.Errorf("12 nodes for 12 launches: %v", err)
	}
	if err := checkCaptured(14, 12); err != nil { // copies and sets are nodes too
		t.Errorf("14 nodes for 12 launches: %v", err)
	}
	err := checkCaptured(0, 12)
	if err == nil || !strings.Contains(err.Error(), "0 nodes for 12 kernel launches") {
		t.Errorf("empty graph: %v", err)
	}
}

// allocQ8 is an 8-bit copy of rows×cols values in a buffer of bk's.
func allocQ8(t testing.TB, bk *Backend, rows, cols int) kernels.Q8 {
	t.Helper()
	buf, err := bk.Alloc(kernels.Q8Floats(rows, cols))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bk.Free(buf) })
	q, err := kernels.Q8In(buf, rows, cols)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// wantQ8 checks that an op of bk filled its 8-bit copy exactly when bk
// fuses: otherwise the comparison of fused and plain steps would compare
// quantize_q8 with itself.
func wantQ8(bk *Backend, op string, q kernels.Q8) error {
	if q.Empty() != bk.noFuse {
		return fmt.Errorf("%s: 8-bit copy filled: %v, with fusing %v", op, !q.Empty(), !bk.noFuse)
	}
	return nil
}
