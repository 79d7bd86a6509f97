package sample

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

func randLogits(r *rand.Rand, n int) []float32 {
	l := make([]float32, n)
	for i := range l {
		l[i] = float32(r.NormFloat64() * 3)
	}
	return l
}

// mustSample is s.Sample for logits that are known to be finite.
func mustSample(t *testing.T, s *Sampler, logits []float32) int32 {
	t.Helper()
	id, err := s.Sample(logits)
	if err != nil {
		t.Fatalf("Sample: %v", err)
	}
	return id
}

func TestGreedyTiesToLowestID(t *testing.T) {
	s := New(Params{}, 6)
	if got := mustSample(t, s, []float32{1, 5, 2, 5, -1, 5}); got != 1 {
		t.Fatalf("greedy = %d, want 1 (lowest of the tied maxima 1, 3, 5)", got)
	}
	r := rand.New(rand.NewPCG(1, 2))
	s = New(Params{}, 50)
	for range 100 {
		l := randLogits(r, 50)
		best := 0
		for i := range l {
			if l[i] > l[best] {
				best = i
			}
		}
		if got := mustSample(t, s, l); got != int32(best) {
			t.Fatalf("greedy = %d, want %d", got, best)
		}
	}
}

func TestRepeatPenalty(t *testing.T) {
	// Token 0 leads, but it was just seen: penalty 2 halves its positive
	// logit (4 → 2), below token 1 (3). A negative logit gets more negative.
	s := New(Params{RepeatPenalty: 2}, 3)
	s.Accept(0)
	s.Accept(0) // repeated tokens are penalised once
	if got := mustSample(t, s, []float32{4, 3, 0}); got != 1 {
		t.Fatalf("with penalty = %d, want 1", got)
	}
	s = New(Params{RepeatPenalty: 2}, 3)
	s.Accept(2)
	if got := mustSample(t, s, []float32{-1, -1.5, -0.9}); got != 0 {
		t.Fatalf("negative logit penalised: got %d, want 0 (-0.9·2 = -1.8 is now last)", got)
	}
	// Outside the window the penalty no longer applies.
	s = New(Params{RepeatPenalty: 2, RepeatLastN: 2}, 3)
	s.Accept(0)
	s.Accept(1)
	s.Accept(1)
	if got := mustSample(t, s, []float32{4, 3, 0}); got != 0 {
		t.Fatalf("token 0 left the window: got %d, want 0", got)
	}
	// The logits the caller passed are left unchanged.
	l := []float32{4, 3, 0}
	s = New(Params{RepeatPenalty: 2}, 3)
	s.Accept(0)
	mustSample(t, s, l)
	if l[0] != 4 {
		t.Fatalf("Sample modified the caller's logits: %v", l)
	}
}

func TestSeedDeterminism(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	rows := make([][]float32, 200)
	for i := range rows {
		rows[i] = randLogits(r, 300)
	}
	run := func(seed uint64) []int32 {
		s := New(Params{Temp: 1.2, TopK: 50, TopP: 0.9, MinP: 0.01, RepeatPenalty: 1.1, Seed: seed}, 300)
		out := make([]int32, len(rows))
		for i, l := range rows {
			out[i] = mustSample(t, s, l)
			s.Accept(out[i])
		}
		return out
	}
	a, b, c := run(42), run(42), run(43)
	same := 0
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("step %d: seed 42 gave %d then %d", i, a[i], b[i])
		}
		if a[i] == c[i] {
			same++
		}
	}
	if same == len(a) {
		t.Fatal("seeds 42 and 43 gave identical sequences of 200 draws")
	}
}

func TestTopKOneIsGreedy(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	s := New(Params{Temp: 5, TopK: 1, Seed: 9}, 100)
	g := New(Params{}, 100)
	for range 50 {
		l := randLogits(r, 100)
		if a, b := mustSample(t, s, l), mustSample(t, g, l); a != b {
			t.Fatalf("top-k 1 = %d, greedy = %d", a, b)
		}
	}
}

// TestDistribution draws many samples with no filter and compares the
// frequencies with softmax(logits/T). The seed is fixed, so the test is
// deterministic; the bound is 5 standard errors.
func TestDistribution(t *testing.T) {
	logits := []float32{2, 1, 0.5, 0, -1, -3}
	const temp, draws = 0.7, 40000
	s := New(Params{Temp: temp, Seed: 1}, len(logits))
	count := make([]int, len(logits))
	for range draws {
		count[mustSample(t, s, logits)]++
	}
	want := make([]float64, len(logits))
	sum := 0.0
	for i, l := range logits {
		want[i] = math.Exp(float64(l) / temp)
		sum += want[i]
	}
	for i := range want {
		p := want[i] / sum
		got := float64(count[i]) / draws
		se := math.Sqrt(p * (1 - p) / draws)
		if math.Abs(got-p) > 5*se+1e-9 {
			t.Errorf("token %d: frequency %.4f, want %.4f ± %.4f", i, got, p, 5*se)
		}
	}
}

