package conformance

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/forge-llm/forge/kernels"
)

// The checks of kernels.Batcher (continuous batching): RoPEAt against RoPE
// at the same positions, PagedAttention against the float64 reference over
// random block tables, and MatMul's row invariance. A backend that is not a
// Batcher skips them.

func (s *suite) batcher(t *testing.T) (kernels.Backend, kernels.Batcher) {
	t.Helper()
	b := s.newBackend(t)
	bt, ok := kernels.As[kernels.Batcher](b)
	if !ok {
		t.Skipf("%s is not a kernels.Batcher (optional)", b.Name())
	}
	return b, bt
}

// ropeAt rotates rows at scattered positions (one layout row per token, as
// a step of several sequences has) and requires exactly the bits RoPE gives
// each row at its position alone.
func (s *suite) ropeAt(t *testing.T) {
	b, bt := s.batcher(t)
	rng := s.rng(t)
	cases := []struct {
		name           string
		heads, headDim int
		r              kernels.Rope
	}{
		{"normal", 4, 64, kernels.Rope{Dim: 64, Base: 10000, Scale: 1}},
		{"neox-partial", 2, 128, kernels.Rope{Dim: 64, Base: 1000000, Scale: 1, NeoX: true}},
		{"scaled", 8, 128, kernels.Rope{Dim: 128, Base: 500000, Scale: 0.25}},
	}
	for _, c := range cases {
		n := 9
		pos := make([]int32, n)
		for i := range pos {
			pos[i] = int32(rng.IntN(5000))
		}
		pos[0], pos[1] = 0, pos[2] // position 0 and a repeated position
		lay := &kernels.Layout{Pos: pos, Seq: make([]int32, n), Tables: [][]int32{{0}}}
		if err := bt.SetLayout(lay); err != nil {
			t.Fatalf("%s: set layout: %v", c.name, err)
		}
		rowLen := c.heads * c.headDim
		x := RandomVector(rng, n*rowLen, 1)
		xt := upload(t, b, x)
		if err := bt.RoPEAt(xt, n, c.heads, c.headDim, c.r); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got := download(t, b, xt)
		for i := range n {
			one := upload(t, b, x[i*rowLen:(i+1)*rowLen])
			if err := b.RoPE(one, 1, c.heads, c.headDim, int(pos[i]), c.r); err != nil {
				t.Fatal(err)
			}
			want := download(t, b, one)
			for j, w := range want {
				if math.Float32bits(got[i*rowLen+j]) != math.Float32bits(w) {
					t.Fatalf("rope at %s: row %d (position %d) value %d = %g, RoPE gives %g", c.name, i, pos[i], j, got[i*rowLen+j], w)
				}
			}
			bound := 1e-6 + float64(pos[i]+1)*3e-7
			check(t, name("rope at %s row %d", c.name, i), got[i*rowLen:(i+1)*rowLen], ropeRef(x[i*rowLen:(i+1)*rowLen], 1, c.heads, c.headDim, int(pos[i]), c.r, nil), bound)
		}
	}
}

