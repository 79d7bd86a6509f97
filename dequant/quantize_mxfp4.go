package dequant

import (
	"math"

	"github.com/forge-llm/forge/gguf"
)

// The MXFP4 reference quantizer, as ggml's quantize_row_mxfp4_ref
// computes it: each block of 32 values shares the E8M0 exponent that puts
// its largest magnitude in E2M1's top binade (⌊log₂ amax⌋ - 2, biased by
// 127), and each value takes the nearest of the 16 E2M1 codes at that
// scale (ties: the lower code). gpt-oss's experts are stored so.

func init() { encoders[gguf.TypeMXFP4] = encodeMXFP4 }

func encodeMXFP4(src []float32, dst []byte) {
	const bb, bs = 17, 32
	for i := 0; i < len(src)/bs; i++ {
		x := (*[bs]float32)(src[i*bs:])
		b := (*[bb]byte)(dst[i*bb:])
		var amax float32
		for _, v := range x {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		e := 0
		if amax > 0 {
			e = int(math.Floor(float64(float32(math.Log2(float64(amax)))))) - 2 + 127
			e = min(max(e, 0), 255)
		}
		b[0] = byte(e)
		d := E8M0ToF32Half(byte(e))
		for j := range bs / 2 {
			b[1+j] = mxfp4Code(x[j], d) | mxfp4Code(x[j+bs/2], d)<<4
		}
	}
}

// mxfp4Code is the E2M1 code whose value at scale d is nearest to v.
func mxfp4Code(v, d float32) byte {
	best, bestErr := 0, float32(math.Abs(float64(kvMXFP4F32[0]*d-v)))
	for i := 1; i < 16; i++ {
		if err := float32(math.Abs(float64(kvMXFP4F32[i]*d - v))); err < bestErr {
			best, bestErr = i, err
		}
	}
	return byte(best)
}
