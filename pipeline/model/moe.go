package model

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
)

// A mixture of experts (Mixtral, Qwen3-MoE) replaces a block's one SwiGLU
// feed-forward by Experts of them, of which a router picks ExpertsUsed
// per token:
//
//	xb     = rmsnorm(x) ⊙ ffn_norm
//	p      = softmax(xb·Wrouterᵀ)                    (over the Experts)
//	S      = the ExpertsUsed largest p, best first
//	w_s    = p_s / max(Σ_{s∈S} p_s, 2⁻¹⁴)            (renormalised)
//	x      = x + Σ_{s∈S} w_s · (silu(xb·Wgate_sᵀ) ⊙ xb·Wup_sᵀ)·Wdown_sᵀ
//
// as llama.cpp computes it for both architectures (softmax gating, weights
// renormalised over the chosen experts, the sum clamped at F16's smallest
// normal number, the experts' outputs added in the router's order).
//
// The op is composed of the backend's existing ops, so every backend runs
// it without kernels of its own: the router is a MatMul whose logits are
// read back, and the softmax and top-k are done on the host (route); each
// expert used by some token of the step then runs once over those tokens'
// rows (gathered with Scale by 1 unless it is every row), its matrices
// being row views of the layer's stacked 3-D tensors; the weighted sum is
// Scale and Add on each token's rows. A backend with kernels.RowMixer
// gathers every (token, expert) pair's row in one op and sums in one op
// instead (the same bits). A decode step (one token) runs its experts'
// gate and up products as one MatMuls where the backend has it
// (mixtureDecode: on the CPU, one quantized input and one parallel loop
// for all of them). The read-back costs one wait per layer on a GPU and
// rules out a recorded decode step (model.go): a backend with
// kernels.ExpertRouter routes a decode step on the device instead, where
// nothing needs the host (moe_gpu.go), and one with kernels.ExpertGrouper
// runs a prompt's expert products grouped, every expert's rows of a
// matrix in one op, routed on the device too (moe_grouped.go).
//
// Experts are asked for one at a time (Model.expert), after the router has
// chosen them, so that a loader with per-(layer, expert) readiness has a
// single place to wait for only the experts a step uses.

// maxExperts bounds expert_count (llama.cpp's LLAMA_MAX_EXPERTS is 512).
const maxExperts = 512

// configureExperts reads a mixture of experts' keys of arch from md into c:
// expert_count, expert_used_count and expert_feed_forward_length (absent:
// defaultFF). With required, a file without expert_count is an error (an
// architecture that is only ever a mixture); else it is a dense model.
func configureExperts(c *Config, md Metadata, arch string, required bool, defaultFF int) error {
	n, okN := metaUint(md, arch+".expert_count")
	k, okK := metaUint(md, arch+".expert_used_count")
	if !okN || n == 0 {
		if required {
			return fmt.Errorf("%s.expert_count is missing or 0: a %s model is a mixture of experts", arch, arch)
		}
		if okK && k > 0 {
			return fmt.Errorf("%s.expert_used_count = %d without %s.expert_count", arch, k, arch)
		}
		return nil
	}
	switch {
	case n > maxExperts:
		return fmt.Errorf("%s.expert_count = %d: must be at most %d", arch, n, maxExperts)
	case !okK || k == 0:
		return fmt.Errorf("%s.expert_used_count is missing or 0 (%s.expert_count = %d)", arch, arch, n)
	case k > n:
		return fmt.Errorf("%s.expert_used_count = %d exceeds %s.expert_count = %d", arch, k, arch, n)
	}
	c.Experts, c.ExpertsUsed, c.ExpertFF = int(n), int(k), defaultFF
	if f, ok := metaUint(md, arch+".expert_feed_forward_length"); ok && f > 0 {
		if f > gguf.MaxFeedForward {
			return fmt.Errorf("%s.expert_feed_forward_length = %d: must be at most %d", arch, f, gguf.MaxFeedForward)
		}
		c.ExpertFF = int(f)
	}
	if c.ExpertFF <= 0 {
		return fmt.Errorf("%s: an expert's width is 0 (set %s.expert_feed_forward_length)", arch, arch)
	}
	return nil
}