// pagedAttention runs several sequences through one pool over a few steps,
// each step mixing prompt chunks and single decode rows, every sequence
// reading its blocks through a random block table, and compares every row
// with the float64 reference over that sequence's own history.
func (s *suite) pagedAttention(t *testing.T) {
	b, bt := s.batcher(t)
	rng := s.rng(t)
	cases := []struct {
		name      string
		a         kernels.Attn
		blockSize int
		steps     [][]int // per step, rows of each sequence (0: absent)
	}{
		{"gqa", kernels.Attn{Heads: 8, KVHeads: 2, HeadDim: 64}, 16, [][]int{{5, 17, 0}, {1, 1, 3}, {1, 1, 1}, {0, 1, 33}, {1, 0, 1}}},
		{"mha-small-blocks", kernels.Attn{Heads: 4, KVHeads: 4, HeadDim: 16}, 4, [][]int{{9, 1, 2}, {1, 1, 1}, {2, 7, 1}}},
		{"mqa", kernels.Attn{Heads: 6, KVHeads: 1, HeadDim: 32}, 32, [][]int{{1, 40}, {1, 1}, {64, 1}}},
		{"one-block", kernels.Attn{Heads: 2, KVHeads: 1, HeadDim: 64}, 256, [][]int{{3}, {1}, {100}}},
		// Sliding windows (gpt-oss's even layers, Gemma's local ones):
		// prompt pieces alone (the GPU's prefill kernels) and mixed steps,
		// windows shorter than a piece and than a block.
		{"window", kernels.Attn{Heads: 8, KVHeads: 2, HeadDim: 64, Window: 20}, 16, [][]int{{40, 0}, {1, 1}, {0, 30}, {1, 3}, {1, 1}}},
		{"window-small", kernels.Attn{Heads: 4, KVHeads: 2, HeadDim: 32, Window: 3}, 4, [][]int{{9, 1}, {1, 1}, {2, 7}}},
	}
	if sa, ok := kernels.As[kernels.SinkAttender](b); ok && sa.AttentionSinks() {
		// gpt-oss's two kinds of layer: sinks with a window and without.
		for _, w := range []int{24, 0} {
			a := kernels.Attn{Heads: 8, KVHeads: 2, HeadDim: 64, Window: w}
			v := RandomVector(rng, a.Heads, 2)
			v[0] = 6 // a head whose sink outweighs its scores
			a.Sinks = sinksWeight(t, b, v)
			cases = append(cases, struct {
				name      string
				a         kernels.Attn
				blockSize int
				steps     [][]int
			}{name("sinks-window-%d", w), a, 16, [][]int{{40, 0}, {1, 1}, {0, 30}, {1, 3}, {1, 1}}})
		}
	}
	for _, c := range cases {
		a := c.a
		a.Scale = float32(1 / math.Sqrt(float64(a.HeadDim)))
		kvDim := a.KVHeads * a.HeadDim
		nseq := len(c.steps[0])
		total := make([]int, nseq)
		for _, st := range c.steps {
			for q, n := range st {
				total[q] += n
			}
		}
		need := 0
		for _, n := range total {
			need += (n + c.blockSize - 1) / c.blockSize
		}
		const layers, layer = 2, 1
		blocks := need + 5
		pool, err := bt.NewKVPool(layers, blocks, c.blockSize, kvDim)
		if err != nil {
			t.Fatalf("%s: new pool: %v", c.name, err)
		}
		// Hand out the pool's blocks in a random order: tables are not
		// contiguous and interleave between sequences.
		perm := rng.Perm(blocks)
		tables := make([][]int32, nseq)
		for q := range nseq {
			for range (total[q] + c.blockSize - 1) / c.blockSize {
				tables[q] = append(tables[q], int32(perm[0]))
				perm = perm[1:]
			}
		}
		keys := make([][][]float32, nseq)
		vals := make([][][]float32, nseq)
		for si, st := range c.steps {
			var lay kernels.Layout
			lay.Tables = tables
			for q, rows := range st {
				for range rows {
					lay.Pos = append(lay.Pos, int32(len(keys[q])+countRows(lay.Seq, q)))
					lay.Seq = append(lay.Seq, int32(q))
				}
			}
			n := len(lay.Pos)
			qv := RandomVector(rng, n*a.Heads*a.HeadDim, 1)
			kv := RandomVector(rng, n*kvDim, 1)
			vv := RandomVector(rng, n*kvDim, 1)
			if err := bt.SetLayout(&lay); err != nil {
				t.Fatalf("%s step %d: set layout: %v", c.name, si, err)
			}
			out := alloc(t, b, n*a.Heads*a.HeadDim)
			if err := bt.PagedAttention(out, upload(t, b, qv), upload(t, b, kv), upload(t, b, vv), pool, layer, n, a); err != nil {
				t.Fatalf("%s step %d: %v", c.name, si, err)
			}
			got := download(t, b, out)
			for i := range n {
				q := lay.Seq[i]
				keys[q] = append(keys[q], kv[i*kvDim:(i+1)*kvDim])
				vals[q] = append(vals[q], vv[i*kvDim:(i+1)*kvDim])
			}
			qDim := a.Heads * a.HeadDim
			for i := range n {
				q, p := lay.Seq[i], int(lay.Pos[i])
				want := attnRef(qv[i*qDim:(i+1)*qDim], keys[q][:p+1], vals[q][:p+1], p, 1, a)
				check(t, name("paged attention %s step %d row %d (seq %d pos %d)", c.name, si, i, q, p), got[i*qDim:(i+1)*qDim], want, 2e-5)
			}
		}
		bt.FreeKVPool(pool)
	}
}

