package actors

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/forge-llm/forge/actors/progress"
	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
)

// ErrClosed fails what is still pending when the system closes.
var ErrClosed = errors.New("actors: pipeline closed")

// Config describes one model's load pipeline.
type Config struct {
	// File is the opened model. The system owns it from Start on and
	// closes it in Close, unless KeepFile.
	File *gguf.File
	// KeepFile leaves File open at Close: the caller closes it (an
	// Engine unmaps an evicted model's file once the next model's
	// weights are in, not while they are being read).
	KeepFile bool
	// Layers is the number of blocks the architecture runs.
	Layers   int
	Strategy Strategy
	// Converter decides what the backend consumes; nil: Conversion with
	// AllF32 for HostF32 (pass-through of every type otherwise).
	Converter Converter
	// Uploader places the weights; nil: a HostUploader on Memory.
	Uploader Uploader
	// Memory accounts the device memory the HostUploader takes; nil: a
	// private one without limit.
	Memory *Memory
	// Readers is the number of reader actors (default 4: a cold file
	// needs several reads in flight; page cache does not mind).
	Readers int
	// Converters is the size of the dequantizer pool (default GOMAXPROCS).
	Converters int
	// ChunkBytes is the read and upload unit (default 4 MiB, whole rows).
	ChunkBytes int64
	// MaxInflight bounds the chunks between reading and upload (default
	// 4 per reader): what waits for the staging ring of a GPU.
	MaxInflight int
	// InflightBytes, when positive, bounds their file bytes instead, so
	// that a load of small chunks (a mixture's experts, ~1 MB each) keeps
	// as many bytes in flight as one of whole chunks.
	InflightBytes int64
	Hooks         Hooks
	// Start is when event times count from (default: now).
	Start time.Time
	// Order, if set, returns every unit of the plan in the order to load
	// them (Prefetch, Eager, HostF32): a model split over devices
	// interleaves the devices' blocks so that every device's copies run
	// at once. nil: plan order.
	Order func(p *Plan) []*Unit
}

// DefaultChunkBytes is Config.ChunkBytes's default.
const DefaultChunkBytes = 4 << 20

// System is the running load pipeline of one model: the actor system with
// its loader (and readers), dequantizer pool, uploader and executor, the
// readiness futures and the event bus.
type System struct {
	cfg    Config
	ctx    context.Context // the load; cancelled by the caller's ctx or Close
	cancel context.CancelFunc
	as     *actor.ActorSystem
	bus    *progress.Bus
	plan   *Plan
	all    *Future

	loader, dequant, uploader, executor *actor.PID
	exec                                *executorState

	failed   atomic.Bool  // the whole load failed (failAll)
	failFrom atomic.Int32 // units from this index on are failed (fail)
	resident atomic.Int32 // units resident
	// expertsIn counts each block's resident experts.
	expertsIn []atomic.Int32
	broken    atomic.Pointer[error] // the file changed under the mapping (see usable)
	wg        sync.WaitGroup

	closeMu sync.Mutex
	closed  bool
	closing chan struct{}
	nextReq atomic.Uint64
}

// Start plans the load of cfg.File and starts the actors; loading runs in
// the background until everything is resident, something fails, ctx is
// done or Close. Start itself reads no tensor data.
func Start(ctx context.Context, cfg Config) (*System, error) {
	if cfg.File == nil {
		return nil, fmt.Errorf("actors: no file")
	}
	if cfg.Start.IsZero() {
		cfg.Start = time.Now()
	}
	if cfg.Memory == nil {
		cfg.Memory = NewMemory(0)
	}
	if cfg.Converter == nil {
		cfg.Converter = Conversion{AllF32: cfg.Strategy == HostF32}
	}
	if cfg.Uploader == nil {
		cfg.Uploader = &HostUploader{Mem: cfg.Memory, PerTensor: cfg.Strategy == HostF32}
	}
	if cfg.Readers <= 0 {
		cfg.Readers = 4
	}
	if cfg.Converters <= 0 {
		cfg.Converters = runtime.GOMAXPROCS(0)
	}
	if cfg.ChunkBytes <= 0 {
		cfg.ChunkBytes = DefaultChunkBytes
	}
	if cfg.MaxInflight <= 0 {
		cfg.MaxInflight = 4 * cfg.Readers
	}
	plan, err := NewPlan(cfg.File, cfg.Layers)
	if err != nil {
		return nil, err
	}
	if err := plan.Convert(cfg.Converter); err != nil {
		return nil, fmt.Errorf("actors: %s: %w", cfg.File.Path, err)
	}

	first := plan.Units
	if cfg.Order != nil {
		if first = cfg.Order(plan); len(first) != len(plan.Units) {
			return nil, fmt.Errorf("actors: %s: load order of %d units, the plan has %d", cfg.File.Path, len(first), len(plan.Units))
		}
	}
	s := &System{cfg: cfg, plan: plan, all: newFuture("all resident"), closing: make(chan struct{}),
		expertsIn: make([]atomic.Int32, plan.Layers())}
	s.failFrom.Store(math.MaxInt32)
	s.ctx, s.cancel = context.WithCancel(ctx)
	s.as = actor.NewActorSystem(
		actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }),
		actor.WithDeadLetterThrottleInterval(time.Millisecond),
	)
	s.bus = progress.NewBus(s.as.EventStream, cfg.Start)
	root := s.as.Root
	s.uploader = root.Spawn(s.props(func() actor.Actor { return &uploader{s: s} }))
	s.dequant = root.Spawn(s.props(func() actor.Actor { return &dequantizer{s: s} }))
	s.loader = root.Spawn(s.props(func() actor.Actor { return &loader{s: s} }))
	if cfg.Strategy == Lazy {
		first = plan.Units[:1]
	}
	// The actors know each other's PIDs from here on; only now may they
	// send to each other.
	root.Send(s.uploader, &reserve{})
	root.Send(s.loader, &loadUnits{units: first})

	// A cancelled load fails what it leaves behind.
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		select {
		case <-s.ctx.Done():
			select {
			case <-s.closing:
			default:
				s.failAll(fmt.Errorf("load cancelled: %w", context.Cause(s.ctx)))
			}
		case <-s.closing:
		}
	}()
	return s, nil
}

