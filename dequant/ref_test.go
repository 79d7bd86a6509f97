package dequant

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/forge-llm/forge/gguf"
)

// refDecode is a deliberately naive decoder written straight from ggml's
// dequantize_row_* loops: element by element, no tables, the same float32
// operations in the same order. The fast decoders must agree with it bit
// for bit on arbitrary blocks.
func refDecode(typ gguf.Type, src []byte, y []float32) {
	bs, bb := typ.BlockSize(), typ.BlockBytes()
	h := func(b []byte) float32 { return F16ToF32(binary.LittleEndian.Uint16(b)) }
	for i := 0; i < len(y)/bs; i++ {
		x := src[i*bb : (i+1)*bb]
		y := y[i*bs : (i+1)*bs]
		switch typ {
		case gguf.TypeF32:
			y[0] = math.Float32frombits(binary.LittleEndian.Uint32(x))
		case gguf.TypeF16:
			y[0] = h(x)
		case gguf.TypeBF16:
			y[0] = BF16ToF32(binary.LittleEndian.Uint16(x))
		case gguf.TypeQ4_0:
			d := h(x)
			for j := 0; j < 16; j++ {
				y[j] = float32(int(x[2+j]&0xf)-8) * d
				y[j+16] = float32(int(x[2+j]>>4)-8) * d
			}
		case gguf.TypeQ4_1:
			d, m := h(x), h(x[2:])
			for j := 0; j < 16; j++ {
				y[j] = float32(float32(x[4+j]&0xf)*d) + m
				y[j+16] = float32(float32(x[4+j]>>4)*d) + m
			}
		case gguf.TypeQ5_0, gguf.TypeQ5_1:
			off := 2
			var m float32
			if typ == gguf.TypeQ5_1 {
				m, off = h(x[2:]), 4
			}
			d := h(x)
			qh := binary.LittleEndian.Uint32(x[off:])
			qs := x[off+4:]
			for j := 0; j < 16; j++ {
				xh0 := uint8((qh>>j)<<4) & 0x10
				xh1 := uint8(qh>>(j+12)) & 0x10
				x0, x1 := int(qs[j]&0xf|xh0), int(qs[j]>>4|xh1)
				if typ == gguf.TypeQ5_0 {
					y[j], y[j+16] = float32(x0-16)*d, float32(x1-16)*d
				} else {
					y[j], y[j+16] = float32(float32(x0)*d)+m, float32(float32(x1)*d)+m
				}
			}
		case gguf.TypeQ8_0, gguf.TypeQ8_1:
			d := h(x)
			qs := x[2:]
			if typ == gguf.TypeQ8_1 {
				qs = x[4:]
			}
			for j := 0; j < 32; j++ {
				y[j] = float32(int8(qs[j])) * d
			}
		case gguf.TypeQ2_K:
			d, mn := h(x[80:]), h(x[82:])
			q := x[16:]
			is, k := 0, 0
			for n := 0; n < 256; n += 128 {
				for shift := 0; shift < 8; shift += 2 {
					for half := 0; half < 2; half++ {
						sc := x[is]
						is++
						dl, ml := d*float32(sc&0xf), mn*float32(sc>>4)
						for l := 0; l < 16; l++ {
							y[k] = float32(dl*float32((q[l+16*half]>>shift)&3)) - ml
							k++
						}
					}
				}
				q = q[32:]
			}
		case gguf.TypeQ3_K:
			d := h(x[108:])
			hm, q, s := x[0:32], x[32:], x[96:108]
			a0 := binary.LittleEndian.Uint32(s[0:])
			a1 := binary.LittleEndian.Uint32(s[4:])
			tmp := binary.LittleEndian.Uint32(s[8:])
			const k1, k2 = 0x03030303, 0x0f0f0f0f
			aux := [4]uint32{
				a0&k2 | (tmp>>0&k1)<<4,
				a1&k2 | (tmp>>2&k1)<<4,
				(a0>>4)&k2 | (tmp>>4&k1)<<4,
				(a1>>4)&k2 | (tmp>>6&k1)<<4,
			}
			var scales [16]int8
			for g := range scales {
				scales[g] = int8(aux[g/4] >> (8 * (g % 4)))
			}
			is, k := 0, 0
			m := uint8(1)
			for n := 0; n < 256; n += 128 {
				for shift := 0; shift < 8; shift += 2 {
					for half := 0; half < 2; half++ {
						dl := d * float32(int(scales[is])-32)
						is++
						for l := 16 * half; l < 16*half+16; l++ {
							v := int((q[l] >> shift) & 3)
							if hm[l]&m == 0 {
								v -= 4
							}
							y[k] = dl * float32(v)
							k++
						}
					}
					m <<= 1
				}
				q = q[32:]
			}
		case gguf.TypeQ4_K, gguf.TypeQ5_K:
			d, mn := h(x), h(x[2:])
			s := (*[12]byte)(x[4:16])
			qh, ql := x[16:48], x[48:]
			if typ == gguf.TypeQ4_K {
				ql = x[16:]
			}
			u1, u2 := uint8(1), uint8(2)
			k := 0
			for is := 0; is < 8; is += 2 {
				sc, m := scaleMinK4(is, s)
				d1, m1 := d*float32(sc), mn*float32(m)
				sc, m = scaleMinK4(is+1, s)
				d2, m2 := d*float32(sc), mn*float32(m)
				for l := 0; l < 32; l++ {
					v := int(ql[l] & 0xf)
					if typ == gguf.TypeQ5_K && qh[l]&u1 != 0 {
						v += 16
					}
					y[k] = float32(d1*float32(v)) - m1
					k++
				}
				for l := 0; l < 32; l++ {
					v := int(ql[l] >> 4)
					if typ == gguf.TypeQ5_K && qh[l]&u2 != 0 {
						v += 16
					}
					y[k] = float32(d2*float32(v)) - m2
					k++
				}
				ql = ql[32:]
				u1 <<= 2
				u2 <<= 2
			}
		case gguf.TypeQ6_K:
			d := h(x[208:])
			ql, qh, sc := x[0:128], x[128:192], x[192:208]
			for n := 0; n < 256; n += 128 {
				for l := 0; l < 32; l++ {
					is := l / 16
					q1 := int8(ql[l]&0xf|(qh[l]>>0&3)<<4) - 32
					q2 := int8(ql[l+32]&0xf|(qh[l]>>2&3)<<4) - 32
					q3 := int8(ql[l]>>4|(qh[l]>>4&3)<<4) - 32
					q4 := int8(ql[l+32]>>4|(qh[l]>>6&3)<<4) - 32
					y[n+l] = d * float32(int8(sc[is])) * float32(q1)
					y[n+l+32] = d * float32(int8(sc[is+2])) * float32(q2)
					y[n+l+64] = d * float32(int8(sc[is+4])) * float32(q3)
					y[n+l+96] = d * float32(int8(sc[is+6])) * float32(q4)
				}
				ql, qh, sc = ql[64:], qh[32:], sc[8:]
			}
		case gguf.TypeQ8_K:
			d := math.Float32frombits(binary.LittleEndian.Uint32(x))
			for j := 0; j < 256; j++ {
				y[j] = d * float32(int8(x[4+j]))
			}
		case gguf.TypeIQ4_NL:
			d := h(x)
			for j := 0; j < 16; j++ {
				y[j] = d * float32(KValuesIQ4NL[x[2+j]&0xf])
				y[j+16] = d * float32(KValuesIQ4NL[x[2+j]>>4])
			}
		case gguf.TypeIQ4_XS:
			d := h(x)
			sh := binary.LittleEndian.Uint16(x[2:])
			for ib := 0; ib < 8; ib++ {
				ls := int(x[4+ib/2]>>(4*(ib%2))&0xf) | int(sh>>(2*ib)&3)<<4
				dl := d * float32(ls-32)
				qs := x[8+16*ib:]
				for j := 0; j < 16; j++ {
					y[32*ib+j] = dl * float32(KValuesIQ4NL[qs[j]&0xf])
					y[32*ib+j+16] = dl * float32(KValuesIQ4NL[qs[j]>>4])
				}
			}
		case gguf.TypeMXFP4:
			var bits uint32
			if e := x[0]; e < 2 {
				bits = 0x00200000 << e
			} else {
				bits = uint32(e-1) << 23
			}
			d := math.Float32frombits(bits)
			for j := 0; j < 16; j++ {
				y[j] = float32(KValuesMXFP4[x[1+j]&0xf]) * d
				y[j+16] = float32(KValuesMXFP4[x[1+j]>>4]) * d
			}
		default:
			panic("refDecode: " + typ.String())
		}
	}
}

