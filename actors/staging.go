// This file holds the DeviceUploader's staging ring: stagers copy chunks
// into a ring of pinned host buffers and the copier, on the copy thread,
// queues the asynchronous copies out of it and gives buffers back once
// their copies are done. It is the default path because several stagers
// fill a pinned ring faster than the driver registers memory
// (DESIGN.md, "Moving bytes fast").

package actors

import (
	"fmt"
	"log/slog"
	"time"
	"unsafe"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/rocm"
)

// job is one uploaded chunk.
type job struct {
	us     *unitState
	dst    rocm.DevPtr
	data   []byte
	pieces []*piece // the registered ranges under data (registered path)
	urgent bool     // its unit was demanded: staged before the others
	done   func()   // UploadThen's: the chunk has left the queue
}

// finish tells the loader, once, that j has left the uploader's queue
// (UploadThen).
func (j *job) finish() {
	if j.done != nil {
		j.done()
		j.done = nil
	}
}

// op is one copy for the copy thread.
type op struct {
	us   *unitState
	dst  rocm.DevPtr
	src  uintptr
	n    int
	slot int  // staging buffer, or -1 for a registered source
	last bool // the chunk's last copy
	err  error
}

// stage queues j for the staging ring, starting the ring and its stagers
// on first use. It reports false once Release has begun.
func (d *DeviceUploader) stage(j *job) bool {
	d.stageMu.Lock()
	if d.stopped {
		d.stageMu.Unlock()
		return false
	}
	if !d.staging {
		d.staging = true
		d.wg.Add(1 + d.Stagers)
		go d.pinRing()
		for range d.Stagers {
			go d.stager()
		}
	}
	d.stageMu.Unlock()
	q := d.jobs
	if j.urgent {
		q = d.urgent
	}
	select {
	case q <- j:
		return true
	case <-d.quit:
		return false
	}
}

// next is the next job for a stager: a demanded unit's before the rest;
// nil once the uploader is released.
func (d *DeviceUploader) next() *job {
	select {
	case j := <-d.urgent:
		return j
	default:
	}
	select {
	case j := <-d.urgent:
		return j
	case j := <-d.jobs:
		return j
	case <-d.quit:
		return nil
	}
}

// pinRing makes the staging ring (see pinStagingRing), or borrows one
// from Rings, and hands its buffers to the stagers as they become usable.
// Without a ring nothing can be staged: the stagers fail what comes.
func (d *DeviceUploader) pinRing() {
	defer d.wg.Done()
	t0 := time.Now()
	ready := func(i int, buf []byte, ev rocm.Event) {
		d.ring[i], d.ringEv[i] = buf, ev
		d.free <- i
	}
	var r *StagingRing
	var reused bool
	var err error
	if d.Rings != nil {
		r, reused, err = d.Rings.get(d.RingBuffers, d.RingBytes, ready, d.quit)
	} else {
		r, err = pinStagingRing(d.W, d.RingBuffers, d.RingBytes, ready, d.quit)
	}
	d.stats.add(func(s *DeviceStats) {
		s.RingPinTime, s.RingReady, s.RingReused = time.Since(t0), time.Since(d.reserveAt), reused
	})
	if err != nil {
		slog.Error("actors: staging ring", "err", err)
		d.free <- -1
		return
	}
	d.rng = r
}

// stager copies queued chunks into free ring buffers and hands them to the
// copy thread.
func (d *DeviceUploader) stager() {
	defer d.wg.Done()
	for {
		j := d.next()
		if j == nil {
			return
		}
		data, dst := j.data, j.dst
		for len(data) > 0 {
			t0 := time.Now()
			var slot int
			select {
			case slot = <-d.free:
			case <-d.quit:
				return
			}
			if slot < 0 {
				d.free <- slot // for the other stagers
				d.send(op{us: j.us, slot: -1, last: true, err: fmt.Errorf("no pinned staging buffer")})
				break
			}
			t1 := time.Now()
			buf := d.ring[slot]
			n := min(len(buf), len(data))
			err := gguf.CopyMapped(buf[:n], data[:n])
			d.stats.add(func(s *DeviceStats) {
				s.RingWait += t1.Sub(t0)
				s.StageCopyTime += time.Since(t1)
				s.StagedBytes += int64(n)
			})
			src := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
			if !d.send(op{us: j.us, dst: dst, src: src, n: n, slot: slot, last: n == len(data), err: err}) {
				return
			}
			if err != nil {
				break
			}
			data, dst = data[n:], dst+rocm.DevPtr(n)
		}
		j.finish()
	}
}

