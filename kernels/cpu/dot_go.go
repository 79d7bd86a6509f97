package cpu

import (
	"encoding/binary"

	"github.com/forge-llm/forge/dequant"
)

// Plain-Go dot products of one weight row (GGUF blocks) with one quantized
// activation row. They are the reference twins of the assembly kernels and
// the path on machines without them. Integer parts are exact; the float
// parts multiply per block as llama.cpp does (d_w·d_x·Σq_w·q_x), so the
// assembly and Go versions agree to float32 rounding.
//
// Block layouts are documented on dequant's block structs (dequant.BlockQ4_K
// and friends); the byte offsets below are those structs' field offsets.

// qrow is one activation row prepared for one weight type.
type qrow struct {
	f  []float32 // F32/F16/BF16 weights: the activations (rounded to the weight's precision)
	q  []int8    // codes, one per column
	d  []float32 // one scale per activation block (32 or 256 columns)
	s  []float32 // 32-blocks: d·Σq (Q8_1: ggml's f16 s)
	bs []int16   // 256-blocks: Σq of each 16 columns
}

func f16le(b []byte) float32 { return dequant.F16ToF32(binary.LittleEndian.Uint16(b)) }

// f16Table widens every f16 bit pattern; the F16 dot product looks values up.
var f16Table = func() *[1 << 16]float32 {
	var t [1 << 16]float32
	for i := range t {
		t[i] = dequant.F16ToF32(uint16(i))
	}
	return &t
}()

func dotWF32Go(w []byte, x *qrow) float32 {
	f := x.f
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(f); i += 4 {
		wb := w[4*i : 4*i+16]
		s0 += f32le(wb[0:]) * f[i]
		s1 += f32le(wb[4:]) * f[i+1]
		s2 += f32le(wb[8:]) * f[i+2]
		s3 += f32le(wb[12:]) * f[i+3]
	}
	for ; i < len(f); i++ {
		s0 += f32le(w[4*i:]) * f[i]
	}
	return (s0 + s1) + (s2 + s3)
}

func f32le(b []byte) float32 {
	return float32frombits(binary.LittleEndian.Uint32(b))
}

func dotWF16Go(w []byte, x *qrow) float32 {
	f := x.f
	w = w[:2*len(f)]
	var s0, s1 float32
	i := 0
	for ; i+2 <= len(f); i += 2 {
		s0 += f16Table[binary.LittleEndian.Uint16(w[2*i:])] * f[i]
		s1 += f16Table[binary.LittleEndian.Uint16(w[2*i+2:])] * f[i+1]
	}
	for ; i < len(f); i++ {
		s0 += f16Table[binary.LittleEndian.Uint16(w[2*i:])] * f[i]
	}
	return s0 + s1
}

func dotWBF16Go(w []byte, x *qrow) float32 {
	f := x.f
	w = w[:2*len(f)]
	var s0, s1 float32
	i := 0
	for ; i+2 <= len(f); i += 2 {
		s0 += dequant.BF16ToF32(binary.LittleEndian.Uint16(w[2*i:])) * f[i]
		s1 += dequant.BF16ToF32(binary.LittleEndian.Uint16(w[2*i+2:])) * f[i+1]
	}
	for ; i < len(f); i++ {
		s0 += dequant.BF16ToF32(binary.LittleEndian.Uint16(w[2*i:])) * f[i]
	}
	return s0 + s1
}

// dotQ8_0Go: block = d f16, 32 int8 codes (34 bytes).
func dotQ8_0Go(w []byte, x *qrow) float32 {
	var acc float32
	for b := range len(x.d) {
		wb := w[34*b : 34*b+34]
		xq := x.q[32*b : 32*b+32]
		var sum int32
		for i, c := range xq {
			sum += int32(int8(wb[2+i])) * int32(c)
		}
		acc += f16le(wb) * x.d[b] * float32(sum)
	}
	return acc
}

