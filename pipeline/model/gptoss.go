package model

import (
	"fmt"
	"math"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
)

// gptossArch is OpenAI's gpt-oss (20b, 120b): a mixture of experts in
// every block, with
//
//   - biases on Q, K, V and the attention output, on the router and on
//     every expert's gate, up and down products;
//   - attention sinks: one learnt logit per query head that joins the
//     softmax with no value (kernels.Attn.Sinks);
//   - sliding-window attention (attention.sliding_window positions) on
//     the even layers, full attention on the odd ones (pattern 2);
//   - NeoX RoPE with YaRN context extension (yarn.go);
//   - a router that picks the top-k logits and weights the chosen
//     experts by the softmax over those k logits alone;
//   - the clamped SwiGLU: g = min(gate, 7), u = clamp(up, ±7),
//     g·σ(1.702·g)·(u+1) (kernels.SwiGLUOAIer);
//   - experts stored as MXFP4 in the published files.
//
// Attention sinks and the clamped SwiGLU are optional ops (the CPU and GPU
// backends have them), so the model refuses a backend without them
// (Requires) rather than compute something else there.
var gptossArch = Arch{
	Name:      "gpt-oss",
	Configure: gptossConfigure,
	Block:     gptossBlock,
	Layer:     gptossLayer,
	Requires:  gptossRequires,
	Meta: func(s Shape, add func(string, gguf.Value)) {
		add("gpt-oss.attention.sliding_window", gguf.Uint32(uint32(s.SlidingWindow)))
	},
	Presets: map[string]Shape{
		// gpt-oss-20b: 24 blocks of 32 experts (4 per token, 2880 wide),
		// 64 query heads of 64 over 8 KV heads, windows of 128 on every
		// other block, 128K positions by YaRN ×32 from 4096.
		"gpt-oss-20b": {Embd: 2880, FF: 2880, Layers: 24, Heads: 64, KVHeads: 8, HeadDim: 64, Vocab: 201088, Ctx: 131072,
			RopeBase: 150000, NormEps: 1e-5, SlidingWindow: 128, YaRNFactor: 32, YaRNOrigCtx: 4096,
			Experts: 32, ExpertsUsed: 4, ExpertFF: 2880, ChatTemplate: harmonyTemplate,
			SpecialTokens: []string{"<|start|>", "<|message|>", "<|end|>", "<|channel|>", "<|return|>", "<|call|>", "<|constrain|>"}},
		// Small: four blocks (two windowed), a window of 8 (the tests'
		// 21 positions cross it), query heads wider in sum than the model
		// (key_length set), YaRN ×4 from 64 positions, 8 experts, 4 per
		// token.
		"tiny-gpt-oss": {Embd: 256, FF: 128, Layers: 4, Heads: 8, KVHeads: 2, HeadDim: 64, Vocab: 512, Ctx: 256,
			RopeBase: 150000, NormEps: 1e-5, SlidingWindow: 8, YaRNFactor: 4, YaRNOrigCtx: 64,
			Experts: 8, ExpertsUsed: 4, ExpertFF: 128, ChatTemplate: harmonyTemplate},
	},
}

// harmonyTemplate is the core of gpt-oss's conversation format (Harmony:
// <|start|>role<|message|>…<|end|>, the answer on the final channel), as a
// Jinja template; the published one adds the system preamble, reasoning
// and tools.
const harmonyTemplate = `{%- for message in messages %}{%- if message['role'] == 'assistant' %}{{- '<|start|>assistant<|channel|>final<|message|>' + message['content'] + '<|end|>' }}{%- else %}{{- '<|start|>' + message['role'] + '<|message|>' + message['content'] + '<|end|>' }}{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|start|>assistant' }}{%- endif %}`

// gpt-oss's activation constants, which llama.cpp fixes too (no GGUF key).
const gptossAlpha, gptossLimit = 1.702, 7.0