// moeTensors are the feed-forward tensors of a mixture-of-experts block:
// the pre-norm, the router, and the experts' gate, down and up matrices
// stacked in 3-D tensors (a file's dims [Embd, ExpertFF, Experts] for gate
// and up, [ExpertFF, Embd, Experts] for down).
func moeTensors(c Config) []TensorSpec {
	e, f := c.Experts, c.ExpertFF
	return []TensorSpec{
		vec("ffn_norm.weight", c.Embd, KindNorm, fFFNNorm),
		mat("ffn_gate_inp.weight", c.Embd, e, fGateInp),
		mat3("ffn_gate_exps.weight", c.Embd, f, e, fGateExps),
		mat3("ffn_down_exps.weight", f, c.Embd, e, fDownExps),
		mat3("ffn_up_exps.weight", c.Embd, f, e, fUpExps),
	}
}

// mat3 declares a block's 3-D tensor of experts matrices of rows × cols
// each.
func mat3(name string, cols, rows, experts int, f layerField) TensorSpec {
	return TensorSpec{Name: name, Cols: cols, Rows: rows * experts, Experts: experts, Kind: KindWeight, block: f}
}

var (
	fGateInp  layerField = func(l *LayerWeights) **kernels.Weight { return &l.GateInp }
	fGateExps layerField = func(l *LayerWeights) **kernels.Weight { return &l.GateExps }
	fUpExps   layerField = func(l *LayerWeights) **kernels.Weight { return &l.UpExps }
	fDownExps layerField = func(l *LayerWeights) **kernels.Weight { return &l.DownExps }
)

// ExpertWeights are one expert's matrices: row views of its layer's
// stacked tensors (no copy).
type ExpertWeights struct {
	Gate *kernels.Weight // [ExpertFF][Embd]
	Up   *kernels.Weight // [ExpertFF][Embd]
	Down *kernels.Weight // [Embd][ExpertFF]
	// The expert's biases where the layer has them (gpt-oss), else nil:
	// rows of the layer's stacked bias tensors.
	GateB, UpB, DownB *kernels.Weight // [ExpertFF], [ExpertFF], [Embd]
}

// finishExperts makes l.Experts, one row view per expert of each stacked
// tensor, once the layer's tensors are placed; nothing for a dense layer.
func finishExperts(c Config, l *LayerWeights) error {
	if c.Experts == 0 || (l.GateExps == nil && l.UpExps == nil && l.DownExps == nil) {
		return nil
	}
	if l.GateExps == nil || l.UpExps == nil || l.DownExps == nil || l.GateInp == nil {
		return fmt.Errorf("model: a mixture of experts needs ffn_gate_inp, ffn_gate_exps, ffn_up_exps and ffn_down_exps")
	}
	l.Experts = make([]ExpertWeights, c.Experts)
	for e := range l.Experts {
		part := "expert " + strconv.Itoa(e)
		x := &l.Experts[e]
		var err error
		if x.Gate, err = rowView(l.GateExps, part, e*c.ExpertFF, c.ExpertFF); err != nil {
			return err
		}
		if x.Up, err = rowView(l.UpExps, part, e*c.ExpertFF, c.ExpertFF); err != nil {
			return err
		}
		if x.Down, err = rowView(l.DownExps, part, e*c.Embd, c.Embd); err != nil {
			return err
		}
		if err := expertBiases(l, x, e, part); err != nil {
			return err
		}
	}
	return nil
}

// expertBiases views expert e's rows of the layer's stacked expert biases,
// those it has (gpt-oss).
func expertBiases(l *LayerWeights, x *ExpertWeights, e int, part string) error {
	for _, b := range []struct {
		all *kernels.Weight
		dst **kernels.Weight
	}{{l.GateExpsBias, &x.GateB}, {l.UpExpsBias, &x.UpB}, {l.DownExpsBias, &x.DownB}} {
		if b.all == nil {
			continue
		}
		v, err := rowView(b.all, part, e, 1)
		if err != nil {
			return err
		}
		*b.dst = v
	}
	return nil
}

