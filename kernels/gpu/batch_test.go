package gpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/conformance"
	"github.com/forge-llm/forge/rocm"
)

// sameBits reports the first index where got and want differ in their bits
// (NaNs included), or -1.
func sameBits(got, want []float32) int {
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			return i
		}
	}
	return -1
}

// TestMultiRowMatMulMatchesOneRow: MatMul of n rows (2…64, in launches of
// eight) gives every row the bits MatMul of that row alone gives, for the
// types with 8-bit-activation kernels (Q4_K, Q6_K, Q4_0, Q8_0) and two
// that take the generic kernel (Q5_K, F16): the batch invariance of
// kernels.Batcher. Q6_K at 9000 rows checks the one-row kernel the
// backend picks for many rows (c2); Q4_K also against MatMuls (its
// grouped one-row kernel). The multi-row matrix-vector variants run with
// the mmq kernels off, then MatMul's default path (mmq where it fits).
func TestMultiRowMatMulMatchesOneRow(t *testing.T) {
	b := gpuBackend(t, false)
	rng := rand.New(rand.NewPCG(rand.Uint64(), 18))
	cases := []struct {
		typ        gguf.Type
		rows, cols int
	}{
		{gguf.TypeQ4_K, 129, 4096}, {gguf.TypeQ4_K, 1000, 14336},
		{gguf.TypeQ6_K, 300, 4096}, {gguf.TypeQ6_K, 9000, 2048}, {gguf.TypeQ6_K, 70, 768}, {gguf.TypeQ6_K, 64, 11008},
		{gguf.TypeQ8_0, 257, 4096}, {gguf.TypeQ4_0, 300, 14336}, {gguf.TypeQ8_0, 33, 96},
		{gguf.TypeQ5_K, 100, 2048}, {gguf.TypeF16, 100, 1024},
	}
	for _, tc := range cases {
		w := conformance.RandomWeight(rng, "w", tc.typ, tc.rows, tc.cols)
		if err := b.LoadWeight(w); err != nil {
			t.Fatal(err)
		}
		x := upload(t, b, randVec(rng, kernels.MaxBatchRows*tc.cols, 1))
		// each row alone
		alone := make([][]float32, kernels.MaxBatchRows)
		y1, _ := b.Alloc(tc.rows)
		for i := range alone {
			if err := b.MatMul(y1, w, x.View(i*tc.cols, tc.cols), 1); err != nil {
				t.Fatal(err)
			}
			alone[i] = download(t, b, y1)
		}
		if tc.typ == gguf.TypeQ4_K {
			w2 := *w
			w2.Dev = 0
			if err := b.LoadWeight(&w2); err != nil {
				t.Fatal(err)
			}
			y2, _ := b.Alloc(tc.rows)
			if err := b.MatMuls([]kernels.Tensor{y1, y2}, []*kernels.Weight{w, &w2}, x.View(0, tc.cols), 1); err != nil {
				t.Fatal(err)
			}
			for k, y := range []kernels.Tensor{y1, y2} {
				if i := sameBits(download(t, b, y), alone[0]); i >= 0 {
					t.Errorf("%s %d×%d: MatMuls output %d differs from MatMul at %d", tc.typ, tc.rows, tc.cols, k, i)
				}
			}
			b.Free(y2)
			b.FreeWeight(&w2)
		}
		b.Free(y1)
		variants := map[gguf.Type][]string{
			gguf.TypeQ4_K: {"x8r2", "x16r2", ""},
			gguf.TypeQ6_K: {"x8r2", ""},
		}[tc.typ]
		if variants == nil {
			variants = []string{""}
		}
		b.mmqOff = true // the matrix-vector kernels; mmq_test.go checks the tensor-core ones
		for _, mv := range variants {
			b.mxVariant = mv
			checkRows(t, b, w, x, alone, mv)
		}
		b.mxVariant = ""
		b.mmqOff = false
		checkRows(t, b, w, x, alone, "default")
		t.Logf("%s %d×%d (%s kernel for n > 1, variants %q): rows bit-identical to n = 1", tc.typ, tc.rows, tc.cols,
			map[string]string{"x8": "8-bit x", "": "generic"}[b.rowKernel(w, rocm.DevPtr(w.Dev))], variants)
		b.FreeWeight(w)
	}
}

