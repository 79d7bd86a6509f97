package dequant

import (
	"encoding/binary"
	"math"

	"github.com/forge-llm/forge/gguf"
)

// Decoders for the plain float types and ggml's 32-element "legacy" quants.
//
// Speed notes: each decoder walks whole blocks and converts the block and
// output windows to fixed-size array pointers (one bounds check per block,
// none per element). Per element the work is a table load of the code's
// value as float32, ggml's multiply (and add), and a store; the scale's
// f16 is one lookup per block. On amd64 the AVX2 paths in
// decode_amd64.go take over; these remain the portable definition.

func init() {
	decoders[gguf.TypeF32] = decodeF32
	decoders[gguf.TypeF16] = decodeF16
	decoders[gguf.TypeBF16] = decodeBF16
	decoders[gguf.TypeQ4_0] = decodeQ4_0
	decoders[gguf.TypeQ4_1] = decodeQ4_1
	decoders[gguf.TypeQ5_0] = decodeQ5_0
	decoders[gguf.TypeQ5_1] = decodeQ5_1
	decoders[gguf.TypeQ8_0] = decodeQ8_0
	decoders[gguf.TypeQ8_1] = decodeQ8_1
}

// f16 reads the little-endian half at b[0:2] as float32.
func f16(b []byte) float32 { return f16ToF32Table[binary.LittleEndian.Uint16(b)] }

// int8ToF32 maps a byte, read as int8, to its float32 value; a table load
// is cheaper than an integer-to-float conversion in the inner loops.
var int8ToF32 = func() (t [256]float32) {
	for i := range t {
		t[i] = float32(int8(uint8(i)))
	}
	return
}()

func decodeF32(src []byte, dst []float32) {
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
}

// f16ToF32Table is the full half→float32 table ggml also keeps (256 KiB);
// for whole F16 tensors a lookup beats the branchy conversion.
var f16ToF32Table = func() *[1 << 16]float32 {
	t := new([1 << 16]float32)
	for i := range t {
		t[i] = F16ToF32(uint16(i))
	}
	return t
}()

func decodeF16Generic(src []byte, dst []float32) {
	t := f16ToF32Table
	src = src[:2*len(dst)]
	for i := range dst {
		dst[i] = t[binary.LittleEndian.Uint16(src[2*i:])]
	}
}

func decodeBF16Generic(src []byte, dst []float32) {
	src = src[:2*len(dst)]
	for i := range dst {
		dst[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*i:])) << 16)
	}
}

// Code value tables: centred4[k] = k-8, plain32[k] = k, centred32[k] =
// k-16. Loading the float is cheaper than converting an integer, and
// float32(k-8)·d is the same number whichever way k-8 became a float.
var centred4, plain32, centred32 = func() (c4 [16]float32, p32, c32 [32]float32) {
	for k := range c4 {
		c4[k] = float32(k - 8)
	}
	for k := range p32 {
		p32[k] = float32(k)
		c32[k] = float32(k - 16)
	}
	return
}()

func decodeQ4_0Generic(src []byte, dst []float32) {
	const bb, bs = 18, 32
	for i := 0; i < len(dst)/bs; i++ {
		b := (*[bb]byte)(src[i*bb:])
		y := (*[bs]float32)(dst[i*bs:])
		d := f16(b[0:2])
		for j, v := range (*[16]byte)(b[2:]) {
			y[j] = centred4[v&15] * d
			y[j+16] = centred4[v>>4] * d
		}
	}
}

func decodeQ4_1Generic(src []byte, dst []float32) {
	const bb, bs = 20, 32
	for i := 0; i < len(dst)/bs; i++ {
		b := (*[bb]byte)(src[i*bb:])
		y := (*[bs]float32)(dst[i*bs:])
		d, m := f16(b[0:2]), f16(b[2:4])
		for j, v := range (*[16]byte)(b[4:]) {
			// float32(...) keeps the product rounded (no fused multiply-add),
			// as ggml's q·d + m is.
			y[j] = float32(plain32[v&15]*d) + m
			y[j+16] = float32(plain32[v>>4]*d) + m
		}
	}
}

func decodeQ5_0Generic(src []byte, dst []float32) {
	const bb, bs = 22, 32
	for i := 0; i < len(dst)/bs; i++ {
		b := (*[bb]byte)(src[i*bb:])
		y := (*[bs]float32)(dst[i*bs:])
		d := f16(b[0:2])
		qh := binary.LittleEndian.Uint32(b[2:6])
		for j, v := range (*[16]byte)(b[6:]) {
			y[j] = centred32[v&15|byte(qh>>j&1)<<4] * d
			y[j+16] = centred32[v>>4|byte(qh>>(j+16)&1)<<4] * d
		}
	}
}

func decodeQ5_1Generic(src []byte, dst []float32) {
	const bb, bs = 24, 32
	for i := 0; i < len(dst)/bs; i++ {
		b := (*[bb]byte)(src[i*bb:])
		y := (*[bs]float32)(dst[i*bs:])
		d, m := f16(b[0:2]), f16(b[2:4])
		qh := binary.LittleEndian.Uint32(b[4:8])
		for j, v := range (*[16]byte)(b[8:]) {
			y[j] = float32(plain32[v&15|byte(qh>>j&1)<<4]*d) + m
			y[j+16] = float32(plain32[v>>4|byte(qh>>(j+16)&1)<<4]*d) + m
		}
	}
}

func decodeQ8_0Generic(src []byte, dst []float32) {
	const bb, bs = 34, 32
	for i := 0; i < len(dst)/bs; i++ {
		b := (*[bb]byte)(src[i*bb:])
		y := (*[bs]float32)(dst[i*bs:])
		d := f16(b[0:2])
		q := (*[bs]byte)(b[2:])
		for j, v := range q {
			y[j] = int8ToF32[v] * d
		}
	}
}

func decodeQ8_1Generic(src []byte, dst []float32) {
	const bb, bs = 36, 32
	for i := 0; i < len(dst)/bs; i++ {
		b := (*[bb]byte)(src[i*bb:])
		y := (*[bs]float32)(dst[i*bs:])
		d := f16(b[0:2])
		q := (*[bs]byte)(b[4:])
		for j, v := range q {
			y[j] = int8ToF32[v] * d
		}
	}
}
