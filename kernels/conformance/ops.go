package conformance

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/forge-llm/forge/kernels"
)

// buffers: Alloc returns zeros; Write/Read round-trip at offsets and
// through views.
func (s *suite) buffers(t *testing.T) {
	b := s.newBackend(t)
	rng := s.rng(t)
	for _, n := range []int{1, 7, 4096, 100003} {
		x := alloc(t, b, n)
		if x.Len != n {
			t.Fatalf("alloc %d: Len = %d", n, x.Len)
		}
		for i, v := range download(t, b, x) {
			if v != 0 {
				t.Fatalf("alloc %d: element %d = %g, want 0", n, i, v)
			}
		}
		v := RandomVector(rng, n, 1)
		if err := b.Write(x, 0, v); err != nil {
			t.Fatal(err)
		}
		off := n / 3
		part := RandomVector(rng, n-off, 1)
		if err := b.Write(x, off, part); err != nil {
			t.Fatal(err)
		}
		copy(v[off:], part)
		got := make([]float32, n-off/2)
		if err := b.Read(got, x, off/2); err != nil {
			t.Fatal(err)
		}
		for i, g := range got {
			if g != v[off/2+i] {
				t.Fatalf("n=%d: read element %d = %g, want %g", n, off/2+i, g, v[off/2+i])
			}
		}
		if n > 2 {
			view := x.View(1, n-2)
			got := make([]float32, n-2)
			if err := b.Read(got, view, 0); err != nil {
				t.Fatal(err)
			}
			if got[0] != v[1] || got[n-3] != v[n-2] {
				t.Fatalf("n=%d: view reads %g…%g, want %g…%g", n, got[0], got[n-3], v[1], v[n-2])
			}
		}
	}
	if err := b.Write(alloc(t, b, 4), 2, make([]float32, 3)); err == nil {
		t.Errorf("write past the end of a tensor returned no error")
	}
	if err := b.Read(make([]float32, 5), alloc(t, b, 4), 0); err == nil {
		t.Errorf("read past the end of a tensor returned no error")
	}
}

var vecSizes = []int{1, 3, 31, 768, 4096, 14336, 100003}

func (s *suite) add(t *testing.T) {
	b := s.newBackend(t)
	rng := s.rng(t)
	for _, n := range vecSizes {
		x, y := RandomVector(rng, n, 1), RandomVector(rng, n, 3)
		dst := alloc(t, b, n)
		if err := b.Add(dst, upload(t, b, x), upload(t, b, y), n); err != nil {
			t.Fatal(err)
		}
		want := make([]float64, n)
		for i := range want {
			want[i] = float64(x[i]) + float64(y[i])
		}
		check(t, name("add n=%d", n), download(t, b, dst), want, 1e-6)
		// In place, as the residual connection uses it: a = a + b.
		xa := upload(t, b, x)
		if err := b.Add(xa, xa, upload(t, b, y), n); err != nil {
			t.Fatal(err)
		}
		check(t, name("add in place n=%d", n), download(t, b, xa), want, 1e-6)
	}
}

func (s *suite) siluMul(t *testing.T) {
	b := s.newBackend(t)
	rng := s.rng(t)
	for _, n := range vecSizes {
		g, u := RandomVector(rng, n, 3), RandomVector(rng, n, 1)
		dst := alloc(t, b, n)
		if err := b.SiLUMul(dst, upload(t, b, g), upload(t, b, u), n); err != nil {
			t.Fatal(err)
		}
		want := make([]float64, n)
		for i := range want {
			x := float64(g[i])
			want[i] = x / (1 + math.Exp(-x)) * float64(u[i])
		}
		check(t, name("silu·mul n=%d", n), download(t, b, dst), want, 1e-5)
	}
}

