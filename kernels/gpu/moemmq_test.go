package gpu

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/conformance"
)

// TestGroupedMatMulsMatchMatMul: on a device the grouped kernels fit
// (CUDA sm_80 on), GroupedMatMuls gives every row bit for bit what MatMul
// of its expert gives it over that expert's rows (in pieces of at most
// kernels.MaxBatchRows, the row-invariant kernels), for gate and up of
// Q4_K in one launch and a Q6_K down product, with uneven groups: experts
// of 0, 1, 2, 3 rows, one over a tile, one over MaxBatchRows, and trailing
// experts without rows. A second call with other groups (a new upload)
// and a third with the first groups again (uploaded anew, as the cache
// holds only the last) stay right.
func TestGroupedMatMulsMatchMatMul(t *testing.T) {
	b := gpuBackend(t, false)
	rng := rand.New(rand.NewPCG(rand.Uint64(), 21))
	const E = 12
	counts := [][]int32{
		{0, 1, 5, 100, 17, 0, 2, 33, 3, 9, 0, 0},
		{7, 0, 0, 1, 64, 2, 0, 16, 15, 3, 1, 40},
	}
	for _, c := range []struct {
		typ        gguf.Type
		rows, cols int
		tables     int
	}{{gguf.TypeQ4_K, 768, 2048, 2}, {gguf.TypeQ6_K, 2048, 768, 1}, {gguf.TypeQ4_K, 272, 512, 1}} {
		t.Run(fmt.Sprintf("%s/%dx%d/t%d", c.typ, c.rows, c.cols, c.tables), func(t *testing.T) {
			var ws [2][]*kernels.Weight
			var tabs []kernels.ExpertTable
			for i := range c.tables {
				for range E {
					w := conformance.RandomWeight(rng, "w", c.typ, c.rows, c.cols)
					ws[i] = append(ws[i], w)
					t.Cleanup(func() { b.FreeWeight(w) })
				}
				tab, err := b.NewExpertTable(ws[i])
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { b.FreeExpertTable(tab) })
				if !b.GroupsFit(tab) {
					t.Skipf("the grouped kernels do not fit this device (%s)", b.Name())
				}
				tabs = append(tabs, tab)
			}
			for _, cnt := range [][]int32{counts[0], counts[1], counts[0]} {
				groupedCase(t, b, rng, ws, tabs, cnt, c.rows, c.cols)
			}
		})
	}
}

func groupedCase(t *testing.T, b *Backend, rng *rand.Rand, ws [2][]*kernels.Weight, tabs []kernels.ExpertTable, counts []int32, rows, cols int) {
	t.Helper()
	start := make([]int32, len(counts)+1)
	for e, n := range counts {
		start[e+1] = start[e] + n
	}
	n := int(start[len(counts)])
	x := upload(t, b, randVec(rng, n*cols, 1))
	var dsts []kernels.Tensor
	for range tabs {
		d, err := b.Alloc(n * rows)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Free(d) })
		dsts = append(dsts, d)
	}
	if err := b.GroupedMatMuls(dsts, tabs, x, start); err != nil {
		t.Fatal(err)
	}
	ref, err := b.Alloc(kernels.MaxBatchRows * rows)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Free(ref) })
	for i := range tabs {
		got := download(t, b, dsts[i])
		for e := range counts {
			for lo := start[e]; lo < start[e+1]; lo += kernels.MaxBatchRows {
				m := int(min(start[e+1]-lo, kernels.MaxBatchRows))
				if err := b.MatMul(ref.View(0, m*rows), ws[i][e], x.View(int(lo)*cols, m*cols), m); err != nil {
					t.Fatal(err)
				}
				want := download(t, b, ref)[:m*rows]
				same(t, fmt.Sprintf("table %d expert %d rows %d…%d of %v", i, e, lo, int(lo)+m, counts),
					got[int(lo)*rows:(int(lo)+m)*rows], want)
			}
		}
	}
}

// TestGroupsFitRefuses: tables the grouped kernels cannot run (Q8_0, F32
// experts) are refused by GroupsFit and by GroupedMatMuls, so the model
// keeps its per-expert products.
func TestGroupsFitRefuses(t *testing.T) {
	b := gpuBackend(t, false)
	rng := rand.New(rand.NewPCG(rand.Uint64(), 22))
	for _, typ := range []gguf.Type{gguf.TypeQ8_0, gguf.TypeF32} {
		w := conformance.RandomWeight(rng, "w", typ, 64, 256)
		t.Cleanup(func() { b.FreeWeight(w) })
		tab, err := b.NewExpertTable([]*kernels.Weight{w})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.FreeExpertTable(tab) })
		if b.GroupsFit(tab) {
			t.Errorf("%s: GroupsFit accepts a table the grouped kernels cannot run", typ)
		}
		x, dst := upload(t, b, make([]float32, 256)), upload(t, b, make([]float32, 64))
		if err := b.GroupedMatMuls([]kernels.Tensor{dst}, []kernels.ExpertTable{tab}, x, []int32{0, 1}); err == nil {
			t.Errorf("%s: GroupedMatMuls ran a table the grouped kernels cannot run", typ)
		}
	}
}

// TestMoeGroupTiles: the tile list names every expert's rows in tiles of
// moeGroupTile, in expert order, and none for an expert without rows.
func TestMoeGroupTiles(t *testing.T) {
	start := []int32{0, 0, 1, 17, 17, 49, 50}
	raw, tiles := moeGroupTiles(start)
	want := [][2]int32{{1, 0}, {2, 0}, {4, 0}, {4, 16}, {5, 0}}
	if tiles != len(want) || len(raw) != 4*len(start)+8*len(want) {
		t.Fatalf("%d tiles in %d bytes, want %d in %d", tiles, len(raw), len(want), 4*len(start)+8*len(want))
	}
	var got [][2]int32
	for i := range tiles {
		o := 4*len(start) + 8*i
		got = append(got, [2]int32{int32(binary.LittleEndian.Uint32(raw[o:])), int32(binary.LittleEndian.Uint32(raw[o+4:]))})
	}
	if !slices.Equal(got, want) {
		t.Errorf("tiles %v, want %v", got, want)
	}
	for i, s := range start {
		if v := int32(binary.LittleEndian.Uint32(raw[4*i:])); v != s {
			t.Errorf("start[%d] = %d in the upload, want %d", i, v, s)
		}
	}
}