func countRows(seq []int32, q int) int {
	n := 0
	for _, s := range seq {
		if int(s) == q {
			n++
		}
	}
	return n
}

// pagedAttentionAlone: the batch-invariance promise of PagedAttention. A
// step of several sequences (prompt pieces and decode rows) is run, then
// each sequence's rows again alone (same inputs, same blocks): every row
// must come out with the same bits.
func (s *suite) pagedAttentionAlone(t *testing.T) {
	b, bt := s.batcher(t)
	rng := s.rng(t)
	a := kernels.Attn{Heads: 8, KVHeads: 2, HeadDim: 64}
	a.Scale = float32(1 / math.Sqrt(float64(a.HeadDim)))
	kvDim, qDim := a.KVHeads*a.HeadDim, a.Heads*a.HeadDim
	const bsz, blocks = 8, 40
	pool, err := bt.NewKVPool(1, blocks, bsz, kvDim)
	if err != nil {
		t.Fatal(err)
	}
	defer bt.FreeKVPool(pool)
	perm := rng.Perm(blocks)
	rows := []int{1, 37, 1, 9, 1} // per sequence, after a history of hist[q] positions
	hist := []int{40, 0, 17, 3, 0}
	tables := make([][]int32, len(rows))
	for q := range rows {
		for range (hist[q] + rows[q] + bsz - 1) / bsz {
			tables[q] = append(tables[q], int32(perm[0]))
			perm = perm[1:]
		}
	}
	// Histories first, each sequence alone.
	for q, h := range hist {
		if h == 0 {
			continue
		}
		lay := kernels.Layout{Seq: make([]int32, h), Tables: [][]int32{tables[q]}}
		for p := range h {
			lay.Pos = append(lay.Pos, int32(p))
		}
		if err := bt.SetLayout(&lay); err != nil {
			t.Fatal(err)
		}
		n := h
		if err := bt.PagedAttention(alloc(t, b, n*qDim), upload(t, b, RandomVector(rng, n*qDim, 1)), upload(t, b, RandomVector(rng, n*kvDim, 1)), upload(t, b, RandomVector(rng, n*kvDim, 1)), pool, 0, n, a); err != nil {
			t.Fatal(err)
		}
	}
	// together runs the rows of the sequences in qs (rows[q] each, after
	// their histories) as one step, then each sequence alone, and requires
	// the same bits.
	together := func(what string, qs []int) {
		var lay kernels.Layout // the tables of qs only, as the model's groups have
		first := map[int]int{}
		for j, q := range qs {
			lay.Tables = append(lay.Tables, tables[q])
			first[q] = len(lay.Pos)
			for i := range rows[q] {
				lay.Pos = append(lay.Pos, int32(hist[q]+i))
				lay.Seq = append(lay.Seq, int32(j))
			}
		}
		n := len(lay.Pos)
		qv, kv, vv := RandomVector(rng, n*qDim, 1), RandomVector(rng, n*kvDim, 1), RandomVector(rng, n*kvDim, 1)
		if err := bt.SetLayout(&lay); err != nil {
			t.Fatal(err)
		}
		out := alloc(t, b, n*qDim)
		if err := bt.PagedAttention(out, upload(t, b, qv), upload(t, b, kv), upload(t, b, vv), pool, 0, n, a); err != nil {
			t.Fatal(err)
		}
		step := download(t, b, out)
		for _, q := range qs {
			f, m := first[q], rows[q]
			one := kernels.Layout{Pos: lay.Pos[f : f+m], Seq: make([]int32, m), Tables: [][]int32{tables[q]}}
			if err := bt.SetLayout(&one); err != nil {
				t.Fatal(err)
			}
			o := alloc(t, b, m*qDim)
			if err := bt.PagedAttention(o, upload(t, b, qv[f*qDim:(f+m)*qDim]), upload(t, b, kv[f*kvDim:(f+m)*kvDim]), upload(t, b, vv[f*kvDim:(f+m)*kvDim]), pool, 0, m, a); err != nil {
				t.Fatal(err)
			}
			alone := download(t, b, o)
			for i, v := range alone {
				if math.Float32bits(step[f*qDim+i]) != math.Float32bits(v) {
					t.Fatalf("%s: sequence %d value %d: %g in the step, %g alone", what, q, i, step[f*qDim+i], v)
				}
			}
		}
	}
	// A decode step (one row a sequence), then a step of prompt pieces:
	// the Batcher contract lets a backend choose its attention kernel by
	// that kind of layout (the model never mixes the two in one op), so
	// each kind is compared with its rows alone.
	var decode, pieces []int
	for q, n := range rows {
		if n == 1 {
			decode = append(decode, q)
		} else {
			pieces = append(pieces, q)
		}
	}
	together("decode step", decode)
	together("prompt pieces", pieces)
}