// moeScratch are the backend buffers of the mixture-of-experts op, for a
// step of B rows; each is used from its start (not by token row).
type moeScratch struct {
	router       kernels.Tensor // [B][Experts]  the router's logits
	in           kernels.Tensor // [B·ExpertsUsed][Embd] the (token, slot) pairs' rows, gathered (by expert)
	gate, up, hb kernels.Tensor // [max(B, ExpertsUsed)][ExpertFF] one expert's products (a decode step's: all of its experts')
	out          kernels.Tensor // [B·ExpertsUsed][Embd] every (token, slot)'s expert output
	// A step routed on the device (moe_gpu.go): its (token, slot) pairs'
	// experts' ids (int32 in float32 slots) and weights.
	ids, wts kernels.Tensor // [B·ExpertsUsed]
	// hbQ is a decode step's hb's 8-bit copy, [ExpertsUsed][ExpertFF]
	// (kernels.Q8Ops, ExpertFF of whole blocks of 32; else empty): the
	// device-routed step's SiLUMul writes it and its down products read
	// it (kernels.ExpertQ8MatMuler).
	hbQ kernels.Q8
}

// pieces lists the buffers for batches of B rows (none for a dense model).
func (s *moeScratch) pieces(c Config, B int) []scratchPiece {
	if c.Experts == 0 {
		return nil
	}
	rows := max(B, c.ExpertsUsed) // a decode step's experts side by side (mixtureDecode)
	return []scratchPiece{
		{&s.router, B * c.Experts}, {&s.in, B * c.ExpertsUsed * c.Embd},
		{&s.gate, rows * c.ExpertFF}, {&s.up, rows * c.ExpertFF}, {&s.hb, rows * c.ExpertFF},
		{&s.out, B * c.ExpertsUsed * c.Embd},
		{&s.ids, B * c.ExpertsUsed}, {&s.wts, B * c.ExpertsUsed},
	}
}

// moeState is the op's host memory, sized once for B rows so that a step
// allocates nothing.
type moeState struct {
	logits []float32 // [B][Experts] the router's logits, read back
	probs  []float32 // [Experts]    one token's softmax, while routing it
	sel    []int32   // [B][ExpertsUsed] token t's slot j: an expert
	wts    []float32 // [B][ExpertsUsed] its weight
	// The (token, slot) pairs grouped by expert: expert e's are
	// order[start[e]:start[e+1]] (as t·ExpertsUsed + j, tokens ascending),
	// and the pair t·ExpertsUsed + j is row row[t·ExpertsUsed + j] of the
	// scratch's out.
	start []int32 // [Experts+1]
	order []int32 // [B·ExpertsUsed]
	row   []int32 // [B·ExpertsUsed]
	// A decode step's gate and up products in one MatMuls (mixtureDecode).
	dsts []kernels.Tensor  // [2·ExpertsUsed]
	ws   []*kernels.Weight // [2·ExpertsUsed]
	// perExpert turns mixtureDecode off (tests: it must change no bit);
	// decodes counts the steps it ran.
	perExpert bool
	decodes   int
	// mixer moves the rows of a step in one op each where the backend
	// can (kernels.RowMixer); src is its gather list, the token of each
	// pair in expert order [B·ExpertsUsed]. noMixer turns it off (tests).
	mixer   kernels.RowMixer
	src     []int32
	noMixer bool
	// dev is the device routing of a decode step (moe_gpu.go).
	dev devRouting
	// grouped runs a prompt's expert products grouped where the backend
	// can (mixtureGrouped); noGrouped turns it off (tests), groupedRuns
	// counts the layers it ran (tests).
	grouped     groupedState
	noGrouped   bool
	groupedRuns int
	// noRows turns mixtureRows off (tests), rowRuns counts the layers it
	// ran.
	noRows  bool
	rowRuns int
}

func newMoeState(c Config, B int) *moeState {
	k := c.ExpertsUsed
	return &moeState{
		logits: make([]float32, B*c.Experts), probs: make([]float32, c.Experts),
		sel: make([]int32, B*k), wts: make([]float32, B*k),
		start: make([]int32, c.Experts+1), order: make([]int32, B*k), row: make([]int32, B*k), src: make([]int32, B*k),
		dsts: make([]kernels.Tensor, 2*k), ws: make([]*kernels.Weight, 2*k),
	}
}

