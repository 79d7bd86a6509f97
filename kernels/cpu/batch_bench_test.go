package cpu

import (
	"fmt"
	"testing"

	"github.com/forge-llm/forge/gguf"
)

// BenchmarkMatMulRows: batched decode, one activation row per sequence.
// ns/op grows with n by far less than n where each weight block is read
// once for all rows (compare n=1 with n=8).
func BenchmarkMatMulRows(b *testing.B) {
	for _, typ := range []gguf.Type{gguf.TypeQ4_K, gguf.TypeQ8_0, gguf.TypeQ6_K} {
		for _, sh := range benchShapes {
			for _, n := range []int{1, 2, 3, 4, 8, 16} {
				b.Run(fmt.Sprintf("%s/%dx%d/n=%d", typ, sh[0], sh[1], n), func(b *testing.B) {
					benchMatMul(b, typ, sh[0], sh[1], n, fastKernels)
				})
			}
		}
	}
}