// Plan is the load plan.
func (s *System) Plan() *Plan { return s.plan }

// Bus is the event bus (see package progress).
func (s *System) Bus() *progress.Bus { return s.bus }

// Strategy is the load strategy.
func (s *System) Strategy() Strategy { return s.cfg.Strategy }

// Ready is the future of the globals (embedding, output norm, LM head).
func (s *System) Ready() *Future { return s.plan.Units[0].Future }

// Resident is the future of every unit.
func (s *System) Resident() *Future { return s.all }

// LayerFuture is block i's future: of its tensors but the experts (the
// attention, norms and router of a mixture's block).
func (s *System) LayerFuture(i int) *Future { return s.plan.Layer(i).Future }

// ExpertFuture is the future of expert e of block i (its rows of the
// block's stacked expert tensors), or nil where the block has no such
// expert.
func (s *System) ExpertFuture(i, e int) *Future {
	if u := s.plan.Expert(i, e); u != nil {
		return u.Future
	}
	return nil
}

// Experts is the number of experts of block i the plan loads one by one
// (0 for a dense block).
func (s *System) Experts(i int) int {
	if i < 0 || i >= s.plan.Layers() {
		return 0
	}
	return len(s.plan.Experts(i))
}

// ExpertsResident is how many of block i's experts are resident.
func (s *System) ExpertsResident(i int) int {
	if i < 0 || i >= len(s.expertsIn) {
		return 0
	}
	return int(s.expertsIn[i].Load())
}

// ExpertUses is how many tokens the router sent to expert e of block i
// so far (AddExpertUse): what a usage profile records.
func (s *System) ExpertUses(i, e int) int64 {
	if u := s.plan.Expert(i, e); u != nil {
		return u.uses.Load()
	}
	return 0
}

// AddExpertUse counts tokens routed to expert e of block i. The model's
// mixture op calls it (LayerWeights.ExpertUsed) after each step, so a
// single request's steps and the batching scheduler's count alike; an
// expert the plan does not load on its own is not counted.
func (s *System) AddExpertUse(i, e int, tokens int64) {
	if u := s.plan.Expert(i, e); u != nil {
		u.uses.Add(tokens)
	}
}

// WaitExpert blocks until expert e of block i is resident, failed, or ctx
// is done. An expert still pending is loaded first: under Lazy it is
// queued only now, under the other strategies it moves to the front of
// the loader's queue (a request waits on it; the rest of the order can
// wait). Called from a request, it publishes a progress.ExpertRun event
// the first time the request uses the expert.
func (s *System) WaitExpert(ctx context.Context, i, e int) error {
	_, err := s.waitExpert(ctx, i, e, false)
	return err
}

// ExpertFence is WaitExpert for a GPU executor (see LayerFence).
func (s *System) ExpertFence(ctx context.Context, i, e int) (Fence, error) {
	return s.waitExpert(ctx, i, e, true)
}

