//go:build amd64 && !purego

package cpu

import (
	"golang.org/x/sys/cpu"

	"github.com/forge-llm/forge/gguf"
)

// Assembly kernels (dot_amd64.s). Each takes raw pointers and a block
// count; the wrappers below check the slice lengths once per row so the
// assembly never reads out of bounds.

//go:noescape
func dotQ8_0VNNI(w *byte, xq *int8, xd *float32, nb int) float32

//go:noescape
func dotQ8_0x4VNNI(w *byte, xq *int8, xd *float32, cols, nb int, out *float32)

//go:noescape
func dotQ4_0VNNI(w *byte, xq *int8, xd *float32, nb int) float32

//go:noescape
func dotQ5_0VNNI(w *byte, xq *int8, xd *float32, nb int) float32

//go:noescape
func dotQ4_0x4VNNI(w *byte, xq *int8, xd *float32, cols, nb int, out *float32)

//go:noescape
func dotQ5_0x4VNNI(w *byte, xq *int8, xd *float32, cols, nb int, out *float32)

//go:noescape
func dotF16x4AVX512(w *byte, x *float32, cols, n int, out *float32)

//go:noescape
func dotQ4_KVNNI(w *byte, xq *int8, xd *float32, bs *int16, nb int) float32

//go:noescape
func dotQ4_Kx4VNNI(w *byte, xq *int8, xd *float32, bs *int16, cols, nb int, out *float32)

//go:noescape
func dotQ6_KVNNI(w *byte, xq *int8, xd *float32, bs *int16, nb int) float32

//go:noescape
func dotQ6_Kx4VNNI(w *byte, xq *int8, xd *float32, bs *int16, cols, nb int, out *float32)

//go:noescape
func dotF16AVX512(w *byte, x *float32, n int) float32

//go:noescape
func dotF16SeqAVX512(w *byte, x *float32, n int) float32

//go:noescape
func dotF32SeqAVX512(w, x *float32, n int) float32

//go:noescape
func dotF32AVX512(a, b *float32, n int) float32

//go:noescape
func axpyF32AVX512(y, x *float32, a float32, n int)

// hasVNNI reports whether the CPU runs the AVX-512 kernels: F (zmm, EVEX
// f16 conversion), BW (byte/word ops), VL (EVEX on ymm), VNNI (VPDPBUSD,
// VPDPWSSD) and FMA.
var hasVNNI = cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512VL &&
	cpu.X86.HasAVX512VNNI && cpu.X86.HasFMA && cpu.X86.HasAVX2

func init() {
	if !hasVNNI {
		return
	}
	for t, k := range asmKernels {
		fastKernels[t] = k
	}
	asmEnabled = true
	dotF32 = dotF32Fast
	axpyF32 = axpyF32Fast
	quantQ8_0 = quantQ8_0Fast
	quantQ8_K = quantQ8_KFast
	siluMul = siluMulFast
	expShift = expShiftFast
	scoresF32 = scoresF32Fast
	axpyRowsF32 = axpyRowsF32Fast
}

// asmKernels are the types with assembly dot products.
var asmKernels = map[gguf.Type]kernel{
	gguf.TypeQ8_0: {actQ8_0, dotQ8_0Asm, dotQ8_0x4Asm, false, dotQ8_0r4Asm, nil, gemmQ8_0Asm, nil},
	gguf.TypeQ4_0: {actQ8_0, dotQ4_0Asm, dotQ4_0x4Asm, false, nil, nil, nil, nil},
	gguf.TypeQ5_0: {actQ8_0, dotQ5_0Asm, dotQ5_0x4Asm, false, nil, nil, nil, nil},
	gguf.TypeQ4_K: {actQ8_K4, dotQ4_KAsm, dotQ4_Kx4Asm, false, nil, dotQ4_Kx8Asm, nil, dotQ4_Kx2Asm},
	gguf.TypeQ6_K: {actQ8_K, dotQ6_KAsm, dotQ6_Kx4Asm, false, nil, nil, nil, nil},
	gguf.TypeF16:  {actF16, dotWF16Asm, dotWF16x4Asm, false, nil, nil, nil, nil},
	gguf.TypeF32:  {actF32, dotWF32Asm, nil, false, nil, nil, nil, nil},
	gguf.TypeBF16: {actBF16, dotWBF16Go, nil, false, nil, nil, nil, nil},
}

