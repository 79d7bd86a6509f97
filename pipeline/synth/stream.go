package synth

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/pipeline/model"
)

// The tensor data is written by a pipeline: a dispatcher cuts every tensor
// into chunks of whole rows, workers fill chunks in parallel, and the
// caller's goroutine writes them in file order. At most `window` chunks
// exist at once, so memory stays bounded (a 70B model's 1 GB token_embd
// never sits in memory whole) while the fill of the next chunks, of the
// same tensor or the next one, overlaps the write of the current one.

const (
	// chunkBytes is the target size of a chunk. Chunk boundaries, and so
	// the random streams, depend only on the tensor's shape.
	chunkBytes = 4 << 20
	// rowsPerChunk rows share one random stream in the quantize fill, as
	// they always have, so its bytes do not change with the chunking.
	rowsPerChunk = 16
	// maxWindow bounds the chunks in flight (and so the memory, 256 MiB)
	// on machines with many cores; a disk is saturated well before.
	maxWindow = 64
)

// plan is how one tensor is cut and filled.
type plan struct {
	t          tensor
	idx        uint64 // the tensor's place in the file: part of every seed
	skip       bool   // Zero: leave a hole
	blocks     bool   // FillBlocks recipe, else draw floats and encode
	rowBytes   int
	rowsPerJob int
	std        float64
	scales     *blockScales // blocks only
}

// job is one chunk: rows [r0, r1) of a tensor, filled into buf.
type job struct {
	p      *plan
	seq    int // chunk index within the tensor
	r0, r1 int
	buf    []byte
	done   chan error // receives exactly one value (capacity 1)
}

// plans cuts the tensors into chunks and picks each one's fill.
func plans(ts []tensor, o *Options) ([]plan, error) {
	ps := make([]plan, len(ts))
	var last *blockScales // consecutive tensors mostly share type and width
	lastType, lastStd := gguf.Type(0), 0.0
	for i, t := range ts {
		rb, err := t.typ.RowBytes(uint64(t.cols))
		if err != nil {
			return nil, fmt.Errorf("synth: tensor %q: %w", t.name, err)
		}
		p := plan{t: t, idx: uint64(i), rowBytes: int(rb), skip: o.Zero && t.kind != kindRopeFreqs && t.kind != model.KindRopeFactors}
		p.std = o.Std
		if t.name == "token_embd.weight" && o.EmbedStd > 0 {
			p.std = o.EmbedStd
		}
		if p.std == 0 {
			p.std = 1 / math.Sqrt(float64(t.cols))
		}
		p.blocks = o.Fill == FillBlocks && t.kind == kindWeight && blockFillable(t.typ)
		p.rowsPerJob = max(1, chunkBytes/p.rowBytes)
		if p.blocks && !p.skip {
			if last == nil || lastType != t.typ || lastStd != p.std {
				last, lastType, lastStd = newBlockScales(t.typ, p.std), t.typ, p.std
			}
			p.scales = last
		} else {
			p.rowsPerJob = (p.rowsPerJob + rowsPerChunk - 1) / rowsPerChunk * rowsPerChunk
		}
		ps[i] = p
	}
	return ps, nil
}

// writeData writes every tensor's data through the fill pipeline. It
// returns only after every goroutine it started has stopped.
func writeData(ctx context.Context, w *gguf.Writer, ts []tensor, o *Options, workers int) (err error) {
	ps, err := plans(ts, o)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	window := min(max(2*workers+2, 4), maxWindow)
	free := make(chan []byte, window) // buffers not in use; one token each
	for range window {
		free <- nil
	}
	order := make(chan *job, window) // chunks in file order, for the writer
	work := make(chan *job)          // chunks to fill, for the workers
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()

	wg.Add(1)
	go func() { // dispatcher
		defer wg.Done()
		defer close(work)
		for i := range ps {
			p := &ps[i]
			if p.skip {
				continue
			}
			for seq, r0 := 0, 0; r0 < p.t.rows; seq, r0 = seq+1, r0+p.rowsPerJob {
				var buf []byte
				select {
				case buf = <-free:
				case <-ctx.Done():
					return
				}
				r1 := min(r0+p.rowsPerJob, p.t.rows)
				need := (r1 - r0) * p.rowBytes
				if cap(buf) < need {
					buf = make([]byte, need)
				}
				j := &job{p: p, seq: seq, r0: r0, r1: r1, buf: buf[:need], done: make(chan error, 1)}
				order <- j // never blocks: a job holds one of window tokens
				select {
				case work <- j:
				case <-ctx.Done():
					j.done <- ctx.Err()
					return
				}
			}
		}
	}()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var scratch []float32
			for j := range work {
				j.done <- fillJob(ctx, j, o, &scratch)
			}
		}()
	}

	for i := range ps {
		p := &ps[i]
		if p.skip {
			if err := w.SkipTensorData(p.t.name); err != nil {
				return fmt.Errorf("synth: %w", err)
			}
			continue
		}
		r := &chunkReader{ctx: ctx, order: order, free: free}
		if err := w.WriteTensorFrom(p.t.name, r); err != nil {
			return fmt.Errorf("synth: %w", err)
		}
		if r.cur != nil { // the tensor ended inside a chunk: cannot happen, sizes are whole rows
			return fmt.Errorf("synth: tensor %q: %d bytes left over", p.t.name, len(r.cur))
		}
	}
	return nil
}