func (s *suite) addBias(t *testing.T) {
	b := s.newBackend(t)
	rng := s.rng(t)
	for _, sh := range [][2]int{{1, 1}, {1, 896}, {5, 128}, {17, 4096}, {3, 1000}} {
		n, cols := sh[0], sh[1]
		x, bias := RandomVector(rng, n*cols, 1), RandomVector(rng, cols, 0.5)
		w := F32Weight("bias", bias)
		load(t, b, w)
		xt := upload(t, b, x)
		if err := b.AddBias(xt, w, n); err != nil {
			t.Fatal(err)
		}
		want := make([]float64, n*cols)
		for i := range want {
			want[i] = float64(x[i]) + float64(bias[i%cols])
		}
		check(t, name("add bias %d×%d", n, cols), download(t, b, xt), want, 1e-6)
	}
}

func (s *suite) rmsNorm(t *testing.T) {
	b := s.newBackend(t)
	rng := s.rng(t)
	for _, sh := range [][2]int{{1, 1}, {1, 64}, {3, 288}, {7, 768}, {2, 4096}, {1, 8192}, {33, 896}, {1, 1001}} {
		n, cols := sh[0], sh[1]
		const eps = 1e-5
		x, wv := RandomVector(rng, n*cols, 2), RandomVector(rng, cols, 1)
		w := F32Weight("norm", wv)
		load(t, b, w)
		dst := alloc(t, b, n*cols)
		if err := b.RMSNorm(dst, upload(t, b, x), w, n, eps); err != nil {
			t.Fatal(err)
		}
		want := make([]float64, n*cols)
		for i := range n {
			var ss float64
			for _, v := range x[i*cols : (i+1)*cols] {
				ss += float64(v) * float64(v)
			}
			sc := 1 / math.Sqrt(ss/float64(cols)+eps)
			for j := range cols {
				want[i*cols+j] = float64(x[i*cols+j]) * sc * float64(wv[j])
			}
		}
		check(t, name("rmsnorm %d×%d", n, cols), download(t, b, dst), want, 1e-5)
	}
}

// addRMSNorm checks the optional fused residual add and norm
// (kernels.ResidualNormer) of backends that have it: x += r in place, then
// the norm of the sum, against float64.
func (s *suite) addRMSNorm(t *testing.T) {
	b := s.newBackend(t)
	rn, ok := kernels.As[kernels.ResidualNormer](b)
	if !ok {
		t.Skipf("%s does not fuse the residual add with RMSNorm (optional)", b.Name())
	}
	rng := s.rng(t)
	for _, sh := range [][2]int{{1, 64}, {3, 288}, {1, 4096}, {2, 4096}, {1, 8192}, {33, 896}, {1, 1001}} {
		n, cols := sh[0], sh[1]
		const eps = 1e-5
		x, r, wv := RandomVector(rng, n*cols, 2), RandomVector(rng, n*cols, 1), RandomVector(rng, cols, 1)
		w := F32Weight("norm", wv)
		load(t, b, w)
		dst := alloc(t, b, n*cols)
		xt := upload(t, b, x)
		if err := rn.AddRMSNorm(dst, xt, upload(t, b, r), w, n, eps); err != nil {
			t.Fatal(err)
		}
		sum := make([]float64, n*cols)
		want := make([]float64, n*cols)
		for i := range n {
			var ss float64
			for j := range cols {
				v := float64(x[i*cols+j] + r[i*cols+j]) // the sum is stored as a float32
				sum[i*cols+j] = v
				ss += v * v
			}
			sc := 1 / math.Sqrt(ss/float64(cols)+eps)
			for j := range cols {
				want[i*cols+j] = sum[i*cols+j] * sc * float64(wv[j])
			}
		}
		check(t, name("add·rmsnorm %d×%d: x", n, cols), download(t, b, xt), sum, 1e-7)
		check(t, name("add·rmsnorm %d×%d", n, cols), download(t, b, dst), want, 1e-5)
	}
}

