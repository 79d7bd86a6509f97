// Package sample picks the next token from a row of logits: greedy argmax
// or llama.cpp's usual chain (repetition penalty → top-k → top-p → min-p →
// temperature → a draw from the remaining distribution).
//
// A Sampler owns all its scratch, sized to the vocabulary once, so picking a
// token allocates nothing; and it owns its random source, seeded from
// Params.Seed, so a given seed always gives the same tokens for the same
// logits.
package sample

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// ErrNonFinite is returned (wrapped, with the token id) by Sample when a
// logit is NaN or infinite: a model whose weights or hyper-parameters
// overflow gives such rows, and no distribution can be drawn from them.
var ErrNonFinite = errors.New("non-finite logit")

// ErrNoLogits is returned by Sample for an empty row of logits.
var ErrNoLogits = errors.New("no logits to sample from")

// Params selects the sampling method. The zero value is greedy with no
// penalty; Defaults gives llama.cpp's defaults.
type Params struct {
	Temp          float32 // ≤ 0: greedy (argmax, ties to the lowest id)
	TopK          int     // keep the K most likely tokens; ≤ 0: off
	TopP          float32 // keep the smallest set whose probability reaches P; ≥ 1 or ≤ 0: off
	MinP          float32 // drop tokens less likely than MinP × the most likely one; ≤ 0: off
	RepeatPenalty float32 // divide positive logits (multiply negative ones) of recent tokens; ≤ 0 or 1: off
	RepeatLastN   int     // how many recent tokens the penalty looks at (0: 64, as llama.cpp)
	// PresencePenalty and FrequencyPenalty are OpenAI's, in [-2, 2] (0:
	// off): every token already generated has its logit lowered by
	// PresencePenalty plus FrequencyPenalty times how often it was
	// generated. Unlike RepeatPenalty they count only generated tokens
	// (those accepted after the first Sample), as OpenAI describes them.
	PresencePenalty  float32
	FrequencyPenalty float32
	Seed             uint64 // seeds the random draws

	// OnLogprob, when set, receives for every pick the token's
	// log-probability under the model's distribution (the softmax of
	// the raw logits, before penalties and temperature, as OpenAI's
	// logprobs report it) and the TopLogprobs most likely tokens'. It
	// costs a pass over the row per token and makes a greedy pick read
	// the whole row, so it is set only when a caller asks.
	OnLogprob   func(Logprob) `json:"-"`
	TopLogprobs int           // alternatives given to OnLogprob, at most 20
}

// Logprob is one pick's log-probability and the most likely tokens'.
type Logprob struct {
	ID      int32
	Logprob float32
	Top     []TokenLogprob // most likely first
}

// TokenLogprob is a token's log-probability.
type TokenLogprob struct {
	ID      int32
	Logprob float32
}

// Defaults returns llama.cpp's default sampling parameters (common_params).
func Defaults() Params {
	return Params{Temp: 0.8, TopK: 40, TopP: 0.95, MinP: 0.05, RepeatPenalty: 1, RepeatLastN: 64}
}

// Greedy reports whether p always picks the most likely token.
func (p Params) Greedy() bool { return p.Temp <= 0 || p.TopK == 1 }

// FullRow reports whether Sample needs the whole row of logits even for
// a greedy pick (a penalty changes them, or OnLogprob reads them), so
// that the model's argmax cannot stand in for it.
func (p Params) FullRow() bool {
	return p.RepeatPenalty > 0 && p.RepeatPenalty != 1 || p.PresencePenalty != 0 || p.FrequencyPenalty != 0 || p.OnLogprob != nil
}

// candidate is one token still in the running.
type candidate struct {
	id    int32
	logit float32
	p     float64 // probability after the last softmax
}