// checkRows checks that MatMul of n = 2, 5, 8, 16, 64 rows of x gives row i
// the bits of alone[i].
func checkRows(t *testing.T, b *Backend, w *kernels.Weight, x kernels.Tensor, alone [][]float32, variant string) {
	t.Helper()
	for _, n := range []int{2, 5, 8, 16, 64} {
		y, _ := b.Alloc(n * w.Rows)
		if err := b.Write(y, 0, nanVec(n*w.Rows)); err != nil {
			t.Fatal(err)
		}
		if err := b.MatMul(y, w, x, n); err != nil {
			t.Fatal(err)
		}
		got := download(t, b, y)
		bad := 0
		for i := range n {
			if j := sameBits(got[i*w.Rows:(i+1)*w.Rows], alone[i]); j >= 0 {
				if bad == 0 {
					t.Errorf("%s %d×%d %s n=%d: row %d differs from its one-row product at %d: %g vs %g",
						w.Type, w.Rows, w.Cols, variant, n, i, j, got[i*w.Rows+j], alone[i][j])
				}
				bad++
			}
		}
		if bad > 0 {
			t.Errorf("%s %d×%d %s n=%d: %d of %d rows differ", w.Type, w.Rows, w.Cols, variant, n, bad, n)
		}
		b.Free(y)
	}
}

// TestMultiRowMatMulAccuracy: the multi-row kernels against the float64
// product of the weight with x rounded as the kernels round it (8-bit
// codes in groups of 32, q8Round). Against x itself the error is the
// 8-bit rounding's, which on these random Q4_K weights (6-bit sub-block
// scales: a few sub-blocks carry most of a row) is heavy-tailed: a CPU
// emulation of the kernels' rounding put one row in a thousand near
// 1.5 % of Σ|w·x|, and the H100 once gave 1.52 % (Q4_K, n = 11). With
// the rounding in the reference only the float sums differ.
func TestMultiRowMatMulAccuracy(t *testing.T) {
	b := gpuBackend(t, false)
	rng := rand.New(rand.NewPCG(rand.Uint64(), 19))
	for _, typ := range []gguf.Type{gguf.TypeQ4_K, gguf.TypeQ6_K, gguf.TypeQ8_0, gguf.TypeQ4_0} {
		rows, cols, n := 200, 4096, 11
		w := conformance.RandomWeight(rng, "w", typ, rows, cols)
		if err := b.LoadWeight(w); err != nil {
			t.Fatal(err)
		}
		xs := randVec(rng, n*cols, 1)
		y, _ := b.Alloc(n * rows)
		if err := b.MatMul(y, w, upload(t, b, xs), n); err != nil {
			t.Fatal(err)
		}
		got := download(t, b, y)
		for i := range n {
			xi := xs[i*cols : (i+1)*cols]
			e := relScaled(got[i*rows:(i+1)*rows], matRef(t, w, q8Round(xi), 1), matScale(t, w, xi))
			// A code one step off (an input exactly between two) moves a
			// row by about 1/127 of one of 4096 products.
			if !(e < 1e-3) {
				t.Errorf("%s n=%d row %d: relative error %.3g", typ, n, i, e)
			}
		}
		b.Free(y)
		b.FreeWeight(w)
	}
}

