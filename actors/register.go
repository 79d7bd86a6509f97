// This file holds the DeviceUploader's read-only registration path
// (Register): pass-through tensors are copied straight from the mapped file,
// registered with the driver in page-aligned ranges by threads running ahead
// of the chunks in load order. It is kept because registration wins where
// it is paid once (Pinned, a registration kept across swaps, pinned.go;
// bench/results/2026-11-25-night-swap-h100.md), and for comparison with the
// staging ring.

package actors

import (
	"context"
	"log/slog"
	"sort"
	"time"
	"unsafe"

	"github.com/forge-llm/forge/rocm"
)

// piece is one registration range of the mapped file.
type piece struct {
	lo, hi uintptr
	unit   *unitState
	done   chan struct{} // closed once registered (reg) or failed (err)
	reg    *rocm.Registered
	err    error
}

// osPage is the granularity of host registration.
const osPage = 4096

// span is a page range [lo, hi) of the mapped file.
type span struct{ lo, hi uintptr }

// plan lays out the registration ranges of every pass-through tensor in
// load order, given one chunk (data at offset off of tensor t) to find
// where the file is mapped: every tensor view is a slice of one mapping.
// Neighbouring tensors that share a page register it once (the driver
// refuses overlapping registrations); a range never spans two units.
// Called with d.mu held.
func (d *DeviceUploader) plan(t *Tensor, off int64, data []byte) {
	d.planned = true
	base := uintptr(unsafe.Pointer(unsafe.SliceData(data))) - uintptr(off) - uintptr(t.Info.Offset)
	var covered []span // sorted, disjoint
	var units []*unitState
	for _, us := range d.units {
		units = append(units, us)
	}
	sort.Slice(units, func(a, b int) bool { return units[a].u.idx < units[b].u.idx })
	for _, us := range units {
		var last *piece
		for _, tn := range us.u.Tensors {
			if !tn.PassThrough() || tn.OutBytes == 0 {
				continue
			}
			lo := (base + uintptr(tn.Info.Offset)) &^ (osPage - 1)
			hi := (base + uintptr(tn.Info.Offset) + uintptr(tn.OutBytes) + osPage - 1) &^ (osPage - 1)
			for _, g := range gaps(covered, lo, hi) {
				for g.lo < g.hi {
					if last != nil && last.hi == g.lo && last.hi-last.lo < uintptr(d.RegBytes) {
						n := min(g.hi-g.lo, uintptr(d.RegBytes)-(last.hi-last.lo))
						last.hi += n
						g.lo += n
						continue
					}
					n := min(g.hi-g.lo, uintptr(d.RegBytes))
					last = &piece{lo: g.lo, hi: g.lo + n, unit: us, done: make(chan struct{})}
					d.pieces = append(d.pieces, last)
					g.lo += n
				}
			}
			covered = insertSpan(covered, span{lo, hi})
		}
	}
	d.byAddr = append([]*piece(nil), d.pieces...)
	sort.Slice(d.byAddr, func(a, b int) bool { return d.byAddr[a].lo < d.byAddr[b].lo })
}

// startRegistrars starts the registration threads. Called with d.mu held.
func (d *DeviceUploader) startRegistrars() {
	for _, w := range d.regW {
		d.wg.Add(1)
		go d.registrar(w)
	}
}

// gaps returns the parts of [lo, hi) that no span of covered (sorted,
// disjoint) covers, in order.
func gaps(covered []span, lo, hi uintptr) []span {
	var out []span
	// The first span ending after lo.
	i := sort.Search(len(covered), func(i int) bool { return covered[i].hi > lo })
	for ; lo < hi; i++ {
		if i == len(covered) || covered[i].lo >= hi {
			out = append(out, span{lo, hi})
			break
		}
		if covered[i].lo > lo {
			out = append(out, span{lo, covered[i].lo})
		}
		lo = covered[i].hi
	}
	return out
}

// insertSpan adds s to covered (sorted, disjoint), merging what it touches.
func insertSpan(covered []span, s span) []span {
	i := sort.Search(len(covered), func(i int) bool { return covered[i].hi >= s.lo })
	j := i
	for j < len(covered) && covered[j].lo <= s.hi {
		s.lo, s.hi = min(s.lo, covered[j].lo), max(s.hi, covered[j].hi)
		j++
	}
	out := append(covered[:i:i], s)
	return append(out, covered[j:]...)
}

// covering returns the registration ranges under data, in order, or nil
// where some byte of data is in none.
func (d *DeviceUploader) covering(data []byte) []*piece {
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(data)))
	hi := lo + uintptr(len(data))
	i := sort.Search(len(d.byAddr), func(i int) bool { return d.byAddr[i].hi > lo })
	var out []*piece
	for at := lo; at < hi; i++ {
		if i == len(d.byAddr) || d.byAddr[i].lo > at {
			return nil
		}
		out = append(out, d.byAddr[i])
		at = d.byAddr[i].hi
	}
	return out
}

// registrar registers ranges read-only on its thread, in load order.
func (d *DeviceUploader) registrar(w *rocm.Worker) {
	defer d.wg.Done()
	for {
		select {
		case <-d.quit:
			return
		default:
		}
		i := d.regNext.Add(1) - 1
		if i >= int64(len(d.pieces)) {
			return
		}
		p := d.pieces[i]
		t0 := time.Now()
		p.err = w.Do(context.Background(), func(c *rocm.Ctx) error {
			var err error
			p.reg, err = c.Register(unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(nil), p.lo)), int(p.hi-p.lo)), true)
			return err
		})
		d.stats.add(func(s *DeviceStats) {
			s.RegisterTime += time.Since(t0)
			if p.err == nil {
				s.Registrations++
				s.RegisteredBytes += int64(p.hi - p.lo)
			}
		})
		if p.err != nil {
			slog.Info("actors: read-only registration of the mapped file failed; copying through pinned staging", "err", p.err)
		}
		close(p.done)
	}
}

// registeredCopies hands chunks to the copy thread, in order, as soon as
// the ranges under them are registered (split where a chunk crosses from
// one range into the next: a copy's source must lie in one registration).
// A chunk on a range that failed to register goes through the ring.
func (d *DeviceUploader) registeredCopies() {
	defer d.wg.Done()
	for {
		var j *job
		select {
		case j = <-d.regJobs:
		case <-d.quit:
			return
		}
		t0 := time.Now()
		ok := true
		for _, p := range j.pieces {
			select {
			case <-p.done:
			case <-d.quit:
				return
			}
			ok = ok && p.err == nil
		}
		d.stats.add(func(s *DeviceStats) { s.RegisterWait += time.Since(t0) })
		if !ok {
			j.pieces = nil // staged for good
			if !d.stage(j) {
				return
			}
			continue
		}
		src := uintptr(unsafe.Pointer(unsafe.SliceData(j.data)))
		end := src + uintptr(len(j.data))
		dst := j.dst
		for i, p := range j.pieces {
			n := min(end, p.hi) - src
			if !d.send(op{us: j.us, dst: dst, src: src, n: int(n), slot: -1, last: i == len(j.pieces)-1}) {
				return
			}
			src += n
			dst += rocm.DevPtr(n)
		}
		j.finish()
	}
}

// Registrations is the number of registered ranges (for tests).
func (d *DeviceUploader) Registrations() int { return d.Stats().Registrations }
