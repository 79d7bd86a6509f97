//go:build !amd64 || purego

package dequant

// Without the AVX2 assembly every type uses its generic decoder.

// useAVX2 is always false here; the variable exists so tests build everywhere.
var useAVX2 = false

func decodeQ4_0(src []byte, dst []float32)   { decodeQ4_0Generic(src, dst) }
func decodeQ8_0(src []byte, dst []float32)   { decodeQ8_0Generic(src, dst) }
func decodeQ4_K(src []byte, dst []float32)   { decodeQ4_KGeneric(src, dst) }
func decodeQ6_K(src []byte, dst []float32)   { decodeQ6_KGeneric(src, dst) }
func decodeIQ4_NL(src []byte, dst []float32) { decodeIQ4_NLGeneric(src, dst) }
func decodeIQ4_XS(src []byte, dst []float32) { decodeIQ4_XSGeneric(src, dst) }
func decodeMXFP4(src []byte, dst []float32)  { decodeMXFP4Generic(src, dst) }
func decodeQ5_K(src []byte, dst []float32)   { decodeQ5_KGeneric(src, dst) }
func decodeQ4_1(src []byte, dst []float32)   { decodeQ4_1Generic(src, dst) }
func decodeQ5_0(src []byte, dst []float32)   { decodeQ5_0Generic(src, dst) }
func decodeQ5_1(src []byte, dst []float32)   { decodeQ5_1Generic(src, dst) }
func decodeQ8_1(src []byte, dst []float32)   { decodeQ8_1Generic(src, dst) }
func decodeQ8_K(src []byte, dst []float32)   { decodeQ8_KGeneric(src, dst) }
func decodeQ2_K(src []byte, dst []float32)   { decodeQ2_KGeneric(src, dst) }
func decodeQ3_K(src []byte, dst []float32)   { decodeQ3_KGeneric(src, dst) }
func decodeF16(src []byte, dst []float32)    { decodeF16Generic(src, dst) }
func decodeBF16(src []byte, dst []float32)   { decodeBF16Generic(src, dst) }

func f32sToF16s(dst []uint16, src []float32) { f32sToF16sGeneric(dst, src) }
