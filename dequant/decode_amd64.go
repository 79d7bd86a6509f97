//go:build amd64 && !purego

package dequant

import (
	"encoding/binary"
	"math"

	"golang.org/x/sys/cpu"

	"github.com/forge-llm/forge/gguf"
)

// AVX2 fast paths for every supported type but F32. The Go side widens
// each block's f16 scale(s), and any packed group scales, to float32 into a
// small stack buffer, a chunk of blocks at a time, exactly as the generic
// decoders compute them; the assembly (decode_amd64.s) then does the
// per-element work eight lanes at a time with the same float32 operations,
// so results are bit-identical. Machines without AVX2 and F16C, and builds
// with the purego tag, use the generic decoders.

//go:noescape
func lut4AVX2(src *byte, stride int, table *[16]int8, d *float32, dst *float32, n int)

//go:noescape
func i8AVX2(src *byte, stride int, d *float32, dst *float32, n int)

//go:noescape
func q4_1AVX2(src *byte, dm *float32, dst *float32, n int)

//go:noescape
func q5_0AVX2(src *byte, dm *float32, dst *float32, n int)

//go:noescape
func q5_1AVX2(src *byte, dm *float32, dst *float32, n int)

//go:noescape
func q2_KAVX2(src *byte, dm *float32, dst *float32, n int)

//go:noescape
func q3_KAVX2(src *byte, ds *float32, dst *float32, n int)

//go:noescape
func q4_KAVX2(src *byte, dm *float32, dst *float32, n int)

//go:noescape
func q5_KAVX2(src *byte, dm *float32, dst *float32, n int)

//go:noescape
func q6_KAVX2(src *byte, ds *float32, dst *float32, n int)

//go:noescape
func f16ToF32F16C(src *byte, dst *float32, n int)

//go:noescape
func bf16ToF32AVX2(src *byte, dst *float32, n int)

//go:noescape
func f32ToF16F16C(src *float32, dst *uint16, n int) (nan bool)

// useAVX2 selects the assembly paths; tests turn it off to check the
// generic decoders too. (Every AVX2 processor also has F16C, which the
// half-precision conversions use; the check asks for both anyway.)
var useAVX2 = cpu.X86.HasAVX2 && cpu.X86.HasF16C

func decodeF16(src []byte, dst []float32) {
	n := 0 // elements done by F16C: whole groups of 8
	if useAVX2 {
		if n = len(dst) &^ 7; n > 0 {
			f16ToF32F16C(&src[:2*n][0], &dst[:n][0], n)
		}
	}
	decodeF16Generic(src[2*n:], dst[n:])
}

func decodeBF16(src []byte, dst []float32) {
	n := 0 // elements done by AVX2: whole groups of 8
	if useAVX2 {
		if n = len(dst) &^ 7; n > 0 {
			bf16ToF32AVX2(&src[:2*n][0], &dst[:n][0], n)
		}
	}
	decodeBF16Generic(src[2*n:], dst[n:])
}

// f32sToF16s is F32ToF16 over a slice.
func f32sToF16s(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	n := 0 // elements done by F16C: whole groups of 8
	if useAVX2 {
		if n = len(src) &^ 7; n > 0 && f32ToF16F16C(&src[0], &dst[0], n) {
			// F16C keeps NaN payloads; rewrite NaNs as F32ToF16 does.
			for i, f := range src[:n] {
				if f != f {
					dst[i] = F32ToF16(f)
				}
			}
		}
	}
	f32sToF16sGeneric(dst[n:], src[n:])
}

// chunk is how many 32-element blocks' scales are widened per assembly
// call (a 256-byte stack buffer).
const chunk = 64

// centred4I8[k] = k-8, Q4_0's code values as the table lut4AVX2 takes.
var centred4I8 = [16]int8{-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7}

// lut4Blocks decodes 32-element blocks of bb bytes whose 16 code bytes
// start at byte off, with table values and a per-block scale in the
// block's first bytes (f16, or an E8M0 byte for MXFP4): Q4_0, IQ4_NL and
// MXFP4.
func lut4Blocks(src []byte, dst []float32, bb, off int, table *[16]int8, e8m0 bool) {
	const bs = 32
	var d [chunk]float32
	nb := len(dst) / bs
	for b0 := 0; b0 < nb; b0 += chunk {
		n := min(chunk, nb-b0)
		s := src[b0*bb : (b0+n)*bb]
		y := dst[b0*bs : (b0+n)*bs]
		if e8m0 {
			for k := range n {
				d[k] = E8M0ToF32Half(s[k*bb])
			}
		} else {
			for k := range n {
				d[k] = f16(s[k*bb:])
			}
		}
		lut4AVX2(&s[off], bb, table, &d[0], &y[0], n)
	}
}

func decodeQ4_0(src []byte, dst []float32) {
	if !useAVX2 {
		decodeQ4_0Generic(src, dst)
		return
	}
	lut4Blocks(src, dst, 18, 2, &centred4I8, false)
}

