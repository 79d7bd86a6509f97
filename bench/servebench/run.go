package servebench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Target is one server to measure.
type Target struct {
	Name string `json:"name"`
	URL  string `json:"url"` // base URL, without /v1
	// Models are the ids sent as "model"; clients take them in turn
	// (client i uses Models[i%len]). Empty: no model field.
	Models []string `json:"models,omitempty"`
	// API is how requests are sent: "" or "openai" (streaming
	// /v1/completions), or "llama" for llama-server's own streaming
	// /completion, whose newer versions refuse to send OpenAI streams of
	// text their chat parser cannot match (a random-weight model's
	// output) with "does not match the expected Content-only format".
	API string `json:"api,omitempty"`
}

func (t Target) model(i int) string {
	if len(t.Models) == 0 {
		return ""
	}
	return t.Models[i%len(t.Models)]
}

// Config is one benchmark run over every target.
type Config struct {
	Targets []Target
	// Clients are the concurrency steps, in order; each step runs every
	// target in turn, the order rotated by one each step so no target
	// always goes first.
	Clients      []int
	PromptTokens int
	MaxTokens    int
	// Each client sends RequestsPerClient requests one after the other,
	// or, with Duration > 0, sends new ones until Duration has passed
	// since the step began (at least one each).
	RequestsPerClient int
	Duration          time.Duration
	// RequestTimeout bounds one request (0: none beyond ctx).
	RequestTimeout time.Duration
	// Warmup requests go to each target (and each of its models) before
	// anything is measured; they are not recorded.
	Warmup   int
	Prompter Prompter
	// Turns > 0 makes each client hold RequestsPerClient conversations of
	// Turns turns, one after the other:
	// turn 1 sends a history of HistoryTokens tokens shared by every
	// client plus TurnTokens new tokens; turn k resends turn k−1's prompt
	// and reply plus TurnTokens new tokens. After the conversations, each
	// turn's new text is sent alone as a fresh request (after one word of
	// its own, so that alone requests share no cached prefix), at the same
	// concurrency, for the comparison.
	Turns         int
	HistoryTokens int
	TurnTokens    int
	// Swap alternates one-token requests between a target's first two
	// models, RequestsPerClient rounds of a swap then a warm request.
	Swap   bool
	Client *http.Client
	Log    *slog.Logger
}

// Report is everything a run measured.
type Report struct {
	Mode        string      `json:"mode"` // "load", "turns" or "swap"
	Targets     []Target    `json:"targets"`
	Calibration Calibration `json:"calibration"`
	Requests    []Record    `json:"requests"`
	Steps       []Step      `json:"steps"`
	Turns       []TurnStat  `json:"turns,omitempty"`
	Swaps       []SwapStat  `json:"swaps,omitempty"`
}

// AllFailed lists the targets whose every measured request failed.
func (r *Report) AllFailed() []string {
	sent, failed := map[string]int{}, map[string]int{}
	for _, q := range r.Requests {
		sent[q.Target]++
		if q.Err != "" {
			failed[q.Target]++
		}
	}
	var out []string
	for _, t := range r.Targets {
		if sent[t.Name] > 0 && failed[t.Name] == sent[t.Name] {
			out = append(out, t.Name)
		}
	}
	return out
}

// Mode is the kind of run the config asks for.
func (c *Config) Mode() string {
	switch {
	case c.Swap:
		return "swap"
	case c.Turns > 0:
		return "turns"
	}
	return "load"
}

func (c *Config) check() error {
	if len(c.Targets) == 0 {
		return errors.New("servebench: no target")
	}
	if c.Swap && c.Turns > 0 {
		return errors.New("servebench: --swap and --turns are separate runs")
	}
	if c.Swap {
		for _, t := range c.Targets {
			if len(t.Models) < 2 {
				return fmt.Errorf("servebench: --swap needs two models on %s, it has %q", t.Name, t.Models)
			}
		}
	} else if len(c.Clients) == 0 {
		return errors.New("servebench: no client counts")
	}
	for _, n := range c.Clients {
		if n <= 0 {
			return fmt.Errorf("servebench: %d clients", n)
		}
	}
	if c.MaxTokens <= 0 && !c.Swap {
		return fmt.Errorf("servebench: max tokens %d", c.MaxTokens)
	}
	if c.RequestsPerClient <= 0 && c.Duration <= 0 {
		return errors.New("servebench: neither requests per client nor a duration")
	}
	return nil
}

