package model

import (
	"fmt"
	"math"

	"github.com/forge-llm/forge/dequant"
	"github.com/forge-llm/forge/kernels"
)

// hostBackend is the plainest possible kernels.Backend: float32 on the
// host, weights dequantized row by row, no threads. The model tests run on
// it as well as on the real CPU backend, so a model-code bug and a kernel
// bug show up differently.
type hostBackend struct{}

type hostKV struct{ k, v []float32 } // [layers][ctx][kvDim]

func (hostBackend) Name() string { return "host" }

func (hostBackend) Alloc(n int) (kernels.Tensor, error) {
	return kernels.Tensor{Len: n, Host: make([]float32, n)}, nil
}
func (hostBackend) Free(kernels.Tensor) {}

func (hostBackend) NewKVCache(layers, ctx, kvDim int) (*kernels.KVCache, error) {
	n := layers * ctx * kvDim
	return &kernels.KVCache{Layers: layers, Ctx: ctx, KVDim: kvDim, Impl: &hostKV{make([]float32, n), make([]float32, n)}}, nil
}
func (hostBackend) FreeKVCache(*kernels.KVCache) {}

func (hostBackend) Write(dst kernels.Tensor, off int, src []float32) error {
	copy(dst.Host[off:], src)
	return nil
}

func (hostBackend) Read(dst []float32, src kernels.Tensor, off int) error {
	copy(dst, src.Host[off:off+len(dst)])
	return nil
}

func row(w *kernels.Weight, r int, dst []float32) error {
	rb, err := w.Type.RowBytes(uint64(w.Cols))
	if err != nil {
		return err
	}
	return dequant.ToFloat32(w.Type, w.Host[r*int(rb):(r+1)*int(rb)], dst)
}

func (hostBackend) Embed(dst kernels.Tensor, table *kernels.Weight, ids []int32) error {
	for i, id := range ids {
		if err := row(table, int(id), dst.Host[i*table.Cols:(i+1)*table.Cols]); err != nil {
			return err
		}
	}
	return nil
}

func (hostBackend) MatMul(dst kernels.Tensor, w *kernels.Weight, x kernels.Tensor, n int) error {
	if dst.Len != n*w.Rows || x.Len != n*w.Cols {
		return fmt.Errorf("host matmul %s: dst %d, x %d for %d rows of %d×%d", w.Name, dst.Len, x.Len, n, w.Rows, w.Cols)
	}
	wr := make([]float32, w.Cols)
	for r := range w.Rows {
		if err := row(w, r, wr); err != nil {
			return err
		}
		for i := range n {
			xi := x.Host[i*w.Cols : (i+1)*w.Cols]
			s := float32(0)
			for c, v := range wr {
				s += v * xi[c]
			}
			dst.Host[i*w.Rows+r] = s
		}
	}
	return nil
}

func (hostBackend) RMSNorm(dst, x kernels.Tensor, w *kernels.Weight, n int, eps float32) error {
	d := w.Cols
	wv := make([]float32, d)
	if err := row(w, 0, wv); err != nil {
		return err
	}
	for i := range n {
		xi, di := x.Host[i*d:(i+1)*d], dst.Host[i*d:(i+1)*d]
		ss := float32(0)
		for _, v := range xi {
			ss += v * v
		}
		inv := float32(1 / math.Sqrt(float64(ss/float32(d)+eps)))
		for j := range xi {
			di[j] = xi[j] * inv * wv[j]
		}
	}
	return nil
}

func (hostBackend) AddBias(x kernels.Tensor, b *kernels.Weight, n int) error {
	bv := make([]float32, b.Cols)
	if err := row(b, 0, bv); err != nil {
		return err
	}
	for i := range n {
		for j, v := range bv {
			x.Host[i*b.Cols+j] += v
		}
	}
	return nil
}

