package gpu

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/conformance"
)

// TestQ8OpsMatchPlain: the ops that quantize their output on the side
// (RMSNormQ8, AddRMSNormQ8, SiLUMulQ8, AttentionQ8) and the products that
// read that copy (MatMulQ8, MatMulsQ8) give bit for bit what the plain ops
// and products give, at one row (the fused decode shape) and at several
// (where nothing is fused and the products quantize for themselves). The
// copy must be filled exactly at the fused shapes.
func TestQ8OpsMatchPlain(t *testing.T) {
	b := gpuBackend(t, true)
	rng := rand.New(rand.NewPCG(rand.Uint64(), 24))
	const embd, ff = 1024, 2048
	at := kernels.Attn{Heads: 8, KVHeads: 2, HeadDim: 128, Scale: 0.088}
	qDim, kvDim := at.Heads*at.HeadDim, at.KVHeads*at.HeadDim
	norm := &kernels.Weight{Name: "norm", Type: gguf.TypeF32, Cols: embd, Rows: 1, Host: f32bytes(randVec(rng, embd, 1))}
	weight := func(name string, typ gguf.Type, rows, cols int) *kernels.Weight {
		w := conformance.RandomWeight(rng, name, typ, rows, cols)
		t.Cleanup(func() { b.FreeWeight(w) })
		return w
	}
	// The weights read by products on xb: Q4_K ones share one launch
	// (MatMuls), the others each their own; F32 reads float x.
	onXB := []*kernels.Weight{
		weight("q", gguf.TypeQ4_K, qDim, embd), weight("k", gguf.TypeQ4_K, kvDim, embd),
		weight("v", gguf.TypeQ6_K, kvDim, embd), weight("b32", gguf.TypeQ4_0, 256, embd),
		weight("q8", gguf.TypeQ8_0, 256, embd), weight("f32", gguf.TypeF32, 64, embd),
	}
	down := weight("down", gguf.TypeQ6_K, embd, ff)
	wo := weight("o", gguf.TypeQ4_K, embd, qDim)
	alloc := func(n int) kernels.Tensor {
		x, err := b.Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Free(x) })
		return x
	}
	for _, n := range []int{1, 2, 5, 16} {
		// Two copies of every buffer: plain ops (p) and Q8 ops (q).
		xIn := randVec(rng, n*embd, 1)
		rIn := randVec(rng, n*embd, 1)
		gate, up := upload(t, b, randVec(rng, n*ff, 1)), upload(t, b, randVec(rng, n*ff, 1))
		xp, xq := upload(t, b, xIn), upload(t, b, xIn)
		r := upload(t, b, rIn)
		xbp, xbq := alloc(n*embd), alloc(n*embd)
		hp, hq := alloc(n*ff), alloc(n*ff)
		outs := func() []kernels.Tensor {
			var o []kernels.Tensor
			for _, w := range onXB {
				o = append(o, alloc(n*w.Rows))
			}
			return o
		}
		yp, yq, ysq := outs(), outs(), outs()
		dp, dq := alloc(n*embd), alloc(n*embd)
		xbQ, hQ := allocQ8(t, b, n, embd), allocQ8(t, b, n, ff)
		fused := n == 1

		// The norm with the residual add, then every product on its output.
		if err := b.AddRMSNorm(xbp, xp, r, norm, n, 1e-5); err != nil {
			t.Fatal(err)
		}
		c, err := b.AddRMSNormQ8(xbq, xq, r, norm, n, 1e-5, xbQ)
		if err != nil {
			t.Fatal(err)
		}
		if c.Empty() == fused {
			t.Fatalf("n=%d: add·rmsnorm filled the copy: %v", n, !c.Empty())
		}
		for i, w := range onXB {
			if err := b.MatMul(yp[i], w, xbp, n); err != nil {
				t.Fatal(err)
			}
			if err := b.MatMulQ8(yq[i], w, xbq, c, n); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.MatMulsQ8(ysq, onXB, xbq, c, n); err != nil {
			t.Fatal(err)
		}
		// The norm without the add: RMSNormQ8 over the same x, into
		// another buffer (xbq stays for the comparison below).
		xbq2 := alloc(n * embd)
		c2, err := b.RMSNormQ8(xbq2, xq, norm, n, 1e-5, xbQ)
		if err != nil {
			t.Fatal(err)
		}
		if c2.Empty() == fused {
			t.Fatalf("n=%d: rmsnorm filled the copy: %v", n, !c2.Empty())
		}
		xbr := alloc(n * embd)
		if err := b.RMSNorm(xbr, xp, norm, n, 1e-5); err != nil {
			t.Fatal(err)
		}
		yr, yrq := alloc(n*onXB[2].Rows), alloc(n*onXB[2].Rows)
		if err := b.MatMul(yr, onXB[2], xbr, n); err != nil {
			t.Fatal(err)
		}
		if err := b.MatMulQ8(yrq, onXB[2], xbq2, c2, n); err != nil {
			t.Fatal(err)
		}
		// SiLU·mul, then the down product on its output.
		if err := b.SiLUMul(hp, gate, up, n*ff); err != nil {
			t.Fatal(err)
		}
		hc, err := b.SiLUMulQ8(hq, gate, up, n*ff, hQ)
		if err != nil {
			t.Fatal(err)
		}
		if hc.Empty() {
			t.Fatalf("n=%d: silu·mul of %d values did not fill the copy", n, n*ff)
		}
		if err := b.MatMul(dp, down, hp, n); err != nil {
			t.Fatal(err)
		}
		if err := b.MatMulQ8(dq, down, hq, hc, n); err != nil {
			t.Fatal(err)
		}
		same := func(what string, p, q kernels.Tensor) {
			t.Helper()
			if got, want := download(t, b, q), download(t, b, p); !slices.Equal(got, want) {
				t.Errorf("n=%d: %s differs from the plain ops' (first at %d)", n, what, firstDiff(got, want))
			}
		}
		same("x after the residual add", xp, xq)
		same("xb", xbp, xbq)
		same("h", hp, hq)
		same("down", dp, dq)
		same("xb of rmsnorm", xbr, xbq2)
		same("v after rmsnorm", yr, yrq)
		for i, w := range onXB {
			same("product "+w.Name, yp[i], yq[i])
			same("matmuls "+w.Name, yp[i], ysq[i])
		}
	}

	// One token's attention, then the output projection on its copy.
	kv, err := b.NewKVCache(1, 64, kvDim)
	if err != nil {
		t.Fatal(err)
	}
	defer b.FreeKVCache(kv)
	attQ := allocQ8(t, b, 1, qDim)
	op, oq := alloc(embd), alloc(embd)
	for pos := range 3 {
		q := upload(t, b, randVec(rng, qDim, 1))
		k, v := upload(t, b, randVec(rng, kvDim, 1)), upload(t, b, randVec(rng, kvDim, 1))
		ap, aq := alloc(qDim), alloc(qDim)
		if err := b.Attention(ap, q, k, v, kv, 0, pos, 1, at); err != nil {
			t.Fatal(err)
		}
		c, err := b.AttentionQ8(aq, q, k, v, kv, 0, pos, 1, at, attQ) // stores the same k, v again
		if err != nil {
			t.Fatal(err)
		}
		if c.Empty() {
			t.Fatalf("pos %d: one token's attention did not fill the copy", pos)
		}
		if err := b.MatMul(op, wo, ap, 1); err != nil {
			t.Fatal(err)
		}
		if err := b.MatMulQ8(oq, wo, aq, c, 1); err != nil {
			t.Fatal(err)
		}
		if got, want := download(t, b, oq), download(t, b, op); !slices.Equal(got, want) {
			t.Errorf("pos %d: output projection on the attention's copy differs (first at %d)", pos, firstDiff(got, want))
		}
	}

	// A copy of the wrong shape is refused, not read.
	x := upload(t, b, randVec(rng, 2*embd, 1))
	y := alloc(2 * onXB[0].Rows)
	if err := b.MatMulQ8(y, onXB[0], x, allocQ8(t, b, 1, embd), 2); err == nil || !strings.Contains(err.Error(), "8-bit copy") {
		t.Errorf("a one-row copy for two rows: err = %v", err)
	}
}