// dotQ4_0Go: block = d f16, 16 bytes of nibbles; byte j holds element j
// (low) and j+16 (high); value = nibble - 8.
func dotQ4_0Go(w []byte, x *qrow) float32 {
	var acc float32
	for b := range len(x.d) {
		wb := w[18*b : 18*b+18]
		xq := x.q[32*b : 32*b+32]
		var sum int32
		for j := range 16 {
			c := wb[2+j]
			sum += (int32(c&15)-8)*int32(xq[j]) + (int32(c>>4)-8)*int32(xq[j+16])
		}
		acc += f16le(wb) * x.d[b] * float32(sum)
	}
	return acc
}

// dotQ4_1Go: block = d, m f16, 16 bytes of nibbles; value = nibble·d + m.
// Pairs with Q8_1 activations: Σ = d·d_x·Σ nib·q + m·s_x.
func dotQ4_1Go(w []byte, x *qrow) float32 {
	var acc float32
	for b := range len(x.d) {
		wb := w[20*b : 20*b+20]
		xq := x.q[32*b : 32*b+32]
		var sum int32
		for j := range 16 {
			c := wb[4+j]
			sum += int32(c&15)*int32(xq[j]) + int32(c>>4)*int32(xq[j+16])
		}
		acc += f16le(wb)*x.d[b]*float32(sum) + f16le(wb[2:])*x.s[b]
	}
	return acc
}

// dotQ5_0Go: block = d f16, qh uint32 (fifth bits), 16 bytes of nibbles;
// value = (nibble | bit<<4) - 16.
func dotQ5_0Go(w []byte, x *qrow) float32 {
	var acc float32
	for b := range len(x.d) {
		wb := w[22*b : 22*b+22]
		xq := x.q[32*b : 32*b+32]
		qh := binary.LittleEndian.Uint32(wb[2:])
		var sum int32
		for j := range 16 {
			c := wb[6+j]
			lo := int32(c&15) | int32(qh>>j&1)<<4
			hi := int32(c>>4) | int32(qh>>(j+16)&1)<<4
			sum += (lo-16)*int32(xq[j]) + (hi-16)*int32(xq[j+16])
		}
		acc += f16le(wb) * x.d[b] * float32(sum)
	}
	return acc
}

// dotQ5_1Go: block = d, m f16, qh uint32, 16 bytes; value = q·d + m.
func dotQ5_1Go(w []byte, x *qrow) float32 {
	var acc float32
	for b := range len(x.d) {
		wb := w[24*b : 24*b+24]
		xq := x.q[32*b : 32*b+32]
		qh := binary.LittleEndian.Uint32(wb[4:])
		var sum int32
		for j := range 16 {
			c := wb[8+j]
			lo := int32(c&15) | int32(qh>>j&1)<<4
			hi := int32(c>>4) | int32(qh>>(j+16)&1)<<4
			sum += lo*int32(xq[j]) + hi*int32(xq[j+16])
		}
		acc += f16le(wb)*x.d[b]*float32(sum) + f16le(wb[2:])*x.s[b]
	}
	return acc
}

// dotIQ4_NLGo: laid out like Q4_0, codes index dequant.KValuesIQ4NL.
func dotIQ4_NLGo(w []byte, x *qrow) float32 {
	kv := &dequant.KValuesIQ4NL
	var acc float32
	for b := range len(x.d) {
		wb := w[18*b : 18*b+18]
		xq := x.q[32*b : 32*b+32]
		var sum int32
		for j := range 16 {
			c := wb[2+j]
			sum += int32(kv[c&15])*int32(xq[j]) + int32(kv[c>>4])*int32(xq[j+16])
		}
		acc += f16le(wb) * x.d[b] * float32(sum)
	}
	return acc
}

// dotMXFP4Go: block = E8M0 exponent, 16 bytes of E2M1 codes (laid out like
// Q4_0) indexing dequant.KValuesMXFP4 (doubled values, so the scale is
// halved).
func dotMXFP4Go(w []byte, x *qrow) float32 {
	kv := &dequant.KValuesMXFP4
	var acc float32
	for b := range len(x.d) {
		wb := w[17*b : 17*b+17]
		xq := x.q[32*b : 32*b+32]
		var sum int32
		for j := range 16 {
			c := wb[1+j]
			sum += int32(kv[c&15])*int32(xq[j]) + int32(kv[c>>4])*int32(xq[j+16])
		}
		acc += dequant.E8M0ToF32Half(wb[0]) * x.d[b] * float32(sum)
	}
	return acc
}

