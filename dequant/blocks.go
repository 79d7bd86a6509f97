package dequant

import "unsafe"

// Block layouts, one Go struct per ggml block struct, field for field and in
// ggml's order. All multi-byte fields are little-endian in files. The
// structs document the formats and let tests build blocks by name
// (encoding/binary writes them with no padding); the decoders themselves
// read raw bytes at the same offsets.
//
// Notation in the formulas: d, m, dmin are the half-precision (f16) fields
// widened to float32; y[i] is element i of the block; q[i] is the unsigned
// code of element i as stored; "lo(b)" and "hi(b)" are the low and high
// nibble of byte b.

// BlockQ4_0 holds 32 elements as 4-bit codes around a single scale
// (18 bytes). Byte j carries element j in its low nibble and element j+16
// in its high nibble:
//
//	y[j]    = (lo(Qs[j]) - 8) · d
//	y[j+16] = (hi(Qs[j]) - 8) · d      j = 0..15
type BlockQ4_0 struct {
	D  uint16    // scale d, f16
	Qs [16]uint8 // 32 × 4-bit codes
}

// BlockQ4_1 is Q4_0 with an offset instead of a centred code (20 bytes):
//
//	y[j]    = lo(Qs[j]) · d + m
//	y[j+16] = hi(Qs[j]) · d + m        j = 0..15
type BlockQ4_1 struct {
	D  uint16    // scale d, f16
	M  uint16    // offset m (the block minimum), f16
	Qs [16]uint8 // 32 × 4-bit codes
}

// BlockQ5_0 holds 32 5-bit codes (22 bytes): the low 4 bits as in Q4_0 and
// the fifth bit of element i in bit i of the little-endian uint32 Qh:
//
//	q[j]    = lo(Qs[j]) | bit(Qh, j)<<4
//	q[j+16] = hi(Qs[j]) | bit(Qh, j+16)<<4
//	y[i]    = (q[i] - 16) · d
type BlockQ5_0 struct {
	D  uint16    // scale d, f16
	Qh [4]uint8  // fifth bits, uint32 little-endian
	Qs [16]uint8 // low 4 bits
}

// BlockQ5_1 is Q5_0 with an offset (24 bytes): y[i] = q[i] · d + m, q[i]
// assembled as in Q5_0.
type BlockQ5_1 struct {
	D  uint16    // scale d, f16
	M  uint16    // offset m, f16
	Qh [4]uint8  // fifth bits, uint32 little-endian
	Qs [16]uint8 // low 4 bits
}

// BlockQ8_0 holds 32 signed bytes and a scale (34 bytes): y[i] = Qs[i] · d.
type BlockQ8_0 struct {
	D  uint16   // scale d = max|x|/127, f16
	Qs [32]int8 // codes
}

// BlockQ8_1 is Q8_0 plus S = d · Σ Qs[i] (36 bytes), the precomputed sum
// that dot products with Q4_1/Q5_1 offsets need: y[i] = Qs[i] · d.
type BlockQ8_1 struct {
	D  uint16   // scale d, f16
	S  uint16   // d · Σ Qs, f16
	Qs [32]int8 // codes
}

// BlockQ2_K is a 256-element super-block of 2-bit codes in 16 groups of 16
// (84 bytes). Group g has a 4-bit scale lo(Scales[g]) and a 4-bit min
// hi(Scales[g]), themselves scaled by d and dmin. Codes are packed four to
// a byte: within each half h (128 elements, 32 bytes Qs[32h..32h+31]),
// element 128h + 32s + l is bits 2s..2s+1 of Qs[32h + l] (s = 0..3,
// l = 0..31). With g = i/16:
//
//	y[i] = d · lo(Scales[g]) · q[i] - dmin · hi(Scales[g])
type BlockQ2_K struct {
	Scales [16]uint8 // per group: scale (low nibble), min (high nibble)
	Qs     [64]uint8 // 256 × 2-bit codes
	D      uint16    // super-block scale for scales, f16
	Dmin   uint16    // super-block scale for mins, f16
}

// BlockQ3_K is a 256-element super-block of 3-bit signed codes in 16 groups
// of 16 (110 bytes). The low 2 bits are packed as in Q2_K; the third bit of
// element i is bit i/32 of Hmask[i%32], and a cleared bit means "subtract 4".
// Group scales are 6-bit, biased by 32: the low 4 bits are lo(Scales[g]) for
// g < 8 or hi(Scales[g-8]) for g ≥ 8, the high 2 bits are bits
// 2⌊g/4⌋..2⌊g/4⌋+1 of Scales[8 + g%4]. With g = i/16:
//
//	q[i] = low2[i] - (bit(Hmask[i%32], i/32) ? 0 : 4)      ∈ [-4, 3]
//	y[i] = d · (s6[g] - 32) · q[i]
type BlockQ3_K struct {
	Hmask  [32]uint8 // third (high) bits
	Qs     [64]uint8 // low 2 bits
	Scales [12]uint8 // 16 × 6-bit scales, packed
	D      uint16    // super-block scale, f16
}

// BlockQ4_K is a 256-element super-block of 4-bit codes in 8 groups of 32
// (144 bytes), each group with a 6-bit scale sc[g] and 6-bit min mn[g]
// packed into 12 bytes: for g < 4, sc = Scales[g]&63 and mn =
// Scales[g+4]&63; for g ≥ 4, sc = lo(Scales[g+4]) | (Scales[g-4]>>6)<<4 and
// mn = hi(Scales[g+4]) | (Scales[g]>>6)<<4. Group pairs (2p, 2p+1) share
// bytes Qs[32p..32p+31]: group 2p in the low nibbles, 2p+1 in the high.
//
//	y[i] = d · sc[g] · q[i] - dmin · mn[g]       g = i/32
type BlockQ4_K struct {
	D      uint16     // super-block scale for scales, f16
	Dmin   uint16     // super-block scale for mins, f16
	Scales [12]uint8  // 8 × (6-bit scale, 6-bit min), packed
	Qs     [128]uint8 // 256 × 4-bit codes
}