func dotQ8_0Asm(w []byte, x *qrow) float32 {
	nb := len(x.d)
	_, _ = w[34*nb-1], x.q[32*nb-1]
	return dotQ8_0VNNI(&w[0], &x.q[0], &x.d[0], nb)
}

// dotQ8_0x4Asm multiplies one weight row by activation rows j…j+3.
func dotQ8_0x4Asm(w []byte, a *actBuf, j int, out *[4]float32) {
	nb := a.cols / 32
	_, _, _ = w[34*nb-1], a.q[(j+4)*a.cols-1], a.d[(j+4)*nb-1]
	dotQ8_0x4VNNI(&w[0], &a.q[j*a.cols], &a.d[j*nb], a.cols, nb, &out[0])
}

func dotQ4_0Asm(w []byte, x *qrow) float32 {
	nb := len(x.d)
	_, _ = w[18*nb-1], x.q[32*nb-1]
	return dotQ4_0VNNI(&w[0], &x.q[0], &x.d[0], nb)
}

func dotQ5_0Asm(w []byte, x *qrow) float32 {
	nb := len(x.d)
	_, _ = w[22*nb-1], x.q[32*nb-1]
	return dotQ5_0VNNI(&w[0], &x.q[0], &x.d[0], nb)
}

func dotQ4_0x4Asm(w []byte, a *actBuf, j int, out *[4]float32) {
	nb := a.cols / 32
	_, _, _ = w[18*nb-1], a.q[(j+4)*a.cols-1], a.d[(j+4)*nb-1]
	dotQ4_0x4VNNI(&w[0], &a.q[j*a.cols], &a.d[j*nb], a.cols, nb, &out[0])
}

func dotQ5_0x4Asm(w []byte, a *actBuf, j int, out *[4]float32) {
	nb := a.cols / 32
	_, _, _ = w[22*nb-1], a.q[(j+4)*a.cols-1], a.d[(j+4)*nb-1]
	dotQ5_0x4VNNI(&w[0], &a.q[j*a.cols], &a.d[j*nb], a.cols, nb, &out[0])
}

// dotWF16x4Asm: four tokens at once for rows that are multiples of 16
// (the tinyBLAS arithmetic, bit-identical to dotWF16Asm per token); other
// row lengths take the single-token path four times.
func dotWF16x4Asm(w []byte, a *actBuf, j int, out *[4]float32) {
	n := a.cols
	if n%16 != 0 {
		for k := range 4 {
			out[k] = dotWF16Asm(w, &a.rows[j+k])
		}
		return
	}
	_, _ = w[2*n-1], a.f[(j+4)*n-1]
	dotF16x4AVX512(&w[0], &a.f[j*n], n, n, &out[0])
}

func dotQ4_KAsm(w []byte, x *qrow) float32 {
	nb := len(x.d)
	_, _, _ = w[144*nb-1], x.q[256*nb-1], x.bs[16*nb-1]
	return dotQ4_KVNNI(&w[0], &x.q[0], &x.d[0], &x.bs[0], nb)
}

// dotQ4_Kx4Asm multiplies one weight row by activation rows j…j+3.
func dotQ4_Kx4Asm(w []byte, a *actBuf, j int, out *[4]float32) {
	nb := a.cols / 256
	_, _, _ = w[144*nb-1], a.q[(j+4)*a.cols-1], a.bs[(j+4)*a.cols/16-1]
	dotQ4_Kx4VNNI(&w[0], &a.q[j*a.cols], &a.d[j*nb], &a.bs[j*a.cols/16], a.cols, nb, &out[0])
}

func dotQ6_KAsm(w []byte, x *qrow) float32 {
	nb := len(x.d)
	_, _, _ = w[210*nb-1], x.q[256*nb-1], x.bs[16*nb-1]
	return dotQ6_KVNNI(&w[0], &x.q[0], &x.d[0], &x.bs[0], nb)
}