func gptossConfigure(c *Config, md Metadata) error {
	const p = "gpt-oss."
	c.Rope.NeoX = true
	c.Sinks = true
	c.SwiGLUAlpha, c.SwiGLULimit = gptossAlpha, gptossLimit
	if err := configureExperts(c, md, "gpt-oss", true, 0); err != nil {
		return err
	}
	w, ok := metaUint(md, p+"attention.sliding_window")
	switch {
	case !ok:
		return fmt.Errorf("%sattention.sliding_window is missing", p)
	case w == 0 || w > 1<<30:
		return fmt.Errorf("%sattention.sliding_window = %d: must be in [1, 2^30]", p, w)
	}
	c.Window, c.SWAPattern = int(w), 2
	if v, present := md.Lookup(p + "attention.sliding_window_pattern"); present {
		pat, ok := v.Uint()
		if !ok || pat == 0 || pat > uint64(gguf.MaxBlockCount) {
			return fmt.Errorf("%sattention.sliding_window_pattern must be a count in [1, %d] (a per-layer array is not supported)", p, gguf.MaxBlockCount)
		}
		c.SWAPattern = int(pat)
	}
	if b, ok := metaFloat(md, p+"rope.freq_base_swa"); ok && float32(b) != c.Rope.Base {
		return fmt.Errorf("%srope.freq_base_swa = %v differs from rope.freq_base = %v: not supported", p, b, c.Rope.Base)
	}
	if c.Rope.Dim != c.HeadDim {
		return fmt.Errorf("%srope.dimension_count = %d: only whole heads (%d) are supported", p, c.Rope.Dim, c.HeadDim)
	}
	scale := float32(1 / math.Sqrt(float64(c.Rope.Dim))) // llama.cpp's 1/√n_rot
	if t, ok := md.Lookup(p + "rope.scaling.type"); ok {
		if s, _ := t.Text(); s == "yarn" {
			if err := gptossYaRN(c, md); err != nil {
				return err
			}
			m := yarnMScale(c.YaRNFactor)
			if f, ok := metaFloat(md, p+"rope.scaling.attn_factor"); ok {
				if !(f > 0) || math.IsInf(f, 0) {
					return fmt.Errorf("%srope.scaling.attn_factor = %v: must be finite and > 0", p, f)
				}
				m *= float32(f)
			}
			scale *= m * m // the rotated queries' and keys' magnitude correction
		}
	}
	c.AttnScale = scale
	return nil
}

// gptossYaRN reads YaRN's factor and original context.
func gptossYaRN(c *Config, md Metadata) error {
	const p = "gpt-oss."
	f, ok := metaFloat(md, p+"rope.scaling.factor")
	if !ok || !(f >= 1) || math.IsInf(f, 0) {
		return fmt.Errorf("%srope.scaling.factor is missing or not a finite number ≥ 1 (rope.scaling.type yarn)", p)
	}
	orig := uint64(c.Ctx) // llama.cpp's default: the training context
	if v, ok := metaUint(md, p+"rope.scaling.original_context_length"); ok {
		orig = v
	}
	if orig == 0 || orig > gguf.MaxContext {
		return fmt.Errorf("%srope.scaling.original_context_length = %d: must be in [1, %d]", p, orig, gguf.MaxContext)
	}
	c.YaRNFactor, c.YaRNOrigCtx = float32(f), int(orig)
	return nil
}

// gptossRequires refuses a backend without attention sinks or the clamped
// SwiGLU.
func gptossRequires(be kernels.Backend) error {
	if s, ok := kernels.As[kernels.SinkAttender](be); !ok || !s.AttentionSinks() {
		return fmt.Errorf("the backend has no attention sinks (kernels.SinkAttender): run gpt-oss on the CPU backend")
	}
	if _, ok := kernels.As[kernels.SwiGLUOAIer](be); !ok {
		return fmt.Errorf("the backend has no clamped SwiGLU (kernels.SwiGLUOAIer): run gpt-oss on the CPU backend")
	}
	return nil
}

var (
	fOBias       layerField = func(l *LayerWeights) **kernels.Weight { return &l.OBias }
	fGateInpBias layerField = func(l *LayerWeights) **kernels.Weight { return &l.GateInpBias }
	fGateExpsB   layerField = func(l *LayerWeights) **kernels.Weight { return &l.GateExpsBias }
	fUpExpsB     layerField = func(l *LayerWeights) **kernels.Weight { return &l.UpExpsBias }
	fDownExpsB   layerField = func(l *LayerWeights) **kernels.Weight { return &l.DownExpsBias }
	fAttnSinks   layerField = func(l *LayerWeights) **kernels.Weight { return &l.AttnSinks }
)

// biasRows declares a block's stacked per-expert bias vectors: rows rows
// of cols F32 values.
func biasRows(name string, cols, rows int, f layerField) TensorSpec {
	return TensorSpec{Name: name, Cols: cols, Rows: rows, Kind: KindBias, block: f}
}

