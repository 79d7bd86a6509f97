package rocm

import (
	"fmt"
	"unsafe"

	"github.com/ebitengine/purego"
)

// Stream is a CUstream / hipStream_t. The zero Stream is the legacy default
// stream, which synchronises with every other blocking stream: use your own.
type Stream uintptr

// Event is a CUevent / hipEvent_t.
type Event uintptr

// Graph is a captured and instantiated sequence of stream work, replayed with
// one launch (the decode step's hundreds of kernels cost one launch).
type Graph struct {
	graph uintptr // CUgraph
	exec  uintptr // CUgraphExec
	nodes int     // nodes the capture recorded
}

// Nodes is how many nodes (kernels, copies, sets) the capture recorded. A
// runtime that runs the work during capture instead of recording it (some
// HIP implementations do) leaves fewer nodes than the work queued: the
// caller compares and falls back to running the work op by op.
func (g *Graph) Nodes() int { return g.nodes }

// NewStream creates a non-blocking stream (it does not synchronise with the
// legacy default stream).
func (c *Ctx) NewStream() (Stream, error) {
	var s uintptr
	const nonBlocking = 1 // CU_STREAM_NON_BLOCKING == hipStreamNonBlocking
	if err := c.call(c.name("cuStreamCreate", "hipStreamCreateWithFlags"), c.streamCreate, uintptr(unsafe.Pointer(&s)), nonBlocking); err != nil {
		return 0, err
	}
	live.streams.Add(1)
	return Stream(s), nil
}

// DestroyStream destroys s once its queued work is done.
func (c *Ctx) DestroyStream(s Stream) error {
	if s == 0 {
		return nil
	}
	if err := c.call(c.name("cuStreamDestroy_v2", "hipStreamDestroy"), c.streamDestroy, uintptr(s)); err != nil {
		return err
	}
	live.streams.Add(-1)
	return nil
}

// SyncStream waits until everything queued on s is done.
func (c *Ctx) SyncStream(s Stream) error {
	return c.call(c.name("cuStreamSynchronize", "hipStreamSynchronize"), c.streamSync, uintptr(s))
}

// WaitEvent makes s wait, on the device, until e has completed: later work on
// s starts after the work e was recorded behind. The host does not block.
func (c *Ctx) WaitEvent(s Stream, e Event) error {
	r, _, _ := purego.SyscallN(c.streamWaitEvent, uintptr(s), uintptr(e), 0)
	return c.check("cuStreamWaitEvent", "hipStreamWaitEvent", r)
}

// NewEvent creates an event; timing events can be used with Elapsed, others
// are cheaper to record and wait on.
func (c *Ctx) NewEvent(timing bool) (Event, error) {
	var e uintptr
	flags := uintptr(0)
	if !timing {
		flags = 2 // CU_EVENT_DISABLE_TIMING == hipEventDisableTiming
	}
	if err := c.call(c.name("cuEventCreate", "hipEventCreateWithFlags"), c.eventCreate, uintptr(unsafe.Pointer(&e)), flags); err != nil {
		return 0, err
	}
	live.events.Add(1)
	return Event(e), nil
}

// DestroyEvent destroys e.
func (c *Ctx) DestroyEvent(e Event) error {
	if e == 0 {
		return nil
	}
	if err := c.call(c.name("cuEventDestroy_v2", "hipEventDestroy"), c.eventDestroy, uintptr(e)); err != nil {
		return err
	}
	live.events.Add(-1)
	return nil
}

// Record records e on s: e completes when all work queued on s before it has.
func (c *Ctx) Record(e Event, s Stream) error {
	r, _, _ := purego.SyscallN(c.eventRecord, uintptr(e), uintptr(s))
	return c.check("cuEventRecord", "hipEventRecord", r)
}

// Query reports whether e has completed, without blocking.
func (c *Ctx) Query(e Event) (bool, error) {
	r, _, _ := purego.SyscallN(c.eventQuery, uintptr(e))
	switch int32(r) {
	case resSuccess:
		return true, nil
	case resNotReady:
		return false, nil
	}
	return false, c.err(c.name("cuEventQuery", "hipEventQuery"), int32(r))
}