// dotQ6_Kx4Asm multiplies one weight row by activation rows j…j+3.
func dotQ6_Kx4Asm(w []byte, a *actBuf, j int, out *[4]float32) {
	nb := a.cols / 256
	_, _, _ = w[210*nb-1], a.q[(j+4)*a.cols-1], a.bs[(j+4)*a.cols/16-1]
	dotQ6_Kx4VNNI(&w[0], &a.q[j*a.cols], &a.d[j*nb], &a.bs[j*a.cols/16], a.cols, nb, &out[0])
}

// dotWF16Asm reproduces llama.cpp's float arithmetic for F16 weights, so
// that greedy outputs match it through near-ties: rows whose length is a
// multiple of 16 go through llamafile's tinyBLAS there (one accumulator),
// other rows through ggml_vec_dot_f16 (four accumulators over steps of 64,
// the rest added in float64).
func dotWF16Asm(w []byte, x *qrow) float32 {
	n := len(x.f)
	if n%16 == 0 {
		_ = w[2*n-1]
		return dotF16SeqAVX512(&w[0], &x.f[0], n)
	}
	m := n &^ 63
	var s float32
	if m > 0 {
		_ = w[2*m-1]
		s = dotF16AVX512(&w[0], &x.f[0], m)
	}
	if m == n {
		return s
	}
	sum := float64(s)
	w = w[:2*n]
	for i := m; i < n; i++ {
		sum += float64(f16Table[uint16(w[2*i])|uint16(w[2*i+1])<<8] * x.f[i])
	}
	return float32(sum)
}

// dotWF32Asm: as dotWF16Asm, tinyBLAS's single accumulator for rows that
// are multiples of 16.
func dotWF32Asm(w []byte, x *qrow) float32 {
	n := len(x.f)
	if n%16 == 0 {
		_ = w[4*n-1]
		return dotF32SeqAVX512((*float32)(unsafePointer(&w[0])), &x.f[0], n)
	}
	m := n &^ 31
	var s float32
	if m > 0 {
		_ = w[4*m-1]
		s = dotF32AVX512((*float32)(unsafePointer(&w[0])), &x.f[0], m)
	}
	if m < n {
		s += dotWF32Go(w[4*m:], &qrow{f: x.f[m:]})
	}
	return s
}

func dotF32Fast(a, b []float32) float32 {
	n := len(a)
	m := n &^ 31
	var s float32
	if m > 0 {
		_ = b[m-1]
		s = dotF32AVX512(&a[0], &b[0], m)
	}
	if m < n {
		s += dotF32Go(a[m:], b[m:])
	}
	return s
}

func axpyF32Fast(y, x []float32, a float32) {
	n := len(y)
	m := n &^ 15
	if m > 0 {
		_ = x[m-1]
		axpyF32AVX512(&y[0], &x[0], a, m)
	}
	if m < n {
		axpyF32Go(y[m:], x[m:], a)
	}
}

//go:noescape
func scoresF32AVX512(q, k *float32, stride, n, count int, out *float32)

//go:noescape
func axpyRowsF32AVX512(o, v *float32, stride, n, count int, e *float32)

// scoresF32Fast is scoresF32Go with dotF32Fast's arithmetic per key, in one
// call for all keys when the head is a multiple of 32 floats.
func scoresF32Fast(q, k []float32, stride int, out []float32) {
	n, count := len(q), len(out)
	if count == 0 {
		return
	}
	if n == 0 || n%32 != 0 {
		scoresF32Go(q, k, stride, out)
		return
	}
	_ = k[(count-1)*stride+n-1]
	scoresF32AVX512(&q[0], &k[0], stride, n, count, &out[0])
}

// axpyRowsF32Fast is axpyRowsF32Go with axpyF32Fast's arithmetic, o kept
// in registers across the rows when its length is a multiple of 16.
func axpyRowsF32Fast(o, v []float32, stride int, e []float32) {
	n, count := len(o), len(e)
	if count == 0 {
		return
	}
	if n == 0 || n%16 != 0 {
		axpyRowsF32Go(o, v, stride, e)
		return
	}
	_ = v[(count-1)*stride+n-1]
	axpyRowsF32AVX512(&o[0], &v[0], stride, n, count, &e[0])
}

