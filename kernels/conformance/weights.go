package conformance

import (
	"encoding/binary"
	"math"
	"math/rand/v2"

	"github.com/forge-llm/forge/dequant"
	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
)

// MatMulTypes are the weight types every backend must multiply and embed.
var MatMulTypes = []gguf.Type{
	gguf.TypeF32, gguf.TypeF16, gguf.TypeBF16,
	gguf.TypeQ4_0, gguf.TypeQ4_1, gguf.TypeQ5_0, gguf.TypeQ5_1, gguf.TypeQ8_0,
	gguf.TypeQ2_K, gguf.TypeQ3_K, gguf.TypeQ4_K, gguf.TypeQ5_K, gguf.TypeQ6_K,
	gguf.TypeIQ4_NL, gguf.TypeIQ4_XS, gguf.TypeMXFP4,
}

// halfFields lists, per block type, the byte offsets of its f16 scale
// fields (the field offsets of dequant's block structs: D, M, Dmin).
// RandomWeight overwrites them with sane positive scales; every other byte
// of a block is a valid code whatever its value.
var halfFields = map[gguf.Type][]int{
	gguf.TypeQ4_0:   {0},      // BlockQ4_0.D
	gguf.TypeQ4_1:   {0, 2},   // D, M
	gguf.TypeQ5_0:   {0},      // D
	gguf.TypeQ5_1:   {0, 2},   // D, M
	gguf.TypeQ8_0:   {0},      // D
	gguf.TypeQ2_K:   {80, 82}, // D, Dmin after Scales[16], Qs[64]
	gguf.TypeQ3_K:   {108},    // D after Hmask[32], Qs[64], Scales[12]
	gguf.TypeQ4_K:   {0, 2},   // D, Dmin
	gguf.TypeQ5_K:   {0, 2},   // D, Dmin
	gguf.TypeQ6_K:   {208},    // D after Ql[128], Qh[64], Scales[16]
	gguf.TypeIQ4_NL: {0},      // D
	gguf.TypeIQ4_XS: {0},      // D
}

// RandomWeight returns a rows×cols weight of type t filled with random
// blocks: random codes, random 6/8-bit group scales, and f16 super-scales
// drawn in [0.5, 1.5)·2^-6 (signed where the format allows it), so every
// code path of the format is exercised. Plain types hold normal values.
func RandomWeight(rng *rand.Rand, name string, t gguf.Type, rows, cols int) *kernels.Weight {
	n := rows * cols
	var buf []byte
	switch t {
	case gguf.TypeF32:
		buf = make([]byte, 4*n)
		for i := range n {
			binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(float32(rng.NormFloat64())))
		}
	case gguf.TypeF16:
		buf = make([]byte, 2*n)
		for i := range n {
			binary.LittleEndian.PutUint16(buf[2*i:], dequant.F32ToF16(float32(rng.NormFloat64())))
		}
	case gguf.TypeBF16:
		buf = make([]byte, 2*n)
		for i := range n {
			binary.LittleEndian.PutUint16(buf[2*i:], dequant.F32ToBF16(float32(rng.NormFloat64())))
		}
	default:
		bs, bb := t.BlockSize(), t.BlockBytes()
		nb := n / bs
		buf = make([]byte, nb*bb)
		fillRandom(rng, buf)
		offs := halfFields[t]
		for b := range nb {
			blk := buf[b*bb : (b+1)*bb]
			for i, off := range offs {
				d := float32(0.5+rng.Float64()) / 64
				if i == 0 && rng.IntN(4) == 0 && t != gguf.TypeQ2_K && t != gguf.TypeQ4_K && t != gguf.TypeQ5_K {
					d = -d // a negative scale is legal for the symmetric formats
				}
				binary.LittleEndian.PutUint16(blk[off:], dequant.F32ToF16(d))
			}
			if t == gguf.TypeMXFP4 {
				blk[0] = byte(120 + rng.IntN(12)) // BlockMXFP4.E: 2^-8 … 2^3
			}
		}
	}
	return &kernels.Weight{Name: name, Type: t, Rows: rows, Cols: cols, Host: buf}
}

func fillRandom(rng *rand.Rand, b []byte) {
	i := 0
	for ; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], rng.Uint64())
	}
	for ; i < len(b); i++ {
		b[i] = byte(rng.Uint32())
	}
}

// RandomVector returns n normal float32 values with standard deviation sd.
func RandomVector(rng *rand.Rand, n int, sd float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64() * sd)
	}
	return v
}

// F32Weight wraps float32 values as a 1×len(v) F32 weight (norms, biases).
func F32Weight(name string, v []float32) *kernels.Weight {
	buf := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(f))
	}
	return &kernels.Weight{Name: name, Type: gguf.TypeF32, Rows: 1, Cols: len(v), Host: buf}
}

// dequantRow decodes row r of w to float64.
func dequantRow(w *kernels.Weight, r int, tmp []float32, out []float64) error {
	rb := w.Cols / w.Type.BlockSize() * w.Type.BlockBytes()
	if err := dequant.ToFloat32(w.Type, w.Host[r*rb:(r+1)*rb], tmp[:w.Cols]); err != nil {
		return err
	}
	for i, v := range tmp[:w.Cols] {
		out[i] = float64(v)
	}
	return nil
}