// SyncEvent blocks the worker until e has completed.
func (c *Ctx) SyncEvent(e Event) error {
	return c.call(c.name("cuEventSynchronize", "hipEventSynchronize"), c.eventSync, uintptr(e))
}

// Elapsed returns the milliseconds between two completed timing events.
func (c *Ctx) Elapsed(start, end Event) (float32, error) {
	var ms float32
	err := c.call(c.name("cuEventElapsedTime", "hipEventElapsedTime"), c.eventElapsed, uintptr(unsafe.Pointer(&ms)), uintptr(start), uintptr(end))
	return ms, err
}

// BeginCapture starts recording the work queued on s into a graph instead of
// running it. Capture is thread-local: other threads' driver calls are not
// disturbed (and every call of this worker is on its own thread).
func (c *Ctx) BeginCapture(s Stream) error { return c.BeginCaptureMode(s, CaptureThreadLocal) }

// CaptureMode says which driver calls a thread may make while a stream
// capture is under way (CUstreamCaptureMode / hipStreamCaptureMode).
type CaptureMode int

const (
	// CaptureThreadLocal refuses potentially unsafe calls (allocations,
	// synchronous copies) on the capturing thread only.
	CaptureThreadLocal CaptureMode = 1
	// CaptureRelaxed refuses none: for a worker thread that other users
	// (an uploader on the same worker) may call between the captured ops.
	// A call that really cannot be captured (a wait on the capturing
	// stream) still fails the capture.
	CaptureRelaxed CaptureMode = 2
)

// BeginCaptureMode is BeginCapture with the given mode.
func (c *Ctx) BeginCaptureMode(s Stream, m CaptureMode) error {
	return c.call(c.name("cuStreamBeginCapture_v2", "hipStreamBeginCapture"), c.beginCapture, uintptr(s), uintptr(m))
}

// EndCapture ends the capture on s and instantiates the graph.
func (c *Ctx) EndCapture(s Stream) (*Graph, error) {
	var g, x uintptr
	if err := c.call(c.name("cuStreamEndCapture", "hipStreamEndCapture"), c.endCapture, uintptr(s), uintptr(unsafe.Pointer(&g))); err != nil {
		return nil, err
	}
	live.graphs.Add(1)
	var n uintptr // with a NULL node array, the call reports the count only
	if err := c.call(c.name("cuGraphGetNodes", "hipGraphGetNodes"), c.graphGetNodes, g, 0, uintptr(unsafe.Pointer(&n))); err != nil {
		_ = c.call("GraphDestroy", c.graphDestroy, g)
		live.graphs.Add(-1)
		return nil, fmt.Errorf("rocm: counting the captured graph's nodes: %w", err)
	}
	if err := c.call(c.name("cuGraphInstantiateWithFlags", "hipGraphInstantiateWithFlags"), c.graphInstantiate, uintptr(unsafe.Pointer(&x)), g, 0); err != nil {
		_ = c.call("GraphDestroy", c.graphDestroy, g)
		live.graphs.Add(-1)
		return nil, fmt.Errorf("rocm: instantiating captured graph: %w", err)
	}
	return &Graph{graph: g, exec: x, nodes: int(n)}, nil
}

// LaunchGraph replays the graph on s.
func (c *Ctx) LaunchGraph(g *Graph, s Stream) error {
	r, _, _ := purego.SyscallN(c.graphLaunch, g.exec, uintptr(s))
	return c.check("cuGraphLaunch", "hipGraphLaunch", r)
}

// DestroyGraph releases the graph and its executable form.
func (c *Ctx) DestroyGraph(g *Graph) error {
	if g == nil || g.graph == 0 {
		return nil
	}
	err1 := c.call(c.name("cuGraphExecDestroy", "hipGraphExecDestroy"), c.graphExecDestroy, g.exec)
	err2 := c.call(c.name("cuGraphDestroy", "hipGraphDestroy"), c.graphDestroy, g.graph)
	g.graph, g.exec = 0, 0
	live.graphs.Add(-1)
	if err1 != nil {
		return err1
	}
	return err2
}
