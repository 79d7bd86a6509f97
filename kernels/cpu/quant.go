package cpu

import (
	"math"

	"github.com/forge-llm/forge/dequant"
)

// Activation quantizers. MatMul quantizes each activation row once and then
// takes integer dot products of it with every weight row. The rounding is
// that of llama.cpp's x86 build (quantize_row_q8_0/q8_1 with AVX, and the
// reference quantize_row_q8_K), so the integer codes are exactly the ones
// llama.cpp multiplies with, and greedy outputs can match token for token.
//
// The codes and scales are kept in separate arrays rather than ggml's
// interleaved block structs: the dot kernels read them with plain vector
// loads.

// f16Round rounds f to the nearest f16 value (ties to even).
func f16Round(f float32) float32 { return dequant.F16ToF32(dequant.F32ToF16(f)) }

// bf16Round rounds f to the nearest bf16 value, as ggml converts
// activations for BF16 weights.
func bf16Round(f float32) float32 { return dequant.BF16ToF32(dequant.F32ToBF16(f)) }

// quantQ8_0 and quantQ8_K are the activation quantizers MatMul calls: the
// Go functions below, or assembly with the same results where the
// architecture file installs it.
var (
	quantQ8_0 = quantQ8_0Go
	quantQ8_K = quantQ8_KGo
)

// q8_0Scales finishes a block of quantQ8_0 from its max|x| and code sum:
// d and s as described there.
func q8_0Scales(amax float32, sum int32, q81 bool) (d, s float32) {
	dd := amax / 127
	dh := f16Round(dd)
	if q81 {
		return dh, f16Round(dd * float32(sum))
	}
	return dh, dh * float32(sum)
}

// quantQ8_0Go quantizes x (a multiple of 32 values) in blocks of 32:
// d = max|x|/127 stored as f16, q = round-half-even(x · 127/max|x|).
// s[b] receives d·Σq, the term the unsigned-code kernels subtract; with q81
// set it receives ggml's Q8_1 sum f16(d·Σq) computed from the unrounded d.
func quantQ8_0Go(x []float32, q []int8, d, s []float32, q81 bool) {
	for b := range len(x) / 32 {
		xb := x[32*b : 32*b+32]
		qb := q[32*b : 32*b+32]
		var amax float32
		for _, v := range xb {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		var id float32
		if amax != 0 {
			id = 127 / amax
		}
		var sum int32
		for i, v := range xb {
			c := int8(math.RoundToEven(float64(v * id)))
			qb[i] = c
			sum += int32(c)
		}
		d[b], s[b] = q8_0Scales(amax, sum, q81)
	}
}

// quantQ8_KGo quantizes x (a multiple of 256 values) in blocks of 256 as
// ggml's quantize_row_q8_K: the value of largest magnitude maps to -127,
// codes are clamped to 127, d is a float32, and bs holds the sum of each
// 16 codes.
func quantQ8_KGo(x []float32, q []int8, d []float32, bs []int16) {
	for b := range len(x) / 256 {
		xb := x[256*b : 256*b+256]
		qb := q[256*b : 256*b+256]
		var amax, mx float32
		for _, v := range xb {
			if a := float32(math.Abs(float64(v))); a > amax {
				amax, mx = a, v
			}
		}
		if amax == 0 {
			d[b] = 0
			clear(qb)
			clear(bs[16*b : 16*b+16])
			continue
		}
		iscale := -127 / mx
		for i, v := range xb {
			qb[i] = int8(min(127, nearestInt(iscale*v)))
		}
		for g := range 16 {
			var sum int16
			for _, c := range qb[16*g : 16*g+16] {
				sum += int16(c)
			}
			bs[16*b+g] = sum
		}
		d[b] = 1 / iscale
	}
}

// nearestInt is ggml's nearest_int: round to nearest, ties to even.
func nearestInt(f float32) int32 {
	v := f + 12582912
	return int32(math.Float32bits(v)&0x007fffff) - 0x00400000
}

// q4kOrder reorders Q8_K codes (in place; the sums bs keep their order)
// for the Q4_K kernels: in every 128 codes, the 32-code groups 0 1 2 3
// become 0 2 1 3. A Q4_K super-block keeps groups 2p and 2p+1 in the low
// and high nibbles of the same 32 bytes, so 64 bytes of nibbles hold, once
// masked, groups 0 and 2 (low) and 1 and 3 (high) of each 128: in this
// order each matches 64 consecutive codes.
func q4kOrder(q []int8) {
	var t [32]int8
	for h := 0; h+128 <= len(q); h += 128 {
		copy(t[:], q[h+32:h+64])
		copy(q[h+32:h+64], q[h+64:h+96])
		copy(q[h+64:h+96], t[:])
	}
}