func TestFiltersNeverPickExcludedTokens(t *testing.T) {
	// probabilities at T=1 ∝ e^logit: 0.64, 0.24, 0.09, 0.03, …
	logits := []float32{3, 2, 1, 0, -2, -4}
	check := func(name string, p Params, allowed map[int32]bool) {
		t.Helper()
		s := New(p, len(logits))
		seen := map[int32]bool{}
		for range 5000 {
			id := mustSample(t, s, logits)
			if !allowed[id] {
				t.Fatalf("%s: sampled excluded token %d", name, id)
			}
			seen[id] = true
		}
		if len(seen) != len(allowed) {
			t.Fatalf("%s: sampled %v, want every one of %v", name, seen, allowed)
		}
	}
	check("top-k 3", Params{Temp: 1, TopK: 3, Seed: 1}, map[int32]bool{0: true, 1: true, 2: true})
	// cumulative: 0.636, 0.870, 0.956 → top-p 0.9 keeps three tokens.
	check("top-p 0.9", Params{Temp: 1, TopP: 0.9, Seed: 2}, map[int32]bool{0: true, 1: true, 2: true})
	check("top-p 0.5", Params{Temp: 1, TopP: 0.5, Seed: 2}, map[int32]bool{0: true})
	// min-p 0.1 keeps p ≥ 0.1·p_max: e^(l-3) ≥ 0.1 ⇔ l ≥ 0.70.
	check("min-p 0.1", Params{Temp: 1, MinP: 0.1, Seed: 3}, map[int32]bool{0: true, 1: true, 2: true})
	check("all", Params{Temp: 2, TopK: 0, Seed: 4}, map[int32]bool{0: true, 1: true, 2: true, 3: true, 4: true, 5: true})
}

func TestTopKSelectsLargest(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for range 50 {
		l := randLogits(r, 500)
		c := make([]candidate, len(l))
		for i := range l {
			c[i] = candidate{id: int32(i), logit: l[i]}
		}
		got := topK(c, 17)
		// The 17th largest value bounds every kept one, and the rest are ≤ it.
		kept := map[int32]bool{}
		for i, x := range got {
			kept[x.id] = true
			if i > 0 && byLogitDesc(got[i-1], x) > 0 {
				t.Fatalf("top-k not sorted at %d", i)
			}
		}
		last := got[len(got)-1].logit
		for i, v := range l {
			if !kept[int32(i)] && v > last {
				t.Fatalf("token %d (%.3f) left out but beats kept %.3f", i, v, last)
			}
		}
	}
}

func TestSampleDoesNotAllocate(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	l := randLogits(r, 32000)
	for _, p := range []Params{{}, Defaults(), {Temp: 1, TopP: 0.9, RepeatPenalty: 1.1}} {
		s := New(p, len(l))
		s.Accept(5)
		if a := testing.AllocsPerRun(20, func() {
			id, _ := s.Sample(l)
			s.Accept(id)
		}); a != 0 {
			t.Errorf("%+v: %.1f allocations per token, want 0", p, a)
		}
	}
}

// TestOpenAIPenalties: presence and frequency penalties lower the logits
// of generated tokens by presence + frequency × count, and leave the
// prompt's tokens alone.
func TestOpenAIPenalties(t *testing.T) {
	// Greedy over [5, 4.5, 4, 0]: token 0 wins until penalised.
	logits := []float32{5, 4.5, 4, 0}
	s := New(Params{PresencePenalty: 0.5, FrequencyPenalty: 0.25}, 4)
	s.Accept(1) // the prompt: not counted
	s.Accept(1)
	if id := mustSample(t, s, logits); id != 0 {
		t.Fatalf("first pick %d, want 0 (no generated token yet)", id)
	}
	s.Accept(0) // token 0: 5 - (0.5 + 0.25) = 4.25 < 4.5
	if id := mustSample(t, s, logits); id != 1 {
		t.Fatalf("second pick %d, want 1 (token 0 penalised to 4.25; the prompt's 1s are not)", id)
	}
	s.Accept(1) // token 1: 4.5 - 0.75 = 3.75; token 0 at 4.25 wins again
	if id := mustSample(t, s, logits); id != 0 {
		t.Fatalf("third pick %d, want 0", id)
	}
	s.Accept(0) // token 0 twice: 5 - (0.5 + 0.5) = 4.0, equal to token 2; the lower id wins ties
	if id := mustSample(t, s, logits); id != 0 {
		t.Fatalf("fourth pick %d, want 0 (tie at 4.0 goes to the lower id)", id)
	}
	s.Accept(0) // three times: 5 - 1.25 = 3.75 < 4 (token 2)
	if id := mustSample(t, s, logits); id != 2 {
		t.Fatalf("fifth pick %d, want 2", id)
	}
	// A negative penalty favours what was generated.
	s = New(Params{FrequencyPenalty: -2}, 4)
	mustSample(t, s, logits)
	s.Accept(3)
	if id := mustSample(t, s, logits); id != 0 {
		t.Fatalf("one -2 leaves token 3 at 2: pick %d, want 0", id)
	}
	s.Accept(3)
	s.Accept(3)
	if id := mustSample(t, s, logits); id != 3 {
		t.Fatalf("three times -2 lifts token 3 to 6: pick %d, want 3", id)
	}
	s.Reset()
	s.Accept(0) // a prompt again
	if id := mustSample(t, s, logits); id != 0 {
		t.Fatalf("after Reset: pick %d, want 0", id)
	}
	if !(Params{PresencePenalty: 0.1}).FullRow() || !(Params{FrequencyPenalty: -0.1}).FullRow() || (Params{RepeatPenalty: 1}).FullRow() {
		t.Error("FullRow disagrees with the penalties")
	}
}

