package gpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/cpu"
)

// prefillCase is one attention shape and how far its sequences grow.
type prefillCase struct {
	a      kernels.Attn
	bs     int
	upTo   int   // prefix length the schedule reaches
	pieces []int // piece lengths, cycled
}

// pieceSchedule is the piece lengths of a sequence grown to upTo: every
// length in pieces in turn (so every one meets many prefix lengths), then
// a last piece of 64 rows past upTo.
func pieceSchedule(pieces []int, upTo int) []int {
	var out []int
	for p, i := 0, 0; p < upTo; i++ {
		n := pieces[i%len(pieces)]
		out = append(out, n)
		p += n
	}
	return append(out, 64)
}

// TestPrefillMatchesCPU grows two sequences of a paged pool piece by piece
// (pieces of 1…64 rows and a few of several tiles, prefixes 0…3000, block
// tables in shuffled and reversed order) on the GPU and on the CPU backend,
// and compares every piece's attention output by relative error: the
// tiled prompt kernel (tensor cores on sm_80+), its first sm_80 version,
// its plain path, and the per-row kernel it replaces; plain, and with
// gpt-oss's sliding window and attention sinks.
func TestPrefillMatchesCPU(t *testing.T) {
	b := gpuBackend(t, false)
	cb := cpu.New(0)
	defer cb.Close()
	var grow []int
	for n := 1; n <= 64; n++ {
		grow = append(grow, n)
	}
	grow = append(grow, 300, 7, 129, 2)
	cases := []prefillCase{
		{a: kernels.Attn{Heads: 8, KVHeads: 2, HeadDim: 128}, bs: 16, upTo: 3000, pieces: grow},
		{a: kernels.Attn{Heads: 4, KVHeads: 4, HeadDim: 64}, bs: 32, upTo: 700, pieces: []int{33, 1, 64, 65, 5, 17}},
		// gpt-oss's layers: a sliding window of 128 with attention sinks,
		// and sinks alone.
		{a: kernels.Attn{Heads: 8, KVHeads: 2, HeadDim: 64, Window: 128, Sinks: randomSinks(rand.New(rand.NewPCG(5, 7)), 8)},
			bs: 16, upTo: 700, pieces: []int{33, 1, 64, 65, 5, 17, 200}},
		{a: kernels.Attn{Heads: 8, KVHeads: 2, HeadDim: 64, Sinks: randomSinks(rand.New(rand.NewPCG(6, 7)), 8)},
			bs: 16, upTo: 700, pieces: []int{33, 1, 64, 65, 5, 17}},
	}
	for _, mode := range []int{prefillAuto, prefillWhole, prefillV1, prefillPlain, prefillOff} {
		for _, pc := range cases {
			name := fmt.Sprintf("mode=%d/D=%d/window=%d/sinks=%v", mode, pc.a.HeadDim, pc.a.Window, pc.a.Sinks != nil)
			t.Run(name, func(t *testing.T) {
				defer func(m int) { prefillMode = m }(prefillMode)
				prefillMode = mode
				checkPrefill(t, b, cb, pc)
			})
		}
	}
}

func checkPrefill(t *testing.T, b *Backend, cb *cpu.Backend, pc prefillCase) {
	a := pc.a
	a.Scale = float32(1 / math.Sqrt(float64(a.HeadDim)))
	kvDim, qDim := a.KVHeads*a.HeadDim, a.Heads*a.HeadDim
	rng := rand.New(rand.NewPCG(uint64(a.HeadDim), 31))
	sched := pieceSchedule(pc.pieces, pc.upTo)
	total := 0
	for _, n := range sched {
		total += n
	}
	perSeq := (total + pc.bs - 1) / pc.bs
	blocks := 2*perSeq + 3
	const layers, layer = 2, 1
	gp, err := b.NewKVPool(layers, blocks, pc.bs, kvDim)
	if err != nil {
		t.Fatal(err)
	}
	defer b.FreeKVPool(gp)
	cp, err := cb.NewKVPool(layers, blocks, pc.bs, kvDim)
	if err != nil {
		t.Fatal(err)
	}
	perm := rng.Perm(blocks)
	tables := [][]int32{make([]int32, perSeq), make([]int32, perSeq)}
	for i := range perSeq {
		tables[0][i] = int32(perm[i])                 // shuffled
		tables[1][perSeq-1-i] = int32(perm[perSeq+i]) // the other blocks, last first
	}
	lens := [2]int{}
	worst := 0.0
	for step := 0; step < 2*len(sched); step++ {
		s := step % 2
		n := sched[step/2]
		if s == 1 {
			n = sched[len(sched)-1-step/2] // the other sequence takes the schedule backwards
		}
		l := kernels.Layout{Tables: tables}
		for i := range n {
			l.Pos = append(l.Pos, int32(lens[s]+i))
			l.Seq = append(l.Seq, int32(s))
		}
		qs, ks, vs := randVec(rng, n*qDim, 1), randVec(rng, n*kvDim, 1), randVec(rng, n*kvDim, 1)
		run := func(be kernels.Backend, bt kernels.Batcher, pool *kernels.KVPool) []float32 {
			if err := bt.SetLayout(&l); err != nil {
				t.Fatal(err)
			}
			tensor := func(v []float32) kernels.Tensor {
				x, err := be.Alloc(len(v))
				if err != nil {
					t.Fatal(err)
				}
				if err := be.Write(x, 0, v); err != nil {
					t.Fatal(err)
				}
				return x
			}
			out, q, k, v := tensor(nanVec(n*qDim)), tensor(qs), tensor(ks), tensor(vs)
			defer func() {
				for _, x := range []kernels.Tensor{out, q, k, v} {
					be.Free(x)
				}
			}()
			if err := bt.PagedAttention(out, q, k, v, pool, layer, n, a); err != nil {
				t.Fatal(err)
			}
			got := make([]float32, n*qDim)
			if err := be.Read(got, out, 0); err != nil {
				t.Fatal(err)
			}
			return got
		}
		got := run(b, b, gp)
		want := run(cb, cb, cp)
		wf := make([]float64, len(want))
		for i, x := range want {
			wf[i] = float64(x)
		}
		e := relNorm(got, wf)
		if !(e < 4e-3) {
			t.Fatalf("sequence %d, piece of %d rows at positions %d…%d: relative error %.3g against the CPU", s, n, lens[s], lens[s]+n-1, e)
		}
		worst = max(worst, e)
		lens[s] += n
	}
	t.Logf("%d pieces, sequences of %d and %d positions: worst relative error %.3g", 2*len(sched), lens[0], lens[1], worst)
}