// route is the router on the host: for each of n tokens, the softmax of its
// row of logits [n][experts] (its sum as laneSum takes it), its k most
// probable experts, best first (ties: the lower index), into sel [n][k],
// and their probabilities
// renormalised to sum to 1 (the sum clamped at 2⁻¹⁴ as llama.cpp does)
// into w [n][k]. probs is scratch of experts values. NaN or infinite
// logits (a broken model) still give k distinct experts in range.
func route(logits []float32, n, experts, k int, sel []int32, w []float32, probs []float32) {
	for t := range n {
		row := logits[t*experts : (t+1)*experts]
		mx := row[0]
		for _, v := range row[1:] {
			mx = max(mx, v)
		}
		for e, v := range row {
			probs[e] = float32(math.Exp(float64(v - mx)))
		}
		inv := float32(1 / laneSum(probs))
		for e := range probs {
			probs[e] *= inv
			if !(probs[e] >= 0) {
				probs[e] = 0 // NaN (from NaN or infinite logits): chosen after any number
			}
		}
		s, ws := sel[t*k:(t+1)*k], w[t*k:(t+1)*k]
		var total float32
		for j := range k {
			best := -1
			for e, p := range probs {
				if p >= 0 && (best < 0 || p > probs[best]) {
					best = e
				}
			}
			s[j], ws[j] = int32(best), probs[best]
			total += probs[best]
			probs[best] = -1 // taken
		}
		total = max(total, 6.103515625e-5)
		for j := range ws {
			ws[j] /= total
		}
	}
}

// laneSum is the softmax's sum in the order the device router takes it
// (moe.cu's route_lanes), so both routes give the same bits: 32 lanes each
// add experts lane, lane+32, … in double, then a butterfly adds the
// lanes' sums (lane l adds lane l^o's for o = 16, 8, 4, 2, 1).
func laneSum(p []float32) float64 {
	var s [32]float64
	for e, v := range p {
		s[e%32] += float64(v)
	}
	for o := 16; o > 0; o >>= 1 {
		var n [32]float64
		for l := range s {
			n[l] = s[l] + s[l^o]
		}
		s = n
	}
	return s[0]
}

// group sorts the step's (token, slot) pairs by expert (a counting sort:
// tokens stay ascending within an expert) into start, order and row.
func (st *moeState) group(n, experts, k int) {
	start := st.start[:experts+1]
	clear(start)
	for _, e := range st.sel[:n*k] {
		start[e+1]++
	}
	for e := range experts {
		start[e+1] += start[e]
	}
	// Place each pair at its expert's cursor, start[e] advancing; the
	// cursors end at the next expert's start, so shift them back.
	for i, e := range st.sel[:n*k] {
		p := start[e]
		st.order[p], st.row[i] = int32(i), p
		start[e]++
	}
	copy(start[1:], start[:experts])
	start[0] = 0
}

// moeFeedForward is the mixture-of-experts sub-block (see above):
//
//	xb = rmsnorm(x) ⊙ ffn_norm
//	x  = x + moe(xb)   (the add left pending)
func moeFeedForward(m *Model, lw *LayerWeights, a act, n int) {
	xq := m.preNorm(a, lw.FFNNorm, n)
	m.mixture(lw, a.xb2, a.xb, xq, n)
	m.pending = true // x += xb2
}

// ErrExpertUnavailable marks a step that failed because an expert the
// router chose cannot arrive (its load failed): only the sequences routed
// to it need fail, and a batched step's caller can run the others again
// without them (batch.Scheduler does).
var ErrExpertUnavailable = errors.New("an expert's weights are unavailable")

