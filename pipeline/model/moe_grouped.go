package model

import (
	"fmt"

	"github.com/forge-llm/forge/kernels"
)

// A prompt's mixture with its expert products grouped
// (kernels.ExpertGrouper): where eachExpert runs, for every expert some
// token chose, a gate and up MatMul, a SiLUMul and a down MatMul over that
// expert's rows (hundreds of small products per layer of a long prompt),
// the grouped path queues per layer
//
//	router MatMul → RouteTopK (every token's experts and weights, on the
//	device, read back together: the host only groups the pairs)
//	→ GatherRows (every (token, expert) pair's row, in expert order)
//	→ GroupedMatMuls (gate and up of every expert, one launch)
//	→ SiLUMul (every row) → GroupedMatMuls (down, one launch)
//	→ MixRows (the weighted sum, as today)
//
// with each expert's matrices taken from the decode path's tables
// (moe_gpu.go). During the load the layer's experts may still be arriving:
// once the routing is read back the op asks for every expert it chose at
// once and waits for those only (the kernels read no other expert). The
// router is the decode path's kernel (its ids and weights are the host
// router's, bit for bit), which spares the host the softmax and top-k of
// every token (about 1.7 ms a layer for 512 tokens of 128 experts) and the
// read-back of every logit. Every row is what the expert's own MatMul
// gives it over that expert's rows wherever that MatMul is row-invariant
// (an expert chosen by at most kernels.MaxBatchRows tokens of the step);
// beyond, the per-expert path's long products go through a GEMM on f16 x
// and differ from the grouped ones by its rounding. It runs on a backend
// with a RowMixer and an ExpertGrouper whose kernels fit the layer's
// tables (on the GPU: Q4_K and Q6_K experts on CUDA sm_80 on); otherwise
// eachExpert runs.

// groupedState is the grouped path's backend and its buffer of every
// pair's gate and up rows, allocated on first use (a backend without the
// grouped kernels never pays for it).
type groupedState struct {
	grouper kernels.ExpertGrouper
	buf     kernels.Tensor // [2][B·ExpertsUsed][ExpertFF]; first the routing's ids and weights [2][B·ExpertsUsed]
	routed  []float32      // [2][B·ExpertsUsed] the ids and weights, read back
	failed  bool           // the buffer could not be allocated: eachExpert always
}

// groupedFloats is the grouped path's buffer for batches of rows tokens:
// every (token, expert) pair's gate and up rows (0 for a dense model).
func groupedFloats(c Config, rows int) int64 {
	if c.Experts == 0 {
		return 0
	}
	return 2 * int64(rows) * int64(c.ExpertsUsed) * int64(c.ExpertFF)
}

// groupedTables reports whether the n-token mixture of lw may run grouped,
// returning the layer's tables (made if needed) and making the buffer.
func (m *Model) groupedTables(lw *LayerWeights, n int) *expertTables {
	st := m.moeState()
	g := &st.grouped
	if g.grouper == nil || g.failed || st.noGrouped || st.rowMixer() == nil || m.err != nil || n <= 0 {
		return nil
	}
	t := m.layerTables(lw, true)
	if t == nil || t.gateB != nil || !g.grouper.GroupsFit(t.gate) || !g.grouper.GroupsFit(t.up) || !g.grouper.GroupsFit(t.down) {
		return nil
	}
	if g.buf.Len == 0 {
		c := m.Cfg
		buf, err := m.be.Alloc(int(groupedFloats(c, m.batch)))
		if err != nil {
			g.failed = true // the per-expert products need no more memory
			return nil
		}
		g.buf = buf
		g.routed = make([]float32, 2*m.batch*c.ExpertsUsed)
	}
	return t
}

// freeGrouped releases the grouped path's buffer (Model.Close).
func (m *Model) freeGrouped() {
	if g := &m.moe.grouped; g.buf.Len > 0 {
		m.be.Free(g.buf)
		g.buf = kernels.Tensor{}
	}
}

// mixtureGrouped is the mixture of n tokens xb [n][Embd] (xq: its 8-bit
// copy, or the zero Q8, for the router's product) into dst, with lw's
// tables t (see above).
func (m *Model) mixtureGrouped(lw *LayerWeights, t *expertTables, dst, xb kernels.Tensor, xq kernels.Q8, n int) {
	c, st, s := m.Cfg, m.moe, &m.s.moe
	E, K, F, D := c.Experts, c.ExpertsUsed, c.ExpertFF, c.Embd
	g := &st.grouped
	router := s.router.View(0, n*E)
	m.matmul(router, lw.GateInp, xb, xq, n)
	if m.err != nil {
		return
	}
	ids, wts := g.buf.View(0, n*K), g.buf.View(n*K, n*K)
	if err := st.dev.router.RouteTopK(ids, wts, router, n, E, K, kernels.RouteSoftmax); err != nil {
		m.err = fmt.Errorf("mixture of experts (grouped): routing %d tokens: %w", n, err)
		return
	}
	routed := g.routed[:2*n*K]
	if err := m.be.Read(routed, g.buf.View(0, 2*n*K), 0); err != nil {
		m.err = fmt.Errorf("mixture of experts (grouped): reading %d tokens' experts: %w", n, err)
		return
	}
	for i, v := range routed[:n*K] {
		st.sel[i] = kernels.IDOf(v)
	}
	copy(st.wts[:n*K], routed[n*K:])
	st.group(n, E, K)
	if !expertsResident(lw) { // during the load: wait for the experts chosen, all asked for at once
		m.demandExperts(lw, st.sel[:n*K])
		for e := range E {
			if st.start[e+1] > st.start[e] && m.expert(lw, e) == nil {
				return
			}
		}
	}
	for p, pair := range st.order[:n*K] {
		st.src[p] = pair / int32(K)
	}
	in := s.in.View(0, n*K*D)
	fail := func(what string, err error) {
		if err != nil && m.err == nil {
			m.err = fmt.Errorf("mixture of experts (grouped, %d rows): %s: %w", n*K, what, err)
		}
	}
	fail("gathering the rows", st.rowMixer().GatherRows(in, xb, st.src[:n*K], D))
	if m.err != nil {
		return
	}
	st.groupedRuns++
	half := m.batch * K * F
	gate, up := g.buf.View(0, n*K*F), g.buf.View(half, n*K*F)
	start := st.start[:E+1]
	if t.pair {
		fail("gate and up", g.grouper.GroupedMatMuls([]kernels.Tensor{gate, up}, []kernels.ExpertTable{t.gate, t.up}, in, start))
	} else {
		fail("gate", g.grouper.GroupedMatMuls([]kernels.Tensor{gate}, []kernels.ExpertTable{t.gate}, in, start))
		fail("up", g.grouper.GroupedMatMuls([]kernels.Tensor{up}, []kernels.ExpertTable{t.up}, in, start))
	}
	m.siluMul(gate, gate, up, n*K*F) // in place: each value read, then written, by one thread
	if m.err != nil {
		return
	}
	fail("down", g.grouper.GroupedMatMuls([]kernels.Tensor{s.out.View(0, n*K*D)}, []kernels.ExpertTable{t.down}, gate, start))
	if m.err != nil {
		return
	}
	m.weightedSum(dst, n)
	if lw.ExpertUsed != nil && m.err == nil {
		for e := range E {
			if cnt := int(st.start[e+1] - st.start[e]); cnt > 0 {
				lw.ExpertUsed(e, cnt)
			}
		}
	}
}
