package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/forge-llm/forge/actors"
	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/pipeline/model"
	"github.com/forge-llm/forge/pipeline/store"
)

// DefaultKeepAlive is how long an idle model stays loaded unless told
// otherwise (Ollama's default).
const DefaultKeepAlive = 5 * time.Minute

// ErrEngineClosed is returned by an Engine after Close.
var ErrEngineClosed = errors.New("pipeline: engine closed")

// ErrBudget is wrapped when a model cannot be loaded within the memory
// budget, even after evicting every idle model.
var ErrBudget = errors.New("pipeline: memory budget exceeded")

// ErrUnknownModel is wrapped when a model id is neither registered nor
// resolvable to a file.
var ErrUnknownModel = errors.New("pipeline: unknown model")

// ErrInvalidModel is wrapped when a model's file resolves but is not a
// GGUF model the engine can read (its header or metadata fail).
var ErrInvalidModel = errors.New("pipeline: not a usable model file")

// DefaultMaxNames is how many names the engine remembers, besides the
// models added with Add, once their models are not loaded.
const DefaultMaxNames = 64

// EngineOptions configure an Engine.
type EngineOptions struct {
	// Open is how each model is opened. Its Memory is ignored: every
	// model gets an accountant of its own, which the engine sums against
	// Budget.
	Open Options
	// KeepAlive is how long a model stays loaded after its last request
	// ends: nil means DefaultKeepAlive, 0 unloads it as soon as it is
	// idle, negative keeps it until Close.
	KeepAlive *time.Duration
	// Budget caps the bytes all loaded models hold (weights, KV cache,
	// scratch, as their accountants count them; on the CPU backend the
	// mapped weights count too). Loading a model that does not fit evicts
	// idle models, least recently used first. ≤ 0: no budget. With a
	// split device ("gpu:0,1") it is each device's: a split model counts
	// what it holds on its fullest device.
	Budget int64
	// Resolve turns a model name into a file path; nil: an existing file,
	// else Ollama's store, else the Hugging Face cache (store.Default).
	Resolve func(name string) (string, error)
	// SingleSequence runs each model's requests one at a time (the
	// single-sequence path) instead of batching them (Open.Batching,
	// turned on by the engine otherwise).
	SingleSequence bool
	// Logger receives load, unload and eviction logs; nil: slog.Default().
	Logger *slog.Logger
	// MaxNames bounds the names (and spellings of names) requests
	// registered that have no loaded model: past it, the least recently
	// used are forgotten. Models added with Add are always kept. ≤ 0:
	// DefaultMaxNames.
	MaxNames int
	// ToolConstraint constrains the answers of requests with tools and
	// no Constrain of their own: the hook where constrained decoding holds
	// the model to its tool-call format and the arguments to the function's
	// schema (nil: answers are parsed as the model writes them).
	ToolConstraint ConstraintFactory
	// PinFiles is how many bytes of served model files a GPU engine may
	// keep mapped and registered with the driver (page-locked host memory)
	// between a model's loads: a model evicted to make room keeps its
	// file, and its next load copies straight from the file's pages at
	// the link's rate instead of through the staging ring. A file is
	// pinned in the background once its model is all resident, if it fits
	// beside those pinned already; it is let go when its model is
	// unloaded (Unload, keep-alive, a failure) and at Close, not when it
	// is evicted. ≤ 0: no file is kept.
	PinFiles int64
}

// ModelState is where a model is in its life.
type ModelState string

// The model states.
const (
	StateUnloaded ModelState = "unloaded" // never loaded, or unloaded after its keep-alive
	StateLoading  ModelState = "loading"  // opened; embedding and head not yet resident
	StateReady    ModelState = "ready"    // serving requests while layers still stream in
	StateResident ModelState = "resident" // every weight resident
	StateEvicted  ModelState = "evicted"  // unloaded to make room for another model
	StateFailed   ModelState = "failed"   // the last load failed, or its file changed while loaded (Err says why); the next request retries
)

