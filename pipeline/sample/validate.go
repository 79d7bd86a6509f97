package sample

import (
	"fmt"
	"math"
)

// FieldError is a request field whose value is out of range. Field is the
// name a user wrote it under (the HTTP API's JSON name, such as "min_p"),
// so the CLI and the server can both say which value was wrong.
type FieldError struct {
	Field  string
	Value  any
	Reason string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("%s = %v: %s", e.Field, e.Value, e.Reason)
}

// The largest values Validate accepts (and New clamps to).
const (
	maxTemp          = 100
	maxTopK          = 1 << 20
	maxRepeatPenalty = 10
	maxRepeatLastN   = 1 << 20
	maxOpenAIPenalty = 2  // presence and frequency penalties: [-2, 2]
	maxTopLogprobs   = 20 // OpenAI's top_logprobs bound
)

// finite32 reports whether v is neither NaN nor infinite.
func finite32(v float32) bool {
	return !math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0)
}

// Validate checks every parameter's range, as llama.cpp's server and
// OpenAI's API accept them, and returns a *FieldError for the first one
// out of range. A Sampler made from valid Params never panics.
func (p Params) Validate() error {
	switch {
	case !finite32(p.Temp) || p.Temp < 0 || p.Temp > maxTemp:
		return &FieldError{"temperature", p.Temp, "must be a number in [0, 100]"}
	case p.TopK < 0 || p.TopK > maxTopK:
		return &FieldError{"top_k", p.TopK, "must be in [0, 1048576] (0: off)"}
	case !finite32(p.TopP) || p.TopP < 0 || p.TopP > 1:
		return &FieldError{"top_p", p.TopP, "must be a number in [0, 1]"}
	case !finite32(p.MinP) || p.MinP < 0 || p.MinP > 1:
		return &FieldError{"min_p", p.MinP, "must be a number in [0, 1]"}
	case !finite32(p.RepeatPenalty) || p.RepeatPenalty < 0 || p.RepeatPenalty > maxRepeatPenalty:
		return &FieldError{"repeat_penalty", p.RepeatPenalty, "must be a number in [0, 10] (0 or 1: off)"}
	case p.RepeatLastN < 0 || p.RepeatLastN > maxRepeatLastN:
		return &FieldError{"repeat_last_n", p.RepeatLastN, "must be in [0, 1048576]"}
	case !finite32(p.PresencePenalty) || p.PresencePenalty < -maxOpenAIPenalty || p.PresencePenalty > maxOpenAIPenalty:
		return &FieldError{"presence_penalty", p.PresencePenalty, "must be a number in [-2, 2]"}
	case !finite32(p.FrequencyPenalty) || p.FrequencyPenalty < -maxOpenAIPenalty || p.FrequencyPenalty > maxOpenAIPenalty:
		return &FieldError{"frequency_penalty", p.FrequencyPenalty, "must be a number in [-2, 2]"}
	case p.TopLogprobs < 0 || p.TopLogprobs > maxTopLogprobs:
		return &FieldError{"top_logprobs", p.TopLogprobs, "must be in [0, 20]"}
	}
	return nil
}
