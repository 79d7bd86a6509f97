package pipeline

import (
	"context"
	"fmt"
	"sync"
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
	path    string
	cfg     model.Config
	start   time.Time
	sys     *actors.System
	mem     *actors.Memory
	be      kernels.Backend
	closeBe func()
	ctxAt   time.Time // when the GPU context became current (zero on the CPU)

	// The tokenizer is built in the background too (large vocabularies
	// take tens of milliseconds); Generate waits for it.
	tokDone chan struct{}
	tok     *tokenizer.Tokenizer
	tokErr  error

	// chatTemplate is tokenizer.chat_template ("" when absent), for
	// rendering conversations (package chat).
	chatTemplate string

	closeOnce sync.Once
	closeErr  error
}

// typeReader is a backend that says which block types its kernels read
// as they are (a GPU without a kernel for some type); the others are
// converted to F32 on the host. Backends without it read every type.
type typeReader interface {
	Reads(t gguf.Type) bool
}

// Open maps the file, parses its metadata and starts loading; it returns
// as soon as the metadata is checked, while weights stream in the
// background. ctx bounds the load only: cancelling it stops loading and
// fails the readiness futures still pending. Close the model when done.
func Open(ctx context.Context, path string, o Options) (*Model, error) {
	start := time.Now()
	mem := o.Memory
	if mem == nil {
		mem = actors.NewMemory(0)
	}
	f, err := gguf.Open(path)
	if err != nil {
		return nil, err
	}
	cfg, err := model.ConfigFromFile(f)
	if err == nil {
		err = checkShapes(f, cfg)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	// The file's pages stream into the page cache while the driver
	// starts (DESIGN.md: start-up is on the clock).
	prefetched := make(chan struct{})
	go func() { defer close(prefetched); prefetchFile(f) }()
	dev, err := openBackend(o)
	<-prefetched
	if err != nil {
		f.Close()
		return nil, err
	}
	be, closeBe := dev.be, dev.close
	up := o.Uploader
	if up == nil && dev.uploader != nil {
		up = dev.uploader(o.Strategy, mem)
	}
	conv := actors.Conversion{AllF32: o.Strategy == HostF32}
	if r, ok := be.(typeReader); ok {
		conv.Reads = r.Reads
	}
	sys, err := actors.Start(ctx, actors.Config{
		File: f, Layers: cfg.Layers, Strategy: o.Strategy, Memory: mem, Converter: conv, Uploader: up,
		Readers: o.Readers, ChunkBytes: o.ChunkBytes, Hooks: o.Hooks, Start: start,
	})
	if err != nil {
		f.Close()
		if closeBe != nil {
			closeBe()
		}
		return nil, err
	}
	m := &Model{path: path, cfg: cfg, start: start, sys: sys, mem: mem, be: be, closeBe: closeBe, ctxAt: dev.ctxAt, tokDone: make(chan struct{})}
	m.chatTemplate, _ = f.String("tokenizer.chat_template")
	go func() {
		defer close(m.tokDone)
		m.tok, m.tokErr = tokenizer.FromFile(f)
	}()
	mo := model.Options{Ctx: o.Ctx, Batch: o.Batch}
	sys.StartExecutor(func(ctx context.Context) (actors.Generator, error) {
		w, err := newWeights(sys, be, cfg)
		if err != nil {
			return nil, err
		}
		mdl, err := model.New(accounted{Backend: be, mem: mem}, cfg, w, mo)
		if err != nil {
			return nil, err
		}
		return &generator{m: m, mdl: mdl}, nil
	})
	return m, nil
}

// ContextCurrent is how long after Started the GPU context became current
// (0 on the CPU): "ready within X ms of the context" is Ready's time minus
// this.
func (m *Model) ContextCurrent() time.Duration {
	if m.ctxAt.IsZero() {
		return 0
	}
	return m.ctxAt.Sub(m.start)
}

// Path is the model file.
func (m *Model) Path() string { return m.path }

// Config is the model's shape.
func (m *Model) Config() model.Config { return m.cfg }

// Started is the time event times count from (when Open began).
func (m *Model) Started() time.Time { return m.start }

// Strategy is the load strategy.
func (m *Model) Strategy() Strategy { return m.sys.Strategy() }

// Ready resolves when the embedding, output norm and LM head are resident:
// from then on requests run.
func (m *Model) Ready() *actors.Future { return m.sys.Ready() }

// Resident resolves when every weight is resident.
func (m *Model) Resident() *actors.Future { return m.sys.Resident() }

// Layer is block i's readiness future.
func (m *Model) Layer(i int) *actors.Future { return m.sys.LayerFuture(i) }

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
func (m *Model) Close() error {
	m.closeOnce.Do(func() {
		<-m.tokDone // it reads the file, which sys.Close closes
		m.closeErr = m.sys.Close()
		if m.closeBe != nil {
			m.closeBe()
		}
	})
	return m.closeErr
}

// String describes the model for logs.
func (m *Model) String() string {
	return fmt.Sprintf("%s (%s, %d layers, %s, %s)", m.path, m.cfg.Arch, m.cfg.Layers, m.be.Name(), m.sys.Strategy())
}