// gptossBlock is a gpt-oss block's table, in the order of llama.cpp's
// converter. The feed-forward's pre-norm is post_attention_norm.
func gptossBlock(c Config) []TensorSpec {
	e, f := c.Experts, c.ExpertFF
	return []TensorSpec{
		vec("attn_norm.weight", c.Embd, KindNorm, fAttnNorm),
		mat("attn_q.weight", c.Embd, c.QDim(), fQ),
		vec("attn_q.bias", c.QDim(), KindBias, fQBias),
		mat("attn_k.weight", c.Embd, c.KVDim(), fK),
		vec("attn_k.bias", c.KVDim(), KindBias, fKBias),
		mat("attn_v.weight", c.Embd, c.KVDim(), fV),
		vec("attn_v.bias", c.KVDim(), KindBias, fVBias),
		mat("attn_output.weight", c.QDim(), c.Embd, fO),
		vec("attn_output.bias", c.Embd, KindBias, fOBias),
		vec("attn_sinks.weight", c.Heads, KindBias, fAttnSinks),
		vec("post_attention_norm.weight", c.Embd, KindNorm, fFFNNorm),
		mat("ffn_gate_inp.weight", c.Embd, e, fGateInp),
		vec("ffn_gate_inp.bias", e, KindBias, fGateInpBias),
		mat3("ffn_gate_exps.weight", c.Embd, f, e, fGateExps),
		biasRows("ffn_gate_exps.bias", f, e, fGateExpsB),
		mat3("ffn_down_exps.weight", f, c.Embd, e, fDownExps),
		biasRows("ffn_down_exps.bias", c.Embd, e, fDownExpsB),
		mat3("ffn_up_exps.weight", c.Embd, f, e, fUpExps),
		biasRows("ffn_up_exps.bias", f, e, fUpExpsB),
	}
}

// gptossLayer is the gpt-oss block on n tokens at positions pos0…:
//
//	xb  = rmsnorm(x) ⊙ attn_norm
//	q   = xb·Wqᵀ + bq   k = xb·Wkᵀ + bk   v = xb·Wvᵀ + bv
//	q,k = rope_neox_yarn(q, pos), rope_neox_yarn(k, pos)
//	att = softmax(q·Kᵀ·scale ∪ sink_h, causal, window on even layers)·V
//	x   = x + att·Woᵀ + bo
//	xb  = rmsnorm(x) ⊙ post_attention_norm
//	x   = x + Σ_{s∈top-k(r)} softmax_k(r)_s · (swiglu_oai(xb·Wg_sᵀ + bg_s, xb·Wu_sᵀ + bu_s)·Wd_sᵀ + bd_s)
//	      where r = xb·Wrᵀ + br
func gptossLayer(m *Model, lw *LayerWeights, layer, pos0, n, nOut int) error {
	c := m.Cfg
	a := m.s.rows(0, n, c)

	xq := m.preNorm(a, lw.AttnNorm, n)
	m.matmul3(a.q, lw.Q, a.k, lw.K, a.v, lw.V, a.xb, xq, n)
	m.addBias(a.q, lw.QBias, n)
	m.addBias(a.k, lw.KBias, n)
	m.addBias(a.v, lw.VBias, n)
	m.attns[layer].Sinks = lw.AttnSinks // the layer's own: its weights may arrive late
	aq := m.selfAttention(a, nil, nil, layer, pos0, n)
	if nOut == 0 {
		return m.err
	}

	b := m.s.rows(n-nOut, nOut, c)
	m.matmul(b.xb2, lw.O, b.att, aq.View(n-nOut, nOut), nOut)
	m.addBias(b.xb2, lw.OBias, nOut)
	m.pending = true // x += xb2

	xq = m.preNorm(b, lw.FFNNorm, nOut)
	m.oaiMixture(lw, b.xb2, b.xb, xq, nOut)
	m.pending = true // x += xb2
	return m.err
}

// oaiMixture is gpt-oss's mixture of experts on xb [n][Embd] into dst: the
// router's logits (with its bias) read back, each token's top-k experts
// weighted by the softmax over their k logits (routeTopK), each chosen
// expert run once over its tokens' rows, with its biases and the clamped
// SwiGLU, and the weighted sum in the router's order (moe.go's buffers and
// grouping); a decode step's experts share their input
// (oaiMixtureDecode). xq is xb's 8-bit copy, or the zero Q8.
func (m *Model) oaiMixture(lw *LayerWeights, dst, xb kernels.Tensor, xq kernels.Q8, n int) {
	if lw.GateInpBias == nil && m.err == nil {
		m.err = fmt.Errorf("mixture of experts: the layer has no router bias")
	}
	if n == 1 && m.err == nil && len(lw.Experts) > 0 && lw.Experts[0].GateB != nil {
		if t := m.deviceRoutable(lw); t != nil { // routed on the device (moe_gpu.go)
			m.mixtureDevice(lw, t, dst, xb, xq)
			return
		}
	}
	// a short prompt as products by id, where the tables hold the biases
	if n > 1 && m.err == nil && len(lw.Experts) > 0 && lw.Experts[0].GateB != nil && m.mixtureRows(lw, dst, xb, xq, n) {
		return
	}
	st := m.routeTokens(lw, lw.GateInpBias, xb, xq, n, routeTopK)
	if st == nil {
		return
	}
	if n == 1 && m.multi != nil && !m.inPrompt && !st.perExpert {
		m.oaiMixtureDecode(lw, dst, xb, xq)
		return
	}
	F := m.Cfg.ExpertFF
	s := &m.s.moe
	m.eachExpert(lw, dst, xb, xq, n, func(ew *ExpertWeights, in kernels.Tensor, inQ kernels.Q8, out kernels.Tensor, cnt int) {
		if !m.hasBiases(ew) {
			return
		}
		g, u, h := s.gate.View(0, cnt*F), s.up.View(0, cnt*F), s.hb.View(0, cnt*F)
		m.matmul2(g, ew.Gate, u, ew.Up, in, inQ, cnt)
		m.addBias(g, ew.GateB, cnt)
		m.addBias(u, ew.UpB, cnt)
		m.swigluOAI(h, g, u, cnt*F)
		m.matmul(out, ew.Down, h, kernels.Q8{}, cnt)
		m.addBias(out, ew.DownB, cnt)
	})
}