// expert is expert e of layer lw's weights: the one place the op asks for
// an expert, after the router chose it. Where the weights arrive expert by
// expert (LayerWeights.ExpertReady) it waits for that expert's only; a
// failed one fails the step (m.err, naming the expert) and returns nil.
func (m *Model) expert(lw *LayerWeights, e int) *ExpertWeights {
	if m.err != nil {
		return nil
	}
	if lw.ExpertReady != nil {
		ctx := m.wctx
		if ctx == nil {
			ctx = context.Background()
		}
		if err := lw.ExpertReady(ctx, e); err != nil {
			m.err = fmt.Errorf("mixture of experts: expert %d: %w: %w", e, ErrExpertUnavailable, err)
			return nil
		}
	}
	return &lw.Experts[e]
}

// mixture computes dst [n][Embd] = Σ over each token's chosen experts of their
// weighted SwiGLU outputs on xb [n][Embd] (xq: its 8-bit copy, or the zero
// Q8).
func (m *Model) mixture(lw *LayerWeights, dst, xb kernels.Tensor, xq kernels.Q8, n int) {
	if n == 1 {
		if t := m.deviceRoutable(lw); t != nil {
			m.mixtureDevice(lw, t, dst, xb, xq)
			return
		}
	}
	decode := n == 1 && m.multi != nil && !m.inPrompt && !m.moeState().perExpert
	if !decode {
		// a short prompt as products by id; a longer one grouped
		if m.mixtureRows(lw, dst, xb, xq, n) {
			return
		}
		if t := m.groupedTables(lw, n); t != nil {
			m.mixtureGrouped(lw, t, dst, xb, xq, n)
			return
		}
	}
	st := m.routeTokens(lw, nil, xb, xq, n, func(logits []float32, n, E, K int, sel []int32, w []float32) {
		route(logits, n, E, K, sel, w, m.moe.probs)
	})
	if st == nil {
		return
	}
	if decode {
		m.mixtureDecode(lw, dst, xb, xq)
		return
	}
	F := m.Cfg.ExpertFF
	s := &m.s.moe
	m.eachExpert(lw, dst, xb, xq, n, func(ew *ExpertWeights, in kernels.Tensor, inQ kernels.Q8, out kernels.Tensor, cnt int) {
		g, u, h := s.gate.View(0, cnt*F), s.up.View(0, cnt*F), s.hb.View(0, cnt*F)
		m.matmul2(g, ew.Gate, u, ew.Up, in, inQ, cnt)
		m.siluMul(h, g, u, cnt*F)
		m.matmul(out, ew.Down, h, kernels.Q8{}, cnt)
	})
}

// routeTokens runs layer lw's router on xb [n][Embd] (xq: its 8-bit copy,
// or the zero Q8; adding bias when there is one), reads its logits back and lets pick choose each token's
// experts and weights into the mixture's state, which it returns; nil
// when it failed (m.err says why).
func (m *Model) routeTokens(lw *LayerWeights, bias *kernels.Weight, xb kernels.Tensor, xq kernels.Q8, n int,
	pick func(logits []float32, n, experts, k int, sel []int32, w []float32)) *moeState {
	if m.err != nil {
		return nil
	}
	c := m.Cfg
	E, K := c.Experts, c.ExpertsUsed
	if lw.GateInp == nil || len(lw.Experts) != E {
		m.err = fmt.Errorf("mixture of experts: the layer has %d of %d experts' weights", len(lw.Experts), E)
		return nil
	}
	st := m.moeState()
	router := m.s.moe.router.View(0, n*E)
	m.matmul(router, lw.GateInp, xb, xq, n)
	if bias != nil {
		m.addBias(router, bias, n)
	}
	if m.err != nil {
		return nil
	}
	if err := m.be.Read(st.logits[:n*E], router, 0); err != nil {
		m.err = fmt.Errorf("mixture of experts: reading the router's logits: %w", err)
		return nil
	}
	pick(st.logits[:n*E], n, E, K, st.sel[:n*K], st.wts[:n*K])
	m.demandExperts(lw, st.sel[:n*K])
	return st
}