// ModelStatus is a snapshot of one model.
type ModelStatus struct {
	ID    string     `json:"id"`
	Path  string     `json:"path,omitempty"`
	State ModelState `json:"state"`
	// LoadedBytes of WeightBytes have reached the device.
	LoadedBytes int64 `json:"loaded_bytes"`
	WeightBytes int64 `json:"weight_bytes"`
	// MemoryBytes is what the model's accountant holds now.
	MemoryBytes int64 `json:"memory_bytes"`
	// Active counts requests running or queued on the model.
	Active    int           `json:"active"`
	KeepAlive time.Duration `json:"keep_alive_ns"`
	LastUsed  time.Time     `json:"last_used,omitzero"`
	// ExpiresAt is when an idle model unloads (zero: not scheduled).
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	Err       string    `json:"error,omitempty"`
}

// Engine keeps several models for a long-running program: each is loaded
// through Open on first use, serves any number of concurrent requests
// (queued fairly, in arrival order, by its executor), stays loaded for its
// keep-alive after the last one, and is evicted, least recently used
// first, when another model needs room within the budget. All methods are
// safe for concurrent use.
type Engine struct {
	o       EngineOptions
	log     *slog.Logger
	resolve func(string) (string, error)

	// ctx is cancelled by Close: every request and load derives from it.
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	models map[string]*entry
	// aliases are other names of a registered model's file (another
	// spelling of its path, a symlink, a store name of the same blob):
	// one file is one model, loaded once, whatever it is called.
	aliases map[string]*alias
	closed  bool
	// freed is closed (and replaced) whenever a model becomes idle or
	// unloads: loads waiting for room in the budget try again.
	freed chan struct{}
	wg    sync.WaitGroup // unloads and progress watchers in flight
	// closing counts evicted models still closing beside the load they
	// made room for (Engine.open); tests wait on it before reading the
	// device's counters.
	closing sync.WaitGroup
	// gpu is the GPU every model shares (opened by the first GPU model,
	// closed by Close): a swap costs the model's own memory and copies,
	// not a context, kernel modules, cuBLAS and a pinned ring.
	gpu *sharedGPU
	// subs are the subscriptions taken with Engine.Subscribe, closed by
	// Close (engine_subscribe.go).
	subs map[*Subscription]struct{}
	// pinnedBytes is what the entries' pins hold (PinFiles); pinWG counts
	// pins not yet unregistered, which Close waits for before the GPU
	// closes.
	pinnedBytes int64
	pinWG       sync.WaitGroup
	// newPin pins a file in place of the GPU's registration (tests).
	newPin func(data []byte, onFree func()) (*actors.PinnedFile, error)
}

// alias is another name of an entry's file.
type alias struct {
	ent      *entry
	lastUsed time.Time
}

// entry is one model id: its settings, and its loaded instance if any.
type entry struct {
	id        string
	name      string      // what Resolve gets
	added     bool        // by Add: never forgotten
	file      os.FileInfo // the resolved file, for identity (os.SameFile); nil until planned
	keepAlive time.Duration
	state     ModelState
	err       error
	lastUsed  time.Time
	inst      *instance
	pin       *filePin // the file kept pinned between loads (PinFiles)
}

// instance is one load of a model, from Open to Close.
type instance struct {
	path     string
	m        *Model
	opened   chan struct{} // closed when Open returned; then m or err is set
	err      error
	estimate int64 // bytes expected before the load measured them
	weights  int64 // sum of the file's tensor bytes

	active    int         // requests holding it (e.mu)
	timer     *time.Timer // keep-alive timer while idle (e.mu)
	expiresAt time.Time   // (e.mu)

	progMu   sync.Mutex
	loaded   int64
	resident bool
	ready    bool
}

// NewEngine returns an engine with no model loaded.
func NewEngine(o EngineOptions) *Engine {
	e := &Engine{o: o, log: o.Logger, resolve: o.Resolve, models: map[string]*entry{}, aliases: map[string]*alias{}, freed: make(chan struct{})}
	if e.log == nil {
		e.log = slog.Default()
	}
	if e.resolve == nil {
		e.resolve = store.Default().Resolve
	}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	e.gpu = newSharedGPU(o.Open)
	return e
}

func (e *Engine) defaultKeepAlive() time.Duration {
	if e.o.KeepAlive == nil {
		return DefaultKeepAlive
	}
	return *e.o.KeepAlive
}