// Run measures every target and returns the report. Failed requests are
// in the report, not errors; Run fails only on a bad config or when ctx
// ends.
func Run(ctx context.Context, c Config) (*Report, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	if c.Client == nil {
		c.Client = http.DefaultClient
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.TurnTokens <= 0 {
		c.TurnTokens = 32
	}
	rep := &Report{Mode: c.Mode(), Targets: c.Targets, Requests: []Record{}, Steps: []Step{}}
	for _, t := range c.Targets {
		for i := range c.Warmup {
			for _, m := range modelsOrNone(t.Models) {
				o := c.send(ctx, t, request{model: m, prompt: c.Prompter.Text("warmup/"+strconv.Itoa(i), c.PromptTokens), maxTokens: max(1, min(c.MaxTokens, 8))})
				if o.err != nil {
					c.Log.Warn("warm-up request failed", "target", t.Name, "model", m, "err", o.err)
				}
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if c.Swap {
		for _, t := range c.Targets {
			recs := c.swapRun(ctx, t)
			rep.Requests = append(rep.Requests, recs...)
			rep.Swaps = append(rep.Swaps, swapStat(t.Name, t.Models[:2], recs))
			if err := ctx.Err(); err != nil {
				return rep, err
			}
		}
		return rep, nil
	}
	for k, n := range c.Clients {
		for j := range c.Targets {
			t := c.Targets[(j+k)%len(c.Targets)]
			c.Log.Info("step", "target", t.Name, "clients", n)
			if c.Turns > 0 {
				recs, convWall, aloneWall := c.turnsStep(ctx, t, n)
				rep.Requests = append(rep.Requests, recs...)
				rep.Steps = append(rep.Steps, summarize(t.Name, n, "turn", recs, convWall), summarize(t.Name, n, "alone", recs, aloneWall))
				rep.Turns = append(rep.Turns, turnStats(t.Name, n, c.Turns, recs)...)
			} else {
				recs, wall := c.loadStep(ctx, t, n)
				rep.Requests = append(rep.Requests, recs...)
				rep.Steps = append(rep.Steps, summarize(t.Name, n, "load", recs, wall))
			}
			if err := ctx.Err(); err != nil {
				return rep, err
			}
		}
	}
	return rep, nil
}

func modelsOrNone(ms []string) []string {
	if len(ms) == 0 {
		return []string{""}
	}
	return ms
}

func (c *Config) send(ctx context.Context, t Target, r request) outcome {
	if c.RequestTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.RequestTimeout)
		defer cancel()
	}
	if t.API == "llama" {
		return completeLlama(ctx, c.Client, t.URL, r)
	}
	return complete(ctx, c.Client, t.URL, r)
}

// measure sends r and turns the outcome into a record.
func (c *Config) measure(ctx context.Context, t Target, r request, stepStart time.Time, rec Record) Record {
	rec.Target, rec.Model = t.Name, r.model
	rec.PromptWords = len(strings.Fields(r.prompt))
	rec.StartMs = ms(time.Since(stepStart))
	o := c.send(ctx, t, r)
	rec.Status = o.status
	rec.TTFTMs, rec.TotalMs = ms(o.ttft), ms(o.total)
	rec.Chunks = o.chunks
	rec.Tokens, rec.TokensFrom = o.chunks, "chunks"
	if o.usage != nil {
		rec.Tokens, rec.TokensFrom = o.usage.CompletionTokens, "usage"
		rec.PromptTokens = o.usage.PromptTokens
	}
	for _, g := range o.gaps {
		rec.gaps = append(rec.gaps, ms(g))
	}
	q := quantiles(rec.gaps)
	rec.ITLP50Ms, rec.ITLMaxMs = q.P50, q.Max
	rec.text = o.text
	if o.err != nil {
		rec.Err = o.err.Error()
	}
	return rec
}

// clients runs body for each of n clients at once and returns their
// records in client order and the wall time until the last finished.
func clients(n int, body func(client int, start time.Time) []Record) ([]Record, time.Duration) {
	start := time.Now()
	per := make([][]Record, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { per[i] = body(i, start) })
	}
	wg.Wait()
	wall := time.Since(start)
	var out []Record
	for _, p := range per {
		out = append(out, p...)
	}
	return out, wall
}

// more says whether a client starts request seq.
func (c *Config) more(ctx context.Context, seq int, start time.Time) bool {
	if ctx.Err() != nil {
		return false
	}
	if c.Duration > 0 {
		return seq == 0 || time.Since(start) < c.Duration
	}
	return seq < c.RequestsPerClient
}

func (c *Config) loadStep(ctx context.Context, t Target, n int) ([]Record, time.Duration) {
	return clients(n, func(client int, start time.Time) []Record {
		var recs []Record
		for seq := 0; c.more(ctx, seq, start); seq++ {
			key := fmt.Sprintf("load/%d/%d/%d", n, client, seq)
			r := request{model: t.model(client), prompt: c.Prompter.Text(key, c.PromptTokens), maxTokens: c.MaxTokens}
			recs = append(recs, c.measure(ctx, t, r, start, Record{Clients: n, Client: client, Seq: seq, Kind: "load"}))
		}
		return recs
	})
}

// turnsStep holds n conversations at once (each client RequestsPerClient
// of them, one after the other, so that one client still gives a median),
// then sends each turn's new text alone, n clients at once again; it
// returns both phases' records and wall times. A turn's new text is what
// its prompt adds to the one before: the previous reply and the turn's own
// words (for turn 1, the whole prompt, since nothing came before it). The
// reply counts because the server never saw it as prompt: on a
// random-weight model its text, tokenized again, can be several times the
// tokens generated.
func (c *Config) turnsStep(ctx context.Context, t Target, n int) ([]Record, time.Duration, time.Duration) {
	history := c.Prompter.Text("history", c.HistoryTokens)
	convs := max(c.RequestsPerClient, 1)
	newText := func(client, conv, turn int) string {
		key := fmt.Sprintf("turn/%d/%d/%d", n, client, turn)
		if conv > 0 {
			key = fmt.Sprintf("turn/%d/%d/%d/%d", n, client, conv, turn)
		}
		return c.Prompter.Text(key, c.TurnTokens)
	}
	added := make([][][]string, n) // added[client][conv][turn-1]: the text turn added
	conv, convWall := clients(n, func(client int, start time.Time) []Record {
		var recs []Record
		for cv := 0; cv < convs && ctx.Err() == nil; cv++ {
			var adds []string
			prompt, reply := history, ""
			for turn := 1; turn <= c.Turns && ctx.Err() == nil; turn++ {
				before := prompt
				prompt = join(prompt, newText(client, cv, turn))
				if turn == 1 {
					adds = append(adds, prompt)
				} else {
					adds = append(adds, strings.TrimLeft(join(reply, prompt[len(before):]), " "))
				}
				r := request{model: t.model(client), prompt: prompt, maxTokens: c.MaxTokens}
				rec := c.measure(ctx, t, r, start, Record{Clients: n, Client: client, Seq: cv*c.Turns + turn - 1, Kind: "turn", Turn: turn})
				recs = append(recs, rec)
				if rec.Err != "" {
					break // the conversation has no reply to go on with
				}
				reply = rec.text
				prompt += rec.text
			}
			added[client] = append(added[client], adds)
		}
		return recs
	})
	// One word of its own before each alone request's text, so that no
	// alone request finds another's blocks in a prefix cache: on a
	// random-weight model every reply is about the same text, and without
	// it the later alone requests computed only their last few tokens
	// (measured: 39 of 327 on forge serve), which is not "its new tokens
	// alone". Drawn here, one after the other, until unused.
	used := map[string]bool{}
	leads := make([][][]string, n)
	for client := range n {
		for cv, adds := range added[client] {
			leads[client] = append(leads[client], make([]string, len(adds)))
			for turn := range adds {
				key := fmt.Sprintf("alone/%d/%d/%d/%d", n, client, cv, turn+1)
				w := c.Prompter.Words(key, 1)
				for i := 1; used[w]; i++ {
					w = c.Prompter.Words(fmt.Sprintf("%s/%d", key, i), 1)
				}
				used[w] = true
				leads[client][cv][turn] = w
			}
		}
	}
	alone, aloneWall := clients(n, func(client int, start time.Time) []Record {
		var recs []Record
		for cv, adds := range added[client] {
			for turn := 1; turn <= len(adds) && ctx.Err() == nil; turn++ {
				r := request{model: t.model(client), prompt: join(leads[client][cv][turn-1], adds[turn-1]), maxTokens: c.MaxTokens}
				recs = append(recs, c.measure(ctx, t, r, start, Record{Clients: n, Client: client, Seq: cv*c.Turns + turn - 1, Kind: "alone", Turn: turn}))
			}
		}
		return recs
	})
	return append(conv, alone...), convWall, aloneWall
}

// join puts a space between a and b unless a is empty or already ends in
// white space.
func join(a, b string) string {
	if a == "" || strings.HasSuffix(a, " ") || strings.HasSuffix(a, "\n") {
		return a + b
	}
	return a + " " + b
}

// swapRun alternates between the target's first two models: round r
// sends to model r%2 twice, the first a swap (but in round 0), the second
// warm. One token each, so the first token is the whole answer.
func (c *Config) swapRun(ctx context.Context, t Target) []Record {
	rounds := c.RequestsPerClient
	if rounds <= 0 {
		rounds = 4
	}
	start := time.Now()
	var recs []Record
	for r := 0; r < rounds && ctx.Err() == nil; r++ {
		m := t.Models[r%2]
		for i, kind := range []string{"swap", "warm"} {
			if r == 0 && i == 0 {
				kind = "first"
			}
			req := request{model: m, prompt: c.Prompter.Text(fmt.Sprintf("swap/%d/%d", r, i), c.PromptTokens), maxTokens: 1}
			recs = append(recs, c.measure(ctx, t, req, start, Record{Clients: 1, Seq: 2*r + i, Kind: kind}))
		}
	}
	return recs
}