// TestPrefillPieceInvariant: a prompt row's attention is the same bits
// whichever piece (and so whichever tile and warp) it is computed in, for
// each of prefill.cu's kernels.
func TestPrefillPieceInvariant(t *testing.T) {
	b := gpuBackend(t, false)
	rng := rand.New(rand.NewPCG(7, 32))
	a := kernels.Attn{Heads: 8, KVHeads: 2, HeadDim: 128, Scale: float32(1 / math.Sqrt(128))}
	kvDim, qDim := a.KVHeads*a.HeadDim, a.Heads*a.HeadDim
	const bs, blocks = 16, 200
	pool, err := b.NewKVPool(1, blocks, bs, kvDim)
	if err != nil {
		t.Fatal(err)
	}
	defer b.FreeKVPool(pool)
	var tab []int32
	for _, p := range rng.Perm(blocks) {
		tab = append(tab, int32(p))
	}
	piece := func(pos0 int, q, k, v []float32) []float32 {
		n := len(q) / qDim
		l := kernels.Layout{Tables: [][]int32{tab}}
		for i := range n {
			l.Pos = append(l.Pos, int32(pos0+i))
			l.Seq = append(l.Seq, 0)
		}
		if err := b.SetLayout(&l); err != nil {
			t.Fatal(err)
		}
		out, _ := b.Alloc(n * qDim)
		defer b.Free(out)
		if err := b.PagedAttention(out, upload(t, b, q), upload(t, b, k), upload(t, b, v), pool, 0, n, a); err != nil {
			t.Fatal(err)
		}
		return download(t, b, out)
	}
	// 150 rows from 950: across the split form's first boundary (1024), so
	// auto computes some pieces unsplit, some split, the rows before 1024
	// in both
	const prefix = 950
	piece(0, randVec(rng, prefix*qDim, 1), randVec(rng, prefix*kvDim, 1), randVec(rng, prefix*kvDim, 1))
	const n = 150
	q, k, v := randVec(rng, n*qDim, 1), randVec(rng, n*kvDim, 1), randVec(rng, n*kvDim, 1)
	defer func(m int) { prefillMode = m }(prefillMode)
	for _, mode := range []int{prefillAuto, prefillWhole, prefillV1, prefillPlain} {
		prefillMode = mode
		whole := piece(prefix, q, k, v)
		// (n is a multiple of no cut plus one: a lone row would be a decode
		// row, computed by attn_paged)
		for _, cut := range []int{2, 10, 64, 77} {
			var parts []float32
			for lo := 0; lo < n; lo += cut {
				hi := min(n, lo+cut)
				parts = append(parts, piece(prefix+lo, q[lo*qDim:hi*qDim], k[lo*kvDim:hi*kvDim], v[lo*kvDim:hi*kvDim])...)
			}
			for i := range whole {
				if math.Float32bits(whole[i]) != math.Float32bits(parts[i]) {
					t.Fatalf("mode %d, pieces of %d: row %d element %d is %g, in one piece %g", mode, cut, i/qDim, i%qDim, parts[i], whole[i])
				}
			}
		}
	}
}

