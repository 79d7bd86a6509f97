package actors

import (
	"fmt"
	"slices"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/forge-llm/forge/actors/progress"
	"github.com/forge-llm/forge/gguf"
)

// Messages of the load pipeline. Each chunk travels as one *chunk from the
// loader to a reader, back to the loader, to a dequantizer worker, to the
// uploader, and its completion back to the loader, which bounds the chunks
// in flight (on a GPU, a PacedUploader's chunk completes once it is staged
// into the pinned ring, so the queue ahead of the ring stays short).
type (
	// loadUnits asks the loader to load units (in the given order, after
	// what is already queued). Units already queued are skipped, so
	// concurrent first uses of a lazy layer load it once. With front the
	// units go before everything queued instead, and the queued chunks of
	// those already queued move there: a request waits on them (an
	// expert its router chose).
	loadUnits struct {
		units []*Unit
		front bool
	}
	// chunk is rows [row0, row0+rows) of one tensor.
	chunk struct {
		t          *Tensor
		off, n     int64 // file bytes, relative to the tensor
		outOff     int64 // converted bytes, relative to the tensor
		outN       int64
		data       []byte // the converted bytes (set by the dequantizer)
		reader     int
		urgent     bool // queued at the front (a demanded unit): counted apart
		readErr    error
		convertErr error
	}
	// chunkRead: a reader is done with a chunk (readErr set on failure).
	chunkRead struct{ c *chunk }
	// chunkDone: a chunk has left the pipeline (uploaded or dropped).
	chunkDone struct{ c *chunk }
	// abort: drop the queued chunks of units from index from on, or with
	// unit set, of that unit only (a failed expert: the others load on).
	abort struct {
		from int
		unit *Unit
	}
	// reserve: make the arena (sent by Start once every actor exists).
	reserve struct{}
	// reserved: the uploader's arena exists; conversion may start.
	reserved struct{}
	// toConvert: a chunk read and ready for a dequantizer worker (loader
	// → dequantizer → converter).
	toConvert struct{ c *chunk }
	// converted: a dequantizer worker is done with a chunk (converter →
	// uploader; the chunk's convertErr says whether it failed).
	converted struct{ c *chunk }
	// landed: a unit's fence completed.
	landed struct{ u *Unit }
)

// loader owns the mapped file: it splits the queued units into chunks,
// in priority order, and hands them to its reader children, at most
// maxInflight at once.
type loader struct {
	s       *System
	readers []*actor.PID
	idle    []int
	queue   []*chunk
	// inflight counts the chunks in flight (Config.MaxInflight, or
	// InflightBytes). urgentIn counts those of demanded units apart: they
	// do not wait for that room (a request waits on them; what is in
	// flight ahead of them is already as much as the queue may hold), and
	// have a bound of their own, the same.
	inflight, urgentIn flight
}

func (l *loader) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *actor.Started:
		for i := range l.s.cfg.Readers {
			pid := c.Spawn(l.s.props(func() actor.Actor { return &reader{s: l.s, id: i} }))
			l.readers = append(l.readers, pid)
			l.idle = append(l.idle, i)
		}
	case *loadUnits:
		var tail []*chunk
		if m.front {
			tail, l.queue = l.queue, nil
			moved := map[*Unit]bool{}
			for _, u := range m.units {
				if u.queued {
					moved[u] = true
				}
			}
			if len(moved) > 0 { // move what they still have queued to the front, in one pass
				tail = slices.DeleteFunc(tail, func(ch *chunk) bool {
					if moved[ch.t.unit] {
						ch.urgent = true
						l.queue = append(l.queue, ch)
						return true
					}
					return false
				})
			}
		}
		fresh := len(l.queue)
	units:
		for _, u := range m.units {
			if u.queued || l.s.dropped(u) {
				continue
			}
			u.queued = true
			if err := l.stacked(u); err != nil {
				break units
			}
			for _, t := range u.Tensors {
				if err := l.split(t); err != nil {
					l.s.fail(u, t.Name(), err)
					if u.IsExpert() {
						continue units // an expert fails alone
					}
					// Units after u fail with it; those before still load.
					break units
				}
			}
		}
		if m.front { // the units queued only now (under Lazy) are as urgent
			for _, ch := range l.queue[fresh:] {
				ch.urgent = true
			}
		}
		l.queue = append(l.queue, tail...)
		l.dispatch(c)
	case *chunkRead:
		l.idle = append(l.idle, m.c.reader)
		t := m.c.t
		if l.s.dropped(t.unit) {
			l.left(m.c)
			l.dispatch(c)
			return
		}
		if m.c.readErr != nil {
			l.left(m.c)
			off := t.FileBase + m.c.off // a piece's bytes, counted in its stacked tensor
			l.s.fail(t.unit, t.Name(), fmt.Errorf("reading bytes [%d, %d): %w", off, off+m.c.n, m.c.readErr))
			l.dispatch(c)
			return
		}
		if t.read++; t.read == t.chunks {
			l.s.publish(progress.TensorRead{At: l.s.bus.Since(), Tensor: t.Name(), Layer: t.Layer, Bytes: int64(t.Info.Size)})
		}
		c.Send(l.s.dequant, &toConvert{c: m.c}) // to the pool, which converts it
		l.dispatch(c)
	case *chunkDone:
		l.left(m.c)
		l.dispatch(c)
	case *abort:
		keep := l.queue[:0]
		for _, ch := range l.queue {
			if m.unit != nil && ch.t.unit != m.unit || m.unit == nil && ch.t.unit.idx < m.from {
				keep = append(keep, ch)
			}
		}
		l.queue = keep
	}
}