// Add registers a model under id; name is a file path or a store name
// (see package store). Requests may also name a model that was never
// added: it is registered on first use under its name.
func (e *Engine) Add(id, name string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return ErrEngineClosed
	}
	if old, ok := e.models[id]; ok {
		if old.name != name {
			return fmt.Errorf("pipeline: model id %q is already %q", id, old.name)
		}
		return nil
	}
	e.models[id] = &entry{id: id, name: name, added: true, keepAlive: e.defaultKeepAlive(), state: StateUnloaded}
	return nil
}

// lookupLocked finds the entry of an id or of one of its aliases (e.mu
// held).
func (e *Engine) lookupLocked(id string) (*entry, bool) {
	if ent, ok := e.models[id]; ok {
		return ent, true
	}
	if a, ok := e.aliases[id]; ok {
		a.lastUsed = time.Now()
		return a.ent, true
	}
	return nil, false
}

// sameFileLocked finds the entry whose file is file (e.mu held).
func (e *Engine) sameFileLocked(file os.FileInfo) *entry {
	for _, ent := range e.models {
		if ent.file != nil && os.SameFile(ent.file, file) {
			return ent
		}
	}
	return nil
}

// maxNames is the bound on forgettable names.
func (e *Engine) maxNames() int {
	if e.o.MaxNames > 0 {
		return e.o.MaxNames
	}
	return DefaultMaxNames
}

// pruneLocked forgets the least recently used names past the bound:
// entries registered by requests whose model is not loaded, and aliases
// (e.mu held), leaving room for that many more. An entry forgotten takes
// its aliases with it.
func (e *Engine) pruneLocked(room int) {
	var idle []*entry
	for _, ent := range e.models {
		if !ent.added && ent.inst == nil {
			idle = append(idle, ent)
		}
	}
	if extra := len(idle) - e.maxNames() + room; extra > 0 {
		slices.SortFunc(idle, func(a, b *entry) int { return a.lastUsed.Compare(b.lastUsed) })
		for _, ent := range idle[:extra] {
			e.forgetLocked(ent)
		}
	}
	if extra := len(e.aliases) - e.maxNames() + room; extra > 0 {
		type named struct {
			name string
			at   time.Time
		}
		var all []named
		for n, a := range e.aliases {
			all = append(all, named{n, a.lastUsed})
		}
		slices.SortFunc(all, func(a, b named) int { return a.at.Compare(b.at) })
		for _, n := range all[:extra] {
			delete(e.aliases, n.name)
		}
	}
}

// forgetLocked drops an entry that has no instance, and its aliases.
func (e *Engine) forgetLocked(ent *entry) {
	e.unpinLocked(ent)
	delete(e.models, ent.id)
	for n, a := range e.aliases {
		if a.ent == ent {
			delete(e.aliases, n)
		}
	}
}

// SetKeepAlive sets one model's keep-alive (0: unload when idle,
// negative: forever); it applies from the model's next idle moment.
func (e *Engine) SetKeepAlive(id string, d time.Duration) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	ent, ok := e.lookupLocked(id)
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownModel, id)
	}
	ent.keepAlive = d
	return nil
}

// Lease is a hold on a loaded model: while held, the model is neither
// evicted nor unloaded. Release it exactly once.
type Lease struct {
	e    *Engine
	ent  *entry
	inst *instance
	once sync.Once
}

// Model is the leased model.
func (l *Lease) Model() *Model { return l.inst.m }

// WaitDevice waits until the leased model's backend is up (on a GPU, its
// context and kernels are made in the background after Open) and returns
// the error that failed it, if any: a server checks at start that the
// device it was told to use works.
func (l *Lease) WaitDevice(ctx context.Context) error {
	_, err := l.inst.m.backend(ctx)
	return err
}

// Release gives the model back; an idle model starts its keep-alive.
func (l *Lease) Release() { l.once.Do(func() { l.e.release(l.ent, l.inst) }) }