// pagedAttentionExact: a sequence run through PagedAttention
// (alone, in blocks of a shuffled table) gives exactly the bits Attention
// gives it in a contiguous cache, so the batched path reproduces the
// single-sequence path token for token.
func (s *suite) pagedAttentionExact(t *testing.T) {
	b, bt := s.batcher(t)
	rng := s.rng(t)
	a := kernels.Attn{Heads: 8, KVHeads: 2, HeadDim: 64}
	a.Scale = float32(1 / math.Sqrt(float64(a.HeadDim)))
	kvDim := a.KVHeads * a.HeadDim
	const bsz, blocks = 8, 12
	steps := []int{13, 1, 1, 20, 1}
	total := 0
	for _, n := range steps {
		total += n
	}
	cache, err := b.NewKVCache(1, total, kvDim)
	if err != nil {
		t.Fatal(err)
	}
	defer b.FreeKVCache(cache)
	pool, err := bt.NewKVPool(1, blocks, bsz, kvDim)
	if err != nil {
		t.Fatal(err)
	}
	defer bt.FreeKVPool(pool)
	var table []int32
	for _, p := range rng.Perm(blocks)[:(total+bsz-1)/bsz] {
		table = append(table, int32(p))
	}
	pos := 0
	for si, n := range steps {
		qv := RandomVector(rng, n*a.Heads*a.HeadDim, 1)
		kv := RandomVector(rng, n*kvDim, 1)
		vv := RandomVector(rng, n*kvDim, 1)
		q, k, v := upload(t, b, qv), upload(t, b, kv), upload(t, b, vv)
		want := alloc(t, b, n*a.Heads*a.HeadDim)
		if err := b.Attention(want, q, k, v, cache, 0, pos, n, a); err != nil {
			t.Fatal(err)
		}
		lay := kernels.Layout{Seq: make([]int32, n), Tables: [][]int32{table}}
		for i := range n {
			lay.Pos = append(lay.Pos, int32(pos+i))
		}
		if err := bt.SetLayout(&lay); err != nil {
			t.Fatal(err)
		}
		got := alloc(t, b, n*a.Heads*a.HeadDim)
		if err := bt.PagedAttention(got, q, k, v, pool, 0, n, a); err != nil {
			t.Fatal(err)
		}
		g, w := download(t, b, got), download(t, b, want)
		for i := range w {
			if math.Float32bits(g[i]) != math.Float32bits(w[i]) {
				t.Fatalf("step %d (pos %d): value %d = %g, Attention gives %g", si, pos, i, g[i], w[i])
			}
		}
		pos += n
	}
}

