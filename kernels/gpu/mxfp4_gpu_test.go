package gpu

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels/conformance"
)

// TestMatMulMXFP4 (device): MatMul of MXFP4 weights on the 8-bit kernels
// of mxfp4.cu against the float64 reference (within the 8-bit bound, as
// TestMatMulBlocks32Q8), every one-row variant (m{R}{U}, and m21
// grid-strided over one block per multiprocessor) bit for bit the
// automatic one, the generic float kernel ("g") within 1e-5; and 5 and 12
// rows of x at once (mv_mxfp4_x8), each row bit for bit what MatMul gives
// it alone. Shapes:
// gpt-oss's experts (2880 columns: 90 blocks), 2880×5760, 65-block rows
// (odd byte lengths) and 4096 columns.
func TestMatMulMXFP4(t *testing.T) {
	b := gpuBackend(t, false)
	rng := rand.New(rand.NewPCG(rand.Uint64(), 21))
	var variants []string
	for _, o := range mxfp4VariantList() {
		variants = append(variants, o.Variant)
	}
	for _, sh := range [][2]int{{2880, 2880}, {5760, 2880}, {2880, 5760}, {37, 2080}, {129, 4096}} {
		matMulStagedCase(t, b, rng, gguf.TypeMXFP4, sh[0], sh[1], variants)
	}
}

// matMulStagedCase is one shape of TestMatMulMXFP4 and
// TestMatMulB32Staged on the device: the automatic kernel within the 8-bit
// bound of the float64 reference, each forced variant (and m21 on one
// block per multiprocessor) bit for bit the automatic one, the generic
// float kernel ("g") within 1e-5, and 5 and 12 rows of x at once bit for
// bit each row alone.
func matMulStagedCase(t *testing.T, b *Backend, rng *rand.Rand, typ gguf.Type, rows, cols int, variants []string) {
	w := conformance.RandomWeight(rng, "w", typ, rows, cols)
	if err := b.LoadWeight(w); err != nil {
		t.Fatal(err)
	}
	const n = 12
	x := randVec(rng, n*cols, 1)
	xt := upload(t, b, x)
	want, scale := matRef(t, w, x[:cols], 1), matScale(t, w, x[:cols])
	var auto []float32
	for _, v := range append(append([]string{""}, variants...), "m21@1", "g") {
		what := fmt.Sprintf("%s %d×%d %q", typ, rows, cols, v)
		v, perSM, _ := strings.Cut(v, "@")
		b.mvVariant = v
		b.mvBlocksPerSM, _ = strconv.Atoi(perSM)
		dst, _ := b.Alloc(rows)
		if err := b.Write(dst, 0, nanVec(rows)); err != nil {
			t.Fatal(err)
		}
		if err := b.MatMul(dst, w, xt.View(0, cols), 1); err != nil {
			t.Fatal(err)
		}
		got := download(t, b, dst)
		b.Free(dst)
		bound, e := 1.5e-2, relScaled(got, want, scale)
		if v == "g" {
			bound, e = 1e-5, relNorm(got, want)
		}
		if !(e < bound) {
			t.Errorf("%s: relative error %.3g > %.3g", what, e, bound)
		}
		switch v {
		case "":
			auto = got
			t.Logf("%s: relative error %.2e", what, e)
		case "g":
		default:
			same(t, what+" vs the automatic kernel", got, auto)
		}
	}
	b.mvVariant, b.mvBlocksPerSM = "", 0
	// every row of x alone, then 5 and 12 at once
	alone := make([]float32, 0, n*rows)
	dst, _ := b.Alloc(n * rows)
	for i := range n {
		if err := b.MatMul(dst.View(i*rows, rows), w, xt.View(i*cols, cols), 1); err != nil {
			t.Fatal(err)
		}
	}
	alone = append(alone, download(t, b, dst)...)
	for _, m := range []int{5, n} {
		if err := b.Write(dst, 0, nanVec(n*rows)); err != nil {
			t.Fatal(err)
		}
		if err := b.MatMul(dst, w, xt, m); err != nil {
			t.Fatal(err)
		}
		same(t, fmt.Sprintf("%s %d×%d, %d rows of x", typ, rows, cols, m), download(t, b, dst)[:m*rows], alone[:m*rows])
	}
	b.Free(dst)
	b.FreeWeight(w)
}

// TestMoEOpsMXFP4 (device): moeOpsCase (moe_test.go) on MXFP4 experts,
// whose products take moe_mv_mxfp4_21: gpt-oss's shape (32 experts of
// 2880×2880, 4 per token) and 65-block rows with k = 8. Each slot's rows
// are the expert's MatMul bit for bit.
func TestMoEOpsMXFP4(t *testing.T) {
	b := gpuBackend(t, false)
	rng := rand.New(rand.NewPCG(rand.Uint64(), 21))
	for _, c := range []struct{ E, F, D, k int }{{32, 2880, 2880, 4}, {16, 576, 2080, 8}} {
		t.Run(fmt.Sprintf("%dx%dx%d/k%d", c.E, c.F, c.D, c.k), func(t *testing.T) {
			moeOpsCase(t, b, rng, gguf.TypeMXFP4, c.E, c.F, c.D, c.k)
		})
	}
}

// TestMatMulB32Staged (device): the 32-element block types on rows that
// b32Fits refuses, which take mxfp4.cu's staged kernels (b32any.go),
// through matMulStagedCase: gpt-oss's Q8_0 output and Q5_0 attention rows
// (2880 columns: 90 blocks), 65- and 3-block rows; Q4_1 and Q5_1 at one
// shape. And the experts (moe_mv_{type}_m21): 2880 and 576 columns.
func TestMatMulB32Staged(t *testing.T) {
	b := gpuBackend(t, false)
	rng := rand.New(rand.NewPCG(rand.Uint64(), 32))
	for _, typ := range []gguf.Type{gguf.TypeQ8_0, gguf.TypeQ5_0, gguf.TypeQ4_0, gguf.TypeQ4_1, gguf.TypeQ5_1} {
		shapes := [][2]int{{4096, 2880}, {2880, 2880}, {37, 2080}, {33, 96}}
		if typ == gguf.TypeQ4_1 || typ == gguf.TypeQ5_1 {
			shapes = shapes[1:2]
		}
		for _, sh := range shapes {
			matMulStagedCase(t, b, rng, typ, sh[0], sh[1], []string{"m11", "m21"})
		}
	}
	for _, typ := range []gguf.Type{gguf.TypeQ8_0, gguf.TypeQ5_0} {
		t.Run(typ.String()+"/experts", func(t *testing.T) {
			moeOpsCase(t, b, rng, typ, 8, 576, 2880, 4)
		})
	}
}
