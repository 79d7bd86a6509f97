// Package servebench measures OpenAI-compatible servers under concurrency:
// clients send streaming /v1/completions with byte-identical prompts to
// every target (forge serve, llama-server, vLLM), and each request's time
// to first token, gaps between streamed chunks and generated tokens
// become per-step figures (tokens/s, TTFT and inter-token percentiles,
// errors). It also runs multi-turn conversations that resend their
// history (--turns) and model swaps under a memory budget (--swap).
// `forge bench serve` is built on it.
package servebench

import (
	"math"
	"slices"
	"time"
)

// Record is one request as measured. Times are milliseconds.
type Record struct {
	Target  string `json:"target"`
	Model   string `json:"model,omitempty"`
	Clients int    `json:"clients"` // concurrent clients in the step
	Client  int    `json:"client"`
	Seq     int    `json:"seq"` // the client's request number, from 0
	// Kind is "load" (a plain request), "turn" (a conversation turn),
	// "alone" (a turn's new text as a fresh request), "first", "swap" or
	// "warm" (--swap: the first request, one to the other model, one to the
	// same model again).
	Kind string `json:"kind"`
	Turn int    `json:"turn,omitempty"` // from 1, for "turn" and "alone"
	// StartMs is when the request was sent, from the start of its step.
	StartMs float64 `json:"start_ms"`
	TTFTMs  float64 `json:"ttft_ms"` // first chunk with text; 0 if none came
	TotalMs float64 `json:"total_ms"`
	// PromptWords is the prompt's length in words (what the benchmark
	// controls); PromptTokens the server's count from its usage (0: none).
	PromptWords  int `json:"prompt_words"`
	PromptTokens int `json:"prompt_tokens,omitempty"`
	// Tokens generated: the usage's completion_tokens when the server sent
	// usage (TokensFrom "usage"), else the chunks with text ("chunks").
	Tokens     int     `json:"tokens"`
	TokensFrom string  `json:"tokens_from"`
	Chunks     int     `json:"chunks"`
	ITLP50Ms   float64 `json:"itl_p50_ms"`
	ITLMaxMs   float64 `json:"itl_max_ms"`
	Status     int     `json:"status,omitempty"`
	Err        string  `json:"error,omitempty"`

	gaps []float64 // ms between text chunks, pooled into the step's ITL
	text string    // the reply, for the next turn
}

// Quantiles of a metric in milliseconds over a step.
type Quantiles struct {
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
	N   int     `json:"n"`
}

// quantiles uses the nearest rank: p99 of fewer than 100 values is a
// value that was measured, not an interpolation.
func quantiles(xs []float64) Quantiles {
	if len(xs) == 0 {
		return Quantiles{} // N 0: nothing measured (JSON has no NaN)
	}
	v := slices.Clone(xs)
	slices.Sort(v)
	rank := func(q float64) float64 {
		i := int(math.Ceil(q*float64(len(v)))) - 1
		return v[min(max(i, 0), len(v)-1)]
	}
	return Quantiles{P50: rank(0.5), P99: rank(0.99), Max: v[len(v)-1], N: len(v)}
}

// Step is one target at one client count (and, in a --turns run, one kind
// of request): Requests counts every request sent, Errors those that
// failed; tokens/s is the generated tokens of every request over the
// step's wall time.
type Step struct {
	Target     string    `json:"target"`
	Clients    int       `json:"clients"`
	Kind       string    `json:"kind"`
	Requests   int       `json:"requests"`
	Errors     int       `json:"errors"`
	FirstError string    `json:"first_error,omitempty"`
	Tokens     int       `json:"tokens"`
	WallMs     float64   `json:"wall_ms"`
	TokensPerS float64   `json:"tokens_per_s"`
	TTFT       Quantiles `json:"ttft_ms"`
	ITL        Quantiles `json:"itl_ms"`
	// PromptTokens is the mean of the servers' prompt counts (0: no usage).
	PromptTokens float64 `json:"prompt_tokens_mean,omitempty"`
}