// TestRoPEAtMatchesRoPE: RoPEAt with per-row positions gives each row the
// bits RoPE gives it at that position, normal and NeoX, with and without
// frequency factors.
func TestRoPEAtMatchesRoPE(t *testing.T) {
	b := gpuBackend(t, false)
	rng := rand.New(rand.NewPCG(rand.Uint64(), 20))
	heads, hd := 8, 128
	freqs := &kernels.Weight{Name: "freqs", Type: gguf.TypeF32, Rows: 1, Cols: hd / 2}
	fv := make([]float32, hd/2)
	for i := range fv {
		fv[i] = 1 + 7*rng.Float32()
	}
	freqs.Host = f32bytes(fv)
	if err := b.LoadWeight(freqs); err != nil {
		t.Fatal(err)
	}
	defer b.FreeWeight(freqs)
	pos := []int32{0, 5, 1000, 7, 131071, 3, 3, 42}
	n := len(pos)
	if err := b.SetLayout(&kernels.Layout{Pos: pos, Seq: make([]int32, n), Tables: [][]int32{{0}}}); err != nil {
		t.Fatal(err)
	}
	for _, r := range []kernels.Rope{
		{Dim: hd, Base: 10000, Scale: 1},
		{Dim: hd, Base: 500000, Scale: 0.25, NeoX: true},
		{Dim: 64, Base: 500000, Scale: 1, Freqs: freqs},
		{Dim: hd, Base: 1e6, Scale: 1, NeoX: true, Freqs: freqs},
	} {
		xs := randVec(rng, n*heads*hd, 1)
		x := upload(t, b, xs)
		if err := b.RoPEAt(x, n, heads, hd, r); err != nil {
			t.Fatal(err)
		}
		got := download(t, b, x)
		for i, p := range pos {
			xi := upload(t, b, xs[i*heads*hd:(i+1)*heads*hd])
			if err := b.RoPE(xi, 1, heads, hd, int(p), r); err != nil {
				t.Fatal(err)
			}
			if j := sameBits(got[i*heads*hd:(i+1)*heads*hd], download(t, b, xi)); j >= 0 {
				t.Errorf("rope %+v: row %d at %d differs from RoPE at element %d", r, i, p, j)
			}
		}
	}
}

// pagedSeq is one sequence of the paged attention tests: its block table
// and the contiguous cache that mirrors it.
type pagedSeq struct {
	table []int32
	cache *kernels.KVCache
	len   int
}