func decodeIQ4_NL(src []byte, dst []float32) {
	if !useAVX2 {
		decodeIQ4_NLGeneric(src, dst)
		return
	}
	lut4Blocks(src, dst, 18, 2, &KValuesIQ4NL, false)
}

func decodeMXFP4(src []byte, dst []float32) {
	if !useAVX2 {
		decodeMXFP4Generic(src, dst)
		return
	}
	lut4Blocks(src, dst, 17, 1, &KValuesMXFP4, true)
}

func decodeIQ4_XS(src []byte, dst []float32) {
	if !useAVX2 {
		decodeIQ4_XSGeneric(src, dst)
		return
	}
	// Each block is 8 IQ4_NL-like groups of 16 code bytes at offset 8,
	// with scales d·(ls-32): one assembly call per block.
	const bb, bs = 136, 256
	var dl [8]float32
	for i := 0; i < len(dst)/bs; i++ {
		b := (*[bb]byte)(src[i*bb:])
		y := dst[i*bs : i*bs+bs]
		d := f16(b[0:2])
		sh := uint16(b[2]) | uint16(b[3])<<8
		for g := range dl {
			ls := int(b[4+g/2]>>(4*(g%2))&0xf) | int(sh>>(2*g)&3)<<4
			dl[g] = d * float32(ls-32)
		}
		lut4AVX2(&b[8], 16, &KValuesIQ4NL, &dl[0], &y[0], 8)
	}
}

func decodeQ8_0(src []byte, dst []float32) {
	if !useAVX2 {
		decodeQ8_0Generic(src, dst)
		return
	}
	i8Blocks(src, dst, 34, 2)
}

func decodeQ8_1(src []byte, dst []float32) {
	if !useAVX2 {
		decodeQ8_1Generic(src, dst)
		return
	}
	i8Blocks(src, dst, 36, 4)
}

// i8Blocks decodes 32-element blocks of bb bytes: an f16 scale first, 32
// signed codes from byte off.
func i8Blocks(src []byte, dst []float32, bb, off int) {
	const bs = 32
	var d [chunk]float32
	nb := len(dst) / bs
	for b0 := 0; b0 < nb; b0 += chunk {
		n := min(chunk, nb-b0)
		s := src[b0*bb : (b0+n)*bb]
		y := dst[b0*bs : (b0+n)*bs]
		for k := range n {
			d[k] = f16(s[k*bb:])
		}
		i8AVX2(&s[off], bb, &d[0], &y[0], n)
	}
}

func decodeQ8_K(src []byte, dst []float32) {
	if !useAVX2 {
		decodeQ8_KGeneric(src, dst)
		return
	}
	// One call per block: 8 runs of 32 codes sharing the float32 scale.
	const bb, bs = 292, 256
	var d [8]float32
	for i := 0; i < len(dst)/bs; i++ {
		b := src[i*bb : i*bb+bb]
		y := dst[i*bs : i*bs+bs]
		dd := math.Float32frombits(binary.LittleEndian.Uint32(b))
		for k := range d {
			d[k] = dd
		}
		i8AVX2(&b[4], 32, &d[0], &y[0], 8)
	}
}

// legacyBlocks decodes 32-element blocks of bb bytes with the assembly
// routine kernel, after widening each block's f16 d (and, when withMin,
// the f16 m that follows it) into a float32 buffer.
// legacyBlocks decodes Q4_1, Q5_0 or Q5_1 (t) in chunks. The kernel is
// chosen by a switch rather than passed as a func value: a call through a
// func value hides //go:noescape, so dm would move to the heap on every call.
func legacyBlocks(src []byte, dst []float32, t gguf.Type) {
	bb, withMin := t.BlockBytes(), t != gguf.TypeQ5_0
	const bs = 32
	var dm [2 * chunk]float32
	nb := len(dst) / bs
	for b0 := 0; b0 < nb; b0 += chunk {
		n := min(chunk, nb-b0)
		s := src[b0*bb : (b0+n)*bb]
		y := dst[b0*bs : (b0+n)*bs]
		if withMin {
			for k := range n {
				dm[2*k], dm[2*k+1] = f16(s[k*bb:]), f16(s[k*bb+2:])
			}
		} else {
			for k := range n {
				dm[k] = f16(s[k*bb:])
			}
		}
		switch t {
		case gguf.TypeQ4_1:
			q4_1AVX2(&s[0], &dm[0], &y[0], n)
		case gguf.TypeQ5_0:
			q5_0AVX2(&s[0], &dm[0], &y[0], n)
		default:
			q5_1AVX2(&s[0], &dm[0], &y[0], n)
		}
	}
}

func decodeQ4_1(src []byte, dst []float32) {
	if !useAVX2 {
		decodeQ4_1Generic(src, dst)
		return
	}
	legacyBlocks(src, dst, gguf.TypeQ4_1)
}

func decodeQ5_0(src []byte, dst []float32) {
	if !useAVX2 {
		decodeQ5_0Generic(src, dst)
		return
	}
	legacyBlocks(src, dst, gguf.TypeQ5_0)
}