// ropeRef rotates x [n][heads][headDim] in float64.
func ropeRef(x []float32, n, heads, headDim, pos0 int, r kernels.Rope, freqs []float32) []float64 {
	out := f64(x)
	scale := float64(r.Scale)
	if scale == 0 {
		scale = 1
	}
	half := r.Dim / 2
	for i := range n {
		for h := range heads {
			v := out[(i*heads+h)*headDim:]
			for k := range half {
				th := float64(pos0+i) * scale * math.Pow(float64(r.Base), -2*float64(k)/float64(r.Dim))
				if freqs != nil {
					th /= float64(freqs[k])
				}
				c, sn := math.Cos(th), math.Sin(th)
				a, bb := 2*k, 2*k+1
				if r.NeoX {
					a, bb = k, k+half
				}
				x0, x1 := v[a], v[bb]
				v[a] = x0*c - x1*sn
				v[bb] = x0*sn + x1*c
			}
		}
	}
	return out
}

func (s *suite) rope(t *testing.T) {
	b := s.newBackend(t)
	rng := s.rng(t)
	type rc struct {
		name                  string
		n, heads, headDim, p0 int
		r                     kernels.Rope
		freqs                 bool
	}
	cases := []rc{
		{"normal", 5, 4, 64, 0, kernels.Rope{Dim: 64, Base: 10000, Scale: 1}, false},
		{"normal-decode", 1, 32, 128, 1000, kernels.Rope{Dim: 128, Base: 10000, Scale: 1}, false},
		{"neox", 7, 3, 64, 3, kernels.Rope{Dim: 64, Base: 1000000, Scale: 1, NeoX: true}, false},
		{"neox-partial", 3, 2, 128, 17, kernels.Rope{Dim: 64, Base: 10000, Scale: 1, NeoX: true}, false},
		{"normal-partial", 3, 2, 96, 9, kernels.Rope{Dim: 32, Base: 10000, Scale: 1}, false},
		{"linear-scaled", 4, 8, 128, 3000, kernels.Rope{Dim: 128, Base: 10000, Scale: 0.25}, false},
		{"llama3-freqs", 6, 8, 128, 500, kernels.Rope{Dim: 128, Base: 500000, Scale: 1}, true},
		{"neox-freqs", 2, 4, 64, 40, kernels.Rope{Dim: 64, Base: 10000, Scale: 1, NeoX: true}, true},
		{"long-position", 2, 8, 128, 8000, kernels.Rope{Dim: 128, Base: 500000, Scale: 1}, false},
	}
	for _, c := range cases {
		x := RandomVector(rng, c.n*c.heads*c.headDim, 1)
		var fv []float32
		r := c.r
		if c.freqs {
			fv = make([]float32, r.Dim/2)
			for i := range fv {
				fv[i] = float32(1 + 7*rng.Float64())
			}
			r.Freqs = F32Weight("rope_freqs", fv)
			load(t, b, r.Freqs)
		}
		xt := upload(t, b, x)
		if err := b.RoPE(xt, c.n, c.heads, c.headDim, c.p0, r); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		// ggml builds angles by repeated float32 products; at position p the
		// angle's error grows like p·1e-7, hence the position-dependent bound.
		bound := 1e-6 + float64(c.p0+c.n)*3e-7
		check(t, "rope "+c.name, download(t, b, xt), ropeRef(x, c.n, c.heads, c.headDim, c.p0, r, fv), bound)
	}
}

// attention runs a sequence of prompt and decode steps through one cache
// and compares every step with a float64 reference that keeps its own
// history.
func (s *suite) attention(t *testing.T) {
	b := s.newBackend(t)
	rng := s.rng(t)
	type ac struct {
		name  string
		a     kernels.Attn
		steps []int // tokens per step
	}
	cases := []ac{
		{"mha", kernels.Attn{Heads: 4, KVHeads: 4, HeadDim: 16}, []int{5, 1, 1, 3, 1}},
		{"gqa", kernels.Attn{Heads: 8, KVHeads: 2, HeadDim: 64}, []int{7, 1, 2, 1}},
		{"mqa", kernels.Attn{Heads: 6, KVHeads: 1, HeadDim: 32}, []int{1, 1, 1, 4}},
		{"llama8b-head", kernels.Attn{Heads: 32, KVHeads: 8, HeadDim: 128}, []int{33, 1}},
		{"long", kernels.Attn{Heads: 2, KVHeads: 1, HeadDim: 64}, []int{300, 1, 200}},
		// Mistral's and Gemma's sliding window, Gemma 2's score soft-cap.
		{"window", kernels.Attn{Heads: 4, KVHeads: 2, HeadDim: 64, Window: 6}, []int{9, 1, 1, 4, 1}},
		{"window-long", kernels.Attn{Heads: 8, KVHeads: 4, HeadDim: 128, Window: 100}, []int{300, 1, 2}},
		{"softcap", kernels.Attn{Heads: 4, KVHeads: 1, HeadDim: 32, Softcap: 1.5}, []int{7, 1, 3, 1}},
		{"window-softcap", kernels.Attn{Heads: 8, KVHeads: 2, HeadDim: 256, Window: 5, Softcap: 2}, []int{12, 1, 1}},
	}
	for _, c := range cases {
		a := c.a
		a.Scale = float32(1 / math.Sqrt(float64(a.HeadDim)))
		attentionSteps(t, b, rng, c.name, a, c.steps)
	}
}

