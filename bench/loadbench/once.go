package loadbench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/pipeline"
)

// OnceConfig is one measured load, run in a fresh child process.
type OnceConfig struct {
	Model        string
	Strategy     string
	Device       string
	Threads      int
	PromptTokens int
	// PromptIDs, when set, is the prompt (the parent makes it once per
	// model with PromptIDs, so the child's clock does not count it);
	// otherwise RunOnce makes one of PromptTokens tokens.
	PromptIDs []int32
	// Fork is the parent's wall clock just before it started this
	// process: every time is measured from it.
	Fork time.Time
	// Trace adds the per-layer spans to the result.
	Trace bool
	// GPUUpload is the GPU uploader's settings
	// (pipeline.UploadTuning.Parse; "": the defaults).
	GPUUpload string
	// Split is each GPU's share of the layers of a model split over
	// several (Device "gpu:N,M,…"; nil: by free memory).
	Split []float64
	// ExpertProfiles is a folder of expert usage profiles
	// (pipeline.Options.ExpertProfiles; "": none).
	ExpertProfiles string
}

// OrdinaryTokens reads a model file's tokenizer and lists its normal
// tokens (no control, byte or unused ones): the pool random prompts are
// drawn from.
func OrdinaryTokens(path string) (*gguf.TokenizerMeta, []int32, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	tm, err := f.Tokenizer()
	if err != nil {
		return nil, nil, err
	}
	var ids []int32
	for i := range tm.Tokens {
		if i >= len(tm.TokenTypes) || tm.TokenTypes[i] == 1 {
			ids = append(ids, int32(i))
		}
	}
	if len(ids) == 0 {
		return nil, nil, fmt.Errorf("loadbench: %s: no ordinary tokens in the vocabulary", path)
	}
	return tm, ids, nil
}

// PromptIDs makes a prompt of n tokens from the vocabulary: BOS (when the
// model asks for it), then ordinary tokens drawn with a fixed seed, so
// every run and strategy processes the same prompt.
func PromptIDs(path string, n int) ([]int32, error) {
	tm, normal, err := OrdinaryTokens(path)
	if err != nil {
		return nil, err
	}
	var ids []int32
	if tm.AddBOS && tm.BOS >= 0 {
		ids = append(ids, tm.BOS)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for len(ids) < n {
		ids = append(ids, normal[rng.IntN(len(normal))])
	}
	return ids[:max(n, 1)], nil
}

// RunOnce loads the model, waits for the first token of a prompt of
// PromptTokens tokens and for every weight to be resident, and returns
// what it measured. It samples RssAnon every millisecond (the peak of
// anonymous memory: host-f32's copies, staging buffers), which VmHWM
// cannot separate from the mapped file.
func RunOnce(ctx context.Context, c OnceConfig) Result {
	since := func(t time.Time) float64 { return float64(t.Sub(c.Fork).Microseconds()) / 1000 }
	r := Result{Model: c.Model, Strategy: c.Strategy, Device: c.Device, MainMs: since(time.Now())}
	fail := func(err error) Result { r.Err = err.Error(); return r }

	var anonPeak atomic.Int64
	stopSampler := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			if a := procStatus("RssAnon")["RssAnon"]; a > anonPeak.Load() {
				anonPeak.Store(a)
			}
			select {
			case <-t.C:
			case <-stopSampler:
				return
			}
		}
	}()
	defer func() { close(stopSampler); <-sampled }()

	strategy, err := pipeline.ParseStrategy(c.Strategy)
	if err != nil {
		return fail(err)
	}
	ids := c.PromptIDs
	if ids == nil {
		if ids, err = PromptIDs(c.Model, c.PromptTokens); err != nil {
			return fail(err)
		}
	}
	r.PromptTokens = len(ids)
	tr := newTracer()
	opts := pipeline.Options{Strategy: strategy, Device: c.Device, Threads: c.Threads, Split: c.Split, ExpertProfiles: c.ExpertProfiles}
	if opts.Upload, err = opts.Upload.Parse(c.GPUUpload); err != nil {
		return fail(fmt.Errorf("gpu upload settings: %w", err))
	}
	if c.Trace {
		opts.Hooks.Read = tr.readHook
	}
	m, err := pipeline.Open(ctx, c.Model, opts)
	if err != nil {
		return fail(err)
	}
	defer m.Close()
	r.OpenMs = since(time.Now())
	off := since(m.Started()) // pipeline times → run times
	at := func(d time.Duration) float64 { return off + float64(d.Microseconds())/1000 }

	sub := m.Subscribe()
	drained := make(chan struct{})
	var readB, placedB int64
	var residentB, firstB, totalB int64 // bytes resident; at the first token; planned
	routed, first := 0, false
	go func() {
		defer close(drained)
		for e := range sub.C {
			if c.Trace {
				tr.event(e, m.Started())
			}
			switch e := e.(type) {
			case pipeline.ModelReady:
				r.ReadyMs = at(e.At)
				residentB += e.Bytes
			case pipeline.LayerReady:
				residentB += e.Bytes
			case pipeline.ExpertReady:
				residentB += e.Bytes
			case pipeline.ExpertRun:
				if !first {
					routed++
				}
			case pipeline.AllResident:
				r.ResidentMs = at(e.At)
				totalB = e.Bytes
			case pipeline.FirstToken:
				if r.FirstTokenMs == 0 {
					r.FirstTokenMs = at(e.At)
					first, firstB = true, residentB
				}
			case pipeline.TensorRead:
				readB += e.Bytes
			case pipeline.TensorUploaded:
				placedB += e.Bytes
			}
		}
	}()

	_, err = m.Generate(ctx, "", pipeline.GenerateOptions{MaxTokens: 1, PromptIDs: ids, IgnoreEOG: true})
	// A lazy mixture loads only the experts requests route to: it is
	// never all resident, and its resident column stays empty.
	if err == nil && !m.LazyExperts() {
		err = m.Resident().Wait(ctx)
	}
	r.DevicePeak = m.Memory().Peak()
	if d := m.ContextCurrent(); d > 0 {
		r.ContextMs = at(d)
	}
	cerr := m.Close()
	<-drained
	if err == nil {
		err = cerr
	}
	if err != nil {
		return fail(err)
	}
	r.ReadBytes, r.PlacedBytes = readB, placedB
	r.ExpertsRouted = routed
	for l := range m.Config().Layers {
		r.Experts += m.Experts(l)
	}
	if fi, err := gguf.Open(c.Model); err == nil {
		for i := range fi.Tensors {
			r.FileBytes += int64(fi.Tensors[i].Size)
		}
		fi.Close()
	}
	if totalB == 0 { // no AllResident (a lazy mixture): the file's tensors
		totalB = r.FileBytes
	}
	if totalB > 0 {
		r.ResidentAtFirst = float64(firstB) / float64(totalB)
	}
	if d := r.ResidentMs - off; d > 0 {
		r.LoadBps = float64(r.FileBytes) / (d / 1000)
	}
	if d := r.ResidentMs - r.ContextMs; r.ContextMs > 0 && d > 0 {
		r.LinkBps = float64(r.FileBytes) / (d / 1000)
	}
	st := procStatus("VmHWM", "RssAnon")
	r.PeakRSS = st["VmHWM"]
	r.PeakRssAnon = max(anonPeak.Load(), st["RssAnon"])
	if c.Trace {
		r.Spans = tr.result(off)
	}
	return r
}
