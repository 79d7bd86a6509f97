package dequant

import (
	"encoding/binary"
	"math"

	"github.com/forge-llm/forge/gguf"
)

// Decoders for the 256-element K-quant super-blocks. Per group of 16 or 32
// elements the scale (and min) are computed once, in ggml's order; per
// element the code's float value comes from a small table and gets ggml's
// multiply (and subtract).

func init() {
	decoders[gguf.TypeQ2_K] = decodeQ2_K
	decoders[gguf.TypeQ3_K] = decodeQ3_K
	decoders[gguf.TypeQ4_K] = decodeQ4_K
	decoders[gguf.TypeQ5_K] = decodeQ5_K
	decoders[gguf.TypeQ6_K] = decodeQ6_K
	decoders[gguf.TypeQ8_K] = decodeQ8_K
}

// scaleMinK4 unpacks the 6-bit scale and min of group j (0..7) from the 12
// packed bytes of a Q4_K/Q5_K block (see BlockQ4_K).
func scaleMinK4(j int, s *[12]byte) (sc, m uint8) {
	if j < 4 {
		return s[j] & 63, s[j+4] & 63
	}
	return s[j+4]&0xf | (s[j-4]>>6)<<4, s[j+4]>>4 | (s[j]>>6)<<4
}

func decodeQ2_KGeneric(src []byte, dst []float32) {
	const bb, bs = 84, 256
	for i := 0; i < len(dst)/bs; i++ {
		b := (*[bb]byte)(src[i*bb:])
		y := (*[bs]float32)(dst[i*bs:])
		scales := (*[16]byte)(b[0:16])
		d, dmin := f16(b[80:82]), f16(b[82:84])
		g := 0 // group index = output position / 16
		for h := 0; h < 2; h++ {
			q := (*[32]byte)(b[16+32*h:])
			for s := uint(0); s < 8; s += 2 { // bit shift of this 32-element run
				for half := 0; half < 2; half++ {
					sc := scales[g]
					dl, ml := d*float32(sc&0xf), dmin*float32(sc>>4)
					out := (*[16]float32)(y[16*g:])
					for l, v := range (*[16]byte)(q[16*half:]) {
						out[l] = float32(dl*plain32[v>>s&3]) - ml
					}
					g++
				}
			}
		}
	}
}

// q3kScales unpacks the 16 6-bit scales of a Q3_K block, minus their bias
// of 32 (see BlockQ3_K).
func q3kScales(s *[12]byte) (out [16]int8) {
	for g := 0; g < 16; g++ {
		var lo byte
		if g < 8 {
			lo = s[g] & 0xf
		} else {
			lo = s[g-8] >> 4
		}
		hi := s[8+g%4] >> (2 * (g / 4)) & 3
		out[g] = int8(lo|hi<<4) - 32
	}
	return out
}

// centred8[k] = k-4: a Q3_K element's value from its low 2 bits (k&3) and
// its high-mask bit (k>>2), since a cleared mask bit means "minus 4".
var centred8 = [8]float32{-4, -3, -2, -1, 0, 1, 2, 3}

func decodeQ3_KGeneric(src []byte, dst []float32) {
	const bb, bs = 110, 256
	for i := 0; i < len(dst)/bs; i++ {
		b := (*[bb]byte)(src[i*bb:])
		y := (*[bs]float32)(dst[i*bs:])
		hm := (*[32]byte)(b[0:32])
		scales := q3kScales((*[12]byte)(b[96:108]))
		d := f16(b[108:110])
		g := 0
		hbit := uint(0) // which Hmask bit holds this run's third bit
		for h := 0; h < 2; h++ {
			q := (*[32]byte)(b[32+32*h:])
			for s := uint(0); s < 8; s += 2 {
				for half := 0; half < 2; half++ {
					dl := d * float32(scales[g])
					out := (*[16]float32)(y[16*g:])
					hh := (*[16]byte)(hm[16*half:])
					for l, v := range (*[16]byte)(q[16*half:]) {
						out[l] = dl * centred8[v>>s&3|(hh[l]>>hbit&1)<<2]
					}
					g++
				}
				hbit++
			}
		}
	}
}

