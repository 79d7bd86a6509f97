package cpu

import (
	"fmt"
	"math"
	"runtime/debug"

	"github.com/forge-llm/forge/kernels"
)

// poolStore is the CPU storage of a KVPool: per layer, keys and values as
// [block][slot][kvDim] float32, F32 like the contiguous cache so that a
// sequence's attention gives the same bits in either.
type poolStore struct {
	k, v [][]float32
}

// NewKVPool allocates an F32 pool of blocks × blockSize positions for
// layers layers of kvDim-wide key and value rows.
func (b *Backend) NewKVPool(layers, blocks, blockSize, kvDim int) (*kernels.KVPool, error) {
	if layers <= 0 || blocks <= 0 || blockSize <= 0 || kvDim <= 0 {
		return nil, fmt.Errorf("cpu: kv pool: bad shape layers=%d blocks=%d blockSize=%d kvDim=%d", layers, blocks, blockSize, kvDim)
	}
	n := blocks * blockSize * kvDim
	s := &poolStore{k: make([][]float32, layers), v: make([][]float32, layers)}
	for l := range layers {
		s.k[l] = make([]float32, n)
		s.v[l] = make([]float32, n)
	}
	return &kernels.KVPool{Layers: layers, Blocks: blocks, BlockSize: blockSize, KVDim: kvDim, Impl: s}, nil
}

// FreeKVPool drops the pool's storage.
func (b *Backend) FreeKVPool(p *kernels.KVPool) {
	if p != nil {
		p.Impl = nil
	}
}

// SetLayout copies l as the layout of the RoPEAt and PagedAttention calls
// that follow. Block ids are checked against a pool when PagedAttention
// runs (the layout does not name one).
func (b *Backend) SetLayout(l *kernels.Layout) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if l == nil {
		return fmt.Errorf("cpu: set layout: nil layout")
	}
	if len(l.Pos) != len(l.Seq) {
		return fmt.Errorf("cpu: set layout: %d positions but %d sequence indexes", len(l.Pos), len(l.Seq))
	}
	for i, s := range l.Seq {
		if s < 0 || int(s) >= len(l.Tables) {
			return fmt.Errorf("cpu: set layout: row %d names sequence %d of %d", i, s, len(l.Tables))
		}
		if l.Pos[i] < 0 {
			return fmt.Errorf("cpu: set layout: row %d at negative position %d", i, l.Pos[i])
		}
	}
	lay := &b.layout
	lay.Pos = append(lay.Pos[:0], l.Pos...)
	lay.Seq = append(lay.Seq[:0], l.Seq...)
	for len(lay.Tables) < len(l.Tables) {
		lay.Tables = append(lay.Tables, nil)
	}
	lay.Tables = lay.Tables[:len(l.Tables)]
	for i, t := range l.Tables {
		lay.Tables[i] = append(lay.Tables[i][:0], t...)
	}
	b.hasLayout = true
	return nil
}

// layoutRows checks that the current layout covers n rows.
func (b *Backend) layoutRows(op string, n int) error {
	if !b.hasLayout {
		return fmt.Errorf("cpu: %s: no layout set (SetLayout)", op)
	}
	if n < 0 || n > len(b.layout.Pos) {
		return fmt.Errorf("cpu: %s: %d rows but the layout has %d", op, n, len(b.layout.Pos))
	}
	return nil
}

// RoPEAt rotates n rows like RoPE, row i at position Layout.Pos[i], with
// the same arithmetic (ropeRow), so a token's bits do not depend on which
// op rotated it.
//
//	x [n][heads][headDim]
func (b *Backend) RoPEAt(x kernels.Tensor, n, heads, headDim int, r kernels.Rope) (err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	defer recoverFault(&err, debug.SetPanicOnFault(true), "rope at: freqs", r.Freqs)
	if err := b.layoutRows("rope at", n); err != nil {
		return err
	}
	freqs, scale, err := ropeArgs("rope at", x, n, heads, headDim, r)
	if err != nil {
		return err
	}
	cs := b.ropeScratch(r.Dim)
	for i := range n {
		ropeRow(x.Host[i*heads*headDim:(i+1)*heads*headDim], heads, headDim, int(b.layout.Pos[i]), r, scale, freqs, cs)
	}
	return nil
}