// Acquire loads the model id (registering it under its own name if it was
// never added) and holds it. It returns once the model is opened (its
// weights may still be streaming in); requests on it wait for what they
// need.
func (e *Engine) Acquire(ctx context.Context, id string) (*Lease, error) {
	// Resolving a name and reading a file's metadata for its estimate
	// happen outside the lock (a large vocabulary takes a while to
	// parse); the lock is then taken again and the entry looked at anew.
	var p *loadPlan
	for {
		e.mu.Lock()
		if e.closed {
			e.mu.Unlock()
			return nil, ErrEngineClosed
		}
		ent, ok := e.lookupLocked(id)
		if ok && (ent.inst != nil || p != nil && p.name == ent.name) {
			return e.acquireLocked(ctx, ent, p)
		}
		if !ok && p != nil && p.name == id {
			// An unregistered id is a name; it is registered only once
			// it resolves, so that bad names do not pile up, and as an
			// alias when its file is a registered model's. Old names are
			// forgotten first, so that the entry acquired stays.
			e.pruneLocked(1)
			if same := e.sameFileLocked(p.file); same != nil {
				e.aliases[id] = &alias{ent: same, lastUsed: time.Now()}
				return e.acquireLocked(ctx, same, p)
			}
			ent = &entry{id: id, name: id, keepAlive: e.defaultKeepAlive(), state: StateUnloaded, file: p.file, lastUsed: time.Now()}
			e.models[id] = ent
			return e.acquireLocked(ctx, ent, p)
		}
		e.mu.Unlock()
		name := id
		if ok {
			name = ent.name
		}
		var err error
		if p, err = e.plan(id, name); err != nil {
			if ok {
				e.planFailed(ent, err)
			}
			return nil, err
		}
	}
}

// planFailed records that a registered model cannot be resolved or read:
// a model added with Add shows it as failed; a name a request registered
// is forgotten (its file is gone).
func (e *Engine) planFailed(ent *entry, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if ent.inst != nil {
		return
	}
	if ent.added {
		ent.state, ent.err = StateFailed, err
		return
	}
	if e.models[ent.id] == ent {
		e.forgetLocked(ent)
	}
}

// loadPlan is what loading a model needs to know beforehand.
type loadPlan struct {
	name, path        string
	file              os.FileInfo
	estimate, weights int64
}

func (e *Engine) plan(id, name string) (*loadPlan, error) {
	path, err := e.resolve(name)
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %w", ErrUnknownModel, id, err)
	}
	file, err := os.Stat(path)
	if err == nil && !file.Mode().IsRegular() {
		err = fmt.Errorf("%s: not a regular file", file.Name())
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %w", ErrUnknownModel, id, err)
	}
	o := e.openOptions()
	o.shared = e.gpu // "auto" is sized as what the shared device found (planBackend)
	est, weights, err := estimate(path, o)
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %w", ErrInvalidModel, id, err)
	}
	return &loadPlan{name: name, path: path, file: file, estimate: est, weights: weights}, nil
}

// acquireLocked holds ent's instance, starting a load from p if it has
// none. Called with e.mu held; it unlocks.
func (e *Engine) acquireLocked(ctx context.Context, ent *entry, p *loadPlan) (*Lease, error) {
	id := ent.id
	inst := ent.inst
	var victims []*instance
	if inst == nil {
		path, est, weights := p.path, p.estimate, p.weights
		var err error
		victims, err = e.makeRoom(ent, est)
		if errors.Is(err, errBusy) {
			// Busy models hold the budget: wait until one is idle.
			freed := e.freed
			e.mu.Unlock()
			e.closeAll(victims)
			select {
			case <-freed:
				return e.Acquire(ctx, id)
			case <-ctx.Done():
				return nil, fmt.Errorf("%w (waited for busy models until the request ended: %w)", err, ctx.Err())
			case <-e.ctx.Done():
				return nil, ErrEngineClosed
			}
		}
		if err != nil {
			e.mu.Unlock()
			e.closeAll(victims)
			return nil, err
		}
		inst = &instance{path: path, opened: make(chan struct{}), estimate: est, weights: weights}
		ent.inst, ent.state, ent.err = inst, StateLoading, nil
		if ent.file == nil {
			ent.file = p.file
		}
		e.wg.Add(1)
		// The load closes its victims first: their device memory and
		// staging ring are free when it starts.
		go e.open(ent, inst, victims)
		victims = nil
	}
	inst.active++
	ent.lastUsed = time.Now()
	if inst.timer != nil {
		inst.timer.Stop()
		inst.timer, inst.expiresAt = nil, time.Time{}
	}
	e.mu.Unlock()
	e.closeAll(victims)

	l := &Lease{e: e, ent: ent, inst: inst}
	select {
	case <-inst.opened:
	case <-ctx.Done():
		l.Release()
		return nil, ctx.Err()
	}
	if inst.err != nil {
		l.Release()
		return nil, inst.err
	}
	return l, nil
}

