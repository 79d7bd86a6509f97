package pipeline

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/forge-llm/forge/actors"
	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/pipeline/model"
	"github.com/forge-llm/forge/pipeline/tokenizer"
)

// Model is an opened model: its weights stream to the device in the
// background while requests already run. Its methods are safe for
// concurrent use; requests run one at a time in submission order.
type Model struct {
	path  string
	cfg   model.Config
	start time.Time
	sys   *actors.System
	exec  *actors.Executor[job] // runs the model's requests in order
	mem   *Memory
	dev   *device         // the model's device, open or opening (device_open.go)
	up    actors.Uploader // what places the weights (nil: the host's)
	// profileID is the file's identity when its experts' use is recorded
	// in Options.ExpertProfiles at Close ("" otherwise).
	profileID string
	// released is closed once the uploader has freed the device weights
	// and given back the staging ring, in Close (nil where the uploader
	// is not the pipeline's lazy one): an Engine starts the next model's
	// reservation there, not after the whole Close.
	released <-chan struct{}
	// f is the mapped file, closed by Close after everything that reads
	// it; where fileGate is set (an Engine's evicted model) Close waits
	// for it first: unmapping gigabytes of a file page by page took
	// 45-70 ms and, beside the next model's load, slowed that load's
	// reading of its own mapping by as much.
	f    *gguf.File
	fref *fileRef // f's holders: this model, and an Engine's pin
	// kvFrom offers the KV pool of the model evicted for this one, kvTo
	// takes this one's at Close (set by the Engine at eviction): see
	// kvHandoff.
	kvFrom   *kvHandoff
	kvTo     atomic.Pointer[kvHandoff]
	fileGate <-chan struct{}

	// prefetched is closed once the readahead hints are given (they touch
	// the mapping, which Close unmaps).
	prefetched chan struct{}

	// The tokenizer is built in the background too (large vocabularies
	// take tens of milliseconds); Generate waits for it.
	tokDone chan struct{}
	tok     *tokenizer.Tokenizer
	tokErr  error
	tokAt   time.Time // when it was built

	builtAt atomic.Int64 // ns after start the executor's model was built (0: not yet)

	// chatTemplate is tokenizer.chat_template ("" when absent), for
	// rendering conversations (package chat).
	chatTemplate string
	// pooling is how Embed pools token states (eval.go).
	pooling Pooling

	cvocab constrainVocab // the vocabulary of constrained requests

	// conts are the latest batched requests' prompts and replies, whose
	// ids a prompt that continues one keeps (continuation.go).
	conts continuations

	closeOnce sync.Once
	closeErr  error

	// split is set on a model split over several devices (split.go).
	split *splitModel

	// Continuous batching (batching.go), with opts.Batching.On.
	opts      Options
	batch     batched
	batchReqs atomic.Uint64
}

// typeReader is a backend that says which block types its kernels read
// as they are (a GPU without a kernel for some type); the others are
// converted to F32 on the host. Backends without it read every type.
type typeReader interface {
	Reads(t gguf.Type) bool
}

// gpuReaders is the default number of file readers on a GPU: they page the
// file in ahead of the copies (one thread populates page tables at a few
// GB/s; the copies run at up to 55).
const gpuReaders = 8

