package model

import (
	"fmt"

	"github.com/forge-llm/forge/kernels"
)

// A decode step's mixture routed on the device (kernels.ExpertRouter): the
// router's logits never come back to the host, so the layer waits for
// nothing and a decode step of a mixture can be recorded as a graph like a
// dense model's. Per layer it queues
//
//	router MatMul → RouteTopK (ids, weights on the device)
//	→ ExpertMatMuls (gate and up of the K experts, one launch)
//	→ SiLUMul → ExpertMatMuls (the K down products, one launch)
//	→ MixSlots (the weighted sum, weights read on the device)
//
// where the host path (mixtureDecode) reads the logits back and queues
// K down products, K Scales and K-1 Adds. Every number is the host path's
// bit for bit: the router kernel rounds as route does, each expert product
// is the one-row MatMul kernel's arithmetic, MixSlots rounds as Scale then
// Add. It runs only where nothing needs the host: every expert of the
// layer resident, no usage profile to count, a backend that can run the
// layer's expert types; otherwise the host path runs.

// devRouting is the device path's state: the backend's router and the
// expert tables made for each layer.
type devRouting struct {
	router kernels.ExpertRouter
	off    bool // tests: the host path always
	// noMixNorm (tests) keeps the weighted sum its own op, not fused
	// with the next norm (kernels.MixNormer).
	noMixNorm bool
	// noFusedRoute (tests) keeps the router's product and the routing
	// their own ops (kernels.RouterFuser).
	noFusedRoute bool
	tables       map[*LayerWeights]*expertTables
	steps        int // decode steps' layers routed on the device (tests)
}

// expertTables are one layer's gate, up and down tables, and the device
// addresses they were made from (a weight moved: made again).
type expertTables struct {
	gate, up, down kernels.ExpertTable
	// gpt-oss: the experts' bias rows (kernels.ExpertBiaser)
	gateB, upB, downB kernels.ExpertTable
	devs              []uintptr // [3·Experts] gate, up, down of each expert
	pair              bool      // gate and up of one type and shape: one launch
	failed            bool      // the backend cannot run this layer's experts
}

// expertsResident reports whether every expert of lw is usable without a
// wait.
func expertsResident(lw *LayerWeights) bool {
	if lw.ExpertReady == nil {
		return true
	}
	return lw.ExpertsReady != nil && lw.ExpertsReady()
}

// deviceRoutable reports whether a one-token mixture of lw may route on the
// device, making the layer's tables if needed.
func (m *Model) deviceRoutable(lw *LayerWeights) *expertTables {
	st := m.moeState()
	d := &st.dev
	if d.off || st.perExpert || lw.ExpertUsed != nil || m.inPrompt {
		return nil
	}
	return m.layerTables(lw, false)
}

// layerTables are lw's expert tables where the backend has an
// ExpertRouter and every expert of lw is resident (or, with arriving, may
// still be on its way: a caller that reads the routing back and waits for
// the experts it chose), made if needed; nil where not, or where the
// backend refused them. A table holds the experts' device addresses,
// which exist from the block's readiness on; no kernel reads an expert
// no token routed to.
func (m *Model) layerTables(lw *LayerWeights, arriving bool) *expertTables {
	d := &m.moeState().dev
	if d.router == nil || m.err != nil || lw.GateInp == nil || len(lw.Experts) != m.Cfg.Experts || !(arriving || expertsResident(lw)) {
		return nil
	}
	t := d.tables[lw]
	if t != nil && (t.failed || sameDevs(t.devs, lw)) {
		if t.failed {
			return nil
		}
		return t
	}
	if t != nil {
		d.free(t)
	}
	t = d.makeTables(lw)
	if d.tables == nil {
		d.tables = map[*LayerWeights]*expertTables{}
	}
	d.tables[lw] = t
	if t.failed {
		return nil
	}
	return t
}

// sameDevs reports whether lw's experts are still at the device addresses
// devs lists.
func sameDevs(devs []uintptr, lw *LayerWeights) bool {
	if len(devs) != 3*len(lw.Experts) {
		return false
	}
	for e, x := range lw.Experts {
		if x.Gate.Dev != devs[3*e] || x.Up.Dev != devs[3*e+1] || x.Down.Dev != devs[3*e+2] {
			return false
		}
	}
	return true
}

