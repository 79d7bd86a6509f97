package cpu

import (
	"fmt"
	"math"

	"github.com/forge-llm/forge/kernels"
)

// Attention appends the n new keys and values of one layer to the cache at
// positions pos0…pos0+n-1, then computes causal grouped-query attention:
// query head h of token i reads key/value head h/(Heads/KVHeads) over
// positions 0…pos0+i (a.First(pos0+i)…pos0+i with a sliding window).
// Scores are scaled (and soft-capped where a.Softcap is set), the maximum
// subtracted before the exponential, and the softmax accumulated in
// float32.
//
//	q, out [n][a.Heads][a.HeadDim]; k, v [n][a.KVHeads][a.HeadDim]
func (b *Backend) Attention(out, q, k, v kernels.Tensor, c *kernels.KVCache, layer, pos0, n int, a kernels.Attn) (err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if c == nil {
		return fmt.Errorf("cpu: attention: nil kv cache")
	}
	s, ok := c.Impl.(*kvStore)
	if !ok {
		return fmt.Errorf("cpu: attention: kv cache was not made by the cpu backend (or was freed)")
	}
	if err := checkAttn("attention", "cache", out, q, k, v, a, c.KVDim, c.Layers, layer, n); err != nil {
		return err
	}
	if pos0 < 0 || n < 0 || pos0+n > c.Ctx {
		return fmt.Errorf("cpu: attention: positions %d…%d outside the context of %d", pos0, pos0+n-1, c.Ctx)
	}
	sinks, err := sinkLogits("attention", a)
	if err != nil {
		return err
	}
	kvDim := a.KVHeads * a.HeadDim
	copy(s.k[layer][pos0*kvDim:(pos0+n)*kvDim], k.Host[:n*kvDim])
	copy(s.v[layer][pos0*kvDim:(pos0+n)*kvDim], v.Host[:n*kvDim])

	for w := range b.scratch {
		if cap(b.scratch[w].scores) < pos0+n {
			b.scratch[w].scores = make([]float32, c.Ctx)
		}
	}
	b.att = attnTask{b: b, out: out.Host, q: q.Host, kc: s.k[layer], vc: s.v[layer], pos0: pos0, a: a, sinks: sinks}
	err = b.pool.parallel(&b.att, n*a.Heads, 1)
	b.att = attnTask{}
	if err != nil {
		return opFault("attention", nil, err)
	}
	return nil
}

// checkAttn checks what Attention and PagedAttention share: the heads,
// the store's row width and layers, and the four tensors of n rows.
func checkAttn(op, store string, out, q, k, v kernels.Tensor, a kernels.Attn, kvDim, layers, layer, n int) error {
	if a.Heads <= 0 || a.KVHeads <= 0 || a.HeadDim <= 0 || a.Heads%a.KVHeads != 0 {
		return fmt.Errorf("cpu: %s: bad heads=%d kvHeads=%d headDim=%d", op, a.Heads, a.KVHeads, a.HeadDim)
	}
	if d := a.KVHeads * a.HeadDim; d != kvDim {
		return fmt.Errorf("cpu: %s: kvHeads·headDim = %d but the %s holds rows of %d", op, d, store, kvDim)
	}
	if layer < 0 || layer >= layers {
		return fmt.Errorf("cpu: %s: layer %d out of range [0,%d)", op, layer, layers)
	}
	qDim := a.Heads * a.HeadDim
	names := &attnNames
	if op == "paged attention" {
		names = &pagedNames
	}
	if err := checkTensor(names[0], q, n*qDim); err != nil {
		return err
	}
	if err := checkTensor(names[1], out, n*qDim); err != nil {
		return err
	}
	if err := checkTensor(names[2], k, n*kvDim); err != nil {
		return err
	}
	return checkTensor(names[3], v, n*kvDim)
}

// The tensors' names in checkAttn's errors, made once (a string built per
// call would allocate on every decode step).
var (
	attnNames  = [4]string{"attention: q", "attention: out", "attention: k", "attention: v"}
	pagedNames = [4]string{"paged attention: q", "paged attention: out", "paged attention: k", "paged attention: v"}
)

// softmaxScores scales the raw scores sc, replaces each by its exponential
// less the maximum, and returns their sum: the softmax numerators of
// Attention and PagedAttention (which divide by the sum at the end).
func softmaxScores(sc []float32, scale float32) float32 {
	mx := float32(math.Inf(-1))
	for p, s := range sc {
		s *= scale
		sc[p] = s
		mx = max(mx, s)
	}
	expShift(sc, mx)
	var sum float32
	for _, e := range sc {
		sum += e
	}
	return sum
}

// attnTask computes one (token, query head) pair per item.
type attnTask struct {
	b      *Backend
	out, q []float32
	kc, vc []float32 // this layer's cache, [ctx][kvDim]
	pos0   int
	a      kernels.Attn
	sinks  []float32 // per query head, or nil (kernels.SinkAttender)
}

func (t *attnTask) run(w, lo, hi int) {
	a := t.a
	hd, group := a.HeadDim, a.Heads/a.KVHeads
	kvDim := a.KVHeads * hd
	for item := lo; item < hi; item++ {
		i, h := item/a.Heads, item%a.Heads
		g := h / group
		qv := t.q[(i*a.Heads+h)*hd : (i*a.Heads+h+1)*hd]
		o := t.out[(i*a.Heads+h)*hd : (i*a.Heads+h+1)*hd]
		npos := t.pos0 + i + 1
		var sum float32
		if a.Plain() { // the common case: row loops in assembly
			sc := t.b.scratch[w].scores[:npos]
			scoresF32(qv, t.kc[g*hd:], kvDim, sc)
			sum = softmaxScores(sc, a.Scale)
			clear(o)
			axpyRowsF32(o, t.vc[g*hd:], kvDim, sc)
		} else { // a sliding window, a score soft-cap or sinks
			first := a.First(npos - 1) // 0 unless a sliding window hides older positions
			sc := t.b.scratch[w].scores[:npos-first]
			mx := float32(math.Inf(-1))
			for j := range sc {
				p := first + j
				s := a.Cap(dotF32(qv, t.kc[p*kvDim+g*hd:p*kvDim+(g+1)*hd]) * a.Scale)
				sc[j] = s
				mx = max(mx, s)
			}
			if t.sinks != nil {
				mx = max(mx, t.sinks[h])
			}
			sum = 0
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
				axpyF32(o, t.vc[p*kvDim+g*hd:p*kvDim+(g+1)*hd], e)
			}
		}
		inv := 1 / sum
		for j := range o {
			o[j] *= inv
		}
	}
}