// Open maps the file, parses its metadata and starts loading; it returns
// as soon as the metadata is checked, while weights stream in the
// background. On a GPU the driver, the context and the kernels are made in
// the background too (a tenth of a second or more): the loader starts
// reading at once, the uploader once the context exists, the executor once
// the kernels are loaded; a device that cannot be opened fails every
// readiness future and every request with its error. ctx bounds the load
// only: cancelling it stops loading and fails the readiness futures still
// pending. Close the model when done.
func Open(ctx context.Context, path string, o Options) (*Model, error) {
	if o.Backend == nil && len(o.Backends) == 1 {
		o.Backend = o.Backends[0] // a split over one backend is that backend
	}
	if ok, ords, err := isSplit(o); err != nil || ok {
		if o.file != nil { // an Engine pins single-device models' files only
			_ = o.file.release()
			o.file, o.pinned = nil, nil
		}
		if err != nil {
			return nil, err
		}
		return openSplit(ctx, path, o, ords)
	} else if len(ords) == 1 {
		o.Device = fmt.Sprintf("gpu:%d", ords[0]) // gpu:all on a machine with one GPU
	}
	start := time.Now()
	mem := o.Memory
	if mem == nil {
		mem = NewMemory(0)
	}
	// An explicit GPU starts its driver before the file is parsed: the
	// driver's start-up is the longest step of a fresh process.
	early := earlyDevice(o)
	fref := o.file // an Engine's pinned file, held for this model
	if fref == nil {
		f, err := gguf.Open(path)
		if err != nil {
			early.discard()
			return nil, err
		}
		fref = newFileRef(f)
	}
	f := fref.f
	cfg, err := model.ConfigFromFile(f)
	if err == nil {
		err = model.CheckShapes(f, cfg)
	}
	if err != nil {
		early.discard()
		_ = fref.release()
		return nil, err
	}
	m := &Model{path: path, cfg: cfg, start: start, mem: mem, prefetched: make(chan struct{}), tokDone: make(chan struct{}), opts: o, kvFrom: o.kvFrom}
	// The file's pages stream into the page cache while the driver
	// starts (DESIGN.md: start-up is on the clock).
	go func() { defer close(m.prefetched); prefetchFile(f) }()
	dev, err := openDevice(o, f, early)
	if err != nil {
		<-m.prefetched
		_ = fref.release()
		return nil, err
	}
	m.dev = dev
	up, released, reads, gpuReads := dev.placement(ctx, o, mem.acct)
	m.released = released
	conv := actors.Conversion{AllF32: o.Strategy == HostF32, Reads: reads}
	if gpuReads && o.Readers <= 0 {
		o.Readers = gpuReaders
	}
	order, profileID := expertOrder(o, f, cfg.Experts)
	var inflight int64
	if gpuReads { // the GPU's paced uploads: as many bytes in flight for a mixture's ~1 MB expert chunks as for whole ones
		inflight = int64(4*o.Readers) * cmp.Or(o.ChunkBytes, actors.DefaultChunkBytes)
	}
	sys, err := actors.Start(ctx, actors.Config{
		File: f, KeepFile: true, Layers: cfg.Layers, Strategy: o.Strategy.toActors(), Memory: mem.acct, Converter: conv, Uploader: up,
		Readers: o.Readers, ChunkBytes: o.ChunkBytes, InflightBytes: inflight, Hooks: o.Hooks.toActors(), Start: start, Order: order,
	})
	if err != nil {
		<-m.prefetched
		_ = fref.release()
		close(m.dev.abort)
		m.dev.close()
		return nil, err
	}
	m.sys, m.up, m.f, m.fref = sys, up, f, fref
	m.profileID = profileID
	m.chatTemplate, _ = f.String("tokenizer.chat_template")
	m.pooling = poolingOf(f, cfg.Arch)
	go func() {
		defer close(m.tokDone)
		m.tok, m.tokErr = tokenizer.FromFile(f)
		m.tokAt = time.Now()
	}()
	mo := model.Options{Ctx: o.Ctx, Batch: o.Batch, NoGraph: o.NoGraph}
	m.exec = actors.StartExecutor(sys, func(ctx context.Context) (actors.Generator[job], error) {
		be, err := m.backend(ctx)
		if err != nil {
			return nil, err
		}
		if o.Batching.On && canBatch(be, o.Batching, cfg) {
			// Requests go through the batching scheduler (batching.go),
			// which holds the KV pool: the executor keeps no model.
			m.builtAt.Store(int64(time.Since(start)))
			return batchedOnly{}, nil
		}
		w, err := newWeights(sys, be, cfg, o.ExpertProfiles != "")
		if err != nil {
			return nil, err
		}
		mdl, err := model.New(accounted{Backend: be, mem: mem.acct}, cfg, w, mo)
		if err != nil {
			return nil, err
		}
		m.builtAt.Store(int64(time.Since(start)))
		return &generator{m: m, mdl: mdl}, nil
	})
	return m, nil
}

// backend waits for the model's backend.
func (m *Model) backend(ctx context.Context) (kernels.Backend, error) {
	return m.dev.backend(ctx)
}

// ContextCurrent is how long after Started the GPU context became current
// (0 on the CPU): "ready within X ms of the context" is Ready's time minus
// this.
// While the device is still opening in the background it is 0.
func (m *Model) ContextCurrent() time.Duration {
	var at time.Time
	select {
	case <-m.dev.ctxReady:
		at = m.dev.ctxAt
	default:
	}
	if at.IsZero() {
		return 0
	}
	return at.Sub(m.start)
}

// Path is the model file.
func (m *Model) Path() string { return m.path }

// Config is the model's shape.
func (m *Model) Config() model.Config { return m.cfg }

// Started is the time event times count from (when Open began).
func (m *Model) Started() time.Time { return m.start }

