package cpu

import (
	"encoding/binary"
	"math"
)

// Register-tiled products of four weight rows with four activation rows
// (tokens), for prompts and batched decode: each weight block is read once
// for four tokens and each token's block once for four rows, where the
// one-row kernels read one of the two again for every pair.
//
// The activations of a tile come packed (packQ8_0x4) so that one pointer
// walks the four tokens' blocks together. Every (row, token) result equals
// the type's one-row kernel bit for bit (dotQ8_0Go for the Go twin,
// dotQ8_0VNNI for the assembly), so MatMul may use a tile at any row count
// without breaking batch invariance.

// gemmFunc multiplies the four weight rows w[0:rb], …, w[3rb:4rb] by the
// four activation rows of packed group g (tokens 4g…4g+3 of a); out[4r+t]
// receives row r times token t. sc is per-worker scratch.
type gemmFunc func(w []byte, rb int, a *actBuf, g int, sc, out *[16]float32)

// q8x4Block is the size of one packed Q8_0 block of a four-token group:
// the four tokens' 32 codes (128 bytes), their lane corrections
// −128·Σ(codes 4i…4i+3) for i < 8 as little-endian int32 (128 bytes), and
// their four scales as float32 (16 bytes).
const q8x4Block = 272

// packQ8_0x4 copies activation row j (already quantized to Q8_0) into its
// place in a.p: token j%4 of group j/4. A last group that the rows do not
// fill is packed too but not read (its rows take the one-token kernels).
func (a *actBuf) packQ8_0x4(j int) {
	nb := a.cols / 32
	r := &a.rows[j]
	packRowQ8_0x4(r.q, r.d, a.p[(j>>2)*nb*q8x4Block:(j>>2+1)*nb*q8x4Block], j&3)
}

// packRowQ8_0x4 packs one row's nb = len(d) blocks (codes q, scales d)
// into slot t of the packed group p; the architecture file may point it at
// assembly.
var packRowQ8_0x4 = packRowQ8_0x4Go

func packRowQ8_0x4Go(rq []int8, rd []float32, p []byte, t int) {
	for b := range len(rd) {
		blk := p[b*q8x4Block : (b+1)*q8x4Block]
		q := rq[32*b : 32*b+32]
		for i, c := range q {
			blk[32*t+i] = byte(c)
		}
		for i := range 8 {
			s := int32(q[4*i]) + int32(q[4*i+1]) + int32(q[4*i+2]) + int32(q[4*i+3])
			binary.LittleEndian.PutUint32(blk[128+32*t+4*i:], uint32(-128*s))
		}
		binary.LittleEndian.PutUint32(blk[256+4*t:], math.Float32bits(rd[b]))
	}
}

// gemmQ8_0Go is the Go twin of the four-by-four Q8_0 tile: dotQ8_0Go's
// arithmetic for each pair, read from the packed codes and scales.
func gemmQ8_0Go(w []byte, rb int, a *actBuf, g int, _, out *[16]float32) {
	nb := a.cols / 32
	p := a.p[g*nb*q8x4Block : (g+1)*nb*q8x4Block]
	for r := range 4 {
		wr := w[r*rb : r*rb+34*nb]
		for t := range 4 {
			var acc float32
			for b := range nb {
				wb := wr[34*b : 34*b+34]
				blk := p[b*q8x4Block : (b+1)*q8x4Block]
				var sum int32
				for i := range 32 {
					sum += int32(int8(wb[2+i])) * int32(int8(blk[32*t+i]))
				}
				dx := math.Float32frombits(binary.LittleEndian.Uint32(blk[256+4*t:]))
				acc += f16le(wb) * dx * float32(sum)
			}
			out[4*r+t] = acc
		}
	}
}

// runGemm computes weight rows lo…hi-1 for the whole four-token groups of
// the activations with the tile kernel (rows past the last whole four
// with the one-row kernels) and returns the first token it left.
func (t *matmulTask) runGemm(w, lo, hi int) int {
	groups := t.act.n >> 2
	sc, o := &t.scr[w].gsc, &t.scr[w].out16
	for g := range groups {
		r := lo
		for ; r+4 <= hi; r += 4 {
			t.gemm(t.w[r*t.rb:(r+4)*t.rb], t.rb, t.act, g, sc, o)
			for k := range min(4, t.n-4*g) { // real rows only
				d := t.dst[(4*g+k)*t.rows+r:]
				d[0], d[1], d[2], d[3] = o[k], o[4+k], o[8+k], o[12+k]
			}
		}
		for ; r < hi; r++ {
			wr := t.w[r*t.rb : (r+1)*t.rb]
			for k := 4 * g; k < min(4*g+4, t.n); k++ {
				t.dst[k*t.rows+r] = t.dot(wr, &t.act.rows[k])
			}
		}
	}
	return groups << 2
}
