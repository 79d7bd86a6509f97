package progress

import (
	"time"

	"github.com/forge-llm/forge/gguf"
)

// Event is one progress event. Every stage publishes typed events on the
// system's event stream; At is the monotonic time since the pipeline
// started (actors.Start), so a trace orders exactly and turns into a
// timeline without clock skew.
type Event interface {
	// Kind is the event's name in JSON lines ("tensor_read", "token", …).
	Kind() string
	// When is the monotonic time since the pipeline started.
	When() time.Duration
}

// Globals is the Layer value of events about the embedding, output norm and
// LM head (the unit that makes the model ready).
const Globals = -1

// TensorRead: the loader has read a tensor's bytes from the file (every
// chunk of it).
type TensorRead struct {
	At     time.Duration
	Tensor string
	Layer  int // Globals or a block index
	Bytes  int64
}

// TensorConverted: the dequantizer pool has turned a tensor into what the
// backend consumes. From == To is a pass-through.
type TensorConverted struct {
	At       time.Duration
	Tensor   string
	Layer    int
	From, To gguf.Type
	InBytes  int64
	OutBytes int64
}

// TensorUploaded: a tensor's bytes are placed in the weight arena (on a GPU:
// its copies are queued on the copy stream).
type TensorUploaded struct {
	At     time.Duration
	Tensor string
	Layer  int
	Bytes  int64
}

// LayerReady: every tensor of block Layer is resident.
type LayerReady struct {
	At    time.Duration
	Layer int
	Bytes int64
}

// ExpertReady: expert Expert of block Layer is resident (its rows of the
// block's stacked expert tensors); Resident of the block's Of experts are
// now. A mixture's block is LayerReady once its attention, norms and
// router are; its experts come one by one.
type ExpertReady struct {
	At           time.Duration
	Layer        int
	Expert       int
	Bytes        int64
	Resident, Of int
}

// ModelReady: the embedding, output norm and LM head are resident; requests
// start from here.
type ModelReady struct {
	At    time.Duration
	Bytes int64
}

// AllResident: every weight of the model is resident.
type AllResident struct {
	At    time.Duration
	Bytes int64
}

// RequestStarted: the executor began a request.
type RequestStarted struct {
	At           time.Duration
	Req          uint64
	PromptTokens int
}

// LayerRun: request Req entered block Layer for the first time (its prompt
// pass). Waited is how long it waited for the layer's weights.
type LayerRun struct {
	At     time.Duration
	Req    uint64
	Layer  int
	Waited time.Duration
}

// ExpertRun: request Req used expert Expert of block Layer for the first
// time (its router chose it). Waited is how long it waited for the
// expert's weights. The distinct experts a prompt routed to are the
// ExpertRun events of its request before its FirstToken.
type ExpertRun struct {
	At     time.Duration
	Req    uint64
	Layer  int
	Expert int
	Waited time.Duration
}

// FirstToken: request Req produced its first token, Latency after it
// started.
type FirstToken struct {
	At      time.Duration
	Req     uint64
	Token   int32
	Latency time.Duration
}

// Token: request Req produced token number Index (0-based).
type Token struct {
	At    time.Duration
	Req   uint64
	Index int
	Token int32
}

// Done: request Req finished normally with Tokens tokens; Stop says why.
type Done struct {
	At     time.Duration
	Req    uint64
	Tokens int
	Stop   string
}

// Error: a stage failed. Req is 0 for load failures; Layer and Tensor name
// what failed where known (Layer is Globals for the embedding and head,
// NoLayer when no unit is involved).
type Error struct {
	At     time.Duration
	Req    uint64
	Layer  int
	Tensor string
	Err    error
}

// NoLayer is Error.Layer when the failure is not about a unit of weights.
const NoLayer = -2

func (e TensorRead) Kind() string      { return "tensor_read" }
func (e TensorConverted) Kind() string { return "tensor_converted" }
func (e TensorUploaded) Kind() string  { return "tensor_uploaded" }
func (e LayerReady) Kind() string      { return "layer_ready" }
func (e ExpertReady) Kind() string     { return "expert_ready" }
func (e ExpertRun) Kind() string       { return "expert_run" }
func (e ModelReady) Kind() string      { return "model_ready" }
func (e AllResident) Kind() string     { return "all_resident" }
func (e RequestStarted) Kind() string  { return "request_started" }
func (e LayerRun) Kind() string        { return "layer_run" }
func (e FirstToken) Kind() string      { return "first_token" }
func (e Token) Kind() string           { return "token" }
func (e Done) Kind() string            { return "done" }
func (e Error) Kind() string           { return "error" }

func (e TensorRead) When() time.Duration      { return e.At }
func (e TensorConverted) When() time.Duration { return e.At }
func (e TensorUploaded) When() time.Duration  { return e.At }
func (e LayerReady) When() time.Duration      { return e.At }
func (e ExpertReady) When() time.Duration     { return e.At }
func (e ExpertRun) When() time.Duration       { return e.At }
func (e ModelReady) When() time.Duration      { return e.At }
func (e AllResident) When() time.Duration     { return e.At }
func (e RequestStarted) When() time.Duration  { return e.At }
func (e LayerRun) When() time.Duration        { return e.At }
func (e FirstToken) When() time.Duration      { return e.At }
func (e Token) When() time.Duration           { return e.At }
func (e Done) When() time.Duration            { return e.At }
func (e Error) When() time.Duration           { return e.At }