// makeTables makes lw's three tables (uploading any expert not on the
// device yet); a table the backend refuses marks the layer failed: it
// keeps the host path, which needs no table.
func (d *devRouting) makeTables(lw *LayerWeights) *expertTables {
	t := &expertTables{}
	ok := d.tablesOf(lw, [3]*kernels.ExpertTable{&t.gate, &t.up, &t.down},
		func(x *ExpertWeights) [3]*kernels.Weight { return [3]*kernels.Weight{x.Gate, x.Up, x.Down} })
	if ok && lw.Experts[0].GateB != nil { // gpt-oss: its biases' tables too
		_, biaser := d.router.(kernels.ExpertBiaser)
		ok = biaser && d.tablesOf(lw, [3]*kernels.ExpertTable{&t.gateB, &t.upB, &t.downB},
			func(x *ExpertWeights) [3]*kernels.Weight { return [3]*kernels.Weight{x.GateB, x.UpB, x.DownB} })
	}
	if !ok {
		d.free(t)
		return &expertTables{failed: true}
	}
	for _, x := range lw.Experts {
		t.devs = append(t.devs, x.Gate.Dev, x.Up.Dev, x.Down.Dev)
	}
	g, u := lw.Experts[0].Gate, lw.Experts[0].Up
	t.pair = g.Type == u.Type && g.Rows == u.Rows && g.Cols == u.Cols
	return t
}

// tablesOf makes three tables, one of each kind of matrix pick gives for
// every expert of lw, into dst; false where the backend refuses one.
func (d *devRouting) tablesOf(lw *LayerWeights, dst [3]*kernels.ExpertTable, pick func(*ExpertWeights) [3]*kernels.Weight) bool {
	var kinds [3][]*kernels.Weight
	for e := range lw.Experts {
		for i, w := range pick(&lw.Experts[e]) {
			kinds[i] = append(kinds[i], w)
		}
	}
	for i, ws := range kinds {
		tab, err := d.router.NewExpertTable(ws)
		if err != nil {
			return false
		}
		*dst[i] = tab
	}
	return true
}

func (d *devRouting) free(t *expertTables) {
	for _, tab := range []kernels.ExpertTable{t.gate, t.up, t.down, t.gateB, t.upB, t.downB} {
		if tab != nil {
			d.router.FreeExpertTable(tab)
		}
	}
	t.gate, t.up, t.down, t.gateB, t.upB, t.downB = nil, nil, nil, nil, nil, nil
}

// freeTables releases every layer's tables (Model.Close).
func (m *Model) freeTables() {
	if m.moe == nil {
		return
	}
	m.freeGrouped()
	d := &m.moe.dev
	for lw, t := range d.tables {
		d.free(t)
		delete(d.tables, lw)
	}
}

// mixtureDevice is the mixture of one token xb [Embd] (xq: its 8-bit copy,
// or the zero Q8, for the router's product) into dst, routed on the device
// with lw's tables t (see above).
func (m *Model) mixtureDevice(lw *LayerWeights, t *expertTables, dst, xb kernels.Tensor, xq kernels.Q8) {
	c, st, s := m.Cfg, m.moe, &m.s.moe
	E, K, D := c.Experts, c.ExpertsUsed, c.Embd
	rt := st.dev.router
	router := s.router.View(0, E)
	ids, wts := s.ids.View(0, K), s.wts.View(0, K)
	out := s.out.View(0, K*D)
	rule, bias := routeRule(lw, t)
	if m.err != nil {
		return
	}
	fail := func(what string, err error) {
		if err != nil && m.err == nil {
			m.err = fmt.Errorf("mixture of experts (routed on the device): %s: %w", what, err)
		}
	}
	var routed bool
	if rf, ok := rt.(kernels.RouterFuser); ok && !st.dev.noFusedRoute {
		var err error
		routed, err = rf.RouteFused(ids, wts, router, xb, lw.GateInp, bias, K, rule)
		fail("router and route", err)
	}
	if !routed && m.err == nil {
		m.matmul(router, lw.GateInp, xb, xq, 1)
		if bias != nil {
			m.addBias(router, bias, 1)
		}
		if m.err == nil {
			fail("route", rt.RouteTopK(ids, wts, router, 1, E, K, rule))
		}
	}
	if m.err != nil {
		return
	}
	st.dev.steps++
	if !m.deviceExperts(t, ids, xb, xq, K, true) {
		return
	}
	if mn, ok := rt.(kernels.MixNormer); ok && m.bat == nil && !st.dev.noMixNorm {
		// left to the next norm, which adds it to x (preNorm)
		m.mix = deferredMix{norm: mn, dst: dst, src: out, w: wts, k: K}
		return
	}
	fail("weighted sum", rt.MixSlots(dst, out, wts, 1, K, D))
}