// demandExperts asks for every expert of sel at once (LayerWeights.
// DemandExperts) where the layer's experts are still arriving, before the
// op waits for the first of them: a prompt during the load then waits
// about one copy of the experts it routed to per layer, not one round
// trip through the load's queue per expert.
func (m *Model) demandExperts(lw *LayerWeights, sel []int32) {
	if lw.DemandExperts == nil || expertsResident(lw) {
		return
	}
	seen := make([]bool, m.Cfg.Experts)
	es := make([]int, 0, len(sel))
	for _, e := range sel {
		if e >= 0 && int(e) < len(seen) && !seen[e] {
			seen[e] = true
			es = append(es, int(e))
		}
	}
	lw.DemandExperts(es)
}

// eachExpert runs ffn once for every expert some of the n tokens chose,
// over those tokens' rows of xb (xb itself when every token chose it,
// else the rows gathered), into the expert's rows of the mixture's out;
// then dst gets the weighted sum. It stops where an expert cannot arrive
// or ffn fails (m.err). ffn's inQ is xq (xb's 8-bit copy, or the zero Q8)
// where in is xb, else the zero Q8.
func (m *Model) eachExpert(lw *LayerWeights, dst, xb kernels.Tensor, xq kernels.Q8, n int,
	ffn func(ew *ExpertWeights, in kernels.Tensor, inQ kernels.Q8, out kernels.Tensor, cnt int)) {
	c, st, s := m.Cfg, m.moe, &m.s.moe
	K, D := c.ExpertsUsed, c.Embd
	st.group(n, c.Experts, K)
	mixer := st.rowMixer()
	if mixer != nil { // every pair's row in one op, in expert order
		for p, pair := range st.order[:n*K] {
			st.src[p] = pair / int32(K)
		}
		if err := mixer.GatherRows(s.in.View(0, n*K*D), xb, st.src[:n*K], D); err != nil && m.err == nil {
			m.err = fmt.Errorf("mixture of experts: gathering %d rows: %w", n*K, err)
		}
	}
	for e := range c.Experts {
		lo, hi := int(st.start[e]), int(st.start[e+1])
		cnt := hi - lo
		if cnt == 0 {
			continue
		}
		ew := m.expert(lw, e)
		if ew == nil {
			return
		}
		in, inQ := xb, xq
		if mixer != nil {
			in, inQ = s.in.View(lo*D, cnt*D), kernels.Q8{}
		} else if cnt != n { // some tokens only: gather their rows
			in, inQ = s.in.View(0, cnt*D), kernels.Q8{}
			for j, pair := range st.order[lo:hi] {
				t := int(pair) / K
				m.copyRow(in.View(j*D, D), xb.View(t*D, D))
			}
		}
		ffn(ew, in, inQ, s.out.View(lo*D, cnt*D), cnt)
		if m.err != nil {
			return
		}
	}
	m.weightedSum(dst, n)
	if lw.ExpertUsed != nil && m.err == nil {
		for e := range c.Experts {
			if cnt := int(st.start[e+1] - st.start[e]); cnt > 0 {
				lw.ExpertUsed(e, cnt)
			}
		}
	}
}

// mixtureDecode is the mixture for one token: its experts' gate and up
// products share one input, so they are one MatMuls (on the CPU: the
// input quantized once, one parallel loop over every expert's rows), their
// gates one SiLUMul, each down product one MatMul into its slot's row of
// out; then the weighted sum in the router's order, as mixture's. Every
// number is the per-expert path's, bit for bit (MatMuls is MatMul's).
func (m *Model) mixtureDecode(lw *LayerWeights, dst, xb kernels.Tensor, xq kernels.Q8) {
	c, st, s := m.Cfg, m.moe, &m.s.moe
	K, F, D := c.ExpertsUsed, c.ExpertFF, c.Embd
	if !m.decodeGateUp(lw, xb, xq, nil) {
		return
	}
	m.siluMul(s.hb.View(0, K*F), s.gate.View(0, K*F), s.up.View(0, K*F), K*F)
	for j, e := range st.sel[:K] {
		m.matmul(s.out.View(j*D, D), lw.Experts[e].Down, s.hb.View(j*F, F), kernels.Q8{}, 1) // waited for above
	}
	m.weightedSum(dst, 1)
	m.usedOne(lw)
}