// Strategy is the load strategy.
func (m *Model) Strategy() Strategy { return m.opts.Strategy }

// Ready resolves when the embedding, output norm and LM head are resident:
// from then on requests run.
func (m *Model) Ready() *Future { return &Future{m.sys.Ready()} }

// Resident resolves when every weight is resident. Not for a mixture of
// experts opened with Lazy (LazyExperts): the experts no request routes
// to never load, so it resolves only at Close, with an error. Wait on it
// with a context that ends, or check LazyExperts first.
func (m *Model) Resident() *Future { return &Future{m.sys.Resident()} }

// LazyExperts reports whether the model is a mixture of experts opened
// with Lazy: its experts load only when a request's router picks them, so
// Resident does not resolve before Close.
func (m *Model) LazyExperts() bool {
	if m.opts.Strategy != Lazy {
		return false
	}
	for l := range m.cfg.Layers {
		if m.sys.Experts(l) > 0 {
			return true
		}
	}
	return false
}

// Layer is block i's readiness future.
func (m *Model) Layer(i int) *Future { return &Future{m.sys.LayerFuture(i)} }

// Experts is the number of experts of block i that load one by one, each
// on its own future (Expert): a mixture's block (0 for a dense one). Its
// Layer future then stands for the rest of the block (attention, norms,
// router).
func (m *Model) Experts(i int) int { return m.sys.Experts(i) }

// Expert is the readiness of expert e of block i (its rows of the block's
// stacked expert tensors), or nil where Experts(i) ≤ e. A request waits
// only for the experts its router picks.
func (m *Model) Expert(i, e int) *Future {
	if f := m.sys.ExpertFuture(i, e); f != nil {
		return &Future{f}
	}
	return nil
}

// Subscribe returns a stream of the load's events so far (a subscriber
// that arrives after Open still sees the whole load), then of every event
// published from now on. Read its C until it closes (after Close) or call
// its Close.
func (m *Model) Subscribe() *Subscription { return m.sys.Bus().Subscribe() }

// Memory is the accountant of what the model holds on its device.
func (m *Model) Memory() *Memory { return m.mem }

// ChatTemplate is the file's tokenizer.chat_template ("" when absent).
func (m *Model) ChatTemplate() string { return m.chatTemplate }

// Tokenizer waits for the model's tokenizer.
func (m *Model) Tokenizer(ctx context.Context) (*tokenizer.Tokenizer, error) {
	select {
	case <-m.tokDone:
		return m.tok, m.tokErr
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Close cancels running requests, stops loading, and releases the weights,
// KV cache, scratch, backend (unless the caller passed it) and file.
// Subscriptions get what was published, then close.
//
// Closing a model whose device is still opening stops the opening after
// its current step (a driver call cannot be interrupted) and waits for it.
func (m *Model) Close() error {
	m.closeOnce.Do(func() {
		close(m.dev.abort)
		tb := time.Now()
		m.closeBatched() // its requests end; its model reads the weights
		// Both read the file, which sys.Close closes.
		<-m.tokDone
		<-m.prefetched
		t0 := time.Now()
		m.closeErr = m.sys.Close()
		if m.profileID != "" {
			if err := m.saveProfile(m.opts.ExpertProfiles, m.profileID); err != nil {
				slog.Warn("pipeline: the expert usage profile was not saved", "model", m.path, "err", err)
			}
		}
		tSys := time.Since(t0)
		m.dev.close()
		tDev := time.Since(t0) - tSys
		if m.fileGate != nil {
			<-m.fileGate
		}
		t1 := time.Now()
		if m.fref != nil {
			m.closeErr = errors.Join(m.closeErr, m.fref.release())
		}
		// An eviction's time is on the path of the next model's load.
		slog.Debug("pipeline: model closed", "path", m.path, "batched", t0.Sub(tb), "system", tSys, "device", tDev,
			"file gate", t1.Sub(t0)-tSys-tDev, "file close", time.Since(t1))
	})
	return m.closeErr
}

// String describes the model for logs.
func (m *Model) String() string {
	name := "opening"
	select {
	case <-m.dev.done:
		if m.dev.be != nil {
			name = m.dev.be.Name()
		} else {
			name = "failed"
		}
	default:
	}
	if m.split != nil {
		name = strings.Join(m.split.names, "+")
	}
	return fmt.Sprintf("%s (%s, %d layers, %s, %s)", m.path, m.cfg.Arch, m.cfg.Layers, name, m.opts.Strategy)
}