// Sampler picks tokens for one sequence. It is not safe for concurrent use.
type Sampler struct {
	p     Params
	vocab int
	rng   *rand.Rand

	cand []candidate // [vocab] working set
	hist []int32     // ring of the last RepeatLastN accepted tokens
	nh   int         // tokens accepted so far
	// stamp marks tokens already penalised in this step (stamp[id] == step),
	// so a token repeated in the window is penalised once, as llama.cpp does.
	stamp []uint32
	step  uint32

	// counts[id] is how often id was generated, for the presence and
	// frequency penalties (nil when both are off); seen lists the ids
	// with a count, so a step touches only those. sampled marks the end
	// of the prompt: tokens accepted before the first Sample are not
	// counted.
	counts  []int32
	seen    []int32
	sampled bool

	// con restricts the picks (constrained decoding); conErr is the error
	// of its last Accept, reported by the next Sample.
	con    Constraint
	conErr error
}

// New returns a sampler for a vocabulary of vocab tokens. Parameters out
// of range (see Params.Validate) are clamped to the nearest meaning, so a
// Sampler is safe whatever it is given; callers that take parameters from
// users validate them first to report the mistake.
func New(p Params, vocab int) *Sampler {
	p = p.clamp()
	vocab = max(vocab, 0)
	s := &Sampler{
		p:     p,
		vocab: vocab,
		rng:   rand.New(rand.NewPCG(p.Seed, p.Seed^0x9e3779b97f4a7c15)),
		cand:  make([]candidate, vocab),
	}
	if s.penalty() {
		s.hist = make([]int32, p.RepeatLastN)
		s.stamp = make([]uint32, vocab)
	}
	if p.PresencePenalty != 0 || p.FrequencyPenalty != 0 {
		s.counts = make([]int32, vocab)
		s.seen = make([]int32, 0, 64)
	}
	return s
}

// clamp maps every value Validate rejects onto an in-range one: NaN and
// negative settings turn their filter off (NaN or negative temperature is
// greedy), too-large ones take the largest valid value. The result never
// makes Sample divide by zero, empty the candidate list or allocate
// without bound.
func (p Params) clamp() Params {
	fix := func(v *float32, hi float32) {
		if math.IsNaN(float64(*v)) || *v < 0 {
			*v = 0
		}
		*v = min(*v, hi)
	}
	fix(&p.Temp, maxTemp)
	fix(&p.TopP, 1)
	fix(&p.MinP, 1)
	fix(&p.RepeatPenalty, maxRepeatPenalty)
	for _, v := range []*float32{&p.PresencePenalty, &p.FrequencyPenalty} {
		if math.IsNaN(float64(*v)) {
			*v = 0
		}
		*v = min(max(*v, -maxOpenAIPenalty), maxOpenAIPenalty)
	}
	p.TopK = min(max(p.TopK, 0), maxTopK)
	if p.RepeatLastN <= 0 {
		p.RepeatLastN = 64
	}
	p.RepeatLastN = min(p.RepeatLastN, maxRepeatLastN)
	p.TopLogprobs = min(max(p.TopLogprobs, 0), maxTopLogprobs)
	return p
}

// Params returns the parameters the sampler uses (after clamping).
func (s *Sampler) Params() Params { return s.p }

func (s *Sampler) penalty() bool { return s.p.RepeatPenalty > 0 && s.p.RepeatPenalty != 1 }

// Accept records a token of the sequence (prompt or generated) for the
// repetition penalty; one accepted after a Sample is a generated token,
// counted for the presence and frequency penalties.
func (s *Sampler) Accept(id int32) {
	if s.con != nil && s.sampled && s.conErr == nil {
		if err := s.con.Accept(id); err != nil {
			s.conErr = fmt.Errorf("sample: constraint: %w", err)
		}
	}
	if s.counts != nil && s.sampled && id >= 0 && int(id) < len(s.counts) {
		if s.counts[id] == 0 {
			s.seen = append(s.seen, id)
		}
		s.counts[id]++
	}
	if s.hist == nil {
		return
	}
	s.hist[s.nh%len(s.hist)] = id
	s.nh++
}

// Reset forgets the accepted tokens (not the random state): the next
// tokens accepted before a Sample are a prompt again.
func (s *Sampler) Reset() {
	s.nh = 0
	for _, id := range s.seen {
		s.counts[id] = 0
	}
	s.seen = s.seen[:0]
	s.sampled = false
}