// attentionSteps runs Attention over steps of the given token counts into
// one cache layer and checks each step against attnRef.
func attentionSteps(t *testing.T, b kernels.Backend, rng *rand.Rand, what string, a kernels.Attn, steps []int) {
	t.Helper()
	total := 0
	for _, n := range steps {
		total += n
	}
	const layers, layer = 3, 1
	kvDim := a.KVHeads * a.HeadDim
	cache, err := b.NewKVCache(layers, total+5, kvDim)
	if err != nil {
		t.Fatal(err)
	}
	defer b.FreeKVCache(cache)
	var keys, vals [][]float32 // reference history, one row per position
	pos := 0
	for si, n := range steps {
		q := RandomVector(rng, n*a.Heads*a.HeadDim, 1)
		k := RandomVector(rng, n*kvDim, 1)
		v := RandomVector(rng, n*kvDim, 1)
		out := alloc(t, b, n*a.Heads*a.HeadDim)
		if err := b.Attention(out, upload(t, b, q), upload(t, b, k), upload(t, b, v), cache, layer, pos, n, a); err != nil {
			t.Fatalf("%s step %d: %v", what, si, err)
		}
		for i := range n {
			keys = append(keys, k[i*kvDim:(i+1)*kvDim])
			vals = append(vals, v[i*kvDim:(i+1)*kvDim])
		}
		want := attnRef(q, keys, vals, pos, n, a)
		check(t, name("attention %s step %d (pos %d, n %d)", what, si, pos, n), download(t, b, out), want, 2e-5)
		pos += n
	}
}

func attnRef(q []float32, keys, vals [][]float32, pos0, n int, a kernels.Attn) []float64 {
	hd, group := a.HeadDim, a.Heads/a.KVHeads
	out := make([]float64, n*a.Heads*hd)
	for i := range n {
		for h := range a.Heads {
			g := h / group
			qv := q[(i*a.Heads+h)*hd:]
			np := pos0 + i + 1
			sc := make([]float64, np)
			mx := math.Inf(-1)
			first := 0
			if a.Window > 0 {
				first = max(0, np-a.Window) // the window's positions np-Window … np-1
			}
			for p := range np {
				if p < first {
					sc[p] = math.Inf(-1)
					continue
				}
				var d float64
				for j := range hd {
					d += float64(qv[j]) * float64(keys[p][g*hd+j])
				}
				sc[p] = d * float64(a.Scale)
				if a.Softcap > 0 {
					sc[p] = float64(a.Softcap) * math.Tanh(sc[p]/float64(a.Softcap))
				}
				mx = max(mx, sc[p])
			}
			sink := math.Inf(-1) // e^(sink−mx) = 0: no sink
			if a.Sinks != nil {
				sink = sinkLogit(a.Sinks, h)
				mx = max(mx, sink)
			}
			sum := math.Exp(sink - mx)
			for p := range sc {
				sc[p] = math.Exp(sc[p] - mx)
				sum += sc[p]
			}
			o := out[(i*a.Heads+h)*hd:]
			for p := range np {
				for j := range hd {
					o[j] += sc[p] / sum * float64(vals[p][g*hd+j])
				}
			}
		}
	}
	return out
}