// estimate is what a model should take before its load measures it: the
// file's tensor bytes plus the KV cache and scratch, as Open will size
// them.
func estimate(path string, o Options) (total, weights int64, err error) {
	f, err := gguf.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	for i := range f.Tensors {
		weights += int64(f.Tensors[i].Size)
	}
	cfg, err := model.ConfigFromFile(f)
	if err != nil {
		return 0, 0, err
	}
	ctx := ctxPositions(cfg, o)
	// The scratch the model allocates: activations for a batch of prompt
	// tokens and one row of logits (see model.allocScratch).
	batch := o.Batch
	if batch <= 0 {
		batch = model.DefaultBatch
	}
	batch = min(batch, ctx)
	rows, logitRows := int64(batch), int64(1)
	// The KV cache as the backend the model will open stores it (it
	// reports its sizes, kernels.KVSizer: a GPU's f16 is half the CPU's
	// F32), and the pool and the batched model's scratch instead where
	// the model will batch there (canBatch's rule). The estimate stays the
	// floor of what the model is charged, so a size too large would be
	// held for good (see planBackend).
	be := planBackend(o)
	kv := be.kv.KVCacheBytes(cfg.Layers, ctx, cfg.KVDim())
	if o.Batching.On && be.batches(o.Batching, cfg) {
		seqs, blocks, bs := o.Batching.poolShape(ctx)
		kv = be.kv.KVPoolBytes(cfg.Layers, blocks, bs, cfg.KVDim())
		rows, logitRows = int64(batch+seqs), int64(seqs)
	}
	scratch := 4 * model.ScratchFloats(cfg, int(rows), int(logitRows))
	return perDevice(weights+kv+scratch, o), weights, nil
}

// ctxPositions is the KV cache size Open gives a model of cfg under o
// (model.Options.Ctx's rule).
func ctxPositions(cfg model.Config, o Options) int {
	ctx := o.Ctx
	if ctx <= 0 {
		ctx = cfg.Ctx
		if ctx <= 0 || ctx > model.DefaultMaxCtx {
			ctx = model.DefaultMaxCtx
		}
	}
	return ctx
}

// bytes is what an instance counts against the budget: the larger of the
// estimate and what its accountant holds.
func (inst *instance) bytes() int64 {
	n := inst.estimate
	select {
	case <-inst.opened:
		if inst.m != nil {
			n = max(n, inst.m.deviceInUse())
		}
	default:
	}
	return n
}

// errBusy says the budget is held by models in use, which will free it.
var errBusy = errors.New("busy")

// signalFreed wakes loads waiting for room (e.mu held).
func (e *Engine) signalFreed() {
	close(e.freed)
	e.freed = make(chan struct{})
}

// makeRoom detaches idle models, least recently used first, until need
// more bytes fit the budget. Called with e.mu held; the caller closes the
// victims after unlocking.
func (e *Engine) makeRoom(want *entry, need int64) ([]*instance, error) {
	if e.o.Budget <= 0 {
		return nil, nil
	}
	if need > e.o.Budget {
		return nil, fmt.Errorf("%w: model %q needs about %d bytes, the budget is %d", ErrBudget, want.id, need, e.o.Budget)
	}
	var used int64
	var idle []*entry
	for _, ent := range e.models {
		if ent.inst == nil || ent == want {
			continue
		}
		used += ent.inst.bytes()
		if ent.inst.active == 0 {
			idle = append(idle, ent)
		}
	}
	slices.SortFunc(idle, func(a, b *entry) int { return a.lastUsed.Compare(b.lastUsed) })
	var victims []*instance
	for _, ent := range idle {
		if used+need <= e.o.Budget {
			break
		}
		used -= ent.inst.bytes()
		victims = append(victims, e.detach(ent, StateEvicted))
		e.log.Info("evicting model", "model", ent.id, "for", want.id, "budget", e.o.Budget)
	}
	if used+need > e.o.Budget {
		return victims, fmt.Errorf("%w: model %q needs about %d bytes; %d of the %d-byte budget are held by busy models: %w", ErrBudget, want.id, need, used, e.o.Budget, errBusy)
	}
	return victims, nil
}