// Sample picks the next token from logits ([vocab] values, left unchanged).
// A NaN or infinite logit is an error wrapping ErrNonFinite (the model
// overflowed; no token is picked), an empty row one wrapping ErrNoLogits.
func (s *Sampler) Sample(logits []float32) (int32, error) {
	id, err := s.sample(logits)
	if err == nil && s.p.OnLogprob != nil {
		s.p.OnLogprob(logprobs(logits[:min(len(logits), s.vocab)], id, s.p.TopLogprobs))
	}
	return id, err
}

// logprobs is the log-softmax of row at id and at the top k tokens.
func logprobs(row []float32, id int32, k int) Logprob {
	maxL := row[0]
	for _, l := range row {
		maxL = max(maxL, l)
	}
	sum := 0.0
	for _, l := range row {
		sum += math.Exp(float64(l - maxL))
	}
	lse := float64(maxL) + math.Log(sum)
	lp := Logprob{ID: id, Logprob: float32(float64(row[id]) - lse)}
	if k <= 0 {
		return lp
	}
	// Insertion into a short sorted list: k is at most 20.
	top := make([]TokenLogprob, 0, k+1)
	for i, l := range row {
		if len(top) == k && l <= top[k-1].Logprob {
			continue
		}
		j := len(top)
		for j > 0 && top[j-1].Logprob < l {
			j--
		}
		top = slices.Insert(top, j, TokenLogprob{ID: int32(i), Logprob: l})
		if len(top) > k {
			top = top[:k]
		}
	}
	for i := range top {
		top[i].Logprob = float32(float64(top[i].Logprob) - lse)
	}
	lp.Top = top
	return lp
}

func (s *Sampler) sample(logits []float32) (int32, error) {
	n := min(len(logits), s.vocab)
	if n == 0 {
		return 0, ErrNoLogits
	}
	s.sampled = true
	if s.con != nil && !s.penalising() {
		// Constrained without penalties: only the allowed tokens become
		// candidates (no pass writing a candidate per token).
		for i, l := range logits[:n] {
			if l-l != 0 {
				return 0, fmt.Errorf("sample: token %d has logit %v: %w", i, l, ErrNonFinite)
			}
		}
		c, err := s.maskedCandidates(logits[:n])
		if err != nil {
			return 0, err
		}
		return s.pick(c)
	}
	c := s.cand[:n]
	for i := range c {
		l := logits[i]
		// l-l is 0 for finite l and NaN for NaN and ±Inf: one test for both.
		if l-l != 0 {
			return 0, fmt.Errorf("sample: token %d has logit %v: %w", i, l, ErrNonFinite)
		}
		c[i] = candidate{id: int32(i), logit: l}
	}
	s.applyPenalty(c)
	s.applyOpenAIPenalties(c)
	if s.con != nil {
		var err error
		if c, err = s.allowedCandidates(c); err != nil {
			return 0, err
		}
	}
	return s.pick(c)
}

// penalising reports whether a penalty changes some logit this step.
func (s *Sampler) penalising() bool {
	return s.hist != nil && s.nh > 0 || len(s.seen) > 0
}

// pick chooses among the candidates c (after penalties and the
// constraint): greedy, or the sampling chain.
func (s *Sampler) pick(c []candidate) (int32, error) {
	if s.p.Greedy() {
		return argmax(c), nil
	}
	if k := s.p.TopK; k > 0 && k < len(c) {
		c = topK(c, k)
	} else if s.p.TopP > 0 && s.p.TopP < 1 {
		slices.SortFunc(c, byLogitDesc)
	}
	if p := s.p.TopP; p > 0 && p < 1 {
		// c is sorted, most likely first.
		softmax(c, 1)
		cum, keep := 0.0, len(c)
		for i := range c {
			cum += c[i].p
			if cum >= float64(p) {
				keep = i + 1
				break
			}
		}
		c = c[:keep]
	}
	if mp := s.p.MinP; mp > 0 && len(c) > 1 {
		// p_i ≥ mp·p_max  ⇔  logit_i ≥ logit_max + ln(mp)
		maxL := c[0].logit
		for _, x := range c {
			maxL = max(maxL, x.logit)
		}
		cut := float64(maxL) + math.Log(float64(mp))
		kept := c[:0]
		for _, x := range c {
			if float64(x.logit) >= cut {
				kept = append(kept, x)
			}
		}
		c = kept
	}
	if len(c) == 0 { // unreachable with clamped Params; never index an empty list
		return 0, ErrNoLogits
	}
	softmax(c, s.p.Temp)
	r := s.rng.Float64()
	cum := 0.0
	for i := range c {
		cum += c[i].p
		if r < cum {
			return c[i].id, nil
		}
	}
	return c[len(c)-1].id, nil // r rounded past the last cumulative sum
}