// decodeGateUp computes a one-token step's gate and up products of its
// chosen experts (sel[:K]) as one MatMuls over their shared input xb (on
// xq, its 8-bit copy, where not empty), expert slot j into row j of the
// mixture's gate and up. ok, when set,
// checks each expert first (gpt-oss: its biases). false: an expert could
// not arrive, was refused, or the product failed (m.err says why).
func (m *Model) decodeGateUp(lw *LayerWeights, xb kernels.Tensor, xq kernels.Q8, ok func(*ExpertWeights) bool) bool {
	c, st, s := m.Cfg, m.moe, &m.s.moe
	K, F := c.ExpertsUsed, c.ExpertFF
	st.decodes++
	for j, e := range st.sel[:K] {
		ew := m.expert(lw, int(e))
		if ew == nil || (ok != nil && !ok(ew)) {
			return false
		}
		st.dsts[2*j], st.ws[2*j] = s.gate.View(j*F, F), ew.Gate
		st.dsts[2*j+1], st.ws[2*j+1] = s.up.View(j*F, F), ew.Up
		st.row[j] = int32(j)
	}
	var err error
	if m.q8 != nil {
		err = m.q8.MatMulsQ8(st.dsts, st.ws, xb, xq, 1)
	} else {
		err = m.multi.MatMuls(st.dsts, st.ws, xb, 1)
	}
	if err != nil {
		m.err = fmt.Errorf("matmuls %s… (%d experts' gate and up): %w", st.ws[0].Name, K, err)
		return false
	}
	return true
}

// usedOne tells lw.ExpertUsed of a one-token step's experts (sel[:K]),
// once the step's mixture succeeded.
func (m *Model) usedOne(lw *LayerWeights) {
	if lw.ExpertUsed != nil && m.err == nil {
		for _, e := range m.moe.sel[:m.Cfg.ExpertsUsed] {
			lw.ExpertUsed(int(e), 1)
		}
	}
}

// weightedSum is dst[t] = Σ_j w[t][j]·out[row(t, j)] for n tokens, the
// experts' outputs added in the router's order.
func (m *Model) weightedSum(dst kernels.Tensor, n int) {
	c, st, s := m.Cfg, m.moe, &m.s.moe
	K, D := c.ExpertsUsed, c.Embd
	if mixer := st.rowMixer(); mixer != nil {
		if m.err == nil {
			if err := mixer.MixRows(dst, s.out, st.row[:n*K], st.wts[:n*K], n, K, D); err != nil {
				m.err = fmt.Errorf("mixture of experts: weighted sum of %d rows: %w", n*K, err)
			}
		}
		return
	}
	for t := range n {
		d := dst.View(t*D, D)
		for j := range K {
			i := t*K + j
			o := s.out.View(int(st.row[i])*D, D)
			if j == 0 {
				m.scaleInto(d, o, st.wts[i])
				continue
			}
			m.scaleInto(o, o, st.wts[i])
			m.add(d, d, o, D)
		}
	}
}

// copyRow copies src into dst (a device copy: Scale by 1 is exact).
func (m *Model) copyRow(dst, src kernels.Tensor) { m.scaleInto(dst, src, 1) }

func (m *Model) scaleInto(dst, x kernels.Tensor, s float32) {
	if m.err == nil {
		if err := m.be.Scale(dst, x, s, dst.Len); err != nil {
			m.err = fmt.Errorf("mixture of experts: scale: %w", err)
		}
	}
}

// moeState is the mixture's host state, made on first use.
func (m *Model) moeState() *moeState {
	if m.moe == nil {
		m.moe = newMoeState(m.Cfg, m.batch)
		m.moe.mixer, _ = kernels.As[kernels.RowMixer](m.be)
		m.moe.dev.router, _ = kernels.As[kernels.ExpertRouter](m.be)
		m.moe.grouped.grouper, _ = kernels.As[kernels.ExpertGrouper](m.be)
	}
	return m.moe
}

// rowMixer is the backend's RowMixer, nil where it has none or tests
// turned it off (the composition of Scale and Add then runs).
func (st *moeState) rowMixer() kernels.RowMixer {
	if st.noMixer {
		return nil
	}
	return st.mixer
}
