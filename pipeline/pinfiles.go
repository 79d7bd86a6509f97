package pipeline

import (
	"log/slog"
	"os"
	"sync"

	"github.com/forge-llm/forge/actors"
	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/rocm"
)

// fileRef is an opened model file shared by its holders: a Model (from
// Open to Close) and, in an Engine, the pin that keeps the file mapped
// and registered across evictions. The last release closes (unmaps) it.
type fileRef struct {
	f    *gguf.File
	mu   sync.Mutex
	refs int
}

func newFileRef(f *gguf.File) *fileRef { return &fileRef{f: f, refs: 1} }

// retain adds a holder; false once the file was closed.
func (r *fileRef) retain() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.refs == 0 {
		return false
	}
	r.refs++
	return true
}

// release drops a holder and closes the file after the last one.
func (r *fileRef) release() error {
	r.mu.Lock()
	r.refs--
	n := r.refs
	r.mu.Unlock()
	switch {
	case n < 0:
		panic("pipeline: model file released more often than held")
	case n == 0:
		return r.f.Close()
	}
	return nil
}

// filePin is an Engine's hold on one served model's file between its
// loads: the mapping stays open (an eviction no longer pays its 45-88 ms
// munmap) and its pages registered with the driver, so the model's next
// load copies at the link's rate (actors.PinnedFile).
type filePin struct {
	ref  *fileRef
	info os.FileInfo // the file when pinned: a file replaced since is not this one
	pf   *actors.PinnedFile
}

// pinLocked starts pinning inst's file (its model is all resident) where
// the engine keeps pinned files, the model is on the engine's GPU and the
// file fits within EngineOptions.PinFiles beside the files already
// pinned (e.mu held).
func (e *Engine) pinLocked(ent *entry, inst *instance) {
	m := inst.m
	if e.o.PinFiles <= 0 || e.closed || ent.pin != nil || ent.inst != inst || m == nil || m.fref == nil {
		return
	}
	data := m.f.Mapped()
	if len(data) == 0 || e.pinnedBytes+int64(len(data)) > e.o.PinFiles {
		return
	}
	pin := e.pinner(m)
	if pin == nil {
		return
	}
	info, err := os.Stat(inst.path)
	if err != nil || !m.fref.retain() {
		return
	}
	size := int64(len(data))
	e.pinWG.Add(1)
	pf, err := pin(data, func() {
		defer e.pinWG.Done()
		if err := m.fref.release(); err != nil {
			slog.Warn("pipeline: closing a pinned model file", "path", inst.path, "err", err)
		}
	})
	if err != nil {
		e.pinWG.Done()
		_ = m.fref.release()
		e.log.Debug("not pinning the model's file", "model", ent.id, "err", err)
		return
	}
	ent.pin = &filePin{ref: m.fref, info: info, pf: pf}
	e.pinnedBytes += size
	e.log.Debug("pinning the model's file for its next loads", "model", ent.id, "bytes", size, "pinned in all", e.pinnedBytes)
}

// pinner returns how m's file is pinned, or nil where it is not: a model
// on the engine's GPU whose device can register a read-only mapping (or
// the engine's newPin, in tests).
func (e *Engine) pinner(m *Model) func(data []byte, onFree func()) (*actors.PinnedFile, error) {
	if e.newPin != nil {
		return e.newPin
	}
	if m.dev == nil || m.dev.o.shared != e.gpu {
		return nil
	}
	w := e.gpu.pinWorker()
	if w == nil {
		return nil
	}
	return func(data []byte, onFree func()) (*actors.PinnedFile, error) {
		return actors.NewPinnedFile(w, data, 0, onFree)
	}
}

// unpinLocked drops ent's pin: its registrations are undone and its file
// closed once no load reads it any more (e.mu held; nothing waits here).
func (e *Engine) unpinLocked(ent *entry) {
	p := ent.pin
	if p == nil {
		return
	}
	ent.pin = nil
	e.pinnedBytes -= int64(len(p.ref.f.Mapped()))
	p.pf.Drop()
}

// pinnedFileLocked returns ent's pinned file for a load of path, held for
// the load (the Model releases it at Close), or nil; a pin whose file was
// replaced on disk is dropped (e.mu held).
func (e *Engine) pinnedFileLocked(ent *entry, path string) (*fileRef, *actors.PinnedFile) {
	p := ent.pin
	if p == nil {
		return nil, nil
	}
	if st, err := os.Stat(path); err != nil || !os.SameFile(st, p.info) || st.ModTime() != p.info.ModTime() || st.Size() != p.info.Size() {
		e.unpinLocked(ent)
		return nil, nil
	}
	if !p.ref.retain() {
		e.unpinLocked(ent)
		return nil, nil
	}
	return p.ref, p.pf
}

// PinnedBytes is how many bytes of served files the engine keeps pinned
// (registered, or being registered) now.
func (e *Engine) PinnedBytes() int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.pinnedBytes
}

// pinWorker is the thread that registers served files' pages (a sibling
// of the uploaders' thread, made on first use and closed with the
// device), or nil where the device cannot register a read-only mapping.
func (s *sharedGPU) pinWorker() *rocm.Worker {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.cur
	if s.closed || d == nil {
		return nil
	}
	select {
	case <-d.done:
	default:
		return nil
	}
	if d.err != nil || d.upW == nil || d.upW.Device.Backend != rocm.CUDA || !d.upW.Device.ReadOnlyRegister {
		return nil
	}
	if d.pinW == nil {
		w, err := d.upW.Sibling()
		if err != nil {
			slog.Debug("pipeline: no thread for pinning served files", "err", err)
			return nil
		}
		d.pinW = w
	}
	return d.pinW
}
