package gguf

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
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
