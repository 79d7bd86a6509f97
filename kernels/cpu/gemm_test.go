package cpu

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/conformance"
)

// TestGemmMatchesSingle checks the four-row, four-token tile kernels (Go
// twin and the table MatMul uses) against the one-row kernel of the same
// table bit for bit on every pair, on fresh random rows including an
// all-zero activation block and weights with the extreme code −128.
func TestGemmMatchesSingle(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 11))
	for _, tab := range []struct {
		name string
		k    map[gguf.Type]kernel
	}{{"go", goKernels}, {"fast", fastKernels}} {
		for _, typ := range []gguf.Type{gguf.TypeQ8_0} {
			k := tab.k[typ]
			if k.gemm == nil {
				t.Fatalf("%s %s: no tile kernel", tab.name, typ)
			}
			for _, nb := range []int{1, 2, 3, 24, 64} {
				cols, n := 32*nb, 4*(1+rng.IntN(3))
				w := conformance.RandomWeight(rng, "w", typ, 4, cols)
				rb := len(w.Host) / 4
				w.Host[2+rng.IntN(32)] = 0x80 // code −128 in row 0's first block
				x := conformance.RandomVector(rng, n*cols, math.Pow(10, float64(rng.IntN(5)-2)))
				clear(x[cols-32 : cols]) // token 0's last block: zero scale
				var a actBuf
				a.pack = true
				a.prepare(k.act, n, cols, x)
				for j := range n {
					a.quantRow(j, x[j*cols:(j+1)*cols])
				}
				var sc, out [16]float32
				for g := range n / 4 {
					k.gemm(w.Host, rb, &a, g, &sc, &out)
					for r := range 4 {
						for tk := range 4 {
							want := k.dot(w.Host[r*rb:(r+1)*rb], &a.rows[4*g+tk])
							if got := out[4*r+tk]; math.Float32bits(got) != math.Float32bits(want) {
								t.Errorf("%s %s cols=%d row %d token %d: tile %g, one-row %g", tab.name, typ, cols, r, 4*g+tk, got, want)
							}
						}
					}
				}
			}
		}
	}
}

// TestMatMulRowInvariant runs MatMul on n rows (2…kernels.MaxBatchRows,
// every tiling path: tiles, leftover rows and tokens, padded rows) and
// checks each row against MatMul of that row alone bit for bit, for the
// types with multi-token kernels.
func TestMatMulRowInvariant(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 12))
	b := New(2)
	defer b.Close()
	for _, typ := range conformance.MatMulTypes {
		k := fastKernels[typ]
		if k.dot4 == nil && k.dot8 == nil && k.gemm == nil && k.dot2 == nil {
			continue
		}
		cols := 2 * max(typ.BlockSize(), 32) * 4
		for _, sh := range [][2]int{{37, 2}, {19, 3}, {64, 4}, {29, 5}, {23, 6}, {22, 7}, {41, 8}, {17, 10}, {30, 11}, {16, 13}, {90, 16}, {33, 64}} {
			rows, n := sh[0], sh[1]
			w := conformance.RandomWeight(rng, "w", typ, rows, cols)
			x := kernels.Tensor{Len: n * cols, Host: conformance.RandomVector(rng, n*cols, 1)}
			all := kernels.Tensor{Len: n * rows, Host: make([]float32, n*rows)}
			if err := b.MatMul(all, w, x, n); err != nil {
				t.Fatal(err)
			}
			one := kernels.Tensor{Len: rows, Host: make([]float32, rows)}
			for j := range n {
				xj := kernels.Tensor{Len: cols, Host: x.Host[j*cols : (j+1)*cols]}
				if err := b.MatMul(one, w, xj, 1); err != nil {
					t.Fatal(err)
				}
				if !bitsEqual(one.Host, all.Host[j*rows:(j+1)*rows]) {
					t.Errorf("%s %d×%d n=%d: row %d differs from the row alone", typ, rows, cols, n, j)
				}
			}
		}
	}
}

// TestPackMatchesGo checks the activation packing MatMul uses (assembly
// where available) against the Go packing byte for byte, codes from −127
// to 127 (the quantizer's range) and −128.
func TestPackMatchesGo(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 13))
	for _, nb := range []int{1, 2, 7, 24} {
		q := make([]int8, 32*nb)
		d := make([]float32, nb)
		for i := range q {
			q[i] = int8(rng.IntN(256) - 128)
		}
		for i := range d {
			d[i] = rng.Float32()
		}
		for slot := range 4 {
			p1, p2 := make([]byte, nb*q8x4Block), make([]byte, nb*q8x4Block)
			packRowQ8_0x4(q, d, p1, slot)
			packRowQ8_0x4Go(q, d, p2, slot)
			if !slices.Equal(p1, p2) {
				t.Fatalf("nb=%d slot %d: packed bytes differ from the Go packing", nb, slot)
			}
		}
	}
}
