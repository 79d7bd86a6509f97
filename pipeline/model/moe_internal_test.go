package model

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// refRoute is the router written plainly, in float64: the softmax of the
// logits, the experts sorted by probability (ties: the lower index), the
// first k, their probabilities divided by their sum (at least 2⁻¹⁴).
func refRoute(logits []float32, k int) ([]int32, []float64) {
	mx := math.Inf(-1)
	for _, v := range logits {
		mx = max(mx, float64(v))
	}
	p := make([]float64, len(logits))
	var sum float64
	for i, v := range logits {
		p[i] = math.Exp(float64(v) - mx)
		sum += p[i]
	}
	idx := make([]int32, len(logits))
	for i := range idx {
		idx[i] = int32(i)
		p[i] /= sum
	}
	slices.SortStableFunc(idx, func(a, b int32) int {
		switch {
		case p[a] > p[b]:
			return -1
		case p[a] < p[b]:
			return 1
		}
		return 0
	})
	idx = idx[:k]
	var total float64
	for _, e := range idx {
		total += p[e]
	}
	total = max(total, 6.103515625e-5)
	w := make([]float64, k)
	for j, e := range idx {
		w[j] = p[e] / total
	}
	return idx, w
}

// TestRouteAgainstReference: the host router (softmax, top-k, weights
// renormalised) picks the reference's experts in its order, with its
// weights to float32 precision, on random logits of every width and
// spread the architectures use, and on ties (the lower index first).
func TestRouteAgainstReference(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 1))
	for _, c := range []struct{ experts, k int }{{8, 2}, {16, 4}, {128, 8}, {32, 4}, {8, 8}, {1, 1}, {64, 1}} {
		for _, spread := range []float64{0.1, 3, 30} {
			const n = 9
			logits := make([]float32, n*c.experts)
			for i := range logits {
				logits[i] = float32(r.NormFloat64() * spread)
			}
			if c.experts >= 4 { // a tie among the best
				logits[2] = 1000
				logits[3] = 1000
			}
			sel, w := make([]int32, n*c.k), make([]float32, n*c.k)
			route(logits, n, c.experts, c.k, sel, w, make([]float32, c.experts))
			for tok := range n {
				wantSel, wantW := refRoute(logits[tok*c.experts:(tok+1)*c.experts], c.k)
				gotSel, gotW := sel[tok*c.k:(tok+1)*c.k], w[tok*c.k:(tok+1)*c.k]
				if !slices.Equal(gotSel, wantSel) {
					t.Fatalf("%d experts, top %d, spread %g, token %d: experts %v, want %v", c.experts, c.k, spread, tok, gotSel, wantSel)
				}
				var sum float64
				for j := range gotW {
					if d := math.Abs(float64(gotW[j]) - wantW[j]); d > 1e-6 {
						t.Errorf("%d experts, top %d, token %d, slot %d: weight %v, want %v", c.experts, c.k, tok, j, gotW[j], wantW[j])
					}
					sum += float64(gotW[j])
				}
				if math.Abs(sum-1) > 1e-5 {
					t.Errorf("%d experts, top %d, token %d: weights sum to %v", c.experts, c.k, tok, sum)
				}
			}
		}
	}
}

// TestRouteNaN: NaN and infinite logits (a broken model's) still route to
// distinct experts in range, with finite weights, instead of failing.
func TestRouteNaN(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	logits := []float32{nan, nan, nan, nan, 1, nan, inf, 2, inf, inf, -inf, 0}
	sel, w := make([]int32, 3*2), make([]float32, 3*2)
	route(logits, 3, 4, 2, sel, w, make([]float32, 4))
	for tok := range 3 {
		s := sel[tok*2 : tok*2+2]
		if s[0] == s[1] || min(s[0], s[1]) < 0 || max(s[0], s[1]) >= 4 {
			t.Errorf("token %d: experts %v", tok, s)
		}
	}
	for i, v := range w {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			t.Errorf("weight %d = %v", i, v)
		}
	}
}

// TestMoEGroup: the step's (token, slot) pairs grouped by expert, tokens
// ascending within each, each pair's row pointing back at its place.
func TestMoEGroup(t *testing.T) {
	c := Config{Experts: 5, ExpertsUsed: 2}
	st := newMoeState(c, 4)
	copy(st.sel, []int32{3, 0, 0, 4, 3, 1, 0, 3}) // tokens 0…3, two slots each
	st.group(4, 5, 2)
	if want := []int32{0, 3, 4, 4, 7, 8}; !slices.Equal(st.start, want) {
		t.Fatalf("start %v, want %v", st.start, want)
	}
	if want := []int32{1, 2, 6, 5, 0, 4, 7, 3}; !slices.Equal(st.order, want) {
		t.Fatalf("order %v, want %v", st.order, want)
	}
	for i, r := range st.row {
		if st.order[r] != int32(i) {
			t.Errorf("pair %d: row %d holds pair %d", i, r, st.order[r])
		}
	}
}

// mixture is the reference's mixture of experts on xb at the block whose
// tensors start with p: refRoute's experts and weights, each expert's
// SwiGLU on its rows of the stacked tensors, summed in float64.
func (r *refModel) mixture(p string, xb []float64) []float64 {
	c := r.c
	router := matvec(r.mat(p+"ffn_gate_inp.weight"), xb)
	logits := make([]float32, len(router))
	for i, v := range router {
		logits[i] = float32(v)
	}
	sel, w := refRoute(logits, c.ExpertsUsed)
	out := make([]float64, c.Embd)
	gate, up, down := r.mat(p+"ffn_gate_exps.weight"), r.mat(p+"ffn_up_exps.weight"), r.mat(p+"ffn_down_exps.weight")
	for j, e := range sel {
		f := int(e) * c.ExpertFF
		g := matvec(gate[f:f+c.ExpertFF], xb)
		u := matvec(up[f:f+c.ExpertFF], xb)
		for i := range g {
			g[i] = g[i] / (1 + math.Exp(-g[i])) * u[i]
		}
		d := matvec(down[int(e)*c.Embd:(int(e)+1)*c.Embd], g)
		for i := range out {
			out[i] += w[j] * d[i]
		}
	}
	return out
}

// TestScratchFloatsCountsGroupedBuffer: the Engine's estimate
// (ScratchFloats) of a mixture includes the grouped prompt path's buffer,
// which the model allocates at its first grouped prompt; a dense model's
// does not change.
func TestScratchFloatsCountsGroupedBuffer(t *testing.T) {
	moe := Config{Layers: 2, Embd: 64, Heads: 4, KVHeads: 2, HeadDim: 16, FF: 128, Vocab: 100,
		Experts: 8, ExpertsUsed: 2, ExpertFF: 48}
	dense := moe
	dense.Experts, dense.ExpertsUsed, dense.ExpertFF = 0, 0, 0
	for _, rows := range []int{1, 64, 512} {
		var pieces int64
		for _, p := range (&scratch{}).pieces(moe, rows, 1, min(rows, 64)) {
			pieces += int64(p.n)
		}
		if got, want := ScratchFloats(moe, rows, 1), pieces+2*int64(rows)*2*48; got != want {
			t.Errorf("mixture, %d rows: ScratchFloats %d, want the pieces %d and the grouped buffer %d", rows, got, pieces, want-pieces)
		}
		pieces = 0
		for _, p := range (&scratch{}).pieces(dense, rows, 1, min(rows, 64)) {
			pieces += int64(p.n)
		}
		if got := ScratchFloats(dense, rows, 1); got != pieces {
			t.Errorf("dense, %d rows: ScratchFloats %d, want the pieces %d", rows, got, pieces)
		}
	}
}
