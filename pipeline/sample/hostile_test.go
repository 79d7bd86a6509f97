package sample

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// TestMinPAboveOne is issue 17's first crash: min_p 2 asks for tokens more
// likely than twice the most likely one, which emptied the candidate list
// and made softmax index it. Validate rejects it; a Sampler made from it
// anyway clamps it to 1 and keeps the most likely token.
func TestMinPAboveOne(t *testing.T) {
	p := Params{Temp: 0.8, MinP: 2}
	var fe *FieldError
	if err := p.Validate(); !errors.As(err, &fe) || fe.Field != "min_p" {
		t.Fatalf("Validate(min_p 2) = %v, want a FieldError for min_p", err)
	}
	s := New(p, 4)
	for range 100 {
		if id := mustSample(t, s, []float32{1, 3, 2, 0}); id != 1 {
			t.Fatalf("min_p clamped to 1 picked %d, want 1 (the only token as likely as the most likely)", id)
		}
	}
}

// TestValidateRejects: every field out of range, NaN or infinite is a
// FieldError naming the field.
func TestValidateRejects(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	for _, c := range []struct {
		field string
		p     Params
	}{
		{"temperature", Params{Temp: -1}},
		{"temperature", Params{Temp: nan}},
		{"temperature", Params{Temp: inf}},
		{"top_k", Params{TopK: -1}},
		{"top_k", Params{TopK: maxTopK + 1}},
		{"top_p", Params{TopP: 7}},
		{"top_p", Params{TopP: nan}},
		{"min_p", Params{MinP: 1.01}},
		{"min_p", Params{MinP: -0.5}},
		{"repeat_penalty", Params{RepeatPenalty: -1}},
		{"repeat_penalty", Params{RepeatPenalty: inf}},
		{"repeat_last_n", Params{RepeatLastN: -2}},
	} {
		var fe *FieldError
		if err := c.p.Validate(); !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("%+v: Validate = %v, want a FieldError for %s", c.p, err, c.field)
		}
	}
	if err := Defaults().Validate(); err != nil {
		t.Errorf("Defaults: %v", err)
	}
}

// TestNonFiniteLogits: a NaN or infinite logit anywhere in the row is an
// error wrapping ErrNonFinite for every sampling method, never a panic or
// a token.
func TestNonFiniteLogits(t *testing.T) {
	for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))} {
		for _, p := range []Params{{}, Defaults(), {Temp: 1, TopP: 0.5}, {Temp: 1, MinP: 0.5}, {Temp: 1, RepeatPenalty: 1.3}} {
			for _, at := range []int{0, 3, 7} {
				l := []float32{1, 2, 3, 4, 5, 6, 7, 8}
				l[at] = bad
				s := New(p, len(l))
				s.Accept(int32(at))
				if _, err := s.Sample(l); !errors.Is(err, ErrNonFinite) {
					t.Errorf("%+v, logit %d = %v: err %v, want ErrNonFinite", p, at, bad, err)
				}
			}
		}
	}
	if _, err := New(Defaults(), 0).Sample([]float32{1}); !errors.Is(err, ErrNoLogits) {
		t.Errorf("vocabulary 0: %v, want ErrNoLogits", err)
	}
	if _, err := New(Defaults(), 5).Sample(nil); !errors.Is(err, ErrNoLogits) {
		t.Errorf("no logits: %v, want ErrNoLogits", err)
	}
}

// hostileFloat draws the values that broke samplers: NaN, ±Inf, zero,
// negatives, denormals, huge and ordinary numbers.
func hostileFloat(r *rand.Rand) float32 {
	switch r.IntN(10) {
	case 0:
		return float32(math.NaN())
	case 1:
		return float32(math.Inf(1 - 2*r.IntN(2)))
	case 2:
		return 0
	case 3:
		return -r.Float32() * 10
	case 4:
		return math.SmallestNonzeroFloat32
	case 5:
		return math.MaxFloat32
	case 6:
		return 1 + r.Float32()*1e-6
	default:
		return r.Float32() * 3
	}
}

func hostileInt(r *rand.Rand) int {
	switch r.IntN(5) {
	case 0:
		return -r.IntN(1 << 30)
	case 1:
		return 1 << (20 + r.IntN(11))
	case 2:
		return 1
	default:
		return r.IntN(50)
	}
}

// checkSample runs a Sampler on a row and fails the test on a panic, a
// token outside the row, or a finite row that gives an error.
func checkSample(t *testing.T, p Params, logits []float32, accepted []int32) {
	t.Helper()
	defer func() {
		if v := recover(); v != nil {
			t.Fatalf("panic %v with %+v on %v", v, p, logits)
		}
	}()
	s := New(p, len(logits))
	for _, id := range accepted {
		s.Accept(id)
	}
	finite := len(logits) > 0
	for _, l := range logits {
		finite = finite && !math.IsNaN(float64(l)) && !math.IsInf(float64(l), 0)
	}
	for range 3 {
		id, err := s.Sample(logits)
		switch {
		case err != nil && finite:
			t.Fatalf("%+v on finite %v: %v", p, logits, err)
		case err == nil && !finite:
			t.Fatalf("%+v on %v: token %d, want an error", p, logits, id)
		case err == nil && (id < 0 || int(id) >= len(logits)):
			t.Fatalf("%+v on %v: token %d outside the row", p, logits, id)
		}
	}
}

// TestHostileParamsNeverPanic is a property test over random Params (any
// float, including NaN and ±Inf, any int) and random rows with and without
// non-finite logits: Sample never panics, returns a token of the row for a
// finite row and an error otherwise.
func TestHostileParamsNeverPanic(t *testing.T) {
	r := rand.New(rand.NewPCG(17, 1))
	for range 3000 {
		p := Params{Temp: hostileFloat(r), TopK: hostileInt(r), TopP: hostileFloat(r), MinP: hostileFloat(r),
			RepeatPenalty: hostileFloat(r), RepeatLastN: hostileInt(r) % (1 << 22), Seed: r.Uint64()}
		n := 1 + r.IntN(40)
		logits := make([]float32, n)
		for i := range logits {
			if r.IntN(4) == 0 {
				logits[i] = hostileFloat(r)
			} else {
				logits[i] = float32(r.NormFloat64() * 5)
			}
		}
		accepted := []int32{int32(r.IntN(n)), int32(r.IntN(n)), -1, int32(n + 3)}
		checkSample(t, p, logits, accepted)
	}
}

// FuzzSample feeds arbitrary parameters and a three-logit row to a
// Sampler; `go test -fuzz FuzzSample` explores further than the seeds.
func FuzzSample(f *testing.F) {
	f.Add(float32(0.8), 40, float32(0.95), float32(2), float32(1), 64, float32(1), float32(2), float32(3))
	f.Add(float32(math.NaN()), -1, float32(7), float32(-1), float32(0), -5, float32(math.NaN()), float32(2), float32(3))
	f.Add(float32(1e-40), 1<<30, float32(0.5), float32(1), float32(1e-38), 1, float32(math.MaxFloat32), float32(-math.MaxFloat32), float32(0))
	f.Fuzz(func(t *testing.T, temp float32, topK int, topP, minP, pen float32, lastN int, a, b, c float32) {
		p := Params{Temp: temp, TopK: topK, TopP: topP, MinP: minP, RepeatPenalty: pen, RepeatLastN: lastN % (1 << 22)}
		checkSample(t, p, []float32{a, b, c}, []int32{0, 2})
	})
}
