package cpu

import (
	"math"
	"unsafe"
)

func float32frombits(u uint32) float32 { return math.Float32frombits(u) }

// dotF32Go and axpyF32Go are the plain float32 loops behind dotF32 and
// axpyF32 (attention), with four accumulators to shorten the dependency
// chain.
func dotF32Go(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// axpyF32Go computes y += a·x.
func axpyF32Go(y, x []float32, a float32) {
	x = x[:len(y)]
	for i := range y {
		y[i] += a * x[i]
	}
}

// scoresF32Go sets out[p] = dotF32(q, k[p·stride:p·stride+len(q)]) for
// every p < len(out).
func scoresF32Go(q, k []float32, stride int, out []float32) {
	for p := range out {
		out[p] = dotF32(q, k[p*stride:p*stride+len(q)])
	}
}

// axpyRowsF32Go adds e[p]·v[p·stride:p·stride+len(o)] to o for every
// p < len(e), in order.
func axpyRowsF32Go(o, v []float32, stride int, e []float32) {
	for p, a := range e {
		axpyF32(o, v[p*stride:p*stride+len(o)], a)
	}
}

// siluMulGo sets d[i] = silu(g[i])·u[i], silu(x) = x/(1+e^-x).
func siluMulGo(d, g, u []float32) {
	g, u = g[:len(d)], u[:len(d)]
	for i, v := range g {
		d[i] = v / (1 + float32(math.Exp(float64(-v)))) * u[i]
	}
}

// expShiftGo replaces every x[i] by e^(x[i]−m).
func expShiftGo(x []float32, m float32) {
	for i, s := range x {
		x[i] = float32(math.Exp(float64(s - m)))
	}
}

func unsafePointer[T any](p *T) unsafe.Pointer { return unsafe.Pointer(p) }