// detach takes an entry's instance off it (e.mu held); the caller closes it.
func (e *Engine) detach(ent *entry, state ModelState) *instance {
	inst := ent.inst
	ent.inst, ent.state = nil, state
	if state != StateEvicted {
		e.unpinLocked(ent) // an eviction keeps the file for the next load
	}
	if inst.timer != nil {
		inst.timer.Stop()
		inst.timer = nil
	}
	return inst
}

// closeAll closes detached instances (without e.mu).
func (e *Engine) closeAll(insts []*instance) {
	for _, inst := range insts {
		<-inst.opened
		if inst.m != nil {
			if err := inst.m.Close(); err != nil {
				e.log.Warn("closing model", "path", inst.path, "err", err)
			}
		}
	}
}

// open closes the instances evicted for it, opens an instance and follows
// its load for the status.
//
// Where every victim's weights went through the pipeline's own uploader
// (a GPU model of this engine), the victims close beside the load: the
// new model opens its file, forks the backend and plans its load at once,
// and only its device reservation (the arena, the staging ring) waits for
// the victims' uploaders to have freed theirs; the rest of their teardown
// (the backend fork, its thread) overlaps the new model's copies instead
// of preceding them, and their files are unmapped once the new model's
// weights are all in (unmapping 4.9 GB took 45-70 ms, and slowed the new
// model's reading of its own mapping by as much when the two overlapped).
// Otherwise the victims close first, as their memory may be what the new
// model needs.
func (e *Engine) open(ent *entry, inst *instance, victims []*instance) {
	defer e.wg.Done()
	var gate []<-chan struct{}
	overlap := len(victims) > 0
	for _, v := range victims {
		<-v.opened
		if v.m == nil {
			continue
		}
		if v.m.released == nil {
			overlap = false
			break
		}
		gate = append(gate, v.m.released)
	}
	// resident is closed once the new model's weights are all in (or its
	// load is over): the victims unmap their files then.
	resident := make(chan struct{})
	var residentOnce sync.Once
	markResident := func() { residentOnce.Do(func() { close(resident) }) }
	// A victim's KV pool goes to this model if its shape fits.
	var kv *kvHandoff
	for _, v := range victims {
		if v.m != nil {
			if kv == nil {
				kv = &kvHandoff{free: e.gpu.freeKVPool}
			}
			v.m.kvTo.Store(kv)
		}
	}
	if overlap {
		for _, v := range victims {
			if v.m != nil {
				v.m.fileGate = resident
			}
		}
		// One goroutine a victim: each one's Close waits for resident,
		// which needs every victim's uploader released first.
		var closed sync.WaitGroup
		for _, v := range victims {
			closed.Add(1)
			e.closing.Add(1)
			go func() {
				defer e.closing.Done()
				defer closed.Done()
				e.closeAll([]*instance{v})
			}()
		}
		defer closed.Wait()
	}
	defer markResident() // first of the deferred calls: before waiting for the victims
	if !overlap {
		e.closeAll(victims)
		gate = nil
	}
	o := e.openOptions()
	o.Memory = NewMemory(0)
	o.shared = e.gpu
	o.afterRelease = gate
	o.kvFrom = kv
	e.mu.Lock()
	o.file, o.pinned = e.pinnedFileLocked(ent, inst.path)
	e.mu.Unlock()
	m, err := Open(e.ctx, inst.path, o)
	if err != nil {
		err = fmt.Errorf("pipeline: loading %q: %w", ent.id, err)
	}
	inst.m, inst.err = m, err
	if err != nil && kv != nil {
		kv.close() // a load that failed frees the pool offered to it
	}
	e.mu.Lock()
	if err != nil {
		if ent.inst == inst {
			ent.inst, ent.state, ent.err = nil, StateFailed, err
		}
	}
	e.mu.Unlock()
	close(inst.opened)
	if err != nil {
		e.log.Warn("model load failed", "model", ent.id, "err", err)
		return
	}
	e.log.Info("loading model", "model", ent.id, "path", inst.path)
	// Follow the load's events for the status; the subscription ends
	// when the model closes.
	sub := m.Subscribe()
	for ev := range sub.C {
		inst.progMu.Lock()
		switch ev := ev.(type) {
		case TensorUploaded:
			inst.loaded += ev.Bytes
		case ModelReady:
			inst.ready = true
		case AllResident:
			inst.ready, inst.resident = true, true
		}
		inst.progMu.Unlock()
		switch ev := ev.(type) {
		case AllResident:
			markResident()
			e.mu.Lock()
			idle := inst.active == 0
			e.mu.Unlock()
			if kv != nil && idle {
				kv.close() // loaded with no request: nobody takes the pool soon
			}
			e.mu.Lock()
			if ent.inst == inst {
				ent.state = StateResident
			}
			e.pinLocked(ent, inst) // in the same hold: a resident model's pin is visible with its state
			e.mu.Unlock()
			sub.Close()
		case ModelReady:
			e.setState(ent, inst, StateReady)
		case ErrorEvent:
			if ev.Req == 0 && gguf.MappingBroken(ev.Err) {
				e.fail(ent, inst, ev.Err)
			} else if ev.Req == 0 {
				e.mu.Lock()
				if ent.inst == inst {
					ent.state, ent.err = StateFailed, ev.Err
				}
				e.mu.Unlock()
			}
		}
	}
}

