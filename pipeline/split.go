package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/forge-llm/forge/actors"
	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/gpu"
	"github.com/forge-llm/forge/pipeline/model"
	"github.com/forge-llm/forge/pipeline/tokenizer"
	"github.com/forge-llm/forge/rocm"
)

// A model split by layers over several devices (DESIGN.md, "Several
// devices"): each device holds a contiguous run of blocks in its own
// weight arena, with its own uploader, copy stream, KV cache and scratch;
// the first device also holds the globals (embedding, output norm, LM
// head) and runs the head. One load pipeline reads the file once and
// routes each unit to its device's uploader, the devices' blocks
// interleaved in load order so that every device's link copies at once.

// splitModel is what a split Model holds besides the first device's
// backend (Model.be).
type splitModel struct {
	bes    []kernels.Backend // one per device, in layer order
	bounds []int             // device k runs layers [bounds[k], bounds[k+1])
	mems   []*Memory         // per device
	names  []string
}

// splitDevice parses "gpu:A,B,…" and "gpu:all": the GPU ordinals (an
// ordinal may repeat: two contexts on one card, for tests), or nil for
// any other device name.
func splitDevice(name string) ([]int, error) {
	if !splitName(name) {
		return nil, nil
	}
	rest, _ := strings.CutPrefix(strings.ToLower(strings.TrimSpace(name)), "gpu:")
	if rest == "all" {
		rt, err := rocm.OpenAny()
		if err != nil {
			return nil, fmt.Errorf("pipeline: device %q: %w", name, err)
		}
		n, err := rt.DeviceCount()
		if err != nil {
			return nil, fmt.Errorf("pipeline: device %q: %w", name, err)
		}
		if n == 0 {
			return nil, fmt.Errorf("pipeline: device %q: %w", name, rocm.ErrNoDevice)
		}
		ords := make([]int, n)
		for i := range ords {
			ords[i] = i
		}
		return ords, nil
	}
	var ords []int
	for _, f := range strings.Split(rest, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("pipeline: device %q: want gpu:N,M,… with N, M ≥ 0", name)
		}
		ords = append(ords, n)
	}
	return ords, nil
}

// ParseSplit reads --split: comma-separated non-negative shares of the
// layers per device ("1,1", "3,2", "0.6,0.4").
func ParseSplit(s string) ([]float64, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []float64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
			return nil, fmt.Errorf("pipeline: split %q: want comma-separated shares ≥ 0", s)
		}
		out = append(out, v)
	}
	return out, nil
}

// isSplit says whether o asks for a split model, and on which GPUs.
func isSplit(o Options) (bool, []int, error) {
	if o.Backend == nil && len(o.Backends) > 1 {
		return true, nil, nil
	}
	if o.Backend != nil || len(o.Backends) > 0 {
		return false, nil, nil
	}
	ords, err := splitDevice(o.Device)
	if err != nil {
		return false, nil, err
	}
	return len(ords) > 1, ords, nil
}

// splitDev is one opened device of a split model.
type splitDev struct {
	be    kernels.Backend
	w     *rocm.Worker // nil for a caller's CPU backend
	upW   *rocm.Worker
	free  uint64    // device memory free when opened (0: unknown)
	ctxAt time.Time // its context was made (zero: a caller's backend)
	close func()
	name  string
}