// maxRowSlots bounds the (token, slot) pairs of a prompt's mixture that
// run as products by id (mixtureRows): each pair reads its expert's whole
// matrices, so past some hundreds of pairs the grouped products, which
// read each chosen expert once, read less. Measured on the H100 in one
// run against a bound of 64 (bench/results/2026-11-26-moe-router-rows-
// h100.md, call 11): gpt-oss-20b, which has no grouped kernel, 2.1–3.4 ×
// faster at 32 to 128 tokens; Qwen3-30B-A3B 1.4–2.9 × at 16 and 32
// tokens, the same at 64. The scratch bounds it further (mixtureRows).
const maxRowSlots = 512

// mixtureRows is the mixture of a short prompt's n tokens xb [n][Embd]
// (xq: their 8-bit copy, or the zero Q8, for the router's product) into
// dst: routed on the device, every (token, slot) pair's row gathered, the
// decode step's products by id over all n·k pairs (deviceExperts), then
// one weighted sum: a few launches a layer, where the per-expert path
// queues several for each chosen expert (gpt-oss's 8-token prompt went
// from ~3000 launches to 694). Every number is the per-expert
// path's: each pair's row is its expert's one-row product. Where the
// layer's experts are still arriving, or their use is counted, the
// routing is read back first; the experts chosen are asked for at once
// and waited for. It reports whether it ran (false: it does not apply
// and queued nothing).
func (m *Model) mixtureRows(lw *LayerWeights, dst, xb kernels.Tensor, xq kernels.Q8, n int) bool {
	c, st, s := m.Cfg, m.moeState(), &m.s.moe
	E, K, D := c.Experts, c.ExpertsUsed, c.Embd
	P := n * K // pairs
	mixer := st.rowMixer()
	if n < 2 || P > maxRowSlots || P > s.ids.Len || P*c.ExpertFF > s.gate.Len || P*D > s.in.Len ||
		mixer == nil || st.dev.off || st.perExpert || st.noRows || m.err != nil {
		return false
	}
	t := m.layerTables(lw, true)
	if t == nil {
		return false
	}
	fail := func(what string, err error) {
		if err != nil && m.err == nil {
			m.err = fmt.Errorf("mixture of experts (%d tokens routed on the device): %s: %w", n, what, err)
		}
	}
	rule, bias := routeRule(lw, t)
	router := s.router.View(0, n*E)
	ids, wts := s.ids.View(0, P), s.wts.View(0, P)
	m.matmul(router, lw.GateInp, xb, xq, n)
	if bias != nil {
		m.addBias(router, bias, n)
	}
	if m.err == nil {
		fail("route", st.dev.router.RouteTopK(ids, wts, router, n, E, K, rule))
	}
	if m.err != nil {
		return true
	}
	arriving := !expertsResident(lw)
	if arriving || lw.ExpertUsed != nil {
		routed := st.logits[:P]
		fail("reading the routing", m.be.Read(routed, ids, 0))
		if m.err != nil {
			return true
		}
		for i, v := range routed {
			st.sel[i] = kernels.IDOf(v)
		}
		st.group(n, E, K)
		if arriving {
			m.demandExperts(lw, st.sel[:P])
			for e := range E {
				if st.start[e+1] > st.start[e] && m.expert(lw, e) == nil {
					return true
				}
			}
		}
	}
	src := st.src[:P] // pair t·K + j takes token t's row
	for p := range src {
		src[p] = int32(p / K)
	}
	in := s.in.View(0, P*D)
	fail("gathering the rows", mixer.GatherRows(in, xb, src, D))
	if m.err != nil || !m.deviceExperts(t, ids, in, kernels.Q8{}, P, false) {
		return true
	}
	fail("weighted sum", st.dev.router.MixSlots(dst, s.out.View(0, P*D), wts, n, K, D))
	st.rowRuns++
	if lw.ExpertUsed != nil && m.err == nil {
		for e := range E {
			if cnt := int(st.start[e+1] - st.start[e]); cnt > 0 {
				lw.ExpertUsed(e, cnt)
			}
		}
	}
	return true
}

