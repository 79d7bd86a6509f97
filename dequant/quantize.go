package dequant

import (
	"encoding/binary"
	"math"

	"github.com/forge-llm/forge/gguf"
)

// Reference quantizers for the plain and 32-element formats and Q8_K.
// They follow ggml's quantize_row_*_ref functions operation for operation
// (float32 arithmetic, the same rounding and clamping, the same tie
// rules), so quantizing an F32 tensor here gives the same bytes as
// llama-quantize without an importance matrix. Explicit float32(...)
// conversions around products that are then added keep the compiler from
// fusing them into FMA on architectures where Go does that; ggml's
// reference code rounds each product.

func init() {
	encoders[gguf.TypeF32] = encodeF32
	encoders[gguf.TypeF16] = encodeF16
	encoders[gguf.TypeBF16] = encodeBF16
	encoders[gguf.TypeQ4_0] = encodeQ4_0
	encoders[gguf.TypeQ4_1] = encodeQ4_1
	encoders[gguf.TypeQ5_0] = encodeQ5_0
	encoders[gguf.TypeQ5_1] = encodeQ5_1
	encoders[gguf.TypeQ8_0] = encodeQ8_0
	encoders[gguf.TypeQ8_1] = encodeQ8_1
	encoders[gguf.TypeQ8_K] = encodeQ8_K
}

func putF16(b []byte, f float32) { binary.LittleEndian.PutUint16(b, F32ToF16(f)) }

// roundAway is C's roundf: nearest integer, halves away from zero.
func roundAway(f float32) float32 { return float32(math.Round(float64(f))) }

// nearestInt is ggml's nearest_int: round to nearest, ties to even, by
// adding 1.5·2^23 so the integer lands in the low mantissa bits. Valid for
// |f| ≤ 4194303, as in ggml.
func nearestInt(f float32) int32 {
	v := f + 12582912
	return int32(math.Float32bits(v)&0x007fffff) - 0x00400000
}

// absMax returns max|x| and the signed value that has it (the first one on
// ties), as ggml's legacy quantizers scan for it.
func absMax(x []float32) (amax, max float32) {
	for _, v := range x {
		if a := float32(math.Abs(float64(v))); amax < a {
			amax, max = a, v
		}
	}
	return amax, max
}

// minMax returns the smallest and largest value of x.
func minMax(x []float32) (lo, hi float32) {
	lo, hi = math.MaxFloat32, -math.MaxFloat32
	for _, v := range x {
		if v < lo {
			lo = v
		}
		if v > hi {
			hi = v
		}
	}
	return lo, hi
}

// recip is ggml's "d ? 1.0f/d : 0.0f".
func recip(d float32) float32 {
	if d != 0 {
		return 1 / d
	}
	return 0
}

func encodeF32(src []float32, dst []byte) {
	for i, v := range src {
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
	}
}

func encodeF16(src []float32, dst []byte) {
	for i, v := range src {
		binary.LittleEndian.PutUint16(dst[2*i:], F32ToF16(v))
	}
}

func encodeBF16(src []float32, dst []byte) {
	for i, v := range src {
		binary.LittleEndian.PutUint16(dst[2*i:], F32ToBF16(v))
	}
}

// encodeQ4_0: d = max/-8 where max is the signed value of largest
// magnitude, so that value maps exactly to code 0; codes
// min(15, trunc(x/d + 8.5)).
func encodeQ4_0(src []float32, dst []byte) {
	const bb, bs = 18, 32
	for i := 0; i < len(src)/bs; i++ {
		x := (*[bs]float32)(src[i*bs:])
		b := (*[bb]byte)(dst[i*bb:])
		_, max := absMax(x[:])
		d := max / -8
		id := recip(d)
		putF16(b[0:2], d)
		for j := 0; j < 16; j++ {
			x0, x1 := x[j]*id, x[j+16]*id
			xi0 := min(15, int8(x0+8.5))
			xi1 := min(15, int8(x1+8.5))
			b[2+j] = uint8(xi0) | uint8(xi1)<<4
		}
	}
}

// encodeQ4_1: d = (max-min)/15, m = min; codes min(15, trunc((x-min)/d + 0.5)).
func encodeQ4_1(src []float32, dst []byte) {
	const bb, bs = 20, 32
	for i := 0; i < len(src)/bs; i++ {
		x := (*[bs]float32)(src[i*bs:])
		b := (*[bb]byte)(dst[i*bb:])
		lo, hi := minMax(x[:])
		d := (hi - lo) / 15
		id := recip(d)
		putF16(b[0:2], d)
		putF16(b[2:4], lo)
		for j := 0; j < 16; j++ {
			x0, x1 := (x[j]-lo)*id, (x[j+16]-lo)*id
			xi0 := min(15, int8(x0+0.5))
			xi1 := min(15, int8(x1+0.5))
			b[4+j] = uint8(xi0) | uint8(xi1)<<4
		}
	}
}