// openSplitDevices opens every GPU at once (driver contexts, kernels,
// each device's uploader thread). As for one GPU (device.run), the
// run-time compiler loads next to the driver's start and cuBLAS next to
// the contexts; preloads counts them, for the model's close to wait on.
func openSplitDevices(ords []int, mmq string, preloads *sync.WaitGroup) ([]*splitDev, error) {
	t0 := time.Now()
	preloads.Go(rocm.PreloadCompiler)
	if _, err := rocm.OpenAny(); err != nil {
		return nil, err // the driver: once, not once per device
	}
	slog.Debug("pipeline: split: driver open", "in", time.Since(t0))
	preloads.Go(gpu.PreloadBLAS)
	devs := make([]*splitDev, len(ords))
	errs := make([]error, len(ords))
	var wg sync.WaitGroup
	for k, ord := range ords {
		wg.Go(func() {
			ch, err := rocm.Choose(rocm.Selection{Kind: rocm.SelectGPU, Ordinal: ord})
			if err != nil {
				errs[k] = err
				return
			}
			w, err := ch.Runtime.NewWorker(ord)
			if err != nil {
				errs[k] = fmt.Errorf("%s: %w", ch.Device, err)
				return
			}
			ctxAt := time.Now()
			upW, err := w.Sibling()
			if err != nil {
				slog.Debug("pipeline: no thread of its own for the uploader", "device", ord, "err", err)
				upW = w
			}
			closeW := func() {
				if upW != w {
					upW.Close()
				}
				w.Close()
			}
			var free uint64
			if err := w.Do(context.Background(), func(c *rocm.Ctx) error {
				var err error
				free, _, err = c.MemInfo()
				return err
			}); err != nil {
				slog.Debug("pipeline: free memory unknown", "device", ord, "err", err)
			}
			b, err := gpu.New(w, gpu.Options{MMQ: mmq})
			if err != nil {
				closeW()
				errs[k] = fmt.Errorf("%s: %w", ch.Device, err)
				return
			}
			devs[k] = &splitDev{be: b, w: w, upW: upW, free: free, ctxAt: ctxAt, name: fmt.Sprintf("gpu:%d", ord),
				close: func() { b.Close(); closeW() }}
			slog.Debug("pipeline: split device open", "device", ord, "context", ctxAt.Sub(t0), "kernels", time.Since(t0))
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, d := range devs {
			if d != nil {
				d.close()
			}
		}
		return nil, err
	}
	return devs, nil
}

// assignLayers cuts [0, layers) into one run per device: by shares where
// given (of the layers), else by each device's free memory less the
// globals on the first device (equal shares where that is unknown).
// Every device gets at least one layer.
func assignLayers(layers int, shares []float64, free []uint64, globals, perLayer int64) ([]int, error) {
	n := len(free)
	if layers < n {
		return nil, fmt.Errorf("pipeline: %d layers cannot be split over %d devices", layers, n)
	}
	w := make([]float64, n)
	switch {
	case shares != nil:
		if len(shares) != n {
			return nil, fmt.Errorf("pipeline: %d split shares for %d devices", len(shares), n)
		}
		copy(w, shares)
	case !slices.Contains(free, 0):
		for k, f := range free {
			w[k] = float64(f)
			if k == 0 {
				w[k] -= float64(globals)
			}
			w[k] = max(w[k], float64(perLayer))
		}
	default:
		for k := range w {
			w[k] = 1
		}
	}
	var sum float64
	for _, v := range w {
		sum += v
	}
	if sum <= 0 {
		return nil, fmt.Errorf("pipeline: split shares %v give no device a layer", shares)
	}
	bounds := make([]int, n+1)
	var acc float64
	for k := 1; k < n; k++ {
		acc += w[k-1]
		b := int(math.Round(acc / sum * float64(layers)))
		bounds[k] = min(max(b, bounds[k-1]+1), layers-(n-k)) // ≥ 1 layer each
	}
	bounds[n] = layers
	return bounds, nil
}

// deviceOf is the device of a unit: the globals on the first, block i on
// the one whose run holds it.
func deviceOf(bounds []int, layer int) int {
	if layer == Globals {
		return 0
	}
	for k := len(bounds) - 2; k > 0; k-- {
		if layer >= bounds[k] {
			return k
		}
	}
	return 0
}

// interleave orders the units for loading: the globals, then the
// devices' blocks taken in turn, each time from the device that has the
// least of its share loaded so far, so that every device's copies run
// for the whole load and they finish together.
func interleave(bounds []int) func(p *actors.Plan) []*actors.Unit {
	return func(p *actors.Plan) []*actors.Unit {
		n := len(bounds) - 1
		total := make([]int64, n)
		for i := range p.Layers() {
			total[deviceOf(bounds, i)] += p.Layer(i).Bytes
		}
		next := slices.Clone(bounds[:n])
		done := make([]int64, n)
		out := []*actors.Unit{p.Units[0]}
		for len(out) < 1+p.Layers() {
			best := -1
			for k := range n {
				if next[k] >= bounds[k+1] {
					continue
				}
				if best < 0 || float64(done[k])*float64(max(total[best], 1)) < float64(done[best])*float64(max(total[k], 1)) {
					best = k
				}
			}
			u := p.Layer(next[best])
			next[best]++
			done[best] += u.Bytes
			out = append(out, u)
		}
		// A mixture's experts come after every block, in the plan's
		// order (each lands on its block's device).
		return append(out, p.Units[1+p.Layers():]...)
	}
}

// splitUploader routes each unit to its device's uploader: one arena,
// uploader and copy stream per device, fed by the one load pipeline.
type splitUploader struct {
	bounds []int
	ups    []actors.Uploader
}

func (s *splitUploader) of(t *actors.Tensor) actors.Uploader {
	return s.ups[deviceOf(s.bounds, t.Layer)]
}

// Reserve implements actors.Uploader: each device reserves the units it
// holds (all devices at once: an arena each).
func (s *splitUploader) Reserve(p *actors.Plan) error {
	subs := make([]*actors.Plan, len(s.ups))
	for k := range subs {
		subs[k] = &actors.Plan{ByName: map[string]*actors.Tensor{}}
	}
	for _, u := range p.Units {
		sp := subs[deviceOf(s.bounds, u.Layer)]
		sp.Units = append(sp.Units, u)
		sp.Bytes += u.Bytes
		for _, t := range u.Placed() {
			sp.ByName[t.Name()] = t
		}
	}
	errs := make([]error, len(s.ups))
	var wg sync.WaitGroup
	for k, up := range s.ups {
		wg.Go(func() {
			if err := up.Reserve(subs[k]); err != nil {
				errs[k] = fmt.Errorf("device %d of the split: %w", k, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Dest implements actors.Uploader.
func (s *splitUploader) Dest(t *actors.Tensor, off, n int64) ([]byte, error) {
	return s.of(t).Dest(t, off, n)
}

// Upload implements actors.Uploader.
func (s *splitUploader) Upload(t *actors.Tensor, off int64, data []byte) error {
	return s.of(t).Upload(t, off, data)
}

// Flush implements actors.Uploader: the unit's fence is its device's.
func (s *splitUploader) Flush(u *actors.Unit) (actors.Fence, error) {
	return s.ups[deviceOf(s.bounds, u.Layer)].Flush(u)
}

// Weight implements actors.Uploader.
func (s *splitUploader) Weight(name string) (*kernels.Weight, bool) {
	for _, up := range s.ups {
		if w, ok := up.Weight(name); ok {
			return w, true
		}
	}
	return nil, false
}

// Release implements actors.Uploader.
func (s *splitUploader) Release() {
	var wg sync.WaitGroup
	for _, up := range s.ups {
		wg.Go(up.Release)
	}
	wg.Wait()
}

// openSplit is Open for a model split over several devices: the GPUs
// named by Options.Device ("gpu:0,1", "gpu:all") or the backends of
// Options.Backends. The devices open before the load starts (all at
// once, while the file is parsed); continuous batching is off (requests run one at a time, on the
// single-sequence path).
func openSplit(ctx context.Context, path string, o Options, ords []int) (*Model, error) {
	start := time.Now()
	if o.Batching.On {
		slog.Info("pipeline: a model split over devices runs requests one at a time (continuous batching is single-device for now)", "path", path)
		o.Batching.On = false
	}
	// The GPUs open (the longest step: the driver, a context each) while
	// the file is parsed.
	var devs []*splitDev
	var preloads sync.WaitGroup
	opened := make(chan error, 1)
	if len(o.Backends) > 1 {
		for _, be := range o.Backends {
			d := &splitDev{be: be, name: be.Name()}
			if g, ok := kernels.As[*gpu.Backend](be); ok {
				d.w, d.upW = g.Worker(), g.Worker()
			}
			devs = append(devs, d)
		}
		opened <- nil
	} else {
		go func() {
			var err error
			devs, err = openSplitDevices(ords, o.MMQ, &preloads)
			if err != nil {
				err = fmt.Errorf("pipeline: device %q: %w", o.Device, err)
			}
			opened <- err
		}()
	}
	closeDevs := func() {
		for _, d := range devs {
			if d.close != nil {
				d.close()
			}
		}
		preloads.Wait()
	}
	f, ferr := gguf.Open(path)
	var cfg model.Config
	if ferr == nil {
		cfg, ferr = model.ConfigFromFile(f)
		if ferr == nil {
			ferr = model.CheckShapes(f, cfg)
		}
		if ferr != nil {
			f.Close()
		}
	}
	err := <-opened // devs is set from here on
	if err != nil || ferr != nil {
		closeDevs()
		if err == nil {
			err = ferr
		}
		return nil, err
	}
	free := make([]uint64, len(devs))
	for k, d := range devs {
		free[k] = d.free
	}
	globals, perLayer := splitBytes(f, cfg)
	bounds, err := assignLayers(cfg.Layers, o.Split, free, globals, perLayer)
	if err != nil {
		f.Close()
		closeDevs()
		return nil, err
	}
	mems := make([]*Memory, len(devs))
	for k := range mems {
		if k == 0 && o.Memory != nil {
			mems[k] = o.Memory
		} else {
			var limit int64
			if o.Memory != nil {
				limit = o.Memory.Limit()
			}
			mems[k] = NewMemory(limit)
		}
	}
	ups := make([]actors.Uploader, len(devs))
	conv := actors.Conversion{AllF32: o.Strategy == HostF32}
	var readers []func(gguf.Type) bool
	for k, d := range devs {
		if d.upW != nil {
			ups[k] = deviceUploader(d.upW, o.Upload, o.Strategy, mems[k].acct)
		} else {
			ups[k] = &actors.HostUploader{Mem: mems[k].acct, PerTensor: o.Strategy == HostF32}
		}
		if r, ok := kernels.As[typeReader](d.be); ok {
			readers = append(readers, r.Reads)
		} else if d.w != nil {
			readers = append(readers, gpu.Supported)
		}
	}
	if len(readers) > 0 {
		// A type goes through as it is only where every device reads it.
		conv.Reads = func(t gguf.Type) bool {
			for _, r := range readers {
				if !r(t) {
					return false
				}
			}
			return true
		}
	}
	if o.Readers <= 0 && devs[0].w != nil {
		o.Readers = gpuReaders * len(devs)
	}
	m := &Model{path: path, cfg: cfg, start: start, mem: mems[0], prefetched: make(chan struct{}), tokDone: make(chan struct{}), opts: o}
	// The model's context time (ContextCurrent) is the last device's:
	// only then can every device's copies run.
	var ctxAt time.Time
	for _, d := range devs {
		if d.ctxAt.After(ctxAt) {
			ctxAt = d.ctxAt
		}
	}
	m.dev = resolvedDevice(devs[0].be, closeDevs, nil, ctxAt)
	m.split = &splitModel{bounds: bounds, mems: mems}
	for _, d := range devs {
		m.split.bes = append(m.split.bes, d.be)
		m.split.names = append(m.split.names, d.name)
	}
	go func() { defer close(m.prefetched); prefetchFile(f) }()
	su := &splitUploader{bounds: bounds, ups: ups}
	sys, err := actors.Start(ctx, actors.Config{
		File: f, Layers: cfg.Layers, Strategy: o.Strategy.toActors(), Memory: mems[0].acct, Converter: conv, Uploader: su,
		Readers: o.Readers, ChunkBytes: o.ChunkBytes, Hooks: o.Hooks.toActors(), Start: start, Order: interleave(bounds),
	})
	if err != nil {
		<-m.prefetched
		f.Close()
		closeDevs()
		return nil, err
	}
	m.sys, m.up = sys, su
	m.chatTemplate, _ = f.String("tokenizer.chat_template")
	go func() {
		defer close(m.tokDone)
		m.tok, m.tokErr = tokenizer.FromFile(f)
		m.tokAt = time.Now()
	}()
	var ropeFreqs *gguf.TensorInfo
	if ti, ok := f.Tensor("rope_freqs.weight"); ok {
		ropeFreqs = ti
	}
	slog.Debug("pipeline: model split over devices", "path", path, "devices", m.split.names, "bounds", bounds)
	mo := model.Options{Ctx: o.Ctx, Batch: o.Batch, NoGraph: o.NoGraph}
	m.exec = actors.StartExecutor(sys, func(ctx context.Context) (actors.Generator[job], error) {
		parts := make([]model.Part, len(devs))
		for k, d := range devs {
			w, err := newWeights(sys, d.be, cfg, o.ExpertProfiles != "")
			if err != nil {
				return nil, err
			}
			if k > 0 && ropeFreqs != nil {
				// RoPE runs on every device: each gets the frequencies.
				if w.g.RopeFreqs, err = deviceCopy(d.be, f, ropeFreqs); err != nil {
					return nil, fmt.Errorf("pipeline: device %s: %w", d.name, err)
				}
			}
			parts[k] = model.Part{Backend: accounted{Backend: d.be, mem: mems[k].acct}, Weights: w, Lo: bounds[k], Hi: bounds[k+1]}
		}
		mdl, err := model.NewSplit(cfg, parts, mo)
		if err != nil {
			return nil, err
		}
		m.builtAt.Store(int64(time.Since(start)))
		return &generator{m: m, mdl: mdl}, nil
	})
	return m, nil
}

// splitBytes is what the globals and the largest block take in the file.
func splitBytes(f *gguf.File, cfg model.Config) (globals, perLayer int64) {
	layer := make([]int64, cfg.Layers)
	for i := range f.Tensors {
		ti := &f.Tensors[i]
		if b, ok, err := gguf.BlockOf(ti.Name); err == nil && ok && b >= 0 && b < cfg.Layers {
			layer[b] += int64(ti.Size)
		} else {
			globals += int64(ti.Size)
		}
	}
	for _, n := range layer {
		perLayer = max(perLayer, n)
	}
	return globals, perLayer
}

// weightLoader is a backend that copies a host weight to its device up
// front (a GPU); others read Host as it is.
type weightLoader interface {
	LoadWeight(w *kernels.Weight) error
}

// deviceCopy makes a small global (F32, a row) usable on be: a view of
// the mapped file, copied to the device where be has one (freed with be).
func deviceCopy(be kernels.Backend, f *gguf.File, ti *gguf.TensorInfo) (*kernels.Weight, error) {
	data, err := f.TensorData(ti)
	if err != nil {
		return nil, fmt.Errorf("tensor %q: %w", ti.Name, err)
	}
	w := &kernels.Weight{Name: ti.Name, Type: ti.Type, Cols: int(ti.Dims[0]), Rows: int(ti.Rows()), Host: data}
	if l, ok := kernels.As[weightLoader](be); ok {
		if err := l.LoadWeight(w); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// Devices names the devices the model runs on, in layer order, with the
// layers each runs ([lo, hi)); one entry unless the model is split.
func (m *Model) Devices() []DeviceShare {
	if m.split == nil {
		name := "opening"
		if be, err := m.backend(context.Background()); err == nil && be != nil {
			name = be.Name()
		}
		return []DeviceShare{{Name: name, Lo: 0, Hi: m.cfg.Layers, Memory: m.mem}}
	}
	out := make([]DeviceShare, len(m.split.bes))
	for k := range out {
		out[k] = DeviceShare{Name: m.split.names[k], Lo: m.split.bounds[k], Hi: m.split.bounds[k+1], Memory: m.split.mems[k]}
	}
	return out
}

// DeviceShare is one device of a model and the layers it runs.
type DeviceShare struct {
	Name   string
	Lo, Hi int
	Memory *Memory // what the model holds on this device
}

// deviceInUse is the most a model holds on any one of its devices (an
// Engine's budget is per device).
func (m *Model) deviceInUse() int64 {
	if m.split == nil {
		return m.mem.InUse()
	}
	var n int64
	for _, mem := range m.split.mems {
		n = max(n, mem.InUse())
	}
	return n
}

// perDevice is a whole model's estimate as the most one device of o's
// split holds (the share of the layers, evenly; the first device's
// globals make it a little more, which the measured use corrects).
func perDevice(total int64, o Options) int64 {
	n := 1
	if ok, ords, err := isSplit(o); err == nil && ok {
		n = max(len(ords), len(o.Backends))
	}
	return (total + int64(n) - 1) / int64(n)
}
