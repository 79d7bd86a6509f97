package dequant

import (
	"math"

	"github.com/forge-llm/forge/gguf"
)

// Decoders for the table-based 4-bit formats: IQ4_NL, IQ4_XS and MXFP4.

func init() {
	decoders[gguf.TypeIQ4_NL] = decodeIQ4_NL
	decoders[gguf.TypeIQ4_XS] = decodeIQ4_XS
	decoders[gguf.TypeMXFP4] = decodeMXFP4
}

// KValuesIQ4NL is ggml's non-linear 4-bit codebook (kvalues_iq4nl): levels
// spaced more densely near zero, where most weights lie.
var KValuesIQ4NL = [16]int8{-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}

// KValuesMXFP4 is ggml's kvalues_mxfp4: the 16 E2M1 values (sign, 2-bit
// exponent, 1-bit mantissa: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and negatives)
// doubled so they are integers. The scale is halved to compensate.
var KValuesMXFP4 = [16]int8{0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12}

// E8M0ToF32Half returns half the E8M0 value of e, 2^(e-128), as ggml's
// GGML_E8M0_TO_FP32_HALF: e = 0 and 1 give the float32 subnormals 2^-128
// and 2^-127; e = 255 (E8M0's NaN) gives 2^127, not NaN, as in ggml.
func E8M0ToF32Half(e uint8) float32 {
	if e < 2 {
		return math.Float32frombits(0x00200000 << e)
	}
	return math.Float32frombits(uint32(e-1) << 23)
}

var kvIQ4NLF32, kvMXFP4F32 = func() (a, b [16]float32) {
	for i := range a {
		a[i] = float32(KValuesIQ4NL[i])
		b[i] = float32(KValuesMXFP4[i])
	}
	return
}()

func decodeIQ4_NLGeneric(src []byte, dst []float32) {
	const bb, bs = 18, 32
	for i := 0; i < len(dst)/bs; i++ {
		b := (*[bb]byte)(src[i*bb:])
		y := (*[bs]float32)(dst[i*bs:])
		d := f16(b[0:2])
		for j, v := range (*[16]byte)(b[2:]) {
			y[j] = d * kvIQ4NLF32[v&15]
			y[j+16] = d * kvIQ4NLF32[v>>4]
		}
	}
}

func decodeIQ4_XSGeneric(src []byte, dst []float32) {
	const bb, bs = 136, 256
	for i := 0; i < len(dst)/bs; i++ {
		b := (*[bb]byte)(src[i*bb:])
		y := (*[bs]float32)(dst[i*bs:])
		d := f16(b[0:2])
		sh := uint16(b[2]) | uint16(b[3])<<8
		for g := 0; g < 8; g++ {
			ls := int(b[4+g/2]>>(4*(g%2))&0xf) | int(sh>>(2*g)&3)<<4
			dl := d * float32(ls-32)
			out := (*[32]float32)(y[32*g:])
			for j, v := range (*[16]byte)(b[8+16*g:]) {
				out[j] = dl * kvIQ4NLF32[v&15]
				out[j+16] = dl * kvIQ4NLF32[v>>4]
			}
		}
	}
}

func decodeMXFP4Generic(src []byte, dst []float32) {
	const bb, bs = 17, 32
	for i := 0; i < len(dst)/bs; i++ {
		b := (*[bb]byte)(src[i*bb:])
		y := (*[bs]float32)(dst[i*bs:])
		d := E8M0ToF32Half(b[0])
		for j, v := range (*[16]byte)(b[1:]) {
			y[j] = kvMXFP4F32[v&15] * d
			y[j+16] = kvMXFP4F32[v>>4] * d
		}
	}
}
