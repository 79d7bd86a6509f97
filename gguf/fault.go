package gguf

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"time"
	"unsafe"
)

// ErrMappingFault is matched (errors.Is) by every *FaultError: touching
// memory mapped from a file faulted, because the file was truncated or
// rewritten in place under the mapping, or the disk returned an I/O error.
var ErrMappingFault = errors.New("memory fault reading the mapped model file (file truncated, rewritten in place, or an I/O error)")

// ErrFileChanged is matched by every *ChangedError: the open file's size or
// modification time is no longer what it was when it was mapped.
var ErrFileChanged = errors.New("model file changed on disk while in use")

// MappingBroken reports whether err says that a mapped file can no longer
// be trusted (a fault reading it, or a size or time change): whoever holds
// the mapping should stop using it, since every later read may fault or
// return bytes of another file.
func MappingBroken(err error) bool {
	return errors.Is(err, ErrMappingFault) || errors.Is(err, ErrFileChanged)
}

// FaultError is a fault (SIGBUS, or an error of the kernel paging the file
// in) turned into an error instead of a crash of the process.
type FaultError struct {
	// File is the mapped file, "" when the code that faulted did not know
	// which file the memory belongs to (a kernel reading a weight); File.Locate
	// fills it in.
	File string
	// Offset is the file offset of the faulting byte, -1 when unknown.
	Offset int64
	// Addr is the faulting address (0 when the kernel reported the error
	// without one, as madvise does).
	Addr uintptr
	// Err is the runtime's fault error or the system call's error.
	Err error
}

func (e *FaultError) Error() string {
	msg := ErrMappingFault.Error()
	switch {
	case e.File != "" && e.Offset >= 0:
		msg = fmt.Sprintf("%s: offset %d: %s", e.File, e.Offset, msg)
	case e.File != "":
		msg = e.File + ": " + msg
	case e.Addr != 0:
		msg = fmt.Sprintf("%s at %#x", msg, e.Addr)
	}
	// The runtime's own text for a fault ("invalid memory address or nil
	// pointer dereference") misleads here; a system call's error does not.
	if _, rt := e.Err.(runtime.Error); e.Err != nil && !rt {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is makes errors.Is(err, ErrMappingFault) true.
func (e *FaultError) Is(target error) bool { return target == ErrMappingFault }

func (e *FaultError) Unwrap() error { return e.Err }

// AsFault turns a value recovered from a panic into a *FaultError when it is
// the runtime's memory-fault error (what a fault becomes on a goroutine with
// debug.SetPanicOnFault(true): it has an Addr method). Anything else is not
// a fault: the caller re-panics with it.
func AsFault(r any) (*FaultError, bool) {
	rf, ok := r.(interface{ Addr() uintptr })
	if !ok {
		return nil, false
	}
	fe := &FaultError{Offset: -1, Addr: rf.Addr()}
	if err, ok := r.(error); ok {
		fe.Err = err
	}
	return fe, true
}

// CatchFault runs fn, which reads memory mapped from a file, with faults
// turned into a *FaultError: a read of a page the file no longer has (it
// was truncated) raises SIGBUS, which would kill the process. It restores
// the goroutine's fault setting, and panics that are not faults go on.
func CatchFault(fn func()) (err error) {
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if r := recover(); r != nil {
			fe, ok := AsFault(r)
			if !ok {
				panic(r)
			}
			err = fe
		}
	}()
	fn()
	return nil
}

// ChangedError says how an open file changed since it was mapped.
type ChangedError struct {
	File             string
	Size, WasSize    int64
	ModTime, WasTime time.Time
	Err              error // the fstat error, when the file could not be checked
}

func (e *ChangedError) Error() string {
	switch {
	case e.Err != nil:
		return fmt.Sprintf("%s: %s: checking it: %v", e.File, ErrFileChanged, e.Err)
	case e.Size < e.WasSize:
		return fmt.Sprintf("%s: %s: truncated to %d bytes, was %d when mapped", e.File, ErrFileChanged, e.Size, e.WasSize)
	case e.Size != e.WasSize:
		return fmt.Sprintf("%s: %s: size %d bytes, was %d when mapped", e.File, ErrFileChanged, e.Size, e.WasSize)
	default:
		return fmt.Sprintf("%s: %s: modified at %s, mapped at modification time %s", e.File, ErrFileChanged,
			e.ModTime.UTC().Format(time.RFC3339Nano), e.WasTime.UTC().Format(time.RFC3339Nano))
	}
}

// Is makes errors.Is(err, ErrFileChanged) true.
func (e *ChangedError) Is(target error) bool { return target == ErrFileChanged }

func (e *ChangedError) Unwrap() error { return e.Err }

// Check compares the open file (fstat on its descriptor, so it is the file
// that is mapped, even if the path now names another one) with what it was
// when Open mapped it, and returns a *ChangedError if its size or
// modification time differ: a file truncated under the mapping faults when
// read, and one rewritten in place hands out bytes of another model. A
// file replaced by rename is not a change: the mapping keeps the old one.
// Files not opened by Open have nothing to check. It costs one system call.
func (f *File) Check() error {
	osf := f.osf
	if osf == nil {
		return nil
	}
	st, err := osf.Stat()
	if err != nil {
		return &ChangedError{File: f.Path, WasSize: f.Size, WasTime: f.modTime, Err: err}
	}
	if st.Size() != f.Size || !st.ModTime().Equal(f.modTime) {
		return &ChangedError{File: f.Path, Size: st.Size(), WasSize: f.Size, ModTime: st.ModTime(), WasTime: f.modTime}
	}
	return nil
}

// Locate completes a *FaultError inside err that does not yet name its file
// (one raised by code that only had a view of the mapping, such as a CPU
// kernel reading a weight) when its address lies in this file's mapping:
// it sets File and Offset and reports true.
func (f *File) Locate(err error) bool {
	var fe *FaultError
	if !errors.As(err, &fe) || fe.File != "" || fe.Addr == 0 || len(f.mmap) == 0 {
		return false
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(f.mmap)))
	if fe.Addr < base || fe.Addr-base >= uintptr(len(f.mmap)) {
		return false
	}
	fe.File, fe.Offset = f.Path, int64(fe.Addr-base)
	return true
}