// TestPagedAttentionMatchesContiguous runs steps of several sequences
// (prompt chunks, decode rows, a row past 256 positions, so several
// splits) through PagedAttention on a pool with random block tables, and
// each sequence's rows through Attention on a contiguous cache of its own:
// the outputs agree to f16 rounding (both caches are f16; only the
// summation order differs). The f32 pool agrees too.
func TestPagedAttentionMatchesContiguous(t *testing.T) {
	for _, kvF32 := range []bool{false, true} {
		t.Run(fmt.Sprintf("kvF32=%v", kvF32), func(t *testing.T) {
			b := gpuBackend(t, kvF32)
			rng := rand.New(rand.NewPCG(rand.Uint64(), 21))
			a := kernels.Attn{Heads: 8, KVHeads: 2, HeadDim: 64, Scale: float32(1 / math.Sqrt(64))}
			kvDim, qDim := a.KVHeads*a.HeadDim, a.Heads*a.HeadDim
			const bs, blocks, layers, layer, ctx = 16, 96, 2, 1, 600
			pool, err := b.NewKVPool(layers, blocks, bs, kvDim)
			if err != nil {
				t.Fatal(err)
			}
			defer b.FreeKVPool(pool)
			perm := rng.Perm(blocks)
			seqs := make([]*pagedSeq, 3)
			for s := range seqs {
				c, err := b.NewKVCache(layers, ctx, kvDim)
				if err != nil {
					t.Fatal(err)
				}
				defer b.FreeKVCache(c)
				seqs[s] = &pagedSeq{cache: c}
				for range 30 {
					seqs[s].table = append(seqs[s].table, int32(perm[0]))
					perm = perm[1:]
				}
			}
			// each step: rows per sequence (0: not in the step)
			steps := [][3]int{{40, 5, 300}, {1, 1, 1}, {1, 0, 3}, {17, 1, 1}, {1, 1, 1}}
			for si, st := range steps {
				var l kernels.Layout
				for _, s := range seqs {
					l.Tables = append(l.Tables, s.table)
				}
				var qs, ks, vs []float32
				type span struct{ s, row0, n int }
				var spans []span
				for s, cnt := range st {
					if cnt == 0 {
						continue
					}
					spans = append(spans, span{s, len(l.Pos), cnt})
					for i := range cnt {
						l.Pos = append(l.Pos, int32(seqs[s].len+i))
						l.Seq = append(l.Seq, int32(s))
					}
					qs = append(qs, randVec(rng, cnt*qDim, 1)...)
					ks = append(ks, randVec(rng, cnt*kvDim, 1)...)
					vs = append(vs, randVec(rng, cnt*kvDim, 1)...)
				}
				n := len(l.Pos)
				if err := b.SetLayout(&l); err != nil {
					t.Fatal(err)
				}
				out, _ := b.Alloc(n * qDim)
				if err := b.Write(out, 0, nanVec(n*qDim)); err != nil {
					t.Fatal(err)
				}
				q, k, v := upload(t, b, qs), upload(t, b, ks), upload(t, b, vs)
				if err := b.PagedAttention(out, q, k, v, pool, layer, n, a); err != nil {
					t.Fatal(err)
				}
				got := download(t, b, out)
				b.Free(out)
				for _, sp := range spans {
					s := seqs[sp.s]
					ref, _ := b.Alloc(sp.n * qDim)
					if err := b.Attention(ref, q.View(sp.row0*qDim, sp.n*qDim), k.View(sp.row0*kvDim, sp.n*kvDim),
						v.View(sp.row0*kvDim, sp.n*kvDim), s.cache, layer, s.len, sp.n, a); err != nil {
						t.Fatal(err)
					}
					want := download(t, b, ref)
					b.Free(ref)
					wf := make([]float64, len(want))
					for i, x := range want {
						wf[i] = float64(x)
					}
					if e := relNorm(got[sp.row0*qDim:(sp.row0+sp.n)*qDim], wf); !(e < 1e-3) {
						t.Errorf("step %d sequence %d (positions %d…%d): paged vs contiguous relative error %.3g",
							si, sp.s, s.len, s.len+sp.n-1, e)
					} else {
						t.Logf("step %d sequence %d (positions %d…%d): relative error %.2e", si, sp.s, s.len, s.len+sp.n-1, e)
					}
					s.len += sp.n
				}
			}
		})
	}
}