// TestOpenAIPenaltyRanges: Validate takes [-2, 2] and names the field;
// New clamps what it is given.
func TestOpenAIPenaltyRanges(t *testing.T) {
	nan := float32(math.NaN())
	for _, c := range []struct {
		field string
		p     Params
	}{
		{"presence_penalty", Params{PresencePenalty: 2.01}},
		{"presence_penalty", Params{PresencePenalty: nan}},
		{"frequency_penalty", Params{FrequencyPenalty: -2.5}},
		{"frequency_penalty", Params{FrequencyPenalty: float32(math.Inf(-1))}},
	} {
		var fe *FieldError
		if err := c.p.Validate(); !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("%+v: Validate = %v, want a FieldError for %s", c.p, err, c.field)
		}
	}
	if err := (Params{PresencePenalty: -2, FrequencyPenalty: 2}).Validate(); err != nil {
		t.Errorf("the bounds: %v", err)
	}
	if p := New(Params{PresencePenalty: 9, FrequencyPenalty: nan}, 4).Params(); p.PresencePenalty != 2 || p.FrequencyPenalty != 0 {
		t.Errorf("clamped to %v, %v; want 2, 0", p.PresencePenalty, p.FrequencyPenalty)
	}
}

// TestLogprobs: OnLogprob gets the log-softmax of the raw row at the
// pick and at the most likely tokens, most likely first, whatever the
// penalties and temperature do to the pick; a greedy pick is the top one.
func TestLogprobs(t *testing.T) {
	row := []float32{0, float32(math.Log(2)), float32(math.Log(5)), float32(math.Log(0.5))} // probabilities 1, 2, 5, 0.5 over 8.5
	var got []Logprob
	s := New(Params{OnLogprob: func(lp Logprob) { got = append(got, lp) }, TopLogprobs: 2}, 4)
	if id := mustSample(t, s, row); id != 2 {
		t.Fatalf("greedy pick %d, want 2", id)
	}
	near := func(a float32, b float64) bool { return math.Abs(float64(a)-b) < 1e-5 }
	if len(got) != 1 || got[0].ID != 2 || !near(got[0].Logprob, math.Log(5/8.5)) {
		t.Fatalf("logprob %+v, want token 2 at ln(5/8.5)", got)
	}
	if top := got[0].Top; len(top) != 2 || top[0].ID != 2 || top[1].ID != 1 || !near(top[1].Logprob, math.Log(2/8.5)) {
		t.Fatalf("top %+v, want 2 then 1 at ln(2/8.5)", top)
	}
	// A sampled pick reports its own log-probability; no alternatives
	// when none are asked for.
	got = nil
	s = New(Params{Temp: 1, Seed: 5, OnLogprob: func(lp Logprob) { got = append(got, lp) }}, 4)
	probs := []float64{1 / 8.5, 2 / 8.5, 5 / 8.5, 0.5 / 8.5}
	for range 50 {
		id := mustSample(t, s, row)
		lp := got[len(got)-1]
		if lp.ID != id || !near(lp.Logprob, math.Log(probs[id])) || lp.Top != nil {
			t.Fatalf("pick %d: %+v, want ln(%v) and no top", id, lp, probs[id])
		}
	}
	if !(Params{OnLogprob: func(Logprob) {}}).FullRow() {
		t.Error("FullRow is false with OnLogprob: a greedy pick would skip it")
	}
	var fe *FieldError
	if err := (Params{TopLogprobs: 21}).Validate(); !errors.As(err, &fe) || fe.Field != "top_logprobs" {
		t.Errorf("top_logprobs 21: %v", err)
	}
}