// hasBiases checks that an expert has gpt-oss's three biases (m.err when
// not).
func (m *Model) hasBiases(ew *ExpertWeights) bool {
	if ew.GateB == nil || ew.UpB == nil || ew.DownB == nil {
		if m.err == nil {
			m.err = fmt.Errorf("mixture of experts: an expert has no biases (%s)", ew.Gate.Name)
		}
		return false
	}
	return true
}

// oaiMixtureDecode is oaiMixture for one token, as mixtureDecode is the
// SwiGLU mixture's: the chosen experts' gate and up products of the one
// input as one MatMuls (on the CPU: the input quantized once, one
// parallel loop over all their rows), side by side in the scratch; each
// expert's gate and up biases on its slot's rows, one clamped SwiGLU over
// all of them (it is elementwise), then each down product and its bias
// into its slot's row of out, and the weighted sum in the router's
// order. Every number is the per-expert path's, bit for bit: MatMuls is
// MatMul's, and the bias adds and the activation are elementwise.
func (m *Model) oaiMixtureDecode(lw *LayerWeights, dst, xb kernels.Tensor, xq kernels.Q8) {
	c, st, s := m.Cfg, m.moe, &m.s.moe
	K, F, D := c.ExpertsUsed, c.ExpertFF, c.Embd
	if !m.decodeGateUp(lw, xb, xq, m.hasBiases) {
		return
	}
	for j, e := range st.sel[:K] {
		ew := &lw.Experts[e] // waited for above
		m.addBias(s.gate.View(j*F, F), ew.GateB, 1)
		m.addBias(s.up.View(j*F, F), ew.UpB, 1)
	}
	m.swigluOAI(s.hb.View(0, K*F), s.gate.View(0, K*F), s.up.View(0, K*F), K*F)
	for j, e := range st.sel[:K] {
		ew := &lw.Experts[e]
		out := s.out.View(j*D, D)
		m.matmul(out, ew.Down, s.hb.View(j*F, F), kernels.Q8{}, 1)
		m.addBias(out, ew.DownB, 1)
	}
	m.weightedSum(dst, 1)
	m.usedOne(lw)
}

// routeTopK is gpt-oss's router on the host: for each of n tokens, the k
// largest of its logits [n][experts], best first (ties: the lower index;
// NaN counts below any number), into sel [n][k], and the softmax over
// those k logits alone into w [n][k].
func routeTopK(logits []float32, n, experts, k int, sel []int32, w []float32) {
	for t := range n {
		row := logits[t*experts : (t+1)*experts]
		s, ws := sel[t*k:(t+1)*k], w[t*k:(t+1)*k]
		for j := range k {
			best := -1
			for e, v := range row {
				if taken(s[:j], e) {
					continue
				}
				if best < 0 || v > row[best] || (row[best] != row[best] && v == v) {
					best = e
				}
			}
			s[j] = int32(best)
		}
		mx := row[s[0]]
		var sum float32
		for j := range k {
			ws[j] = float32(math.Exp(float64(row[s[j]] - mx)))
			sum += ws[j]
		}
		for j := range ws {
			ws[j] /= sum
		}
	}
}

// taken reports whether expert e is among sel.
func taken(sel []int32, e int) bool {
	for _, x := range sel {
		if int(x) == e {
			return true
		}
	}
	return false
}

func (m *Model) swigluOAI(dst, gate, up kernels.Tensor, n int) {
	if m.err != nil {
		return
	}
	be, ok := kernels.As[kernels.SwiGLUOAIer](m.be)
	if !ok {
		m.err = fmt.Errorf("swiglu oai: backend %s lacks it", m.be.Name())
		return
	}
	if err := be.SwiGLUOAI(dst, gate, up, n, m.Cfg.SwiGLUAlpha, m.Cfg.SwiGLULimit); err != nil {
		m.err = fmt.Errorf("swiglu oai: %w", err)
	}
}