func decodeQ4_KGeneric(src []byte, dst []float32) {
	const bb, bs = 144, 256
	for i := 0; i < len(dst)/bs; i++ {
		b := (*[bb]byte)(src[i*bb:])
		y := (*[bs]float32)(dst[i*bs:])
		d, dmin := f16(b[0:2]), f16(b[2:4])
		scales := (*[12]byte)(b[4:16])
		for p := 0; p < 4; p++ { // group pair 2p (low nibbles), 2p+1 (high)
			sc1, m1 := scaleMinK4(2*p, scales)
			sc2, m2 := scaleMinK4(2*p+1, scales)
			d1, mm1 := d*float32(sc1), dmin*float32(m1)
			d2, mm2 := d*float32(sc2), dmin*float32(m2)
			out := (*[64]float32)(y[64*p:])
			for l, v := range (*[32]byte)(b[16+32*p:]) {
				out[l] = float32(d1*plain32[v&15]) - mm1
				out[l+32] = float32(d2*plain32[v>>4]) - mm2
			}
		}
	}
}

func decodeQ5_KGeneric(src []byte, dst []float32) {
	const bb, bs = 176, 256
	for i := 0; i < len(dst)/bs; i++ {
		b := (*[bb]byte)(src[i*bb:])
		y := (*[bs]float32)(dst[i*bs:])
		d, dmin := f16(b[0:2]), f16(b[2:4])
		scales := (*[12]byte)(b[4:16])
		qh := (*[32]byte)(b[16:48])
		for p := 0; p < 4; p++ {
			sc1, m1 := scaleMinK4(2*p, scales)
			sc2, m2 := scaleMinK4(2*p+1, scales)
			d1, mm1 := d*float32(sc1), dmin*float32(m1)
			d2, mm2 := d*float32(sc2), dmin*float32(m2)
			out := (*[64]float32)(y[64*p:])
			s1, s2 := uint(2*p), uint(2*p+1)
			for l, v := range (*[32]byte)(b[48+32*p:]) {
				h := qh[l]
				out[l] = float32(d1*plain32[v&15|(h>>s1&1)<<4]) - mm1
				out[l+32] = float32(d2*plain32[v>>4|(h>>s2&1)<<4]) - mm2
			}
		}
	}
}

// sixBitToF32[q] = float32(q - 32), the centred value of a Q6_K code.
var sixBitToF32 = func() (t [64]float32) {
	for i := range t {
		t[i] = float32(i - 32)
	}
	return
}()

func decodeQ6_KGeneric(src []byte, dst []float32) {
	const bb, bs = 210, 256
	for i := 0; i < len(dst)/bs; i++ {
		b := (*[bb]byte)(src[i*bb:])
		y := (*[bs]float32)(dst[i*bs:])
		d := f16(b[208:210])
		for h := 0; h < 2; h++ {
			ql := (*[64]byte)(b[64*h:])
			qh := (*[32]byte)(b[128+32*h:])
			sc := (*[8]byte)(b[192+8*h:])
			out := (*[128]float32)(y[128*h:])
			for half := 0; half < 2; half++ { // l in [16·half, 16·half+16): scale index is = half
				// ggml computes d·sc first, then ·q.
				s0 := d * int8ToF32[sc[half+0]]
				s2 := d * int8ToF32[sc[half+2]]
				s4 := d * int8ToF32[sc[half+4]]
				s6 := d * int8ToF32[sc[half+6]]
				for l := 16 * half; l < 16*half+16; l++ {
					a, c, e := ql[l], ql[l+32], qh[l]
					out[l] = s0 * sixBitToF32[a&15|(e&3)<<4]
					out[l+32] = s2 * sixBitToF32[c&15|(e>>2&3)<<4]
					out[l+64] = s4 * sixBitToF32[a>>4|(e>>4&3)<<4]
					out[l+96] = s6 * sixBitToF32[c>>4|(e>>6)<<4]
				}
			}
		}
	}
}

func decodeQ8_KGeneric(src []byte, dst []float32) {
	const bb, bs = 292, 256
	for i := 0; i < len(dst)/bs; i++ {
		b := (*[bb]byte)(src[i*bb:])
		y := (*[bs]float32)(dst[i*bs:])
		d := math.Float32frombits(binary.LittleEndian.Uint32(b[0:4]))
		q := (*[bs]byte)(b[4:])
		for j, v := range q {
			y[j] = d * int8ToF32[v]
		}
	}
}
