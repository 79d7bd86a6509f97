package model

import (
	"fmt"
	"math"
	"testing"

	"github.com/forge-llm/forge/dequant"
	"github.com/forge-llm/forge/gguf"
)

// refModel is a plain float64 implementation of the Llama and Qwen2 math,
// written independently of the backend ops: every weight dequantized once
// (dequant.ToFloat32), every activation in float64, one token at a time.
// It is the reference the backend-driven Model is checked against.
type refModel struct {
	c Config
	// mats holds each tensor as rows of float64, by tensor name.
	mats map[string][][]float64
	// cache[l] holds the keys and values of layer l, one row per position.
	kcache, vcache [][][]float64
}

func newRef(tb testing.TB, f *gguf.File, c Config) *refModel {
	tb.Helper()
	r := &refModel{c: c, mats: map[string][][]float64{}}
	for i := range f.Tensors {
		ti := &f.Tensors[i]
		data, err := f.TensorData(ti)
		if err != nil {
			tb.Fatal(err)
		}
		cols, rows := int(ti.Dims[0]), int(ti.Rows())
		flat := make([]float32, cols*rows)
		if err := dequant.ToFloat32(ti.Type, data, flat); err != nil {
			tb.Fatalf("reference: %s: %v", ti.Name, err)
		}
		m := make([][]float64, rows)
		for j := range m {
			m[j] = make([]float64, cols)
			for k := range cols {
				m[j][k] = float64(flat[j*cols+k])
			}
		}
		r.mats[ti.Name] = m
	}
	r.kcache = make([][][]float64, c.Layers)
	r.vcache = make([][][]float64, c.Layers)
	return r
}

func (r *refModel) mat(name string) [][]float64 {
	m, ok := r.mats[name]
	if !ok {
		panic("reference: no tensor " + name)
	}
	return m
}

func (r *refModel) vec(name string) []float64 { return r.mat(name)[0] }

// matvec returns W·x for W [rows][cols], x [cols].
func matvec(w [][]float64, x []float64) []float64 {
	out := make([]float64, len(w))
	for i, row := range w {
		s := 0.0
		for j, v := range row {
			s += v * x[j]
		}
		out[i] = s
	}
	return out
}

func rmsnorm(x, w []float64, eps float64) []float64 {
	ss := 0.0
	for _, v := range x {
		ss += v * v
	}
	inv := 1 / math.Sqrt(ss/float64(len(x))+eps)
	out := make([]float64, len(x))
	for i := range x {
		out[i] = x[i] * inv * w[i]
	}
	return out
}

// rope rotates each head of x in place at position pos.
func (r *refModel) rope(x []float64, heads, pos int) {
	c := r.c
	d, hd := c.Rope.Dim, c.HeadDim
	var freqs []float64
	if _, ok := r.mats["rope_freqs.weight"]; ok {
		freqs = r.vec("rope_freqs.weight")
	}
	for h := range heads {
		v := x[h*hd : (h+1)*hd]
		for i := range d / 2 {
			theta := float64(pos) * float64(c.Rope.Scale) * math.Pow(float64(c.Rope.Base), -2*float64(i)/float64(d))
			if freqs != nil {
				theta /= freqs[i]
			}
			a, b := 2*i, 2*i+1
			if c.Rope.NeoX {
				a, b = i, i+d/2
			}
			cos, sin := math.Cos(theta), math.Sin(theta)
			v[a], v[b] = v[a]*cos-v[b]*sin, v[a]*sin+v[b]*cos
		}
	}
}

func addVec(x, b []float64) {
	for i := range x {
		x[i] += b[i]
	}
}

// forward evaluates one token at position pos (all earlier positions must
// have been evaluated) and returns its logits.
func (r *refModel) forward(tok int32, pos int) []float64 {
	c := r.c
	eps := float64(c.NormEps)
	x := append([]float64(nil), r.mat("token_embd.weight")[tok]...)
	for l := range c.Layers {
		p := fmt.Sprintf("blk.%d.", l)
		xb := rmsnorm(x, r.vec(p+"attn_norm.weight"), eps)
		q := matvec(r.mat(p+"attn_q.weight"), xb)
		k := matvec(r.mat(p+"attn_k.weight"), xb)
		v := matvec(r.mat(p+"attn_v.weight"), xb)
		if c.Bias {
			addVec(q, r.vec(p+"attn_q.bias"))
			addVec(k, r.vec(p+"attn_k.bias"))
			addVec(v, r.vec(p+"attn_v.bias"))
		}
		r.rope(q, c.Heads, pos)
		r.rope(k, c.KVHeads, pos)
		r.kcache[l] = append(r.kcache[l][:pos], k)
		r.vcache[l] = append(r.vcache[l][:pos], v)

		hd, group := c.HeadDim, c.Heads/c.KVHeads
		att := make([]float64, c.QDim())
		for h := range c.Heads {
			kvh := h / group
			qh := q[h*hd : (h+1)*hd]
			scores := make([]float64, pos+1)
			maxS := math.Inf(-1)
			for t := 0; t <= pos; t++ {
				kt := r.kcache[l][t][kvh*hd : (kvh+1)*hd]
				s := 0.0
				for i := range hd {
					s += qh[i] * kt[i]
				}
				scores[t] = s / math.Sqrt(float64(hd))
				maxS = max(maxS, scores[t])
			}
			sum := 0.0
			for t := range scores {
				scores[t] = math.Exp(scores[t] - maxS)
				sum += scores[t]
			}
			for t := range scores {
				vt := r.vcache[l][t][kvh*hd : (kvh+1)*hd]
				for i := range hd {
					att[h*hd+i] += scores[t] / sum * vt[i]
				}
			}
		}
		addVec(x, matvec(r.mat(p+"attn_output.weight"), att))

		xb = rmsnorm(x, r.vec(p+"ffn_norm.weight"), eps)
		if c.Experts > 0 { // Mixtral (moe_internal_test.go)
			addVec(x, r.mixture(p, xb))
			continue
		}
		g := matvec(r.mat(p+"ffn_gate.weight"), xb)
		u := matvec(r.mat(p+"ffn_up.weight"), xb)
		for i := range g {
			g[i] = g[i] / (1 + math.Exp(-g[i])) * u[i]
		}
		addVec(x, matvec(r.mat(p+"ffn_down.weight"), g))
	}
	x = rmsnorm(x, r.vec("output_norm.weight"), eps)
	out := r.mats["output.weight"]
	if out == nil {
		out = r.mat("token_embd.weight")
	}
	return matvec(out, x)
}