func decodeQ5_1(src []byte, dst []float32) {
	if !useAVX2 {
		decodeQ5_1Generic(src, dst)
		return
	}
	legacyBlocks(src, dst, gguf.TypeQ5_1)
}

// kScalesMins widens the scales and mins of Q4_K/Q5_K blocks (n blocks of
// bb bytes from s) into dm: per block, d·sc[g] for g = 0..7 then
// dmin·m[g], computed as the generic decoders do.
func kScalesMins(s []byte, bb, n int, dm []float32) {
	for k := range n {
		b := s[k*bb : k*bb+16]
		d, dmin := f16(b[0:2]), f16(b[2:4])
		out := (*[16]float32)(dm[16*k:])
		for g := 0; g < 8; g++ {
			sc, m := scaleMinK4(g, (*[12]byte)(b[4:16]))
			out[g], out[8+g] = d*float32(sc), dmin*float32(m)
		}
	}
}

func decodeQ4_K(src []byte, dst []float32) {
	if !useAVX2 {
		decodeQ4_KGeneric(src, dst)
		return
	}
	const bb, bs, kchunk = 144, 256, 16
	var dm [kchunk * 16]float32
	nb := len(dst) / bs
	for b0 := 0; b0 < nb; b0 += kchunk {
		n := min(kchunk, nb-b0)
		s := src[b0*bb : (b0+n)*bb]
		y := dst[b0*bs : (b0+n)*bs]
		kScalesMins(s, bb, n, dm[:])
		q4_KAVX2(&s[0], &dm[0], &y[0], n)
	}
}

func decodeQ5_K(src []byte, dst []float32) {
	if !useAVX2 {
		decodeQ5_KGeneric(src, dst)
		return
	}
	const bb, bs, kchunk = 176, 256, 16
	var dm [kchunk * 16]float32
	nb := len(dst) / bs
	for b0 := 0; b0 < nb; b0 += kchunk {
		n := min(kchunk, nb-b0)
		s := src[b0*bb : (b0+n)*bb]
		y := dst[b0*bs : (b0+n)*bs]
		kScalesMins(s, bb, n, dm[:])
		q5_KAVX2(&s[0], &dm[0], &y[0], n)
	}
}

func decodeQ6_K(src []byte, dst []float32) {
	if !useAVX2 {
		decodeQ6_KGeneric(src, dst)
		return
	}
	const bb, bs, kchunk = 210, 256, 16
	var ds [kchunk * 16]float32 // per block: d·scale[g]
	nb := len(dst) / bs
	for b0 := 0; b0 < nb; b0 += kchunk {
		n := min(kchunk, nb-b0)
		s := src[b0*bb : (b0+n)*bb]
		y := dst[b0*bs : (b0+n)*bs]
		for k := range n {
			b := (*[bb]byte)(s[k*bb:])
			d := f16(b[208:210])
			out := (*[16]float32)(ds[16*k:])
			for g, v := range (*[16]byte)(b[192:208]) {
				out[g] = d * int8ToF32[v]
			}
		}
		q6_KAVX2(&s[0], &ds[0], &y[0], n)
	}
}

func decodeQ2_K(src []byte, dst []float32) {
	if !useAVX2 {
		decodeQ2_KGeneric(src, dst)
		return
	}
	const bb, bs, kchunk = 84, 256, 16
	var dm [kchunk * 32]float32 // per block: d·lo(scales[g]), then dmin·hi(scales[g])
	nb := len(dst) / bs
	for b0 := 0; b0 < nb; b0 += kchunk {
		n := min(kchunk, nb-b0)
		s := src[b0*bb : (b0+n)*bb]
		y := dst[b0*bs : (b0+n)*bs]
		for k := range n {
			b := (*[bb]byte)(s[k*bb:])
			d, dmin := f16(b[80:82]), f16(b[82:84])
			out := (*[32]float32)(dm[32*k:])
			for g, sc := range (*[16]byte)(b[0:16]) {
				out[g], out[16+g] = d*float32(sc&0xf), dmin*float32(sc>>4)
			}
		}
		q2_KAVX2(&s[0], &dm[0], &y[0], n)
	}
}

func decodeQ3_K(src []byte, dst []float32) {
	if !useAVX2 {
		decodeQ3_KGeneric(src, dst)
		return
	}
	const bb, bs, kchunk = 110, 256, 16
	var ds [kchunk * 16]float32 // per block: d·(scale[g]-32)
	nb := len(dst) / bs
	for b0 := 0; b0 < nb; b0 += kchunk {
		n := min(kchunk, nb-b0)
		s := src[b0*bb : (b0+n)*bb]
		y := dst[b0*bs : (b0+n)*bs]
		for k := range n {
			b := (*[bb]byte)(s[k*bb:])
			d := f16(b[108:110])
			scales := q3kScales((*[12]byte)(b[96:108]))
			out := (*[16]float32)(ds[16*k:])
			for g, sc := range scales {
				out[g] = d * float32(sc)
			}
		}
		q3_KAVX2(&s[0], &ds[0], &y[0], n)
	}
}