// pagedErrors: bad layouts and block tables are refused with an error.
func (s *suite) pagedErrors(t *testing.T) {
	b, bt := s.batcher(t)
	a := kernels.Attn{Heads: 2, KVHeads: 1, HeadDim: 64, Scale: 0.125}
	pool, err := bt.NewKVPool(2, 4, 8, 64)
	if err != nil {
		t.Fatal(err)
	}
	defer bt.FreeKVPool(pool)
	x := alloc(t, b, 4096)
	if err := bt.SetLayout(&kernels.Layout{Pos: []int32{0}, Seq: []int32{1}, Tables: [][]int32{{0}}}); err == nil {
		t.Errorf("a layout naming a missing sequence was accepted")
	}
	if err := bt.SetLayout(&kernels.Layout{Pos: []int32{8}, Seq: []int32{0}, Tables: [][]int32{{0}}}); err == nil {
		if err := bt.PagedAttention(x, x, x, x, pool, 0, 1, a); err == nil {
			t.Errorf("attention at a position past the block table returned no error")
		}
	}
	if err := bt.SetLayout(&kernels.Layout{Pos: []int32{0}, Seq: []int32{0}, Tables: [][]int32{{4}}}); err == nil {
		if err := bt.PagedAttention(x, x, x, x, pool, 0, 1, a); err == nil {
			t.Errorf("attention through block 4 of a 4-block pool returned no error")
		}
	}
	if err := bt.SetLayout(&kernels.Layout{Pos: []int32{0}, Seq: []int32{0}, Tables: [][]int32{{0}}}); err != nil {
		t.Fatal(err)
	}
	if err := bt.PagedAttention(x, x, x, x, pool, 2, 1, a); err == nil {
		t.Errorf("attention on layer 2 of a 2-layer pool returned no error")
	}
	if err := bt.PagedAttention(x, x, x, x, pool, 0, 2, a); err == nil {
		t.Errorf("attention over 2 rows of a 1-row layout returned no error")
	}
}

// matMulRows checks the batch-invariance promise: for 1 ≤ n ≤
// MaxBatchRows, every row of a MatMul is bit for bit the row computed
// alone (n = 1), for every weight type and row counts that hit every
// remainder of a 4-row kernel.
func (s *suite) matMulRows(t *testing.T) {
	if _, ok := kernels.As[kernels.Batcher](s.newBackend(t)); !ok {
		t.Skip("not a kernels.Batcher: MatMul row invariance is not promised")
	}
	for _, typ := range MatMulTypes {
		t.Run(typ.String(), func(t *testing.T) {
			t.Parallel()
			b := s.newBackend(t)
			rng := s.rng(t)
			cols := 2 * max(typ.BlockSize(), 256)
			rows := 67
			w := RandomWeight(rng, "w", typ, rows, cols)
			load(t, b, w)
			ns := []int{2, 3, 4, 5, 7, 8, 13, kernels.MaxBatchRows}
			if raceEnabled {
				ns = []int{2, 5, 8}
			}
			for _, n := range ns {
				matMulRowsCase(t, b, rng, w, n)
			}
		})
	}
}

func matMulRowsCase(t *testing.T, b kernels.Backend, rng *rand.Rand, w *kernels.Weight, n int) {
	t.Helper()
	xv := RandomVector(rng, n*w.Cols, 1)
	x := upload(t, b, xv)
	dst := alloc(t, b, n*w.Rows)
	if err := b.MatMul(dst, w, x, n); err != nil {
		t.Fatalf("%s n=%d: %v", w.Type, n, err)
	}
	got := download(t, b, dst)
	one := alloc(t, b, w.Rows)
	for i := range n {
		if err := b.MatMul(one, w, x.View(i*w.Cols, w.Cols), 1); err != nil {
			t.Fatal(err)
		}
		want := download(t, b, one)
		for r, v := range want {
			if math.Float32bits(got[i*w.Rows+r]) != math.Float32bits(v) {
				t.Fatalf("%s n=%d: row %d output %d = %g, alone it is %g", w.Type, n, i, r, got[i*w.Rows+r], v)
			}
		}
	}
}
