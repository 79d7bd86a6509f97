package pipeline

import (
	"encoding/json"
	"time"

	"github.com/forge-llm/forge/actors"
)

// Progress events: every stage of the pipeline publishes them, typed, with
// byte counts and monotonic times since Open (At). They are defined in
// package actors, which publishes them; these aliases are the names users
// see.
type (
	Event           = actors.Event
	TensorRead      = actors.TensorRead
	TensorConverted = actors.TensorConverted
	TensorUploaded  = actors.TensorUploaded
	LayerReady      = actors.LayerReady
	ModelReady      = actors.ModelReady
	AllResident     = actors.AllResident
	RequestStarted  = actors.RequestStarted
	LayerRun        = actors.LayerRun
	FirstToken      = actors.FirstToken
	TokenEvent      = actors.Token
	Done            = actors.Done
	ErrorEvent      = actors.Error
	// Subscription is an ordered stream of events; read C until it closes
	// (after Close of the model) or call its Close. At most
	// MaxQueuedEvents wait for the reader; past that they are dropped and
	// counted (Dropped).
	Subscription = actors.Subscription
)

// MaxQueuedEvents bounds the events a Subscription holds for its reader.
const MaxQueuedEvents = actors.MaxQueued

// Globals is the Layer of events about the embedding, output norm and head.
const Globals = actors.Globals

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
	case ModelReady:
		m["bytes"] = e.Bytes
	case AllResident:
		m["bytes"] = e.Bytes
	case RequestStarted:
		m["req"], m["prompt_tokens"] = e.Req, e.PromptTokens
	case LayerRun:
		m["req"], m["layer"], m["waited_ms"] = e.Req, e.Layer, ms(e.Waited)
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