// k4Scales unpacks the 12 packed bytes of Q4_K/Q5_K into 8 six-bit scales
// and mins (see dequant.BlockQ4_K).
func k4Scales(s []byte) (sc, mn [8]int32) {
	s = s[:12]
	for g := range 4 {
		sc[g] = int32(s[g] & 63)
		mn[g] = int32(s[g+4] & 63)
	}
	for g := 4; g < 8; g++ {
		sc[g] = int32(s[g+4]&15) | int32(s[g-4]>>6)<<4
		mn[g] = int32(s[g+4]>>4) | int32(s[g]>>6)<<4
	}
	return
}

// dotQ4_KGo: super-block = d, dmin f16, 12 scale bytes, 128 bytes of
// nibbles (144 bytes). Groups 2p and 2p+1 share qs[32p:32p+32] (low, high
// nibbles). Σ = d_x·(d·Σ_g sc_g·Σ q·x − dmin·Σ_g mn_g·Σ x_g).
func dotQ4_KGo(w []byte, x *qrow) float32 {
	var acc float32
	for b := range len(x.d) {
		wb := w[144*b : 144*b+144]
		xq := x.q[256*b : 256*b+256]
		bs := x.bs[16*b : 16*b+16]
		sc, mn := k4Scales(wb[4:16])
		qs := wb[16:144]
		var sumi, summ int32
		for p := range 4 {
			var lo, hi int32
			for l := range 32 {
				c := qs[32*p+l]
				lo += int32(c&15) * int32(xq[64*p+l])
				hi += int32(c>>4) * int32(xq[64*p+32+l])
			}
			sumi += sc[2*p]*lo + sc[2*p+1]*hi
		}
		for g := range 8 {
			summ += mn[g] * (int32(bs[2*g]) + int32(bs[2*g+1]))
		}
		acc += x.d[b]*f16le(wb)*float32(sumi) - x.d[b]*f16le(wb[2:])*float32(summ)
	}
	return acc
}

// dotQ5_KGo: as Q4_K plus qh[32] at offset 16 (bit g of qh[l] is the fifth
// bit of element 32g+l); nibbles at offset 48.
func dotQ5_KGo(w []byte, x *qrow) float32 {
	var acc float32
	for b := range len(x.d) {
		wb := w[176*b : 176*b+176]
		xq := x.q[256*b : 256*b+256]
		bs := x.bs[16*b : 16*b+16]
		sc, mn := k4Scales(wb[4:16])
		qh := wb[16:48]
		qs := wb[48:176]
		var sumi, summ int32
		for p := range 4 {
			var lo, hi int32
			for l := range 32 {
				c := qs[32*p+l]
				ql := int32(c&15) | int32(qh[l]>>(2*p)&1)<<4
				qu := int32(c>>4) | int32(qh[l]>>(2*p+1)&1)<<4
				lo += ql * int32(xq[64*p+l])
				hi += qu * int32(xq[64*p+32+l])
			}
			sumi += sc[2*p]*lo + sc[2*p+1]*hi
		}
		for g := range 8 {
			summ += mn[g] * (int32(bs[2*g]) + int32(bs[2*g+1]))
		}
		acc += x.d[b]*f16le(wb)*float32(sumi) - x.d[b]*f16le(wb[2:])*float32(summ)
	}
	return acc
}

// dotQ6_KGo: super-block = ql[128], qh[64], int8 scales[16], d f16 (210
// bytes); q = 6-bit code − 32, groups of 16.
func dotQ6_KGo(w []byte, x *qrow) float32 {
	var acc float32
	for b := range len(x.d) {
		wb := w[210*b : 210*b+210]
		xq := x.q[256*b : 256*b+256]
		var codes [256]int8
		for h := range 2 {
			ql := wb[64*h : 64*h+64]
			qh := wb[128+32*h : 128+32*h+32]
			c := codes[128*h : 128*h+128]
			for l := range 32 {
				c[l] = int8(ql[l]&15|(qh[l]&3)<<4) - 32
				c[l+32] = int8(ql[l+32]&15|(qh[l]>>2&3)<<4) - 32
				c[l+64] = int8(ql[l]>>4|(qh[l]>>4&3)<<4) - 32
				c[l+96] = int8(ql[l+32]>>4|(qh[l]>>6&3)<<4) - 32
			}
		}
		var sumi int32
		for g := range 16 {
			var s int32
			for i := 16 * g; i < 16*g+16; i++ {
				s += int32(codes[i]) * int32(xq[i])
			}
			sumi += int32(int8(wb[192+g])) * s
		}
		acc += x.d[b] * f16le(wb[208:]) * float32(sumi)
	}
	return acc
}