// routeRule is the router's rule and bias for lw: gpt-oss (whose tables
// hold expert biases) adds a router bias, takes the top k, then their
// softmax; the others the softmax, then its top k.
func routeRule(lw *LayerWeights, t *expertTables) (kernels.Routing, *kernels.Weight) {
	if t.gateB != nil {
		return kernels.RouteTopKSoftmax, lw.GateInpBias
	}
	return kernels.RouteSoftmax, nil
}

// deviceExperts runs the experts of slots slots, chosen by ids on the
// device, over x (one shared row, or a row per slot; xq its 8-bit copy or
// the zero Q8) with lw's tables t, into the scratch's out [slots][Embd]:
// the gate and up products, gpt-oss's biases and clamped SwiGLU or the
// SiLU product, the down products and their biases. It reports whether
// every op was queued (else m.err says why).
func (m *Model) deviceExperts(t *expertTables, ids, x kernels.Tensor, xq kernels.Q8, slots int, shared bool) bool {
	c, st, s := m.Cfg, m.moe, &m.s.moe
	F, D := c.ExpertFF, c.Embd
	rt := st.dev.router
	gate, up, hb := s.gate.View(0, slots*F), s.up.View(0, slots*F), s.hb.View(0, slots*F)
	out := s.out.View(0, slots*D)
	oai := t.gateB != nil // gpt-oss: expert biases, the clamped SwiGLU
	fail := func(what string, err error) {
		if err != nil && m.err == nil {
			m.err = fmt.Errorf("mixture of experts (routed on the device): %s: %w", what, err)
		}
	}
	rq, takesQ8 := rt.(kernels.ExpertQ8MatMuler)
	// experts multiplies x (slots rows, or one shared) by tables: on x's
	// 8-bit copy xq where there is one and the backend takes it.
	experts := func(dsts []kernels.Tensor, tables []kernels.ExpertTable, x kernels.Tensor, xq kernels.Q8, shared bool) error {
		if takesQ8 && !xq.Empty() {
			return rq.ExpertMatMulsQ8(dsts, tables, ids, x, xq, slots, shared)
		}
		return rt.ExpertMatMuls(dsts, tables, ids, x, slots, shared)
	}
	if t.pair { // gate and up in one launch
		fail("gate and up", experts([]kernels.Tensor{gate, up}, []kernels.ExpertTable{t.gate, t.up}, x, xq, shared))
	} else {
		fail("gate", experts([]kernels.Tensor{gate}, []kernels.ExpertTable{t.gate}, x, xq, shared))
		fail("up", experts([]kernels.Tensor{up}, []kernels.ExpertTable{t.up}, x, xq, shared))
	}
	bs, _ := rt.(kernels.ExpertBiaser) // makeTables checked it where oai
	var hq kernels.Q8                  // hb's 8-bit copy, made by the SiLUMul where the down products take it
	if oai {
		fail("gate bias", bs.AddExpertBias(gate, t.gateB, ids, slots, F))
		fail("up bias", bs.AddExpertBias(up, t.upB, ids, slots, F))
		m.swigluOAI(hb, gate, up, slots*F)
	} else {
		// hbQ holds a decode step's slots (none: siluMulQ is siluMul)
		var q kernels.Q8
		if takesQ8 && slots <= s.hbQ.Rows {
			q = s.hbQ
		}
		hq = m.siluMulQ(hb, gate, up, slots*F, q)
	}
	if m.err != nil {
		return false
	}
	fail("down", experts([]kernels.Tensor{out}, []kernels.ExpertTable{t.down}, hb, hq, false))
	if oai {
		fail("down bias", bs.AddExpertBias(out, t.downB, ids, slots, D))
	}
	return m.err == nil
}

// deviceRouted reports whether a decode step of a mixture of shape cfg may
// route on be's device, and so be recorded: a backend with
// kernels.ExpertRouter (for gpt-oss, with its experts' biases, also
// kernels.ExpertBiaser). A layer that cannot (an expert
// not resident, a usage profile, a type without an expert product) still
// reads back, and the recording then fails and leaves the model op by op.
func deviceRouted(be kernels.Backend, cfg Config) bool {
	_, ok := kernels.As[kernels.ExpertRouter](be)
	if cfg.Arch == "gpt-oss" {
		_, biases := kernels.As[kernels.ExpertBiaser](be)
		return ok && biases
	}
	return ok
}