// send hands o to the copy thread unless the uploader is released.
func (d *DeviceUploader) send(o op) bool {
	select {
	case d.ops <- o:
		return true
	case <-d.quit:
		return false
	}
}

// copier is the copy thread's feeder: it queues the copies it is handed
// (several per round trip to the worker), records the ring buffers' and
// the units' events, and gives ring buffers back once their copies are
// done.
func (d *DeviceUploader) copier() {
	defer d.wg.Done()
	var inflight []int // ring buffers with a copy queued, oldest first
	batch := make([]op, 0, 64)
	for {
		batch = batch[:0]
		select {
		case o := <-d.ops:
			batch = append(batch, o)
		case <-d.quit:
			return
		default:
			// Nothing to queue. While copies are in flight, wait for the
			// oldest (a 4 MiB copy takes ~80 µs) and give back every
			// buffer whose copy is done: given back only when the next
			// chunk came, they kept the stagers waiting for buffers
			// already free (a quarter of their time on the H100 host).
			if len(inflight) > 0 {
				t0 := time.Now()
				var done []int
				err := d.do(func(c *rocm.Ctx) error {
					err := c.SyncEvent(d.ringEv[inflight[0]])
					done, inflight = append(done, inflight[0]), inflight[1:]
					if err == nil {
						done, inflight = d.copied(c, done, inflight)
					}
					return err
				})
				d.stats.add(func(s *DeviceStats) { s.ReclaimWait += time.Since(t0) })
				if err != nil {
					slog.Error("actors: staging copy failed", "err", err)
					if len(done) == 0 { // the worker is gone: never wait on it again
						done, inflight = append(done, inflight[0]), inflight[1:]
					}
				}
				for _, i := range done {
					d.free <- i
				}
				continue
			}
			select {
			case o := <-d.ops:
				batch = append(batch, o)
			case <-d.quit:
				return
			}
		}
	more:
		for len(batch) < cap(batch) {
			select {
			case o := <-d.ops:
				batch = append(batch, o)
			default:
				break more
			}
		}
		var done []int
		var record []*unitState
		var failed []struct {
			us  *unitState
			err error
		}
		err := d.do(func(c *rocm.Ctx) error {
			for _, o := range batch {
				if o.err == nil {
					if err := c.CopyHtoDAsync(o.dst, o.src, o.n, d.stream); err != nil {
						o.err = fmt.Errorf("copying %d bytes (host %#x) to device %#x: %w", o.n, o.src, o.dst, err)
					} else if o.slot >= 0 {
						if err := c.Record(d.ringEv[o.slot], d.stream); err != nil {
							o.err = err
						} else {
							inflight = append(inflight, o.slot)
							o.slot = -1
						}
					}
				}
				if o.slot >= 0 { // failed: the buffer is free again
					done = append(done, o.slot)
				}
				if o.err != nil {
					failed = append(failed, struct {
						us  *unitState
						err error
					}{o.us, o.err})
				}
				if o.last && o.us.finish(true, false) {
					record = append(record, o.us)
				}
			}
			for _, us := range record {
				err := c.Record(us.ev, d.stream)
				if err != nil {
					err = fmt.Errorf("%s: recording its copy event: %w", us.u.Name(), err)
				}
				us.close(err)
			}
			done, inflight = d.copied(c, done, inflight)
			return nil
		})
		now := time.Since(d.reserveAt)
		d.stats.add(func(s *DeviceStats) {
			s.Batches++
			s.CopyCalls += len(batch)
			if s.FirstCopy == 0 {
				s.FirstCopy = now
			}
			s.LastCopy = now
		})
		for _, f := range failed {
			f.us.close(f.err)
		}
		if err != nil { // the worker is gone
			for _, o := range batch {
				o.us.close(err)
			}
		}
		for _, i := range done {
			d.free <- i
		}
	}
}

// copied moves the ring buffers at the front of inflight (oldest first)
// whose copies are done to done, stopping at the first still in flight.
func (d *DeviceUploader) copied(c *rocm.Ctx, done, inflight []int) ([]int, []int) {
	for len(inflight) > 0 {
		if ok, err := c.Query(d.ringEv[inflight[0]]); err != nil || !ok {
			break
		}
		done, inflight = append(done, inflight[0]), inflight[1:]
	}
	return done, inflight
}