// ModelFailedError is what a request gets when its model's file changed
// under the mapping while the model was loaded (gguf.MappingBroken: it was
// truncated, by a download or `forge gen -o` over it, or rewritten in
// place): the model was unloaded and marked failed. Its message names the
// model, not the host path; Err (the *gguf.ChangedError or
// *gguf.FaultError, with the path) is for logs and errors.As.
type ModelFailedError struct {
	Model string
	Err   error
}

func (e *ModelFailedError) Error() string {
	return fmt.Sprintf("pipeline: model %q failed: its file changed on disk while it was loaded (truncated or rewritten in place); it was unloaded, the next request loads the file again", e.Model)
}

func (e *ModelFailedError) Unwrap() error { return e.Err }

// fail handles an error of inst (a request's, or one published by its
// load) that says its file can no longer be read safely: the model is
// marked failed with the reason, detached and closed in the background
// (requests still running on it end with it), and other models keep
// serving. The next request for it loads the file anew. It returns the
// error for the client; other errors come back unchanged.
func (e *Engine) fail(ent *entry, inst *instance, err error) error {
	if !gguf.MappingBroken(err) {
		return err
	}
	var mf *ModelFailedError
	if errors.As(err, &mf) {
		return err
	}
	mf = &ModelFailedError{Model: ent.id, Err: err}
	e.mu.Lock()
	if ent.inst != inst || e.closed {
		e.mu.Unlock()
		return mf
	}
	victim := e.detach(ent, StateFailed)
	ent.err = mf
	e.signalFreed()
	e.wg.Add(1)
	e.mu.Unlock()
	e.log.Error("model failed: file changed while loaded; unloading", "model", ent.id, "path", inst.path, "err", err)
	// Not on this goroutine: it may be the follower of the model's events,
	// which Close waits to drain.
	go func() {
		defer e.wg.Done()
		e.closeAll([]*instance{victim})
	}()
	return mf
}

func (e *Engine) setState(ent *entry, inst *instance, s ModelState) {
	e.mu.Lock()
	if ent.inst == inst && ent.state != StateResident {
		ent.state = s
	}
	e.mu.Unlock()
}

// release ends one hold on an instance; the last one starts the
// keep-alive.
func (e *Engine) release(ent *entry, inst *instance) {
	e.mu.Lock()
	inst.active--
	ent.lastUsed = time.Now()
	if inst.active == 0 {
		e.signalFreed()
	}
	if inst.active > 0 || ent.inst != inst || e.closed {
		e.mu.Unlock()
		return
	}
	keep := ent.keepAlive
	switch {
	case keep < 0:
		e.mu.Unlock()
	case keep == 0:
		victim := e.detach(ent, StateUnloaded)
		e.pruneLocked(0)
		e.wg.Add(1)
		e.mu.Unlock()
		e.log.Debug("unloading idle model", "model", ent.id)
		e.closeAll([]*instance{victim})
		e.wg.Done()
	default:
		inst.expiresAt = time.Now().Add(keep)
		inst.timer = time.AfterFunc(keep, func() { e.expire(ent, inst) })
		e.mu.Unlock()
	}
}

