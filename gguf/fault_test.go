package gguf

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

// A mapped file truncated under a live view: ReadTensor must return an
// error where a plain read of the view would kill the process with SIGBUS.
func TestReadTensorAfterTruncate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "shrink.gguf")
	out, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := NewWriter(out)
	w.AddString("general.architecture", "llama")
	w.AddTensor("small", TypeF32, 16)
	w.AddTensor("big", TypeF32, 1024, 256) // 1 MiB, many pages
	w.WriteHeader()
	small := make([]byte, 64)
	big := make([]byte, 1<<20)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range big {
		big[i] = byte(rng.Uint32())
	}
	w.WriteTensorData("small", small)
	w.WriteTensorData("big", big)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	out.Close()

	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	bt, _ := f.Tensor("big")
	view, err := f.TensorData(bt)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(big))
	if err := f.ReadTensor(bt, 0, got); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("read before truncation: %v", err)
	}

	// Cut the file inside "small", so every page of "big" is gone.
	if err := os.Truncate(path, f.DataOffset+8); err != nil {
		t.Fatal(err)
	}
	err = f.ReadTensor(bt, 4096*10, got[:8192])
	if err == nil || !strings.Contains(err.Error(), "memory fault") || !strings.Contains(err.Error(), `tensor "big"`) {
		t.Fatalf("ReadTensor after truncation: %v", err)
	}
	// The same through the exported helper, straight from the view.
	if err := CopyMapped(got, view); err == nil {
		t.Fatal("CopyMapped after truncation: no error")
	}
	// The goroutine's fault setting is put back as it was.
	if debug.SetPanicOnFault(false) {
		t.Error("SetPanicOnFault left on after CopyMapped")
	}
}

// writeBig writes a file with a 64-byte tensor "small" then a 1 MiB tensor
// "big" and returns its path.
func writeBig(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "model.gguf")
	out, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	w := NewWriter(out)
	w.AddString("general.architecture", "llama")
	w.AddTensor("small", TypeF32, 16)
	w.AddTensor("big", TypeF32, 1024, 256)
	w.WriteHeader()
	w.WriteTensorData("small", make([]byte, 64))
	w.WriteTensorData("big", make([]byte, 1<<20))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// Check sees a file truncated or rewritten in place under its mapping
// (size or modification time), but not one replaced by rename: the mapping
// keeps the old file, which is still sound.
func TestCheck(t *testing.T) {
	path := writeBig(t)
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Check(); err != nil {
		t.Fatalf("Check of an untouched file: %v", err)
	}

	// Replaced by rename (how a careful writer updates a file): fine.
	other := writeBig(t)
	if err := os.Rename(other, path); err != nil {
		t.Fatal(err)
	}
	if err := f.Check(); err != nil {
		t.Fatalf("Check after the path was renamed over: %v", err)
	}
	f.Close()

	f, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Rewritten in place at the same size: only the time tells.
	st, _ := os.Stat(path)
	later := st.ModTime().Add(time.Second)
	if err := os.Chtimes(path, later, later); err != nil {
		t.Fatal(err)
	}
	err = f.Check()
	var ce *ChangedError
	if !errors.Is(err, ErrFileChanged) || !MappingBroken(err) || !errors.As(err, &ce) || ce.Size != ce.WasSize {
		t.Fatalf("Check after the time changed: %v", err)
	}
	// Truncated (what `forge gen -o` over it does first).
	if err := os.Truncate(path, f.Size/2); err != nil {
		t.Fatal(err)
	}
	err = f.Check()
	if !errors.As(err, &ce) || ce.Size != f.Size/2 || ce.WasSize != f.Size || !strings.Contains(err.Error(), "truncated") {
		t.Fatalf("Check after truncation: %v", err)
	}

	// A File not opened from a path has nothing to check.
	b, err := os.ReadFile(writeBig(t))
	if err != nil {
		t.Fatal(err)
	}
	rf, err := OpenReaderAt(bytes.NewReader(b), int64(len(b)), "mem")
	if err != nil {
		t.Fatal(err)
	}
	if err := rf.Check(); err != nil {
		t.Fatalf("Check of a ReaderAt file: %v", err)
	}
}

// A fault raised by code that only had a view of the mapping (a kernel)
// gets its file and offset from Locate; CatchFault turns the fault into a
// *FaultError and lets every other panic through.
func TestCatchFaultAndLocate(t *testing.T) {
	path := writeBig(t)
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	bt, _ := f.Tensor("big")
	view, err := f.TensorData(bt)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, f.DataOffset); err != nil {
		t.Fatal(err)
	}
	const at = 3 << 16 // well past the page that holds the header's end
	var got byte
	err = CatchFault(func() { got = view[at] })
	var fe *FaultError
	if !errors.As(err, &fe) || !errors.Is(err, ErrMappingFault) || !MappingBroken(err) || fe.File != "" || fe.Offset != -1 {
		t.Fatalf("CatchFault: %v (read %d)", err, got)
	}
	if !f.Locate(err) {
		t.Fatalf("Locate did not place %#x in the mapping", fe.Addr)
	}
	if want := f.FileOffset(bt) + at; fe.File != path || fe.Offset != want {
		t.Fatalf("located at %s:%d, want %s:%d", fe.File, fe.Offset, path, want)
	}
	if f.Locate(err) {
		t.Error("Locate placed a fault that already names its file")
	}
	if f.Locate(&FaultError{Offset: -1, Addr: 1}) {
		t.Error("Locate placed an address outside the mapping")
	}
	// ReadTensor names file, tensor and offset.
	err = f.ReadTensor(bt, at, make([]byte, 16))
	if !errors.As(err, &fe) || fe.Offset != f.FileOffset(bt)+at || !strings.Contains(err.Error(), `tensor "big"`) {
		t.Fatalf("ReadTensor: %v", err)
	}

	// Not a fault: the panic goes on, and the setting is put back.
	func() {
		defer func() {
			if r := recover(); r != "not a fault" {
				t.Errorf("recovered %v", r)
			}
		}()
		_ = CatchFault(func() { panic("not a fault") })
	}()
	if debug.SetPanicOnFault(false) {
		t.Error("SetPanicOnFault left on after CatchFault")
	}
}
