package synth

import (
	"fmt"
	"strings"

	"github.com/forge-llm/forge/gguf"
)

// Mix names a quantization recipe, as llama-quantize's file types do.
type Mix string

const (
	MixF32   Mix = "f32"
	MixF16   Mix = "f16"
	MixQ8_0  Mix = "q8_0"
	MixQ4_0  Mix = "q4_0"
	MixQ4_KM Mix = "q4_k_m"
)

// Mixes lists the supported mixes.
func Mixes() []Mix { return []Mix{MixF32, MixF16, MixQ8_0, MixQ4_0, MixQ4_KM} }

// ParseMix accepts a mix name in any case ("Q4_K_M", "q4_k_m").
func ParseMix(s string) (Mix, error) {
	for _, m := range Mixes() {
		if strings.EqualFold(s, string(m)) {
			return m, nil
		}
	}
	return "", fmt.Errorf("synth: unknown mix %q (want one of %v)", s, Mixes())
}

// fileType is llama.cpp's general.file_type (enum llama_ftype) for the mix.
func (m Mix) fileType() uint32 {
	switch m {
	case MixF16:
		return 1
	case MixQ4_0:
		return 2
	case MixQ8_0:
		return 7
	case MixQ4_KM:
		return 15
	}
	return 0 // all F32
}

// base is the type most 2-D tensors of the mix get.
func (m Mix) base() gguf.Type {
	switch m {
	case MixF16:
		return gguf.TypeF16
	case MixQ8_0:
		return gguf.TypeQ8_0
	case MixQ4_0:
		return gguf.TypeQ4_0
	case MixQ4_KM:
		return gguf.TypeQ4_K
	}
	return gguf.TypeF32
}

// useMoreBits is llama-quant's choice of layers that get more bits in the
// _M mixes: the first and last eighth, and every third layer in between.
func useMoreBits(i, n int) bool {
	return i < n/8 || i >= 7*n/8 || (i-n/8)%3 == 2
}

// TensorType returns the type llama-quantize gives a tensor under mix m.
// name is the GGUF tensor name, cols its row length, rows its row count
// (1 for vectors), layer the block index (-1 outside blocks); s is the
// model's shape. The rules follow llama.cpp's llama_tensor_get_type for the
// mixes here, without an importance matrix:
//
//   - vectors (norms, biases, rope_freqs) and a mixture of experts'
//     router (ffn_gate_inp) and stacked biases stay F32;
//   - gpt-oss's expert matrices are MXFP4 in every mix, as published;
//   - the output head (token_embd when the head is tied) gets Q6_K, or Q8_0
//     when its rows are not whole blocks of the base type, except in F32,
//     F16 and Q8_0 files;
//   - Q4_K_M: attn_v and ffn_down (ffn_down_exps) get Q6_K on the layers useMoreBits picks;
//     a 70B model's other attn_v get Q5_K (8 query heads share each);
//   - a type whose block does not divide the row falls back as llama.cpp
//     does (Q4_K→Q5_0, Q5_K→Q5_1, Q6_K→Q8_0), then to F16.
func TensorType(m Mix, s Shape, name string, cols, rows, layer int) gguf.Type {
	if rows == 1 || strings.HasSuffix(name, "ffn_gate_inp.weight") || strings.HasSuffix(name, ".bias") {
		return gguf.TypeF32 // a mixture's router and stacked biases too, as llama.cpp's converter keeps them
	}
	if s.Arch == "gpt-oss" && strings.HasSuffix(name, "_exps.weight") && cols%gguf.TypeMXFP4.BlockSize() == 0 {
		// gpt-oss's experts were published in MXFP4, which llama.cpp's
		// converter keeps whatever the other tensors become (its F16 and
		// F32 files too).
		return gguf.TypeMXFP4
	}
	t := m.base()
	isOutput := name == "output.weight" || (s.Tied && name == "token_embd.weight")
	switch {
	case m == MixF32 || m == MixF16:
		return t
	case isOutput:
		if cols%t.BlockSize() != 0 {
			t = gguf.TypeQ8_0
		} else if t != gguf.TypeQ8_0 {
			t = gguf.TypeQ6_K
		}
	case m == MixQ4_KM && strings.HasSuffix(name, "attn_v.weight"):
		if useMoreBits(layer, s.Layers) {
			t = gguf.TypeQ6_K
		} else if s.Layers == 80 { // llama.cpp's LLM_TYPE_70B
			t = gguf.TypeQ5_K
		}
	case m == MixQ4_KM && (strings.HasSuffix(name, "ffn_down.weight") || strings.HasSuffix(name, "ffn_down_exps.weight")):
		if useMoreBits(layer, s.Layers) {
			t = gguf.TypeQ6_K
		}
	}
	return fallback(t, cols)
}

// fallback replaces a type whose blocks do not divide a row of cols.
func fallback(t gguf.Type, cols int) gguf.Type {
	if cols%t.BlockSize() == 0 {
		return t
	}
	switch t {
	case gguf.TypeQ4_K:
		t = gguf.TypeQ5_0
	case gguf.TypeQ5_K:
		t = gguf.TypeQ5_1
	case gguf.TypeQ6_K:
		t = gguf.TypeQ8_0
	}
	if cols%t.BlockSize() != 0 {
		t = gguf.TypeF16
	}
	return t
}