// dotQ3_KGo: super-block = hmask[32], qs[64], 12 scale bytes, d f16 (110
// bytes); q = low2 − 4·(hmask bit clear), scales 6-bit − 32, groups of 16.
func dotQ3_KGo(w []byte, x *qrow) float32 {
	var acc float32
	for b := range len(x.d) {
		wb := w[110*b : 110*b+110]
		xq := x.q[256*b : 256*b+256]
		hm := wb[0:32]
		qs := wb[32:96]
		s := wb[96:108]
		var codes [256]int8
		for i := range 256 {
			h, r := i/128, i%128
			sh, l := r/32, r%32
			c := int8(qs[32*h+l] >> (2 * sh) & 3)
			if hm[i%32]>>(i/32)&1 == 0 {
				c -= 4
			}
			codes[i] = c
		}
		var sumi int32
		for g := range 16 {
			var lo int32
			if g < 8 {
				lo = int32(s[g] & 15)
			} else {
				lo = int32(s[g-8] >> 4)
			}
			sc := lo | int32(s[8+g%4]>>(2*(g/4))&3)<<4
			var t int32
			for i := 16 * g; i < 16*g+16; i++ {
				t += int32(codes[i]) * int32(xq[i])
			}
			sumi += (sc - 32) * t
		}
		acc += x.d[b] * f16le(wb[108:]) * float32(sumi)
	}
	return acc
}

// dotQ2_KGo: super-block = scales[16] (scale low nibble, min high nibble),
// qs[64] (2-bit codes, packed as Q3_K's low bits), d, dmin f16 (84 bytes).
func dotQ2_KGo(w []byte, x *qrow) float32 {
	var acc float32
	for b := range len(x.d) {
		wb := w[84*b : 84*b+84]
		xq := x.q[256*b : 256*b+256]
		bs := x.bs[16*b : 16*b+16]
		sc := wb[0:16]
		qs := wb[16:80]
		var sumi, summ int32
		for g := range 16 {
			var t int32
			for i := 16 * g; i < 16*g+16; i++ {
				h, r := i/128, i%128
				c := int32(qs[32*h+r%32] >> (2 * (r / 32)) & 3)
				t += c * int32(xq[i])
			}
			sumi += int32(sc[g]&15) * t
			summ += int32(sc[g]>>4) * int32(bs[g])
		}
		acc += x.d[b]*f16le(wb[80:])*float32(sumi) - x.d[b]*f16le(wb[82:])*float32(summ)
	}
	return acc
}

// dotIQ4_XSGo: super-block = d f16, scales_h u16, scales_l[4], qs[128]
// (136 bytes); group g (32 values) has scale ls−32 and codes laid out like
// IQ4_NL in qs[16g:16g+16].
func dotIQ4_XSGo(w []byte, x *qrow) float32 {
	kv := &dequant.KValuesIQ4NL
	var acc float32
	for b := range len(x.d) {
		wb := w[136*b : 136*b+136]
		xq := x.q[256*b : 256*b+256]
		sh := binary.LittleEndian.Uint16(wb[2:])
		var sumi int32
		for g := range 8 {
			ls := int32(wb[4+g/2]>>(4*(g%2))&15) | int32(sh>>(2*g)&3)<<4
			qs := wb[8+16*g : 8+16*g+16]
			xg := xq[32*g : 32*g+32]
			var t int32
			for j := range 16 {
				t += int32(kv[qs[j]&15])*int32(xg[j]) + int32(kv[qs[j]>>4])*int32(xg[j+16])
			}
			sumi += (ls - 32) * t
		}
		acc += x.d[b] * f16le(wb) * float32(sumi)
	}
	return acc
}