// sameBits compares float32 slices bit for bit, except that any NaN
// matches any NaN.
func sameBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	bad := 0
	for i := range want {
		g, w := got[i], want[i]
		if math.Float32bits(g) == math.Float32bits(w) || (math.IsNaN(float64(g)) && math.IsNaN(float64(w))) {
			continue
		}
		if bad++; bad <= 5 {
			t.Errorf("%s: y[%d] = %v (%#08x), want %v (%#08x)", what, i, g, math.Float32bits(g), w, math.Float32bits(w))
		}
	}
	if bad > 5 {
		t.Errorf("%s: %d mismatches in all", what, bad)
	}
}

// randomBlocks returns nblocks blocks of uniformly random bytes: every
// code, every packed scale and every f16 scale pattern (NaN, infinity,
// subnormal) turns up.
func randomBlocks(r *rand.Rand, typ gguf.Type, nblocks int) []byte {
	b := make([]byte, nblocks*typ.BlockBytes())
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestDecodersMatchReference(t *testing.T) {
	paths := []bool{false}
	if useAVX2 {
		paths = append(paths, true)
	}
	defer func(saved bool) { useAVX2 = saved }(useAVX2)
	for _, avx2 := range paths {
		useAVX2 = avx2
		r := rand.New(rand.NewPCG(3, 4))
		for _, typ := range supportedTypes {
			name := typ.String()
			if avx2 {
				name += " (AVX2)"
			}
			nb := 300 // not a multiple of the assembly's chunk sizes
			if typ.BlockSize() == 1 {
				nb = 1 << 16
			}
			src := randomBlocks(r, typ, nb)
			n := nb * typ.BlockSize()
			got, want := make([]float32, n), make([]float32, n)
			if err := ToFloat32(typ, src, got); err != nil {
				t.Fatal(err)
			}
			refDecode(typ, src, want)
			sameBits(t, name, got, want)

			// Every prefix length up to a few blocks, so short calls and
			// chunk tails are covered.
			for k := 1; k <= 5; k++ {
				part := make([]float32, k*typ.BlockSize())
				if err := ToFloat32(typ, src, part); err != nil {
					t.Fatal(err)
				}
				sameBits(t, name+" prefix", part, want[:len(part)])
			}
			for _, w := range []int{0, 1, 2, 3, 7} {
				par := make([]float32, n)
				if err := ParallelToFloat32(typ, src, par, w); err != nil {
					t.Fatal(err)
				}
				sameBits(t, name+" parallel", par, want)
			}
		}
	}
}

// TestToFloat16MatchesF32ToF16: decoding to half must equal F32ToF16 of
// the float32 decoding, element for element (NaN, infinity, subnormal
// and odd-length tails included), on every path; F16 input is copied.
func TestToFloat16MatchesF32ToF16(t *testing.T) {
	paths := []bool{false}
	if useAVX2 {
		paths = append(paths, true)
	}
	defer func(saved bool) { useAVX2 = saved }(useAVX2)
	for _, avx2 := range paths {
		useAVX2 = avx2
		r := rand.New(rand.NewPCG(17, 18))
		for _, typ := range supportedTypes {
			nb := 77
			if typ.BlockSize() == 1 {
				nb = 4099 // not a multiple of 8
			}
			src := randomBlocks(r, typ, nb)
			n := nb * typ.BlockSize()
			f := make([]float32, n)
			h := make([]uint16, n)
			if err := ToFloat32(typ, src, f); err != nil {
				t.Fatal(err)
			}
			if err := ToFloat16(typ, src, h); err != nil {
				t.Fatal(err)
			}
			bad := 0
			for i := range f {
				w := F32ToF16(f[i])
				if typ == gguf.TypeF16 {
					w = binary.LittleEndian.Uint16(src[2*i:]) // F16 is copied, NaN payloads too
				}
				if h[i] != w {
					if bad++; bad <= 5 {
						t.Errorf("%s (AVX2 %v): h[%d] = %#04x, want F32ToF16(%v) = %#04x", typ, avx2, i, h[i], f[i], w)
					}
				}
			}
		}
		// Raw float32 bit patterns through the bulk conversion.
		x := make([]float32, 1<<16+5)
		for i := range x {
			x[i] = math.Float32frombits(r.Uint32())
		}
		h := make([]uint16, len(x))
		f32sToF16s(h, x)
		for i := range x {
			if w := F32ToF16(x[i]); h[i] != w {
				t.Fatalf("AVX2 %v: f32sToF16s(%#08x) = %#04x, want %#04x", avx2, math.Float32bits(x[i]), h[i], w)
			}
		}
	}
}