// firstDiff is the first index where got and want differ (bit for bit), -1
// if none.
func firstDiff(got, want []float32) int {
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			return i
		}
	}
	return -1
}

// TestDevQ8 checks what a product accepts as a caller's copy (pure Go: the
// addresses are only looked at).
func TestDevQ8(t *testing.T) {
	buf := kernels.Tensor{Len: kernels.Q8Floats(4, 64), Dev: 1 << 20}
	q, err := kernels.Q8In(buf, 4, 64)
	if err != nil {
		t.Fatal(err)
	}
	d, err := devQ8("op", q, 4, 64)
	if err != nil {
		t.Fatal(err)
	}
	if d.codes != 1<<20 || d.scales != 1<<20+256 { // 256 codes, then the scales from the next 256 bytes
		t.Errorf("copy at codes %#x, scales %#x", d.codes, d.scales)
	}
	if d, err := devQ8("op", kernels.Q8{}, 4, 64); err != nil || !d.empty() {
		t.Errorf("the zero Q8: %+v, %v", d, err)
	}
	v := q.View(2, 2) // rows 2 and 3: codes 128 bytes on, scales 16 bytes on
	if d, err := devQ8("op", v, 2, 64); err != nil || d.codes != 1<<20+128 || d.scales != 1<<20+256+16 {
		t.Errorf("rows 2…3: %+v, %v", d, err)
	}
	for _, c := range []struct {
		name       string
		q          kernels.Q8
		rows, cols int
		want       string
	}{
		{"other rows", q, 3, 64, "4×64 values for 3×64"},
		{"other width", q, 4, 32, "4×64 values for 4×32"},
		{"host", kernels.Q8{Codes: kernels.Tensor{Len: 64, Host: make([]float32, 64)}, Scales: kernels.Tensor{Len: 8, Host: make([]float32, 8)}, Rows: 4, Cols: 64}, 4, 64, "not on the GPU"},
		{"unaligned", kernels.Q8{Codes: kernels.Tensor{Len: 64, Dev: 1<<20 + 4}, Scales: q.Scales, Rows: 4, Cols: 64}, 4, 64, "16-byte aligned"},
		{"short", kernels.Q8{Codes: q.Codes.View(0, 32), Scales: q.Scales, Rows: 4, Cols: 64}, 4, 64, "holds 128 codes"},
		{"partial block", kernels.Q8{Codes: q.Codes, Scales: q.Scales, Rows: 4, Cols: 48}, 4, 48, "whole blocks of 32"},
	} {
		if _, err := devQ8("op", c.q, c.rows, c.cols); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want it to say %q", c.name, err, c.want)
		}
	}
}
