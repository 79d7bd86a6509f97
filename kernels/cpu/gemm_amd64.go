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