//go:noescape
func quantQ8_KAVX512(x *float32, q *int8, d *float32, bs *int16, nb int)

//go:noescape
func quantQ8_0AVX512(x *float32, q *int8, amax *float32, sums *int32, nb int)

// quantQ8_KFast is quantQ8_KGo in assembly (the same codes, scales and
// sums for finite activations).
func quantQ8_KFast(x []float32, q []int8, d []float32, bs []int16) {
	nb := len(x) / 256
	if nb == 0 {
		return
	}
	_, _, _ = q[256*nb-1], d[nb-1], bs[16*nb-1]
	quantQ8_KAVX512(&x[0], &q[0], &d[0], &bs[0], nb)
}

// quantQ8_0Fast is quantQ8_0Go: the codes and their sums in assembly, 64
// blocks at a time, the f16 scales from them in Go (q8_0Scales).
func quantQ8_0Fast(x []float32, q []int8, d, s []float32, q81 bool) {
	var amax [64]float32
	var sums [64]int32
	nb := len(x) / 32
	if nb == 0 {
		return
	}
	_, _, _ = q[32*nb-1], d[nb-1], s[nb-1]
	for b0 := 0; b0 < nb; b0 += 64 {
		k := min(64, nb-b0)
		quantQ8_0AVX512(&x[32*b0], &q[32*b0], &amax[0], &sums[0], k)
		for i := range k {
			d[b0+i], s[b0+i] = q8_0Scales(amax[i], sums[i], q81)
		}
	}
}

//go:noescape
func dotQ8_0r4VNNI(w *byte, rb int, xq *int8, xd *float32, nb int, out *float32)

// dotQ8_0r4Asm is dotQ8_0Asm for the four weight rows w[0:rb], …,
// w[3rb:4rb] (decode: one activation row, four independent streams).
func dotQ8_0r4Asm(w []byte, rb int, x *qrow, out *[4]float32) {
	nb := len(x.d)
	_, _ = w[3*rb+34*nb-1], x.q[32*nb-1]
	dotQ8_0r4VNNI(&w[0], rb, &x.q[0], &x.d[0], nb, &out[0])
}

//go:noescape
func siluMulAVX512(d, gate, u *float32, n int) int

//go:noescape
func expShiftAVX512(x *float32, m float32, n int) int

// siluMulFast is siluMulGo with the exponentials 8 at a time in assembly
// (math.Exp's own arithmetic, so the same bits); values outside its range
// (|x| > 700, NaN) and the tail take the Go loop.
func siluMulFast(d, g, u []float32) {
	n := len(d)
	g, u = g[:n], u[:n]
	i := 0
	for i+8 <= n {
		i += siluMulAVX512(&d[i], &g[i], &u[i], (n-i)&^7)
		if i+8 <= n { // stopped at an out-of-range 8
			siluMulGo(d[i:i+8], g[i:i+8], u[i:i+8])
			i += 8
		}
	}
	siluMulGo(d[i:], g[i:], u[i:])
}

// expShiftFast is expShiftGo with the exponentials 8 at a time in assembly.
func expShiftFast(x []float32, m float32) {
	n := len(x)
	i := 0
	for i+8 <= n {
		i += expShiftAVX512(&x[i], m, (n-i)&^7)
		if i+8 <= n {
			expShiftGo(x[i:i+8], m)
			i += 8
		}
	}
	expShiftGo(x[i:], m)
}

//go:noescape
func dotQ4_Kx8VNNI(w *byte, xq *int8, xd *float32, bs *int16, cols, nb int, out *float32)

// dotQ4_Kx8Asm multiplies one weight row by activation rows j…j+7.
func dotQ4_Kx8Asm(w []byte, a *actBuf, j int, out *[8]float32) {
	nb := a.cols / 256
	_, _, _ = w[144*nb-1], a.q[(j+8)*a.cols-1], a.bs[(j+8)*a.cols/16-1]
	_ = a.d[(j+8)*nb-1]
	dotQ4_Kx8VNNI(&w[0], &a.q[j*a.cols], &a.d[j*nb], &a.bs[j*a.cols/16], a.cols, nb, &out[0])
}