// stacked maps a block unit's stacked expert tensors: their bytes come
// with the expert units, but the uploader's Flush of this unit makes their
// Weight (a view of the mapping, for a pass-through) visible. An error
// fails the unit (and those after it).
func (l *loader) stacked(u *Unit) error {
	for _, t := range u.Stacked {
		src, err := l.s.cfg.File.TensorData(t.Info)
		if err != nil {
			err = fmt.Errorf("unreadable range: %w", err)
			l.s.fail(u, t.Name(), err)
			return err
		}
		t.src = src
	}
	return nil
}

// split queues t's chunks: whole rows, about ChunkBytes each.
func (l *loader) split(t *Tensor) error {
	src, err := l.s.cfg.File.TensorData(t.Info)
	if err != nil {
		return fmt.Errorf("unreadable range: %w", err)
	}
	t.src = src
	total := int64(t.Info.Rows())
	if total == 0 { // an empty tensor still passes every stage once
		l.queue = append(l.queue, &chunk{t: t})
		t.chunks = 1
		return nil
	}
	rowBytes := int64(t.Info.RowBytes())
	outRow := t.OutBytes / total
	rows := max(1, l.s.cfg.ChunkBytes/max(rowBytes, 1))
	for r := int64(0); r < total; r += rows {
		n := min(rows, total-r)
		l.queue = append(l.queue, &chunk{t: t, off: r * rowBytes, n: n * rowBytes, outOff: r * outRow, outN: n * outRow})
		t.chunks++
	}
	return nil
}

// dispatch hands queued chunks to idle readers, in order, while there is
// room in flight (a demanded unit's chunks have room of their own).
func (l *loader) dispatch(c actor.Context) {
	for len(l.queue) > 0 && len(l.idle) > 0 {
		ch := l.queue[0]
		f := &l.inflight
		if ch.urgent {
			f = &l.urgentIn
		}
		if !f.room(l.s.cfg) {
			return
		}
		f.n++
		f.bytes += ch.n
		l.queue = l.queue[1:]
		r := l.idle[len(l.idle)-1]
		l.idle = l.idle[:len(l.idle)-1]
		ch.reader = r
		c.Send(l.readers[r], ch)
	}
}

// left counts ch out of flight.
func (l *loader) left(ch *chunk) {
	f := &l.inflight
	if ch.urgent {
		f = &l.urgentIn
	}
	f.n--
	f.bytes -= ch.n
}

// flight is chunks in flight: how many, and their file bytes.
type flight struct {
	n     int
	bytes int64
}

// room reports whether another chunk may go: under InflightBytes while
// fewer bytes than that are in flight, else while fewer than MaxInflight
// chunks are.
func (f *flight) room(cfg Config) bool {
	if cfg.InflightBytes > 0 {
		return f.bytes < cfg.InflightBytes
	}
	return f.n < cfg.MaxInflight
}

// reader reads one chunk at a time: it pages the chunk's bytes in from the
// mapped file (several readers keep a cold disk's queue full). On a GPU
// host it would copy them into a pinned staging buffer instead.
type reader struct {
	s  *System
	id int
}

func (r *reader) Receive(c actor.Context) {
	ch, ok := c.Message().(*chunk)
	if !ok {
		return
	}
	if !r.s.dropped(ch.t.unit) {
		if h := r.s.cfg.Hooks.Read; h != nil {
			ch.readErr = h(r.s.ctx, ch.t.Name(), ch.t.FileBase+ch.off, ch.n)
		}
		// A file truncated or rewritten since it was mapped is caught
		// here, before its pages are touched; one that changes between
		// this check and the read faults, which pageIn reports.
		if ch.readErr == nil {
			ch.readErr = r.s.cfg.File.Check()
		}
		if ch.readErr == nil {
			ch.readErr = r.s.locate(pageIn(ch.t.src[ch.off : ch.off+ch.n]))
		}
	}
	c.Send(c.Parent(), &chunkRead{c: ch})
}

// dequantizer spreads chunks over its workers round-robin. It holds them
// until the uploader has made the arena they are converted into.
type dequantizer struct {
	s       *System
	workers []*actor.PID
	next    int
	ready   bool
	held    []*toConvert
}

func (d *dequantizer) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *actor.Started:
		for range d.s.cfg.Converters {
			d.workers = append(d.workers, c.Spawn(d.s.props(func() actor.Actor { return &converter{s: d.s} })))
		}
	case *reserved:
		d.ready = true
		for _, h := range d.held {
			d.route(c, h)
		}
		d.held = nil
	case *toConvert:
		if !d.ready {
			d.held = append(d.held, m)
			return
		}
		d.route(c, m)
	}
}