func (hostBackend) RoPE(x kernels.Tensor, n, heads, hd, pos0 int, r kernels.Rope) error {
	var freqs []float32
	if r.Freqs != nil {
		freqs = make([]float32, r.Freqs.Cols)
		if err := row(r.Freqs, 0, freqs); err != nil {
			return err
		}
	}
	for i := range n {
		for h := range heads {
			v := x.Host[(i*heads+h)*hd : (i*heads+h+1)*hd]
			for p := range r.Dim / 2 {
				theta := float64(pos0+i) * float64(r.Scale) * math.Pow(float64(r.Base), -2*float64(p)/float64(r.Dim))
				if freqs != nil {
					theta /= float64(freqs[p])
				}
				a, b := 2*p, 2*p+1
				if r.NeoX {
					a, b = p, p+r.Dim/2
				}
				c, s := float32(math.Cos(theta)), float32(math.Sin(theta))
				v[a], v[b] = v[a]*c-v[b]*s, v[a]*s+v[b]*c
			}
		}
	}
	return nil
}

func (hostBackend) Attention(out, q, k, v kernels.Tensor, c *kernels.KVCache, layer, pos0, n int, a kernels.Attn) error {
	kv := c.Impl.(*hostKV)
	d, hd := c.KVDim, a.HeadDim
	base := layer * c.Ctx * d
	copy(kv.k[base+pos0*d:], k.Host[:n*d])
	copy(kv.v[base+pos0*d:], v.Host[:n*d])
	group := a.Heads / a.KVHeads
	scores := make([]float32, pos0+n)
	for i := range n {
		last := pos0 + i
		for h := range a.Heads {
			qh := q.Host[(i*a.Heads+h)*hd : (i*a.Heads+h+1)*hd]
			off := (h / group) * hd
			first := a.First(last)
			mx := float32(math.Inf(-1))
			for t := first; t <= last; t++ {
				kt := kv.k[base+t*d+off : base+t*d+off+hd]
				s := float32(0)
				for j := range hd {
					s += qh[j] * kt[j]
				}
				scores[t] = a.Cap(s * a.Scale)
				mx = max(mx, scores[t])
			}
			var sink float32
			if a.Sinks != nil {
				sv := make([]float32, a.Sinks.Cols)
				if err := row(a.Sinks, 0, sv); err != nil {
					return err
				}
				sink = sv[h]
				mx = max(mx, sink)
			}
			sum := float32(0)
			for t := first; t <= last; t++ {
				scores[t] = float32(math.Exp(float64(scores[t] - mx)))
				sum += scores[t]
			}
			if a.Sinks != nil { // a score with no value
				sum += float32(math.Exp(float64(sink - mx)))
			}
			oh := out.Host[(i*a.Heads+h)*hd : (i*a.Heads+h+1)*hd]
			clear(oh)
			for t := first; t <= last; t++ {
				vt := kv.v[base+t*d+off : base+t*d+off+hd]
				for j := range hd {
					oh[j] += scores[t] / sum * vt[j]
				}
			}
		}
	}
	return nil
}

func (hostBackend) SiLUMul(dst, gate, up kernels.Tensor, n int) error {
	for i := range n {
		g := gate.Host[i]
		dst.Host[i] = g / (1 + float32(math.Exp(float64(-g)))) * up.Host[i]
	}
	return nil
}

func (hostBackend) Add(dst, a, b kernels.Tensor, n int) error {
	for i := range n {
		dst.Host[i] = a.Host[i] + b.Host[i]
	}
	return nil
}

func (hostBackend) GELUMul(dst, gate, up kernels.Tensor, n int) error {
	for i := range n {
		x := float64(gate.Host[i])
		dst.Host[i] = float32(0.5*x*(1+math.Tanh(0.7978845608028654*x*(1+0.044715*x*x)))) * up.Host[i]
	}
	return nil
}

func (hostBackend) Scale(dst, x kernels.Tensor, s float32, n int) error {
	for i := range n {
		dst.Host[i] = x.Host[i] * s
	}
	return nil
}

func (hostBackend) Softcap(x kernels.Tensor, c float32, n int) error {
	for i := range n {
		x.Host[i] = c * float32(math.Tanh(float64(x.Host[i]/c)))
	}
	return nil
}

// AttentionSinks: Attention honours kernels.Attn.Sinks.
func (hostBackend) AttentionSinks() bool { return true }

// SwiGLUOAI is gpt-oss's clamped SwiGLU.
func (hostBackend) SwiGLUOAI(dst, gate, up kernels.Tensor, n int, alpha, limit float32) error {
	for i := range n {
		g := min(gate.Host[i], limit)
		u := min(max(up.Host[i], -limit), limit)
		dst.Host[i] = g / (1 + float32(math.Exp(float64(-alpha*g)))) * (u + 1)
	}
	return nil
}