// PagedAttention stores each row's key and value at its position in its
// sequence's blocks, then computes causal grouped-query attention over that
// sequence's positions 0…Pos[i], with the arithmetic of Attention (the same
// score, softmax and accumulation order), parallel over (row, head).
//
//	q, out [n][a.Heads][a.HeadDim]; k, v [n][a.KVHeads][a.HeadDim]
func (b *Backend) PagedAttention(out, q, k, v kernels.Tensor, p *kernels.KVPool, layer, n int, a kernels.Attn) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if p == nil {
		return fmt.Errorf("cpu: paged attention: nil kv pool")
	}
	s, ok := p.Impl.(*poolStore)
	if !ok {
		return fmt.Errorf("cpu: paged attention: kv pool was not made by the cpu backend (or was freed)")
	}
	if err := checkAttn("paged attention", "pool", out, q, k, v, a, p.KVDim, p.Layers, layer, n); err != nil {
		return err
	}
	if err := b.layoutRows("paged attention", n); err != nil {
		return err
	}
	sinks, err := sinkLogits("paged attention", a)
	if err != nil {
		return err
	}
	kvDim := a.KVHeads * a.HeadDim
	lay := &b.layout
	bs := p.BlockSize
	maxPos := 0
	for i := range n {
		pos, tab := int(lay.Pos[i]), lay.Tables[lay.Seq[i]]
		if pos/bs >= len(tab) {
			return fmt.Errorf("cpu: paged attention: row %d at position %d needs block %d, its table has %d", i, pos, pos/bs, len(tab))
		}
		for j, blk := range tab[:pos/bs+1] {
			if blk < 0 || int(blk) >= p.Blocks {
				return fmt.Errorf("cpu: paged attention: sequence %d block %d is %d, pool has %d", lay.Seq[i], j, blk, p.Blocks)
			}
		}
		maxPos = max(maxPos, pos)
	}
	kc, vc := s.k[layer], s.v[layer]
	for i := range n {
		pos, tab := int(lay.Pos[i]), lay.Tables[lay.Seq[i]]
		off := (int(tab[pos/bs])*bs + pos%bs) * kvDim
		copy(kc[off:off+kvDim], k.Host[i*kvDim:(i+1)*kvDim])
		copy(vc[off:off+kvDim], v.Host[i*kvDim:(i+1)*kvDim])
	}
	for w := range b.scratch {
		if cap(b.scratch[w].scores) < maxPos+1 {
			b.scratch[w].scores = make([]float32, maxPos+1)
		}
	}
	b.patt = pagedTask{b: b, out: out.Host, q: q.Host, kc: kc, vc: vc, bs: bs, a: a, sinks: sinks}
	b.pool.parallel(&b.patt, n*a.Heads, 1)
	b.patt = pagedTask{}
	return nil
}

// pagedTask computes one (row, query head) pair per item, reading the
// row's sequence through its block table.
type pagedTask struct {
	b      *Backend
	out, q []float32
	kc, vc []float32 // this layer's pool, [block][slot][kvDim]
	bs     int
	a      kernels.Attn
	sinks  []float32 // per query head, or nil (kernels.SinkAttender)
}

func (t *pagedTask) run(w, lo, hi int) {
	a := t.a
	hd, group := a.HeadDim, a.Heads/a.KVHeads
	kvDim := a.KVHeads * hd
	lay := &t.b.layout
	for item := lo; item < hi; item++ {
		i, h := item/a.Heads, item%a.Heads
		g := h / group
		tab := lay.Tables[lay.Seq[i]]
		qv := t.q[(i*a.Heads+h)*hd : (i*a.Heads+h+1)*hd]
		o := t.out[(i*a.Heads+h)*hd : (i*a.Heads+h+1)*hd]
		npos := int(lay.Pos[i]) + 1
		var sum float32
		if a.Plain() {
			sc := t.b.scratch[w].scores[:npos]
			// Keys and values of one block are consecutive rows: one call
			// per block.
			for p := 0; p < npos; p += t.bs {
				r := int(tab[p/t.bs])*t.bs*kvDim + g*hd
				scoresF32(qv, t.kc[r:], kvDim, sc[p:min(p+t.bs, npos)])
			}
			sum = softmaxScores(sc, a.Scale)
			clear(o)
			for p := 0; p < npos; p += t.bs {
				r := int(tab[p/t.bs])*t.bs*kvDim + g*hd
				axpyRowsF32(o, t.vc[r:], kvDim, sc[p:min(p+t.bs, npos)])
			}
		} else { // a sliding window, a score soft-cap or sinks
			first := a.First(npos - 1)
			sc := t.b.scratch[w].scores[:npos-first]
			mx := float32(math.Inf(-1))
			for j := range sc {
				p := first + j
				r := (int(tab[p/t.bs])*t.bs+p%t.bs)*kvDim + g*hd
				s := a.Cap(dotF32(qv, t.kc[r:r+hd]) * a.Scale)
				sc[j] = s
				mx = max(mx, s)
			}
			if t.sinks != nil {
				mx = max(mx, t.sinks[h])
			}
			for j, s := range sc {
				e := float32(math.Exp(float64(s - mx)))
				sc[j] = e
				sum += e
			}
			if t.sinks != nil { // one more score in the softmax, with no value
				sum += float32(math.Exp(float64(t.sinks[h] - mx)))
			}
			clear(o)
			for j, e := range sc {
				p := first + j
				r := (int(tab[p/t.bs])*t.bs+p%t.bs)*kvDim + g*hd
				axpyF32(o, t.vc[r:r+hd], e)
			}
		}
		inv := 1 / sum
		for j := range o {
			o[j] *= inv
		}
	}
}

var _ kernels.Batcher = (*Backend)(nil)
