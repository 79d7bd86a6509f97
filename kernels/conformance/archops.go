package conformance

import (
	"math"
	"testing"
)

// The ops of the architectures beyond Llama and Qwen2: Gemma's GeGLU and
// embedding scale, Gemma 2's logit soft-cap.

func (s *suite) geluMul(t *testing.T) {
	b := s.newBackend(t)
	rng := s.rng(t)
	cases := map[string][2][]float32{}
	for _, n := range vecSizes {
		cases[name("n=%d", n)] = [2][]float32{RandomVector(rng, n, 3), RandomVector(rng, n, 1)}
	}
	// The negative tail, where 1 + tanh cancels in float32 (a random
	// draw meets it only now and then): each value checked alone.
	for _, x := range []float32{-9, -6, -4.5, -3.2, -1e-3, 2.5, 7} {
		cases[name("x=%g", x)] = [2][]float32{{x}, {1}}
	}
	for what, c := range cases {
		g, u := c[0], c[1]
		n := len(g)
		dst := alloc(t, b, n)
		if err := b.GELUMul(dst, upload(t, b, g), upload(t, b, u), n); err != nil {
			t.Fatal(err)
		}
		want := make([]float64, n)
		for i := range want {
			// 0.5·x·(1 + tanh z) as x / (1 + e^(−2z)): the same value, which
			// float64 keeps in the tail too
			x := float64(g[i])
			z := math.Sqrt(2/math.Pi) * (x + 0.044715*x*x*x)
			want[i] = x / (1 + math.Exp(-2*z)) * float64(u[i])
		}
		check(t, "gelu·mul "+what, download(t, b, dst), want, 1e-5)
	}
}

func (s *suite) scale(t *testing.T) {
	b := s.newBackend(t)
	rng := s.rng(t)
	for _, n := range vecSizes {
		x := RandomVector(rng, n, 1)
		sc := float32(math.Sqrt(2304)) // Gemma 2 2B's √Embd
		dst := alloc(t, b, n)
		if err := b.Scale(dst, upload(t, b, x), sc, n); err != nil {
			t.Fatal(err)
		}
		want := make([]float64, n)
		for i := range want {
			want[i] = float64(x[i]) * float64(sc)
		}
		check(t, name("scale n=%d", n), download(t, b, dst), want, 1e-6)
		// in place
		xa := upload(t, b, x)
		if err := b.Scale(xa, xa, sc, n); err != nil {
			t.Fatal(err)
		}
		check(t, name("scale in place n=%d", n), download(t, b, xa), want, 1e-6)
	}
}

func (s *suite) softcap(t *testing.T) {
	b := s.newBackend(t)
	rng := s.rng(t)
	for _, c := range []float32{30, 2.5} {
		for _, n := range vecSizes {
			x := RandomVector(rng, n, 20)
			xa := upload(t, b, x)
			if err := b.Softcap(xa, c, n); err != nil {
				t.Fatal(err)
			}
			want := make([]float64, n)
			for i := range want {
				want[i] = float64(c) * math.Tanh(float64(x[i])/float64(c))
			}
			check(t, name("softcap %g n=%d", c, n), download(t, b, xa), want, 1e-5)
		}
	}
	if err := b.Softcap(alloc(t, b, 4), 0, 4); err == nil {
		t.Error("softcap with cap 0 accepted")
	}
}