func (s *System) waitExpert(ctx context.Context, i, e int, enqueued bool) (Fence, error) {
	u := s.plan.Expert(i, e)
	if u == nil {
		return nil, fmt.Errorf("actors: layer %d has no expert %d loaded on its own", i, e)
	}
	start := time.Now()
	if st, _ := u.Future.State(); st == Pending && u.demanded.CompareAndSwap(false, true) {
		s.send(s.loader, &loadUnits{units: []*Unit{u}, front: true})
	}
	var fence Fence = doneFence{}
	var err error
	if enqueued {
		fence, err = u.Future.WaitEnqueued(ctx)
	} else {
		err = u.Future.Wait(ctx)
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("layer %d expert %d: %w", i, e, err)
		}
		return nil, err
	}
	if rt, ok := ctx.Value(reqKey{}).(*reqTrace); ok && rt.firstUse(i, e) {
		s.publish(progress.ExpertRun{At: s.bus.Since(), Req: rt.id, Layer: i, Expert: e, Waited: time.Since(start)})
	}
	return fence, nil
}

// DemandExperts moves the experts es of block i that are still pending to
// the front of the loader's queue in one message (a request's router chose
// them and it waits for each next), so their chunks travel together
// instead of one expert's round trip after another's. Under Lazy it is
// what queues them.
func (s *System) DemandExperts(i int, es []int) {
	var us []*Unit
	for _, e := range es {
		u := s.plan.Expert(i, e)
		if u == nil {
			continue
		}
		if st, _ := u.Future.State(); st == Pending && u.demanded.CompareAndSwap(false, true) {
			us = append(us, u)
		}
	}
	if len(us) > 0 {
		s.send(s.loader, &loadUnits{units: us, front: true})
	}
}

// Weight returns the backend's view of a tensor once its unit is resident.
func (s *System) Weight(name string) (*kernels.Weight, bool) { return s.cfg.Uploader.Weight(name) }

// Demand asks for block i to be loaded (a no-op unless it is still
// pending and not yet queued; needed only under Lazy).
func (s *System) Demand(i int) {
	if st, _ := s.plan.Layer(i).Future.State(); st == Pending {
		s.send(s.loader, &loadUnits{units: []*Unit{s.plan.Layer(i)}})
	}
}

// send delivers a message unless the system is closing (a stopped actor
// would turn it into a dead letter).
func (s *System) send(pid *actor.PID, msg any) {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if !s.closed {
		s.as.Root.Send(pid, msg)
	}
}

// WaitLayer blocks until block i is resident (loading it first under
// Lazy), failed, or ctx is done. Called from a request (see Submit), it
// publishes a progress.LayerRun event the first time the request enters
// the layer.
func (s *System) WaitLayer(ctx context.Context, i int) error {
	_, err := s.waitLayer(ctx, i, false)
	return err
}

// LayerFence is WaitLayer for a GPU executor: it returns as soon as block
// i's copies are queued, with the fence its compute stream must wait on
// (cuStreamWaitEvent on Fence.Event), so the wait happens on the device.
func (s *System) LayerFence(ctx context.Context, i int) (Fence, error) {
	return s.waitLayer(ctx, i, true)
}

func (s *System) waitLayer(ctx context.Context, i int, enqueued bool) (Fence, error) {
	if i < 0 || i >= s.plan.Layers() {
		return nil, fmt.Errorf("actors: layer %d out of range [0, %d)", i, s.plan.Layers())
	}
	f := s.plan.Layer(i).Future
	start := time.Now()
	if s.cfg.Strategy == Lazy {
		s.Demand(i)
	}
	var fence Fence = doneFence{}
	var err error
	if enqueued {
		fence, err = f.WaitEnqueued(ctx)
	} else {
		err = f.Wait(ctx)
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("layer %d: %w", i, err)
		}
		return nil, err
	}
	if rt, ok := ctx.Value(reqKey{}).(*reqTrace); ok && !rt.seen[i] {
		rt.seen[i] = true
		s.publish(progress.LayerRun{At: s.bus.Since(), Req: rt.id, Layer: i, Waited: time.Since(start)})
	}
	return fence, nil
}

func (s *System) publish(e progress.Event) { s.bus.Publish(e) }

// LoadError is the cause a unit's future fails with: it names the unit and,
// where known, the tensor.
type LoadError struct {
	Layer  int    // progress.Globals or block index
	Expert int    // the expert of an expert unit, else -1
	Tensor string // "" when not about one tensor
	Err    error
}

// loadError is the cause u fails with.
func (u *Unit) loadError(tensor string, err error) *LoadError {
	return &LoadError{Layer: u.Layer, Expert: u.Expert, Tensor: tensor, Err: err}
}

func (e *LoadError) Error() string {
	where := "layer " + strconv.Itoa(e.Layer)
	switch {
	case e.Layer == progress.Globals:
		where = "ready (embedding, output norm, LM head)"
	case e.Expert >= 0:
		where += " expert " + strconv.Itoa(e.Expert)
	}
	if e.Tensor != "" {
		return fmt.Sprintf("%s: tensor %q: %v", where, e.Tensor, e.Err)
	}
	return fmt.Sprintf("%s: %v", where, e.Err)
}

func (e *LoadError) Unwrap() error { return e.Err }

