package dequant

import "math"

// F16ToF32 widens an IEEE 754 binary16 value to float32. Every half value
// is exactly representable in float32, so the conversion is exact
// (subnormals, infinities and NaN payloads included).
func F16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch exp {
	case 0:
		// Zero or subnormal: mant · 2^-24, exact in float32.
		f := float32(mant) * (1.0 / (1 << 24))
		return math.Float32frombits(math.Float32bits(f) | sign)
	case 0x1f:
		// Infinity or NaN: keep the payload in the top mantissa bits.
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	}
	// Normal: rebias the exponent from 15 to 127.
	return math.Float32frombits(sign | (exp+(127-15))<<23 | mant<<13)
}

// F32ToF16 narrows a float32 to IEEE binary16 with round-to-nearest-even,
// the rounding of ggml's FP32_TO_FP16 (x86 F16C with imm 0, and its portable
// fallback). Values at or above 65520 in magnitude become infinity; values
// below the smallest subnormal round to signed zero. Every NaN becomes the
// canonical quiet NaN 0x7e00 with its sign, as ggml's portable path does.
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	a := b &^ (1 << 31)
	if a-0x38800000 >= 0x47800000-0x38800000 {
		return f32ToF16Rare(b)
	}
	// 2^-14 ≤ |f| < 2^16, the common case (kept small enough to inline):
	// rebias the exponent (-112<<23) and round the 13 dropped bits to
	// nearest even by adding 0xfff plus the lowest kept bit, in one
	// addition; a carry out of the mantissa bumps the exponent, up to
	// infinity at 65520. 0x37fff001 = 112<<23 - 0xfff.
	return uint16(b>>16&0x8000 | (a-0x37fff001+a>>13&1)>>13)
}

// f32sToF16sGeneric is F32ToF16 over a slice, with the common case written
// out in the loop so it costs no call per element.
func f32sToF16sGeneric(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	for i, f := range src {
		b := math.Float32bits(f)
		a := b &^ (1 << 31)
		if a-0x38800000 < 0x47800000-0x38800000 {
			dst[i] = uint16(b>>16&0x8000 | (a-0x37fff001+a>>13&1)>>13)
		} else {
			dst[i] = f32ToF16Rare(b)
		}
	}
}

// f32ToF16Rare handles zeros, half subnormals, overflow, infinities and NaN.
func f32ToF16Rare(b uint32) uint16 {
	sign := uint16(b>>16) & 0x8000
	a := b &^ (1 << 31)
	if a >= 0x7f800000 {
		if a > 0x7f800000 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	}
	if a >= 0x47800000 {
		return sign | 0x7c00 // |f| ≥ 2^16 overflows
	}
	// Half subnormal (or zero): units of 2^-24.
	e := int(a>>23) - 127 + 15 // ≤ 0 here
	if e < -10 {
		return sign // below half the smallest subnormal: rounds to zero
	}
	m := a&0x7fffff | 0x800000 // 24-bit significand, value m·2^(exp-150)
	shift := uint(14 - e)
	q := m >> shift
	rem := m & (1<<shift - 1)
	half := uint32(1) << (shift - 1)
	if rem > half || (rem == half && q&1 == 1) {
		q++ // may carry into the smallest normal, which is correct
	}
	return sign | uint16(q)
}

// BF16ToF32 widens a bfloat16 (the top half of a float32) to float32.
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F32ToBF16 narrows a float32 to bfloat16 the way ggml's
// ggml_compute_fp32_to_bf16 does: NaNs keep their top bits and are forced
// quiet (bit 6 set), everything else rounds to nearest even on the dropped
// 16 bits (so large finite values may round to infinity). Subnormals are
// kept, not flushed.
func F32ToBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16) | 64
	}
	return uint16((u + (0x7fff + (u>>16)&1)) >> 16)
}