func (d *dequantizer) route(c actor.Context, m *toConvert) {
	c.Send(d.workers[d.next], m)
	d.next = (d.next + 1) % len(d.workers)
}

// converter turns one chunk into the backend's format (or passes it
// through) and hands it to the uploader.
type converter struct{ s *System }

func (w *converter) Receive(c actor.Context) {
	m, ok := c.Message().(*toConvert)
	if !ok {
		return
	}
	ch, t := m.c, m.c.t
	if !w.s.dropped(t.unit) {
		src := t.src[ch.off : ch.off+ch.n]
		if t.PassThrough() {
			ch.data = src
		} else if dst, err := w.s.cfg.Uploader.Dest(t, ch.outOff, ch.outN); err != nil {
			ch.convertErr = err
		} else if err := w.convert(t, src, dst); err != nil {
			ch.convertErr = fmt.Errorf("converting %s to %s: %w", t.Info.Type, t.To, err)
		} else {
			ch.data = dst
		}
		if ch.convertErr == nil && int(t.converted.Add(1)) == t.chunks {
			w.s.publish(progress.TensorConverted{At: w.s.bus.Since(), Tensor: t.Name(), Layer: t.Layer,
				From: t.Info.Type, To: t.To, InBytes: int64(t.Info.Size), OutBytes: t.OutBytes})
		}
	}
	c.Send(w.s.uploader, &converted{c: ch})
}

// convert runs the Converter on bytes of the mapping. The reader paged
// them in, but the file may have been truncated since, and then reading
// them raises SIGBUS: the fault becomes the chunk's error (a
// *gguf.FaultError) instead of killing the process. The setting is the
// worker's only for the call: protoactor's goroutines run other actors too.
func (w *converter) convert(t *Tensor, src, dst []byte) error {
	var err error
	if ferr := gguf.CatchFault(func() { err = w.s.cfg.Converter.Convert(t.Info.Type, t.To, src, dst) }); ferr != nil {
		return w.s.locate(ferr)
	}
	return err
}

// uploader owns the Uploader: it makes the arena, uploads converted chunks,
// and resolves a unit's future once all its tensors have landed.
type uploader struct{ s *System }

func (up *uploader) Receive(c actor.Context) {
	s := up.s
	switch m := c.Message().(type) {
	case *reserve:
		if err := s.cfg.Uploader.Reserve(s.plan); err != nil {
			s.failAll(err)
			return
		}
		s.plan.settle()
		c.Send(s.dequant, &reserved{})
	case *converted:
		ch, t := m.c, m.c.t
		// The chunk leaves the loader's count once it is uploaded, or (a
		// paced uploader's) once it leaves the uploader's queue; a failed
		// chunk only after its failure is recorded, so that the read it
		// lets go finds its unit dropped (before, a reader could check
		// the next chunk of a unit whose converter had just faulted and
		// report the file's change as the unit's error instead).
		paced, _ := s.cfg.Uploader.(PacedUploader)
		left := func() { c.Send(s.loader, &chunkDone{c: ch}) }
		if s.dropped(t.unit) {
			left()
			return
		}
		var err error
		if ch.convertErr != nil {
			err = ch.convertErr
		} else if h := s.cfg.Hooks.Upload; h != nil {
			if herr := h(t.Name()); herr != nil {
				err = fmt.Errorf("upload: %w", herr)
			}
		}
		if err == nil {
			if paced != nil {
				if err = paced.UploadThen(t, ch.outOff, ch.data, func() { s.send(s.loader, &chunkDone{c: ch}) }); err != nil {
					err = fmt.Errorf("upload: %w", err)
				}
			} else if err = s.cfg.Uploader.Upload(t, ch.outOff, ch.data); err != nil {
				err = fmt.Errorf("upload: %w", err)
			}
		}
		if err != nil {
			s.fail(t.unit, t.Name(), err)
			left()
			return
		}
		if paced == nil {
			left()
		}
		if t.uploaded++; t.uploaded < t.chunks {
			return
		}
		s.publish(progress.TensorUploaded{At: s.bus.Since(), Tensor: t.Name(), Layer: t.Layer, Bytes: t.OutBytes})
		u := t.unit
		if u.uploaded++; u.uploaded < len(u.Tensors) {
			return
		}
		fence, err := s.cfg.Uploader.Flush(u)
		if err != nil {
			s.fail(u, "", fmt.Errorf("upload: %w", err))
			return
		}
		u.Future.enqueue(fence)
		if fence.Done() {
			s.landed(u)
			return
		}
		// Wait for the device off the mailbox; the result comes back as a
		// message.
		self := c.Self()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := fence.Wait(s.ctx); err != nil {
				if s.ctx.Err() == nil { // else the load was cancelled or closed, which fails what is left
					s.fail(u, "", fmt.Errorf("waiting for the copies: %w", err))
				}
				return
			}
			s.as.Root.Send(self, &landed{u: u})
		}()
	case *landed:
		if !s.dropped(m.u) {
			s.landed(m.u)
		}
	}
}
