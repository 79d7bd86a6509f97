package dequant

import (
	"testing"

	"github.com/forge-llm/forge/gguf"
)

// Decoding a block range must not allocate: the CPU backend calls it per
// token for embedding rows.
func TestToFloat32DoesNotAllocate(t *testing.T) {
	for _, typ := range []gguf.Type{gguf.TypeQ4_0, gguf.TypeQ4_1, gguf.TypeQ5_0, gguf.TypeQ5_1, gguf.TypeQ8_0,
		gguf.TypeQ4_K, gguf.TypeQ5_K, gguf.TypeQ6_K, gguf.TypeF16, gguf.TypeBF16, gguf.TypeIQ4_NL, gguf.TypeMXFP4} {
		n := 256
		src := make([]byte, n/typ.BlockSize()*typ.BlockBytes())
		dst := make([]float32, n)
		if a := testing.AllocsPerRun(20, func() {
			if err := ToFloat32(typ, src, dst); err != nil {
				t.Fatal(err)
			}
		}); a != 0 {
			t.Errorf("%v: %.1f allocations per call, want 0", typ, a)
		}
	}
}