// expire unloads an instance whose keep-alive ran out, unless a request
// took it meanwhile.
func (e *Engine) expire(ent *entry, inst *instance) {
	e.mu.Lock()
	if e.closed || ent.inst != inst || inst.active > 0 || inst.timer == nil || time.Now().Before(inst.expiresAt) {
		e.mu.Unlock()
		return
	}
	victim := e.detach(ent, StateUnloaded)
	e.pruneLocked(0)
	e.wg.Add(1)
	e.mu.Unlock()
	defer e.wg.Done()
	e.log.Info("unloading model after keep-alive", "model", ent.id)
	e.closeAll([]*instance{victim})
}

// Unload unloads an idle model now; a busy one unloads when its last
// request ends, as if its keep-alive were 0.
func (e *Engine) Unload(id string) error {
	e.mu.Lock()
	ent, ok := e.lookupLocked(id)
	if !ok {
		e.mu.Unlock()
		return fmt.Errorf("%w: %q", ErrUnknownModel, id)
	}
	if ent.inst == nil {
		e.unpinLocked(ent)
		e.mu.Unlock()
		return nil
	}
	if ent.inst.active > 0 {
		ent.keepAlive = 0
		e.mu.Unlock()
		return nil
	}
	victim := e.detach(ent, StateUnloaded)
	e.mu.Unlock()
	e.closeAll([]*instance{victim})
	return nil
}

// Status lists every known model, sorted by id.
func (e *Engine) Status() []ModelStatus {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]ModelStatus, 0, len(e.models))
	for _, ent := range e.models {
		out = append(out, e.status(ent))
	}
	slices.SortFunc(out, func(a, b ModelStatus) int {
		if a.ID < b.ID {
			return -1
		}
		if a.ID > b.ID {
			return 1
		}
		return 0
	})
	return out
}

// StatusOf is one model's status.
func (e *Engine) StatusOf(id string) (ModelStatus, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ent, ok := e.lookupLocked(id)
	if !ok {
		return ModelStatus{}, false
	}
	return e.status(ent), true
}

func (e *Engine) status(ent *entry) ModelStatus {
	s := ModelStatus{ID: ent.id, State: ent.state, KeepAlive: ent.keepAlive, LastUsed: ent.lastUsed}
	if ent.err != nil {
		s.Err = ent.err.Error()
	}
	if inst := ent.inst; inst != nil {
		s.Path, s.Active, s.ExpiresAt, s.WeightBytes = inst.path, inst.active, inst.expiresAt, inst.weights
		inst.progMu.Lock()
		s.LoadedBytes = min(inst.loaded, inst.weights)
		if inst.resident {
			s.LoadedBytes = inst.weights
		}
		inst.progMu.Unlock()
		select {
		case <-inst.opened:
			if m := inst.m; m != nil {
				s.MemoryBytes = m.Memory().InUse()
				// The futures are the truth; the event follower that
				// also sets the state may lag behind them.
				if s.State == StateLoading || s.State == StateReady {
					if done(m.Resident()) {
						s.State, s.LoadedBytes = StateResident, inst.weights
					} else if done(m.Ready()) {
						s.State = StateReady
					}
				}
			}
		default:
		}
	}
	return s
}

// done reports whether a readiness future resolved without error.
func done(f interface {
	Done() <-chan struct{}
	Err() error
}) bool {
	select {
	case <-f.Done():
		return f.Err() == nil
	default:
		return false
	}
}

// InUse is the bytes every loaded model's accountant holds now, plus
// what the models share on a GPU (its staging ring), counted once.
func (e *Engine) InUse() int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := e.gpu.inUse()
	for _, ent := range e.models {
		if inst := ent.inst; inst != nil {
			select {
			case <-inst.opened:
				if inst.m != nil {
					n += inst.m.Memory().InUse()
				}
			default:
			}
		}
	}
	return n
}

// Close cancels every request and load, unloads every model and waits
// until all of it is released.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	e.cancel()
	var victims []*instance
	for _, ent := range e.models {
		if ent.inst != nil {
			victims = append(victims, e.detach(ent, StateUnloaded))
		}
		e.unpinLocked(ent)
	}
	subs := e.subs
	e.subs = nil
	e.mu.Unlock()
	e.closeAll(victims)
	e.wg.Wait()
	e.pinWG.Wait() // every pinned file unregistered, on the GPU's thread
	e.gpu.close()  // after every model, including victims closed by Acquire
	for sub := range subs {
		sub.Close()
	}
	return nil
}
