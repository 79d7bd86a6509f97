package gguf

import (
	"fmt"
	"math/bits"
)

// Type is a GGML tensor element type, as stored in a GGUF tensor info.
// The numbers are ggml's enum values; they are part of the file format and
// never change. Gaps are types ggml has since removed.
type Type uint32

const (
	TypeF32     Type = 0
	TypeF16     Type = 1
	TypeQ4_0    Type = 2
	TypeQ4_1    Type = 3
	TypeQ5_0    Type = 6
	TypeQ5_1    Type = 7
	TypeQ8_0    Type = 8
	TypeQ8_1    Type = 9
	TypeQ2_K    Type = 10
	TypeQ3_K    Type = 11
	TypeQ4_K    Type = 12
	TypeQ5_K    Type = 13
	TypeQ6_K    Type = 14
	TypeQ8_K    Type = 15
	TypeIQ2_XXS Type = 16
	TypeIQ2_XS  Type = 17
	TypeIQ3_XXS Type = 18
	TypeIQ1_S   Type = 19
	TypeIQ4_NL  Type = 20
	TypeIQ3_S   Type = 21
	TypeIQ2_S   Type = 22
	TypeIQ4_XS  Type = 23
	TypeI8      Type = 24
	TypeI16     Type = 25
	TypeI32     Type = 26
	TypeI64     Type = 27
	TypeF64     Type = 28
	TypeIQ1_M   Type = 29
	TypeBF16    Type = 30
	TypeTQ1_0   Type = 34
	TypeTQ2_0   Type = 35
	TypeMXFP4   Type = 39
)

// TypeInfo describes the storage of one type: elements are grouped in blocks
// of BlockSize elements that take BlockBytes bytes each. A tensor row must
// hold a whole number of blocks.
type TypeInfo struct {
	Name       string
	BlockSize  int // elements per block
	BlockBytes int // bytes per block
}

// QK_K is the super-block size of the K-quant and most IQ types.
const QK_K = 256

// typeTable holds every type ggml defines today. The byte counts are the
// sizes of ggml's block structs; the comments give each layout so the numbers
// can be checked by hand (the dequant package pins its Go structs to them).
var typeTable = map[Type]TypeInfo{
	TypeF32:     {"F32", 1, 4},
	TypeF16:     {"F16", 1, 2},
	TypeQ4_0:    {"Q4_0", 32, 2 + 16},                        // d f16, 32×4-bit
	TypeQ4_1:    {"Q4_1", 32, 2 + 2 + 16},                    // d, m f16, 32×4-bit
	TypeQ5_0:    {"Q5_0", 32, 2 + 4 + 16},                    // d, 32 high bits, 32×4-bit
	TypeQ5_1:    {"Q5_1", 32, 2 + 2 + 4 + 16},                // d, m, 32 high bits, 32×4-bit
	TypeQ8_0:    {"Q8_0", 32, 2 + 32},                        // d, 32×int8
	TypeQ8_1:    {"Q8_1", 32, 2 + 2 + 32},                    // d, s=d·Σq f16, 32×int8
	TypeQ2_K:    {"Q2_K", QK_K, 16 + 64 + 2 + 2},             // scales/mins 4+4 bit ×16, 256×2-bit, d, dmin
	TypeQ3_K:    {"Q3_K", QK_K, 32 + 64 + 12 + 2},            // high-bit mask, 256×2-bit, 16×6-bit scales, d
	TypeQ4_K:    {"Q4_K", QK_K, 2 + 2 + 12 + 128},            // d, dmin, 8×(6-bit scale, 6-bit min), 256×4-bit
	TypeQ5_K:    {"Q5_K", QK_K, 2 + 2 + 12 + 32 + 128},       // as Q4_K plus 256 high bits
	TypeQ6_K:    {"Q6_K", QK_K, 128 + 64 + 16 + 2},           // low 4 bits, high 2 bits, 16×int8 scales, d
	TypeQ8_K:    {"Q8_K", QK_K, 4 + 256 + 16*2},              // d f32, 256×int8, 16×int16 block sums
	TypeIQ2_XXS: {"IQ2_XXS", QK_K, 2 + 64},                   // d, 32×uint16 grid/sign codes
	TypeIQ2_XS:  {"IQ2_XS", QK_K, 2 + 64 + 8},                // d, 32×uint16, 8 scale bytes
	TypeIQ3_XXS: {"IQ3_XXS", QK_K, 2 + 96},                   // d, 3·256/8 bytes
	TypeIQ1_S:   {"IQ1_S", QK_K, 2 + 32 + 16},                // d, 32 qs, 8×uint16 qh
	TypeIQ4_NL:  {"IQ4_NL", 32, 2 + 16},                      // d, 32×4-bit non-linear codes
	TypeIQ3_S:   {"IQ3_S", QK_K, 2 + 64 + 8 + 32 + 4},        // d, qs, qh, signs, scales
	TypeIQ2_S:   {"IQ2_S", QK_K, 2 + 64 + 8 + 8},             // d, qs, qh, scales
	TypeIQ4_XS:  {"IQ4_XS", QK_K, 2 + 2 + 4 + 128},           // d, scales_h, scales_l, 256×4-bit
	TypeI8:      {"I8", 1, 1},                                //
	TypeI16:     {"I16", 1, 2},                               //
	TypeI32:     {"I32", 1, 4},                               //
	TypeI64:     {"I64", 1, 8},                               //
	TypeF64:     {"F64", 1, 8},                               //
	TypeIQ1_M:   {"IQ1_M", QK_K, 32 + 16 + 8},                // qs, qh, scales (d packed in scales)
	TypeBF16:    {"BF16", 1, 2},                              //
	TypeTQ1_0:   {"TQ1_0", QK_K, (QK_K-4*QK_K/64)/5 + 4 + 2}, // base-3 packed ternary, d
	TypeTQ2_0:   {"TQ2_0", QK_K, QK_K/4 + 2},                 // 2-bit ternary, d
	TypeMXFP4:   {"MXFP4", 32, 1 + 16},                       // e8m0 shared exponent, 32×fp4 (e2m1)
}