// applyPenalty applies the repetition penalty to every distinct token among
// the last RepeatLastN accepted ones.
func (s *Sampler) applyPenalty(c []candidate) {
	if s.hist == nil || s.nh == 0 {
		return
	}
	s.step++
	if s.step == 0 { // wrapped: clear the stamps once every 2³² steps
		clear(s.stamp)
		s.step = 1
	}
	pen := s.p.RepeatPenalty
	for i := range min(s.nh, len(s.hist)) {
		id := s.hist[i]
		if id < 0 || int(id) >= len(c) || s.stamp[id] == s.step {
			continue
		}
		s.stamp[id] = s.step
		l := c[id].logit
		if l > 0 {
			l /= pen
		} else {
			l *= pen
		}
		// A tiny penalty can overflow a large logit: keep it the largest
		// finite value of its sign, so the softmax stays defined.
		c[id].logit = max(min(l, math.MaxFloat32), -math.MaxFloat32)
	}
}

// applyOpenAIPenalties lowers the logit of every generated token by
// presence + frequency × its count (OpenAI's formula).
func (s *Sampler) applyOpenAIPenalties(c []candidate) {
	for _, id := range s.seen {
		if int(id) >= len(c) {
			continue
		}
		l := c[id].logit - (s.p.PresencePenalty + float32(s.counts[id])*s.p.FrequencyPenalty)
		c[id].logit = max(min(l, math.MaxFloat32), -math.MaxFloat32)
	}
}

// argmax returns the most likely token, the lowest id among equals.
func argmax(c []candidate) int32 {
	best := 0
	for i := 1; i < len(c); i++ {
		if c[i].logit > c[best].logit {
			best = i
		}
	}
	return c[best].id
}

// byLogitDesc orders candidates most likely first, lower id first among
// equals, so every ordering is deterministic.
func byLogitDesc(a, b candidate) int {
	switch {
	case a.logit > b.logit:
		return -1
	case a.logit < b.logit:
		return 1
	}
	return int(a.id - b.id)
}

// topK moves the k most likely candidates to the front of c, sorted, and
// returns them. A min-heap of size k keeps it O(n log k).
func topK(c []candidate, k int) []candidate {
	h := c[:k]
	// Build a heap whose root is the least likely of the k (the one to evict).
	for i := k/2 - 1; i >= 0; i-- {
		siftDown(h, i)
	}
	for i := k; i < len(c); i++ {
		if byLogitDesc(c[i], h[0]) < 0 {
			h[0], c[i] = c[i], h[0]
			siftDown(h, 0)
		}
	}
	slices.SortFunc(h, byLogitDesc)
	return h
}

// siftDown restores the heap property below i: a parent is never more likely
// than its children.
func siftDown(h []candidate, i int) {
	for {
		l := 2*i + 1
		if l >= len(h) {
			return
		}
		m := l
		if r := l + 1; r < len(h) && byLogitDesc(h[r], h[l]) > 0 {
			m = r
		}
		if byLogitDesc(h[m], h[i]) <= 0 {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}

// softmax sets c[i].p = exp(logit_i/temp) / Σ exp(logit_j/temp) in float64.
func softmax(c []candidate, temp float32) {
	if temp <= 0 {
		temp = 1
	}
	if len(c) == 0 {
		return
	}
	maxL := c[0].logit
	for _, x := range c {
		maxL = max(maxL, x.logit)
	}
	t := float64(temp)
	sum := 0.0
	for i := range c {
		e := math.Exp((float64(c[i].logit) - float64(maxL)) / t)
		c[i].p = e
		sum += e
	}
	for i := range c {
		c[i].p /= sum
	}
}
