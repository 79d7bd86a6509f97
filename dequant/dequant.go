// Package dequant holds every GGML block format forge reads on the CPU: the
// block layouts (pinned to gguf's type table), conversion of blocks to
// float32 and float16, and round-to-nearest quantization for the formats that
// tests, synthetic models and quantized dot products need.
//
// Supported for decoding: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
// Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, IQ4_NL, IQ4_XS and MXFP4. Any
// other type is an error that names it, never wrong numbers.
//
// Exactness: the arithmetic follows ggml's reference dequantize_row_*
// functions operation for operation (the same float32 products, sums and
// their order, no fused multiply-add), so every output is bit-identical to
// llama.cpp's own CPU dequantization; the quantizers are ggml's reference
// quantizers and reproduce llama-quantize's bytes (checked against the
// bundled model files).
//
// Speed: decoders work on raw little-endian bytes, block by block, with
// fixed-size array views and no per-element calls. On amd64 with AVX2
// (decode_amd64.s) the per-element work runs eight lanes at a time with
// the same float32 operations; the purego build tag or another
// architecture selects the generic Go decoders, which give the same bits.
package dequant

import (
	"fmt"

	"github.com/forge-llm/forge/gguf"
)

// decodeFunc converts whole blocks of src into dst; len(dst) is a multiple of
// the block size and src holds exactly the matching number of bytes.
type decodeFunc func(src []byte, dst []float32)

// maxType bounds the type numbers this package handles (ggml's largest is
// 39); per-type state lives in arrays indexed by type, so that a call that
// decodes a single block costs no map lookups.
const maxType = 64

// decoders and encoders hold each supported type's block functions; the
// init functions of the per-family files fill them in.
var (
	decoders [maxType]decodeFunc
	encoders [maxType]encodeFunc
)

// blockShape caches gguf's block size and bytes per type.
var blockShape = func() (s [maxType]struct{ size, bytes int }) {
	for _, t := range gguf.AllTypes() {
		if t < maxType {
			s[t].size, s[t].bytes = t.BlockSize(), t.BlockBytes()
		}
	}
	return
}()

func decoderFor(t gguf.Type) decodeFunc {
	if t < maxType {
		return decoders[t]
	}
	return nil
}

func encoderFor(t gguf.Type) encodeFunc {
	if t < maxType {
		return encoders[t]
	}
	return nil
}

// Supported reports whether ToFloat32 can decode t.
func Supported(t gguf.Type) bool { return decoderFor(t) != nil }

// checkSizes validates that dst (n elements) is whole blocks of t and that
// src holds at least the bytes those blocks take. It returns the number of
// source bytes used. t must be a supported type.
func checkSizes(op string, t gguf.Type, srcLen, n int) (int, error) {
	bs, bb := blockShape[t].size, blockShape[t].bytes
	if n%bs != 0 {
		return 0, fmt.Errorf("dequant: %s: %d elements of %s is not a multiple of its block size %d", op, n, t, bs)
	}
	need := n / bs * bb
	if srcLen < need {
		return 0, fmt.Errorf("dequant: %s: %d elements of %s need %d bytes, have %d", op, n, t, need, srcLen)
	}
	return need, nil
}

// ToFloat32 decodes len(dst) elements of type t from src into dst. len(dst)
// must be a multiple of t's block size and src must hold at least
// len(dst)/BlockSize blocks; extra source bytes are ignored. Types this
// package does not implement return an error naming the type, never wrong
// numbers.
func ToFloat32(t gguf.Type, src []byte, dst []float32) error {
	dec := decoderFor(t)
	if dec == nil {
		return fmt.Errorf("dequant: to float32: type %s is not supported", t)
	}
	need, err := checkSizes("to float32", t, len(src), len(dst))
	if err != nil {
		return err
	}
	dec(src[:need], dst)
	return nil
}

// encodeFunc quantizes whole blocks of src into dst (exactly the matching
// number of bytes).
type encodeFunc func(src []float32, dst []byte)

// Quantize encodes len(src) float32 values (a multiple of t's block size) as
// type t into dst, which must hold at least the matching bytes. Types: F32,
// F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K,
// Q6_K, Q8_K. The encoders are ggml's reference (round-to-nearest, no
// importance matrix) quantizers, so the output matches llama-quantize's
// bytes for the same F32 input.
func Quantize(t gguf.Type, src []float32, dst []byte) error {
	enc := encoderFor(t)
	if enc == nil {
		return fmt.Errorf("dequant: quantize: type %s is not supported", t)
	}
	need, err := checkSizes("quantize", t, len(dst), len(src))
	if err != nil {
		return err
	}
	enc(src, dst[:need])
	return nil
}

// ToFloat16 decodes len(dst) elements of type t from src as IEEE half
// values (round-to-nearest-even from the float32 decoding; F16 is copied).
func ToFloat16(t gguf.Type, src []byte, dst []uint16) error {
	dec := decoderFor(t)
	if dec == nil {
		return fmt.Errorf("dequant: to float16: type %s is not supported", t)
	}
	need, err := checkSizes("to float16", t, len(src), len(dst))
	if err != nil {
		return err
	}
	if t == gguf.TypeF16 {
		for i := range dst {
			dst[i] = uint16(src[2*i]) | uint16(src[2*i+1])<<8
		}
		return nil
	}
	// Decode through a small float32 buffer, a few blocks at a time, so the
	// conversion needs no allocation proportional to the tensor.
	var buf [1024]float32
	bs, bb := blockShape[t].size, blockShape[t].bytes
	step := len(buf) / bs * bs // whole blocks per chunk (bs ≤ 256)
	src = src[:need]
	for off := 0; off < len(dst); off += step {
		n := min(step, len(dst)-off)
		tmp := buf[:n]
		dec(src[off/bs*bb:(off+n)/bs*bb], tmp)
		f32sToF16s(dst[off:off+n], tmp)
	}
	return nil
}

// QuantizeSupported reports whether Quantize can encode t.
func QuantizeSupported(t gguf.Type) bool { return encoderFor(t) != nil }

// ToFloat32Rows decodes rows [first, first+len(dst)/rowLen) of a row-major
// tensor whose rows hold rowLen elements of type t (rowLen a multiple of
// t's block size, as ggml requires). data is the whole tensor's bytes.
func ToFloat32Rows(t gguf.Type, data []byte, rowLen, first int, dst []float32) error {
	if rowLen <= 0 || len(dst)%rowLen != 0 || first < 0 {
		return fmt.Errorf("dequant: rows of %s: %d elements is not whole rows of %d (first row %d)", t, len(dst), rowLen, first)
	}
	rowBytes, err := t.RowBytes(uint64(rowLen))
	if err != nil {
		return fmt.Errorf("dequant: rows: %w", err)
	}
	off := uint64(first) * rowBytes
	if off > uint64(len(data)) {
		return fmt.Errorf("dequant: rows of %s: row %d starts at byte %d, past the %d bytes given", t, first, off, len(data))
	}
	return ToFloat32(t, data[off:], dst)
}