// TestPagedAttentionBatchInvariant: a decode row's output is the same bits
// alone in its step and next to longer sequences (more splits in the
// grid) and prompt rows.
func TestPagedAttentionBatchInvariant(t *testing.T) {
	b := gpuBackend(t, false)
	rng := rand.New(rand.NewPCG(rand.Uint64(), 22))
	a := kernels.Attn{Heads: 4, KVHeads: 4, HeadDim: 128, Scale: float32(1 / math.Sqrt(128))}
	kvDim, qDim := a.KVHeads*a.HeadDim, a.Heads*a.HeadDim
	const bs = 32
	pool, err := b.NewKVPool(1, 64, bs, kvDim)
	if err != nil {
		t.Fatal(err)
	}
	defer b.FreeKVPool(pool)
	tables := [][]int32{{3, 9, 1}, {10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33}, {40, 41}}
	fill := func(s, n int) { // positions 0…n-1 of sequence s
		pos := make([]int32, n)
		seq := make([]int32, n)
		for i := range pos {
			pos[i], seq[i] = int32(i), int32(s)
		}
		if err := b.SetLayout(&kernels.Layout{Pos: pos, Seq: seq, Tables: tables}); err != nil {
			t.Fatal(err)
		}
		out, _ := b.Alloc(n * qDim)
		defer b.Free(out)
		if err := b.PagedAttention(out, upload(t, b, randVec(rng, n*qDim, 1)), upload(t, b, randVec(rng, n*kvDim, 1)),
			upload(t, b, randVec(rng, n*kvDim, 1)), pool, 0, n, a); err != nil {
			t.Fatal(err)
		}
	}
	fill(0, 70)
	fill(1, 700)
	fill(2, 20)
	// the decode row of sequence 0 at position 70, alone
	q0, k0, v0 := randVec(rng, qDim, 1), randVec(rng, kvDim, 1), randVec(rng, kvDim, 1)
	if err := b.SetLayout(&kernels.Layout{Pos: []int32{70}, Seq: []int32{0}, Tables: tables}); err != nil {
		t.Fatal(err)
	}
	out, _ := b.Alloc(4 * qDim)
	defer b.Free(out)
	if err := b.PagedAttention(out, upload(t, b, q0), upload(t, b, k0), upload(t, b, v0), pool, 0, 1, a); err != nil {
		t.Fatal(err)
	}
	alone := download(t, b, out)[:qDim]
	// the same row after sequence 1's decode row (position 700: 3 splits)
	// and before two prompt rows of sequence 2
	qs := append(append(randVec(rng, qDim, 1), q0...), randVec(rng, 2*qDim, 1)...)
	ks := append(append(randVec(rng, kvDim, 1), k0...), randVec(rng, 2*kvDim, 1)...)
	vs := append(append(randVec(rng, kvDim, 1), v0...), randVec(rng, 2*kvDim, 1)...)
	if err := b.SetLayout(&kernels.Layout{Pos: []int32{700, 70, 20, 21}, Seq: []int32{1, 0, 2, 2}, Tables: tables}); err != nil {
		t.Fatal(err)
	}
	if err := b.PagedAttention(out, upload(t, b, qs), upload(t, b, ks), upload(t, b, vs), pool, 0, 4, a); err != nil {
		t.Fatal(err)
	}
	if i := sameBits(download(t, b, out)[qDim:2*qDim], alone); i >= 0 {
		t.Errorf("the row's output in a batch differs from its output alone at %d", i)
	}
	// a row past its table is refused
	if err := b.SetLayout(&kernels.Layout{Pos: []int32{96}, Seq: []int32{0}, Tables: tables}); err != nil {
		t.Fatal(err)
	}
	if err := b.PagedAttention(out, upload(t, b, q0), upload(t, b, k0), upload(t, b, v0), pool, 0, 1, a); err == nil {
		t.Error("a position past the block table was accepted")
	}
}

