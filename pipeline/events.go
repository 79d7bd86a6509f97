package pipeline

import (
	"encoding/json"
	"time"

	"github.com/forge-llm/forge/actors/progress"
)

// Progress events: every stage of the pipeline publishes them, typed, with
// byte counts and monotonic times since Open (At). They are defined in
// package actors/progress, a leaf that both the actors (which publish
// them) and this package import; these are the names users see, the same
// types, so a type switch on pipeline.TensorRead matches what the actors
// sent.
type (
	Event           = progress.Event
	TensorRead      = progress.TensorRead
	TensorConverted = progress.TensorConverted
	TensorUploaded  = progress.TensorUploaded
	LayerReady      = progress.LayerReady
	ExpertReady     = progress.ExpertReady
	ModelReady      = progress.ModelReady
	AllResident     = progress.AllResident
	RequestStarted  = progress.RequestStarted
	LayerRun        = progress.LayerRun
	ExpertRun       = progress.ExpertRun
	FirstToken      = progress.FirstToken
	TokenEvent      = progress.Token
	Done            = progress.Done
	ErrorEvent      = progress.Error
	// Subscription is an ordered stream of events; read C until it closes
	// (after Close of the model) or call its Close. At most
	// MaxQueuedEvents wait for the reader; past that they are dropped and
	// counted (Dropped).
	Subscription = progress.Subscription
)

// MaxQueuedEvents bounds the events a Subscription holds for its reader.
const MaxQueuedEvents = progress.MaxQueued

// Globals is the Layer of events about the embedding, output norm and head.
const Globals = progress.Globals

// EventJSON encodes an event as one JSON object for agents and logs:
// {"event": kind, "at_ms": …, fields…}; durations are in milliseconds and
// errors are strings.
func EventJSON(e Event) ([]byte, error) {
	m := map[string]any{"event": e.Kind(), "at_ms": ms(e.When())}
	switch e := e.(type) {
	case TensorRead:
		m["tensor"], m["layer"], m["bytes"] = e.Tensor, e.Layer, e.Bytes
	case TensorConverted:
		m["tensor"], m["layer"], m["from"], m["to"], m["in_bytes"], m["out_bytes"] = e.Tensor, e.Layer, e.From.String(), e.To.String(), e.InBytes, e.OutBytes
	case TensorUploaded:
		m["tensor"], m["layer"], m["bytes"] = e.Tensor, e.Layer, e.Bytes
	case LayerReady:
		m["layer"], m["bytes"] = e.Layer, e.Bytes
	case ExpertReady:
		m["layer"], m["expert"], m["bytes"], m["resident"], m["of"] = e.Layer, e.Expert, e.Bytes, e.Resident, e.Of
	case ModelReady:
		m["bytes"] = e.Bytes
	case AllResident:
		m["bytes"] = e.Bytes
	case RequestStarted:
		m["req"], m["prompt_tokens"] = e.Req, e.PromptTokens
	case LayerRun:
		m["req"], m["layer"], m["waited_ms"] = e.Req, e.Layer, ms(e.Waited)
	case ExpertRun:
		m["req"], m["layer"], m["expert"], m["waited_ms"] = e.Req, e.Layer, e.Expert, ms(e.Waited)
	case FirstToken:
		m["req"], m["token"], m["latency_ms"] = e.Req, e.Token, ms(e.Latency)
	case TokenEvent:
		m["req"], m["index"], m["token"] = e.Req, e.Index, e.Token
	case Done:
		m["req"], m["tokens"], m["stop"] = e.Req, e.Tokens, e.Stop
	case ErrorEvent:
		m["req"], m["layer"], m["tensor"], m["error"] = e.Req, e.Layer, e.Tensor, e.Err.Error()
	}
	return json.Marshal(m)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