// fail fails unit u because of err (about tensor, if named), and every
// unit after it in load order (they will not be loaded after a failure:
// the model can not run past u anyway). Units before u that are in flight
// finish loading. The loader drops what it has queued from u on.
//
// An expert unit fails alone: a request whose router picks it fails with
// its cause, requests that do not need it run on, and the other experts
// keep loading.
func (s *System) fail(u *Unit, tensor string, err error) {
	cause := u.loadError(tensor, err)
	if u.IsExpert() {
		u.dead.Store(true)
		if u.Future.fail(cause) {
			slog.Debug("actors: expert load failed", "err", cause)
			s.publish(progress.Error{At: s.bus.Since(), Layer: u.Layer, Tensor: tensor, Err: cause})
		}
		s.all.fail(cause)
		s.send(s.loader, &abort{unit: u})
		return
	}
	for {
		cur := s.failFrom.Load()
		if int32(u.idx) >= cur || s.failFrom.CompareAndSwap(cur, int32(u.idx)) {
			break
		}
	}
	if u.Future.fail(cause) {
		slog.Debug("actors: load failed", "err", cause)
		s.publish(progress.Error{At: s.bus.Since(), Layer: u.Layer, Tensor: tensor, Err: cause})
	}
	for _, o := range s.plan.Units[u.idx+1:] {
		o.Future.fail(o.loadError("", fmt.Errorf("not loaded: %w", cause)))
	}
	s.all.fail(cause)
	s.send(s.loader, &abort{from: u.idx})
}

// dropped reports whether u's work is moot (it or the load failed).
func (s *System) dropped(u *Unit) bool {
	return s.failed.Load() || int32(u.idx) >= s.failFrom.Load() || u.dead.Load()
}

// failAll fails every unresolved unit with err (a failure of the whole
// load: the arena could not be made, the load was cancelled).
func (s *System) failAll(err error) {
	s.failed.Store(true)
	n := 0
	for _, u := range s.plan.Units {
		if u.Future.fail(u.loadError("", err)) {
			n++
		}
	}
	if s.all.fail(fmt.Errorf("load: %w", err)) || n > 0 {
		s.publish(progress.Error{At: s.bus.Since(), Layer: progress.NoLayer, Err: err})
	}
	s.send(s.loader, &abort{from: 0})
}

// landed resolves a unit whose copies have landed.
func (s *System) landed(u *Unit) {
	if !u.Future.resolve() {
		return
	}
	at := s.bus.Since()
	if u.Layer == progress.Globals {
		s.publish(progress.ModelReady{At: at, Bytes: u.Bytes})
	} else if u.IsExpert() {
		n := s.expertsIn[u.Layer].Add(1)
		s.publish(progress.ExpertReady{At: at, Layer: u.Layer, Expert: u.Expert, Bytes: u.Bytes,
			Resident: int(n), Of: len(s.plan.Experts(u.Layer))})
	} else {
		s.publish(progress.LayerReady{At: at, Layer: u.Layer, Bytes: u.Bytes})
	}
	if int(s.resident.Add(1)) == len(s.plan.Units) && s.all.resolve() {
		s.publish(progress.AllResident{At: s.bus.Since(), Bytes: s.plan.Bytes})
	}
}

// Close stops everything: running requests are cancelled, pending futures
// fail with ErrClosed, the actors stop, the weights are released and the
// file is closed. Subscriptions receive what was published, then close.
func (s *System) Close() error {
	s.closeMu.Lock()
	if s.closed {
		s.closeMu.Unlock()
		return nil
	}
	s.closed = true
	close(s.closing)
	s.closeMu.Unlock()

	t0 := time.Now()
	s.cancel()
	s.failAllQuiet(ErrClosed)
	if s.exec != nil {
		s.exec.stop() // running requests see their context cancelled
		s.as.Root.PoisonFuture(s.executor).Wait()
	}
	for _, pid := range []*actor.PID{s.loader, s.dequant, s.uploader} {
		s.as.Root.PoisonFuture(pid).Wait()
	}
	s.wg.Wait()
	s.bus.Close()
	s.as.Shutdown()
	tStop := time.Since(t0)
	s.cfg.Uploader.Release()
	tRel := time.Since(t0)
	var err error
	if !s.cfg.KeepFile {
		err = s.cfg.File.Close()
	}
	// Where an eviction's time goes (a swap's next load waits on parts).
	slog.Debug("actors: system closed", "actors", tStop, "uploader release", tRel-tStop, "file close", time.Since(t0)-tRel)
	return err
}

// failAllQuiet fails what is unresolved without publishing (closing).
func (s *System) failAllQuiet(err error) {
	s.failed.Store(true)
	for _, u := range s.plan.Units {
		u.Future.fail(u.loadError("", err))
	}
	s.all.fail(err)
}