// BenchmarkBatchMatMul: one decode step's matmul share at the Llama 3 8B
// shapes (Q4_K 4096×4096 and 14336×4096; Q6_K 4096×14336, a Q4_K_M
// model's ffn_down in half the layers), n = 1, 8, 16, 64 rows through
// MatMul's kernels (x quantized each time, as a step does), each multi-row
// variant "x{NX}r{R}" (planRows), and the GEMM path at 16 and 64 rows for
// comparison. GB/s counts the weight's bytes once per product; rows/s is
// n over the time.
func BenchmarkBatchMatMul(b *testing.B) {
	bk := gpuBackend(b, false)
	rng := rand.New(rand.NewPCG(3, 4))
	for _, sh := range []struct {
		typ        gguf.Type
		rows, cols int
	}{{gguf.TypeQ4_K, 4096, 4096}, {gguf.TypeQ4_K, 14336, 4096}, {gguf.TypeQ6_K, 4096, 14336}} {
		rows, cols := sh.rows, sh.cols
		w := conformance.RandomWeight(rng, "w", sh.typ, rows, cols)
		copies, free := weightCopies(b, bk, w)
		x := upload(b, bk, conformance.RandomVector(rng, kernels.MaxBatchRows*cols, 1))
		mx := []string{"", "x8r2", "x16r2"} // "": planRows' choice
		if sh.typ == gguf.TypeQ6_K {
			mx = []string{""}
		}
		type run struct {
			n       int
			variant string // mxVariant, or "gemm"
		}
		runs := []run{{1, ""}}
		for _, n := range []int{8, 16, 64} {
			for _, v := range mx {
				runs = append(runs, run{n, v})
			}
		}
		runs = append(runs, run{16, "gemm"}, run{64, "gemm"})
		for _, rn := range runs {
			n := rn.n
			name := fmt.Sprintf("%s/%dx%d/n=%d", sh.typ, rows, cols, n)
			if rn.variant != "" {
				name += "/" + rn.variant
			} else if n > 1 {
				name += "/auto"
			}
			b.Run(name, func(b *testing.B) {
				y, _ := bk.Alloc(n * rows)
				defer bk.Free(y)
				kt, _ := kernelType(sh.typ)
				if rn.variant != "gemm" {
					bk.mxVariant = rn.variant
					bk.mmqOff = true // the matrix-vector kernels (BenchmarkMMQ times mmq)
					defer func() { bk.mxVariant, bk.mmqOff = "", false }()
				}
				var ms float32
				err := bk.do(func(c *rocm.Ctx) error {
					var err error
					ms, err = timeOn(c, bk.stream, 2*len(copies), b.N, func(i int) error {
						cw := copies[i%len(copies)]
						wp := rocm.DevPtr(cw.Dev)
						switch {
						case rn.variant == "gemm":
							return bk.gemm(c, kt, cw, wp, y, x, n)
						case n == 1:
							return bk.matvec(c, kt, cw, wp, dptr(y), dptr(x), 1, nil)
						default:
							return bk.matvecRows(c, kt, cw, wp, y, x, n, nil)
						}
					})
					return err
				})
				if err != nil {
					b.Fatal(err)
				}
				sec := float64(ms) / 1e3 / float64(b.N)
				b.ReportMetric(sec*1e6, "us/op")
				b.ReportMetric(float64(len(w.Host))/sec/1e9, "GB/s")
				b.ReportMetric(float64(n)/sec, "rows/s")
			})
		}
		free()
	}
}

// BenchmarkPagedAttentionDecode: one decode step's attention for 16
// sequences at 1000 positions each (Llama 3 8B heads: 32 query, 8 key/
// value, 128 dimensions; blocks of 16 positions), PagedAttention over the
// 16 rows at once against 16 one-token Attention calls on contiguous
// caches.
func BenchmarkPagedAttentionDecode(b *testing.B) {
	bk := gpuBackend(b, false)
	rng := rand.New(rand.NewPCG(5, 6))
	a := kernels.Attn{Heads: 32, KVHeads: 8, HeadDim: 128, Scale: float32(1 / math.Sqrt(128))}
	kvDim, qDim := a.KVHeads*a.HeadDim, a.Heads*a.HeadDim
	const seqs, pos, bs = 16, 1000, 16
	perSeq := ceilDiv(pos+1, bs)
	pool, err := bk.NewKVPool(1, seqs*perSeq, bs, kvDim)
	if err != nil {
		b.Fatal(err)
	}
	defer bk.FreeKVPool(pool)
	perm := rng.Perm(seqs * perSeq)
	l := kernels.Layout{}
	for s := range seqs {
		tab := make([]int32, perSeq)
		for i := range tab {
			tab[i] = int32(perm[s*perSeq+i])
		}
		l.Tables = append(l.Tables, tab)
		l.Pos = append(l.Pos, pos)
		l.Seq = append(l.Seq, int32(s))
	}
	if err := bk.SetLayout(&l); err != nil {
		b.Fatal(err)
	}
	q := upload(b, bk, randVec(rng, seqs*qDim, 1))
	k := upload(b, bk, randVec(rng, seqs*kvDim, 1))
	v := upload(b, bk, randVec(rng, seqs*kvDim, 1))
	out, _ := bk.Alloc(seqs * qDim)
	defer bk.Free(out)
	caches := make([]*kernels.KVCache, seqs)
	for s := range caches {
		if caches[s], err = bk.NewKVCache(1, pos+1, kvDim); err != nil {
			b.Fatal(err)
		}
		defer bk.FreeKVCache(caches[s])
	}
	for _, mode := range []string{"paged", "contiguous"} {
		b.Run(mode, func(b *testing.B) {
			step := func() error {
				if mode == "paged" {
					return bk.PagedAttention(out, q, k, v, pool, 0, seqs, a)
				}
				for s := range seqs {
					if err := bk.Attention(out.View(s*qDim, qDim), q.View(s*qDim, qDim), k.View(s*kvDim, kvDim),
						v.View(s*kvDim, kvDim), caches[s], 0, pos, 1, a); err != nil {
						return err
					}
				}
				return nil
			}
			for range 3 {
				if err := step(); err != nil {
					b.Fatal(err)
				}
			}
			if err := bk.Sync(); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for range b.N {
				if err := step(); err != nil {
					b.Fatal(err)
				}
			}
			if err := bk.Sync(); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "us/step")
		})
	}
}