// BlockQ5_K is Q4_K with a fifth bit per element (176 bytes): bit g of
// Qh[i%32] is the high bit of element i in group g = i/32.
//
//	y[i] = d · sc[g] · (q4[i] + 16·bit(Qh[i%32], g)) - dmin · mn[g]
type BlockQ5_K struct {
	D      uint16     // super-block scale for scales, f16
	Dmin   uint16     // super-block scale for mins, f16
	Scales [12]uint8  // 8 × (6-bit scale, 6-bit min), packed as Q4_K
	Qh     [32]uint8  // fifth bits
	Qs     [128]uint8 // low 4 bits
}

// BlockQ6_K is a 256-element super-block of 6-bit codes in 16 groups of 16
// with signed 8-bit scales (210 bytes). In each half h (128 elements) with
// ql = Ql[64h:], qh = Qh[32h:], for l = 0..31:
//
//	q[128h+l]    = lo(ql[l])    | (qh[l]>>0 & 3)<<4
//	q[128h+l+32] = lo(ql[l+32]) | (qh[l]>>2 & 3)<<4
//	q[128h+l+64] = hi(ql[l])    | (qh[l]>>4 & 3)<<4
//	q[128h+l+96] = hi(ql[l+32]) | (qh[l]>>6 & 3)<<4
//	y[i] = d · Scales[i/16] · (q[i] - 32)
type BlockQ6_K struct {
	Ql     [128]uint8 // low 4 bits
	Qh     [64]uint8  // high 2 bits
	Scales [16]int8   // group scales
	D      uint16     // super-block scale, f16
}

// BlockQ8_K is the 256-element activation format the K-quant dot products
// pair with (292 bytes). D is a full float32; Bsums[g] = Σ Qs[16g..16g+15].
//
//	y[i] = d · Qs[i]
type BlockQ8_K struct {
	D     float32   // scale
	Qs    [256]int8 // codes
	Bsums [16]int16 // per-16 sums of Qs
}

// BlockIQ4_NL holds 32 4-bit indices into the non-linear table
// KValuesIQ4NL (18 bytes), laid out like Q4_0:
//
//	y[j]    = d · KValuesIQ4NL[lo(Qs[j])]
//	y[j+16] = d · KValuesIQ4NL[hi(Qs[j])]
type BlockIQ4_NL struct {
	D  uint16    // scale, f16
	Qs [16]uint8 // 32 × 4-bit table indices
}

// BlockIQ4_XS is a 256-element super-block of IQ4_NL-style indices in 8
// groups of 32 with 6-bit scales biased by 32 (136 bytes): ls[g] =
// lo/hi nibble g%2 of ScalesL[g/2] | (ScalesH>>2g & 3)<<4. Group g uses
// Qs[16g..16g+15] laid out like IQ4_NL:
//
//	y[i] = d · (ls[g] - 32) · KValuesIQ4NL[code]
type BlockIQ4_XS struct {
	D       uint16     // super-block scale, f16
	ScalesH uint16     // high 2 bits of the 8 group scales
	ScalesL [4]uint8   // low 4 bits of the 8 group scales
	Qs      [128]uint8 // 256 × 4-bit table indices
}

// BlockMXFP4 is the OCP microscaling FP4 block (17 bytes): 32 E2M1 values
// sharing one E8M0 exponent E. ggml stores the E2M1 values doubled as
// integers (KValuesMXFP4) and halves the scale to match:
//
//	scale   = 2^(E - 128)            (E8M0 value 2^(E-127), halved)
//	y[j]    = KValuesMXFP4[lo(Qs[j])] · scale
//	y[j+16] = KValuesMXFP4[hi(Qs[j])] · scale
type BlockMXFP4 struct {
	E  uint8     // shared exponent, E8M0 (bias 127)
	Qs [16]uint8 // 32 × 4-bit E2M1 codes
}

// Compile-time size pins: each line fails to compile unless the struct is
// exactly the size of ggml's block (the same numbers as gguf's type table,
// which a test also checks).
var (
	_ = [1]struct{}{}[unsafe.Sizeof(BlockQ4_0{})-18]
	_ = [1]struct{}{}[unsafe.Sizeof(BlockQ4_1{})-20]
	_ = [1]struct{}{}[unsafe.Sizeof(BlockQ5_0{})-22]
	_ = [1]struct{}{}[unsafe.Sizeof(BlockQ5_1{})-24]
	_ = [1]struct{}{}[unsafe.Sizeof(BlockQ8_0{})-34]
	_ = [1]struct{}{}[unsafe.Sizeof(BlockQ8_1{})-36]
	_ = [1]struct{}{}[unsafe.Sizeof(BlockQ2_K{})-84]
	_ = [1]struct{}{}[unsafe.Sizeof(BlockQ3_K{})-110]
	_ = [1]struct{}{}[unsafe.Sizeof(BlockQ4_K{})-144]
	_ = [1]struct{}{}[unsafe.Sizeof(BlockQ5_K{})-176]
	_ = [1]struct{}{}[unsafe.Sizeof(BlockQ6_K{})-210]
	_ = [1]struct{}{}[unsafe.Sizeof(BlockQ8_K{})-292]
	_ = [1]struct{}{}[unsafe.Sizeof(BlockIQ4_NL{})-18]
	_ = [1]struct{}{}[unsafe.Sizeof(BlockIQ4_XS{})-136]
	_ = [1]struct{}{}[unsafe.Sizeof(BlockMXFP4{})-17]
)