// Info returns the storage description of t, or false for a type number
// ggml does not define.
func (t Type) Info() (TypeInfo, bool) {
	ti, ok := typeTable[t]
	return ti, ok
}

// Valid reports whether t is a type ggml defines.
func (t Type) Valid() bool { _, ok := typeTable[t]; return ok }

// String returns ggml's name for t ("Q4_K"), or "type(N)" for unknown types.
func (t Type) String() string {
	if ti, ok := typeTable[t]; ok {
		return ti.Name
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// BlockSize is the number of elements per block (1 for plain types), 0 if unknown.
func (t Type) BlockSize() int { return typeTable[t].BlockSize }

// BlockBytes is the number of bytes per block, 0 if unknown.
func (t Type) BlockBytes() int { return typeTable[t].BlockBytes }

// TypeByName finds a type by ggml's name, case-sensitive ("Q4_K").
func TypeByName(name string) (Type, bool) {
	for t, ti := range typeTable {
		if ti.Name == name {
			return t, true
		}
	}
	return 0, false
}

// AllTypes returns every defined type in numeric order.
func AllTypes() []Type {
	out := make([]Type, 0, len(typeTable))
	for t := Type(0); t < 64; t++ {
		if _, ok := typeTable[t]; ok {
			out = append(out, t)
		}
	}
	return out
}

// RowBytes returns the bytes taken by n elements of type t. n must be a
// multiple of the block size; the product must not overflow.
func (t Type) RowBytes(n uint64) (uint64, error) {
	ti, ok := typeTable[t]
	if !ok {
		return 0, fmt.Errorf("gguf: unknown tensor type %d", uint32(t))
	}
	if n%uint64(ti.BlockSize) != 0 {
		return 0, fmt.Errorf("gguf: %d elements of %s is not a multiple of its block size %d", n, ti.Name, ti.BlockSize)
	}
	hi, lo := bits.Mul64(n/uint64(ti.BlockSize), uint64(ti.BlockBytes))
	if hi != 0 {
		return 0, fmt.Errorf("gguf: size of %d elements of %s overflows", n, ti.Name)
	}
	return lo, nil
}