// TestRMSNormRowsMatchOneRow: RMSNorm and AddRMSNorm of 2…64 rows give
// every row the bits they give it alone (the one-row kernel per row), and
// agree with a float64 reference.
func TestRMSNormRowsMatchOneRow(t *testing.T) {
	b := gpuBackend(t, false)
	rng := rand.New(rand.NewPCG(rand.Uint64(), 23))
	const cols = 4096
	wv := randVec(rng, cols, 1)
	w := &kernels.Weight{Name: "norm", Type: gguf.TypeF32, Rows: 1, Cols: cols, Host: f32bytes(wv)}
	if err := b.LoadWeight(w); err != nil {
		t.Fatal(err)
	}
	defer b.FreeWeight(w)
	const eps = 1e-5
	for _, n := range []int{2, 5, 64} {
		xs, rs := randVec(rng, n*cols, 1), randVec(rng, n*cols, 1)
		for _, add := range []bool{false, true} {
			norm := func(dst, x, r kernels.Tensor, rows int) error {
				if add {
					return b.AddRMSNorm(dst, x, r, w, rows, eps)
				}
				return b.RMSNorm(dst, x, w, rows, eps)
			}
			dst, _ := b.Alloc(n * cols)
			if err := norm(dst, upload(t, b, xs), upload(t, b, rs), n); err != nil {
				t.Fatal(err)
			}
			got := download(t, b, dst)
			b.Free(dst)
			for i := range n {
				one, _ := b.Alloc(cols)
				xi, ri := xs[i*cols:(i+1)*cols], rs[i*cols:(i+1)*cols]
				if err := norm(one, upload(t, b, xi), upload(t, b, ri), 1); err != nil {
					t.Fatal(err)
				}
				if j := sameBits(got[i*cols:(i+1)*cols], download(t, b, one)); j >= 0 {
					t.Errorf("n=%d add=%v: row %d differs from the row alone at %d", n, add, i, j)
				}
				b.Free(one)
				want := make([]float64, cols)
				var ss float64
				for c := range cols {
					v := float64(xi[c])
					if add {
						v += float64(ri[c])
					}
					want[c] = v
					ss += v * v
				}
				inv := 1 / math.Sqrt(ss/cols+eps)
				for c := range want {
					want[c] *= inv * float64(wv[c])
				}
				if e := relNorm(got[i*cols:(i+1)*cols], want); !(e < 1e-6) {
					t.Errorf("n=%d add=%v row %d: relative error %.3g", n, add, i, e)
				}
			}
		}
	}
}

