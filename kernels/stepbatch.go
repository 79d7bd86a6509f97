package kernels

// BatchStepCapturer is a Batcher that can record the ops of one batched
// decode step (n rows, one token each, every row its own sequence) once
// and replay them for every later step of n rows: one launch per step
// instead of several hundred, with no host work between the ops. The
// serving engine's steps are mostly such steps, with n the number of
// requests running.
//
// While the step function runs under CaptureBatchStep, Embed takes the
// token ids, and RoPEAt and PagedAttention the positions and block tables,
// from the step's layout in device memory, which RunBatchStep sets before
// each replay; their launch arguments carry only what every step of the
// same shape shares. The buffers, weights and pool the ops name must stay
// the same for the life of the graph.
type BatchStepCapturer interface {
	// BatchStepKey is the part of a layout's shape, beyond its row count,
	// that a recorded step is made for (on a GPU: how many splits of the
	// positions attention's grid has). A graph recorded for a layout of n
	// rows and key k replays any layout of n rows and key k.
	BatchStepKey(l *Layout) int
	// CaptureBatchStep sets the layout l (as SetLayout) with the rows'
	// token ids, runs step once (its ops queued and run as usual), then
	// records step's ops a second time into a graph without running them.
	// step must queue the same ops each time, must not call SetLayout, Read
	// or Write, and must embed exactly the ids given (len(l.Pos) of them).
	CaptureBatchStep(ids []int32, l *Layout, step func() error) (StepGraph, error)
	// RunBatchStep sets the layout l with ids and queues the recorded step
	// g, whose ops read the pool p. A graph whose buffers have moved since
	// (a scratch buffer or the layout outgrew its place) is refused with
	// ErrStaleStep: record it again.
	RunBatchStep(g StepGraph, p *KVPool, ids []int32, l *Layout) error
	// FreeStep releases a graph (after the work queued on it is done).
	FreeStep(g StepGraph)
}