func summarize(target string, clients int, kind string, recs []Record, wall time.Duration) Step {
	s := Step{Target: target, Clients: clients, Kind: kind, WallMs: ms(wall)}
	var ttft, itl []float64
	var prompt, withPrompt int
	for _, r := range recs {
		if r.Kind != kind {
			continue
		}
		s.Requests++
		s.Tokens += r.Tokens
		if r.Err != "" {
			s.Errors++
			if s.FirstError == "" {
				s.FirstError = r.Err
			}
		}
		if r.Chunks > 0 {
			ttft = append(ttft, r.TTFTMs)
		}
		itl = append(itl, r.gaps...)
		if r.PromptTokens > 0 {
			prompt += r.PromptTokens
			withPrompt++
		}
	}
	if wall > 0 {
		s.TokensPerS = float64(s.Tokens) / wall.Seconds()
	}
	s.TTFT, s.ITL = quantiles(ttft), quantiles(itl)
	if withPrompt > 0 {
		s.PromptTokens = float64(prompt) / float64(withPrompt)
	}
	return s
}

// TurnStat compares, for one turn of the conversations at one client
// count, the first token of the turn (the whole history resent) with the
// first token of the same new text sent alone. The bar: the turn
// at most 1.2 × the new text alone (Ratio of the medians).
type TurnStat struct {
	Target    string    `json:"target"`
	Clients   int       `json:"clients"`
	Turn      int       `json:"turn"`
	TTFT      Quantiles `json:"ttft_ms"`
	AloneTTFT Quantiles `json:"alone_ttft_ms"`
	Ratio     float64   `json:"ratio,omitempty"` // 0: a side has no measurement
	WithinBar bool      `json:"within_1_2x"`
	// PromptTokens is the mean prompt the server counted for the turn.
	PromptTokens float64 `json:"prompt_tokens_mean,omitempty"`
}

// Bar is the limit on a turn's first token relative to its new
// text alone.
const Bar = 1.2

func turnStats(target string, clients, turns int, recs []Record) []TurnStat {
	var out []TurnStat
	for k := 1; k <= turns; k++ {
		var a, b []float64
		var prompt, n int
		for _, r := range recs {
			if r.Turn != k || r.Err != "" || r.Chunks == 0 {
				continue
			}
			switch r.Kind {
			case "turn":
				a = append(a, r.TTFTMs)
				if r.PromptTokens > 0 {
					prompt += r.PromptTokens
					n++
				}
			case "alone":
				b = append(b, r.TTFTMs)
			}
		}
		ts := TurnStat{Target: target, Clients: clients, Turn: k, TTFT: quantiles(a), AloneTTFT: quantiles(b)}
		if ts.TTFT.N > 0 && ts.AloneTTFT.N > 0 && ts.AloneTTFT.P50 > 0 {
			ts.Ratio = ts.TTFT.P50 / ts.AloneTTFT.P50
			ts.WithinBar = ts.Ratio <= Bar
		}
		if n > 0 {
			ts.PromptTokens = float64(prompt) / float64(n)
		}
		out = append(out, ts)
	}
	return out
}

// SwapStat is a --swap run on one target: the first token of requests
// that switch models (the other model must be loaded back within the
// budget) and, for reference, of the request right after on the same
// model.
type SwapStat struct {
	Target     string    `json:"target"`
	Models     []string  `json:"models"`
	Swaps      Quantiles `json:"swap_ttft_ms"`
	Warm       Quantiles `json:"warm_ttft_ms"`
	Requests   int       `json:"requests"`
	Errors     int       `json:"errors"`
	FirstError string    `json:"first_error,omitempty"`
}

func swapStat(target string, models []string, recs []Record) SwapStat {
	s := SwapStat{Target: target, Models: models}
	var sw, warm []float64
	for _, r := range recs {
		s.Requests++
		if r.Err != "" {
			s.Errors++
			if s.FirstError == "" {
				s.FirstError = r.Err
			}
			continue
		}
		if r.Chunks == 0 {
			continue
		}
		switch r.Kind {
		case "swap":
			sw = append(sw, r.TTFTMs)
		case "warm":
			warm = append(warm, r.TTFTMs)
		}
	}
	s.Swaps, s.Warm = quantiles(sw), quantiles(warm)
	return s
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