// q8Round is x as the kernels see it on 8-bit activations (common.h
// q8_group): in groups of 32, d = max|x|/127 and code rint(x·127/max), in
// float32 arithmetic, then code·d.
func q8Round(x []float32) []float32 {
	out := make([]float32, len(x))
	for g := 0; g < len(x); g += 32 {
		grp := x[g:min(g+32, len(x))]
		var a float32
		for _, v := range grp {
			a = max(a, float32(math.Abs(float64(v))))
		}
		if a == 0 {
			continue
		}
		d, inv := a/127, 127/a
		for i, v := range grp {
			out[g+i] = float32(math.RoundToEven(float64(v*inv))) * d
		}
	}
	return out
}

// TestLayoutStagingRing sets many layouts while the device is still busy
// with earlier work (a queue of large GEMMs), each followed by a RoPEAt
// that reads it, as a step of several groups does at every layer: the
// host runs ahead, the staging ring grows past its first two buffers
// instead of waiting, and every RoPEAt still sees its own layout's
// positions (the bits RoPE gives each row at its position).
func TestLayoutStagingRing(t *testing.T) {
	b := gpuBackend(t, false)
	rng := rand.New(rand.NewPCG(rand.Uint64(), 21))
	heads, hd, n := 4, 64, 8
	r := kernels.Rope{Dim: hd, Base: 10000, Scale: 1}
	// the busy work: GEMMs of 4096 × 512 × 4096 f16 operands
	const m, gn, k = 4096, 512, 4096
	w, x, c := upload(t, b, make([]float32, m*k/2)), upload(t, b, make([]float32, gn*k/2)), upload(t, b, make([]float32, m*gn))
	defer func() { b.Free(w); b.Free(x); b.Free(c) }()
	// the rows and their positions, uploaded before the device is busy
	const layouts = 24
	var xs [][]float32
	var pos [][]int32
	var outs []kernels.Tensor
	for range layouts {
		p := make([]int32, n)
		for i := range p {
			p[i] = int32(rng.IntN(100000))
		}
		v := randVec(rng, n*heads*hd, 1)
		xt := upload(t, b, v)
		defer b.Free(xt)
		xs, pos, outs = append(xs, v), append(pos, p), append(outs, xt)
	}
	if err := b.SetLayout(&kernels.Layout{Pos: make([]int32, n), Seq: make([]int32, n), Tables: [][]int32{{0}}}); err != nil {
		t.Fatal(err)
	}
	for range 200 {
		if err := b.GEMMF16(rocm.DevPtr(c.Dev), rocm.DevPtr(w.Dev), rocm.DevPtr(x.Dev), m, gn, k); err != nil {
			t.Fatal(err)
		}
	}
	for l := range layouts {
		if err := b.SetLayout(&kernels.Layout{Pos: pos[l], Seq: make([]int32, n), Tables: [][]int32{{0}}}); err != nil {
			t.Fatal(err)
		}
		if err := b.RoPEAt(outs[l], n, heads, hd, r); err != nil {
			t.Fatal(err)
		}
	}
	b.mu.Lock()
	ring := len(b.lay.stage)
	b.mu.Unlock()
	if ring <= 2 {
		t.Errorf("the staging ring holds %d buffers after %d layouts set ahead of the device: it did not grow", ring, layouts)
	}
	for l := range layouts {
		got := download(t, b, outs[l])
		for i, p := range pos[l] {
			xi := upload(t, b, xs[l][i*heads*hd:(i+1)*heads*hd])
			if err := b.RoPE(xi, 1, heads, hd, int(p), r); err != nil {
				t.Fatal(err)
			}
			if j := sameBits(got[i*heads*hd:(i+1)*heads*hd], download(t, b, xi)); j >= 0 {
				t.Fatalf("layout %d of %d: row %d at %d differs from RoPE at element %d", l, layouts, i, p, j)
			}
			b.Free(xi)
		}
	}
	t.Logf("%d layouts set ahead of the device: a ring of %d staging buffers", layouts, ring)
}