// encodeQ5_0: as Q4_0 with 32 levels, d = max/-16.
func encodeQ5_0(src []float32, dst []byte) {
	const bb, bs = 22, 32
	for i := 0; i < len(src)/bs; i++ {
		x := (*[bs]float32)(src[i*bs:])
		b := (*[bb]byte)(dst[i*bb:])
		_, max := absMax(x[:])
		d := max / -16
		id := recip(d)
		putF16(b[0:2], d)
		var qh uint32
		for j := 0; j < 16; j++ {
			x0, x1 := x[j]*id, x[j+16]*id
			xi0 := uint8(min(31, int8(x0+16.5)))
			xi1 := uint8(min(31, int8(x1+16.5)))
			b[6+j] = xi0&15 | (xi1&15)<<4
			qh |= uint32(xi0>>4&1) << j
			qh |= uint32(xi1>>4&1) << (j + 16)
		}
		binary.LittleEndian.PutUint32(b[2:6], qh)
	}
}

// encodeQ5_1: as Q4_1 with 32 levels, d = (max-min)/31.
func encodeQ5_1(src []float32, dst []byte) {
	const bb, bs = 24, 32
	for i := 0; i < len(src)/bs; i++ {
		x := (*[bs]float32)(src[i*bs:])
		b := (*[bb]byte)(dst[i*bb:])
		lo, hi := minMax(x[:])
		d := (hi - lo) / 31
		id := recip(d)
		putF16(b[0:2], d)
		putF16(b[2:4], lo)
		var qh uint32
		for j := 0; j < 16; j++ {
			x0, x1 := (x[j]-lo)*id, (x[j+16]-lo)*id
			xi0 := uint8(x0 + 0.5)
			xi1 := uint8(x1 + 0.5)
			b[8+j] = xi0&15 | (xi1&15)<<4
			qh |= uint32(xi0>>4&1) << j
			qh |= uint32(xi1>>4&1) << (j + 16)
		}
		binary.LittleEndian.PutUint32(b[4:8], qh)
	}
}

// encodeQ8_0: d = max|x|/127, codes roundf(x/d).
func encodeQ8_0(src []float32, dst []byte) {
	const bb, bs = 34, 32
	for i := 0; i < len(src)/bs; i++ {
		x := (*[bs]float32)(src[i*bs:])
		b := (*[bb]byte)(dst[i*bb:])
		amax, _ := absMax(x[:])
		d := amax / 127
		id := recip(d)
		putF16(b[0:2], d)
		for j, v := range x {
			b[2+j] = byte(int8(roundAway(v * id)))
		}
	}
}

// encodeQ8_1: Q8_0 plus s = d·Σq (the integer sum times the float32 d).
func encodeQ8_1(src []float32, dst []byte) {
	const bb, bs = 36, 32
	for i := 0; i < len(src)/bs; i++ {
		x := (*[bs]float32)(src[i*bs:])
		b := (*[bb]byte)(dst[i*bb:])
		amax, _ := absMax(x[:])
		d := amax / 127
		id := recip(d)
		putF16(b[0:2], d)
		sum := 0
		for j, v := range x {
			q := int8(roundAway(v * id))
			b[4+j] = byte(q)
			sum += int(q)
		}
		putF16(b[2:4], float32(sum)*d)
	}
}

// encodeQ8_K: iscale = -127/max (max the signed value of largest
// magnitude), codes min(127, nearest(iscale·x)), d = 1/iscale, plus the
// per-16 sums. An all-zero block gets d = 0 and zero codes and sums.
func encodeQ8_K(src []float32, dst []byte) {
	const bb, bs = 292, 256
	for i := 0; i < len(src)/bs; i++ {
		x := (*[bs]float32)(src[i*bs:])
		b := (*[bb]byte)(dst[i*bb:])
		amax, max := absMax(x[:])
		if amax == 0 {
			clear(b[:])
			continue
		}
		iscale := -127 / max
		for j, v := range x {
			b[4+j] = byte(int8(min(127, nearestInt(iscale*v))))
		}
		for g := 0; g < 16; g++ {
			sum := 0
			for _, q := range b[4+16*g : 4+16*g+16] {
				sum += int(int8(q))
			}
			binary.LittleEndian.PutUint16(b[260+2*g:], uint16(int16(sum)))
		}
		binary.LittleEndian.PutUint32(b[0:4], math.Float32bits(1/iscale))
	}
}