// chunkReader hands one tensor's chunks to the GGUF writer in order,
// waiting for each to be filled, and gives each buffer back once written.
type chunkReader struct {
	ctx   context.Context
	order <-chan *job
	free  chan<- []byte
	cur   []byte // unread part of the current chunk
	buf   []byte // the current chunk's whole buffer
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.cur) == 0 {
		var j *job
		select {
		case j = <-r.order:
		case <-r.ctx.Done():
			return 0, r.ctx.Err()
		}
		select {
		case err := <-j.done:
			if err != nil {
				r.free <- j.buf
				return 0, err
			}
		case <-r.ctx.Done():
			return 0, r.ctx.Err()
		}
		r.cur, r.buf = j.buf, j.buf
	}
	n := copy(p, r.cur)
	r.cur = r.cur[n:]
	if len(r.cur) == 0 {
		r.free <- r.buf // never blocks: the buffer's token came from free
		r.cur, r.buf = nil, nil
	}
	return n, nil
}

// fillJob fills one chunk. scratch is the worker's float buffer for the
// quantize path.
func fillJob(ctx context.Context, j *job, o *Options, scratch *[]float32) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p := j.p
	if p.blocks {
		r := chunkRNG(o.Seed, p.idx, j.seq)
		fillBlocks(p.t.typ, j.buf, p.scales, &r)
		zeroHeadRows(o, p.t.name, j.r0, j.r1, p.rowBytes, j.buf)
		return nil
	}
	// Draw floats 16 rows at a time (each group its own PCG stream, keyed
	// as the original one-buffer-per-tensor writer keyed it) and encode.
	t := p.t
	if need := rowsPerChunk * t.cols; cap(*scratch) < need {
		*scratch = make([]float32, need)
	}
	for r0 := j.r0; r0 < j.r1; r0 += rowsPerChunk {
		if err := ctx.Err(); err != nil {
			return err
		}
		r1 := min(r0+rowsPerChunk, j.r1)
		rng := rand.New(rand.NewPCG(o.Seed, p.idx<<32|uint64(r0/rowsPerChunk)))
		v := (*scratch)[:(r1-r0)*t.cols]
		switch t.kind {
		case kindRopeFreqs:
			llama31Freqs(v, o.Shape.RopeBase)
		case model.KindRopeFactors:
			for i := range v {
				v[i] = float32(1 + 2*math.Abs(rng.NormFloat64()))
			}
		case kindNorm:
			mean := 1.0
			if o.NormMean > 0 {
				mean = o.NormMean
			}
			for i := range v {
				v[i] = float32(mean * (1 + 0.2*rng.NormFloat64()))
			}
		case kindBias:
			for i := range v {
				v[i] = float32(0.5 * rng.NormFloat64())
			}
		default:
			for i := range v {
				v[i] = float32(p.std * rng.NormFloat64())
			}
		}
		off := (r0 - j.r0) * p.rowBytes
		if err := encode(t.typ, v, j.buf[off:off+(r1-r0)*p.rowBytes]); err != nil {
			return fmt.Errorf("synth: tensor %q: %w", t.name, err)
		}
	}
	zeroHeadRows(o, t.name, j.r0, j.r1, p.rowBytes, j.buf)
	return nil
}