// TestPrefillPiecesMatchAlone: a merged step's layout (the prompt pieces
// of several sequences, one deep past the first split, the last rows of
// some moved to the end as planGroups puts them) goes through the pieces
// kernel, and every row gets the bits its piece gets alone (which
// TestPrefillMatchesCPU checks against the CPU).
func TestPrefillPiecesMatchAlone(t *testing.T) {
	b := gpuBackend(t, false)
	rng := rand.New(rand.NewPCG(9, 33))
	for _, a := range []kernels.Attn{
		{Heads: 8, KVHeads: 2, HeadDim: 128},
		{Heads: 8, KVHeads: 2, HeadDim: 64, Window: 128, Sinks: randomSinks(rng, 8)},
	} {
		a.Scale = float32(1 / math.Sqrt(float64(a.HeadDim)))
		kvDim, qDim := a.KVHeads*a.HeadDim, a.Heads*a.HeadDim
		seqs := []piecesSeq{{2000, 330, true}, {0, 45, true}, {950, 150, false}, {300, 2, true}, {64, 64, true}}
		const bs = 16
		var tables [][]int32
		next := 0
		for _, s := range seqs {
			var tab []int32
			for range ceilDiv(s.pos0+s.n, bs) {
				tab = append(tab, int32(next))
				next++
			}
			rng.Shuffle(len(tab), func(i, j int) { tab[i], tab[j] = tab[j], tab[i] })
			tables = append(tables, tab)
		}
		pool, err := b.NewKVPool(1, next, bs, kvDim)
		if err != nil {
			t.Fatal(err)
		}
		// attend runs the layout's rows, q, k, v [rows][…], and returns out.
		attend := func(pos, seq []int32, q, k, v []float32) []float32 {
			n := len(pos)
			if err := b.SetLayout(&kernels.Layout{Pos: pos, Seq: seq, Tables: tables}); err != nil {
				t.Fatal(err)
			}
			out, qt, kt, vt := upload(t, b, nanVec(n*qDim)), upload(t, b, q), upload(t, b, k), upload(t, b, v)
			defer func() {
				for _, x := range []kernels.Tensor{out, qt, kt, vt} {
					b.Free(x)
				}
			}()
			if err := b.PagedAttention(out, qt, kt, vt, pool, 0, n, a); err != nil {
				t.Fatal(err)
			}
			return download(t, b, out)
		}
		rows := func(si, lo, hi int) (pos, seq []int32) {
			for p := lo; p < hi; p++ {
				pos, seq = append(pos, int32(p)), append(seq, int32(si))
			}
			return pos, seq
		}
		// each sequence's prefix, then each piece alone
		var qs, ks, vs [][]float32
		alone := make([][]float32, len(seqs))
		for si, s := range seqs {
			tot := s.pos0 + s.n
			qs = append(qs, randVec(rng, tot*qDim, 1))
			ks = append(ks, randVec(rng, tot*kvDim, 1))
			vs = append(vs, randVec(rng, tot*kvDim, 1))
			if s.pos0 > 0 {
				pos, seq := rows(si, 0, s.pos0)
				attend(pos, seq, qs[si][:s.pos0*qDim], ks[si][:s.pos0*kvDim], vs[si][:s.pos0*kvDim])
			}
		}
		defer func(m int) { prefillMode = m }(prefillMode)
		for _, mode := range []int{prefillAuto, prefillWhole} {
			prefillMode = mode
			for si, s := range seqs {
				pos, seq := rows(si, s.pos0, s.pos0+s.n)
				alone[si] = attend(pos, seq, qs[si][s.pos0*qDim:], ks[si][s.pos0*kvDim:], vs[si][s.pos0*kvDim:])
			}
			var pos, seq []int32
			var q, k, v []float32
			add := func(si, lo, hi int) {
				p, sq := rows(si, lo, hi)
				pos, seq = append(pos, p...), append(seq, sq...)
				q = append(q, qs[si][lo*qDim:hi*qDim]...)
				k = append(k, ks[si][lo*kvDim:hi*kvDim]...)
				v = append(v, vs[si][lo*kvDim:hi*kvDim]...)
			}
			for si, s := range seqs {
				end := s.pos0 + s.n
				if s.moved {
					end--
				}
				add(si, s.pos0, end)
			}
			for si, s := range seqs {
				if s.moved {
					add(si, s.pos0+s.n-1, s.pos0+s.n)
				}
			}
			got := attend(pos, seq, q, k, v)
			b.mu.Lock()
			pl, ok := b.prefillKernel(len(pos), a, 2)
			b.mu.Unlock()
			if !ok || pl.tiles == 0 {
				t.Fatalf("mode %d: the merged layout took %q (tiles %d, ok %v), not the pieces kernel", mode, pl.name, pl.tiles, ok)
			}
			for r := range pos {
				si, p := int(seq[r]), int(pos[r])
				want := alone[si][(p-seqs[si].pos0)*qDim:][:qDim]
				for j, x := range want {
					if math.Float32bits(x) != math.Float32bits(got[r*qDim+j]) {
						t.Fatalf("mode %d, D %d, %s: row %d (sequence %d, position %d) element %d is %g, its piece alone %g",
							mode, a.HeadDim, pl.name, r, si, p, j, got[r*qDim+j], x)
					}
				}
			}
			t.Logf("mode %d, D %d: %d rows of %d pieces through %s (%d tiles, %d splits): the bits of each piece alone",
				mode, a.HeadDim, len(pos), len(seqs), pl.name, pl.tiles, pl.splits)
		}
		b.FreeKVPool(pool)
	}
}
