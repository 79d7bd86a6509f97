//go:build amd64 && !purego

package cpu

//go:noescape
func gemmQ8_0x4x4VNNI(w *byte, rb int, p *byte, nb int, sc *float32, out *float32)

// gemmQ8_0Asm is gemmQ8_0Go in assembly (gemm_amd64.s), each result equal
// to dotQ8_0Asm's for its pair bit for bit.
func gemmQ8_0Asm(w []byte, rb int, a *actBuf, g int, sc, out *[16]float32) {
	nb := a.cols / 32
	_, _ = w[3*rb+34*nb-1], a.p[(g+1)*nb*q8x4Block-1]
	gemmQ8_0x4x4VNNI(&w[0], rb, &a.p[g*nb*q8x4Block], nb, &sc[0], &out[0])
}

//go:noescape
func dotQ4_Kx2VNNI(w *byte, xq *int8, xd *float32, bs *int16, cols, nb int, out *float32)

// dotQ4_Kx2Asm multiplies one weight row by activation rows j and j+1.
func dotQ4_Kx2Asm(w []byte, a *actBuf, j int, out *[2]float32) {
	nb := a.cols / 256
	_, _, _ = w[144*nb-1], a.q[(j+2)*a.cols-1], a.bs[(j+2)*a.cols/16-1]
	_ = a.d[(j+2)*nb-1]
	dotQ4_Kx2VNNI(&w[0], &a.q[j*a.cols], &a.d[j*nb], &a.bs[j*a.cols/16], a.cols, nb, &out[0])
}

//go:noescape
func packQ8_0x4AVX512(q *int8, d *float32, pq, pd *byte, nb int)

// packRowQ8_0x4Fast is packRowQ8_0x4Go in assembly (the same bytes).
func packRowQ8_0x4Fast(rq []int8, rd []float32, p []byte, t int) {
	nb := len(rd)
	if nb == 0 {
		return
	}
	_, _ = rq[32*nb-1], p[nb*q8x4Block-1]
	packQ8_0x4AVX512(&rq[0], &rd[0], &p[32*t], &p[256+4*t], nb)
}

func init() {
	if hasVNNI {
		packRowQ8_0x4 = packRowQ8_0x4Fast
	}
}
