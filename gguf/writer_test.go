package gguf

import (
	"bytes"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/forge-llm/forge/gguf/testmodels"
)

// allValues has one metadata entry of every value type, arrays of every
// element type, an array of strings and arrays nested two deep.
func allValues() []KV {
	return []KV{
		{"general.architecture", Str("llama")},
		{"t.u8", Uint8(200)}, {"t.i8", Int8(-100)}, {"t.u16", Uint16(60000)}, {"t.i16", Int16(-30000)},
		{"t.u32", Uint32(4e9)}, {"t.i32", Int32(-2e9)}, {"t.u64", Uint64(1 << 63)}, {"t.i64", Int64(-1 << 62)},
		{"t.f32", Float32(1.5)}, {"t.f64", Float64(math.Pi)}, {"t.bool", Bool(true)}, {"t.str", Str("héllo\x00world")},
		{"t.empty", Str("")},
		{"a.u8", ArrayOf([]uint8{1, 2, 255})}, {"a.i8", ArrayOf([]int8{-1, 2})}, {"a.u16", ArrayOf([]uint16{65535})},
		{"a.i16", ArrayOf([]int16{-5, 5})}, {"a.u32", ArrayOf([]uint32{7, 8, 9})}, {"a.i32", ArrayOf([]int32{-7, 8})},
		{"a.u64", ArrayOf([]uint64{1 << 40})}, {"a.i64", ArrayOf([]int64{-1 << 40})}, {"a.f32", ArrayOf([]float32{0.25, -2})},
		{"a.f64", ArrayOf([]float64{1e300})}, {"a.bool", ArrayOf([]bool{true, false, true})},
		{"a.str", ArrayOf([]string{"a", "", "ccc", "<0x0A>"})}, {"a.empty", ArrayOf([]string{})},
		{"a.nested", ArrayOf([]Value{ArrayOf([]int32{1, 2}), ArrayOf([]string{"x", "yz"}),
			ArrayOf([]Value{ArrayOf([]float32{3}), ArrayOf([]uint8{})})})},
	}
}

type wtensor struct {
	name string
	typ  Type
	dims []uint64
}

var wtensors = []wtensor{
	{"a.weight", TypeF32, []uint64{3, 5}},
	{"b.weight", TypeQ4_0, []uint64{64, 2}},
	{"c.weight", TypeQ6_K, []uint64{256, 3, 1, 2}},
	{"d.bias", TypeF16, []uint64{7}},
}

// writeTestFile writes allValues and wtensors with random data through a
// Writer on out and returns the tensor data it wrote.
func writeTestFile(t *testing.T, w *Writer, rng *rand.Rand) map[string][]byte {
	t.Helper()
	for _, kv := range allValues() {
		if err := w.AddKV(kv.Key, kv.Value); err != nil {
			t.Fatal(err)
		}
	}
	for _, wt := range wtensors {
		if err := w.AddTensor(wt.name, wt.typ, wt.dims...); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.WriteHeader(); err != nil {
		t.Fatal(err)
	}
	data := map[string][]byte{}
	for i, ti := range w.Tensors() {
		b := make([]byte, ti.Size)
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		data[ti.Name] = b
		var err error
		if i%2 == 0 {
			err = w.WriteTensorData(ti.Name, b)
		} else {
			err = w.WriteTensorFrom(ti.Name, bytes.NewReader(b))
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return data
}

func checkTestFile(t *testing.T, f *File, data map[string][]byte) {
	t.Helper()
	want := allValues()
	if len(f.Metadata) != len(want) {
		t.Fatalf("%d metadata entries, want %d", len(f.Metadata), len(want))
	}
	for i, kv := range want {
		got := f.Metadata[i]
		if got.Key != kv.Key {
			t.Fatalf("entry %d key %q, want %q", i, got.Key, kv.Key)
		}
		if !sameValue(t, got.Value, kv.Value) {
			t.Errorf("%s = %v, want %v", kv.Key, got.Value, kv.Value)
		}
	}
	if len(f.Tensors) != len(wtensors) {
		t.Fatalf("%d tensors", len(f.Tensors))
	}
	for i, wt := range wtensors {
		ti := &f.Tensors[i]
		if ti.Name != wt.name || ti.Type != wt.typ || !reflect.DeepEqual(ti.Dims, wt.dims) || ti.Offset%f.Alignment != 0 {
			t.Errorf("tensor %d: %+v, want %+v", i, ti, wt)
		}
		buf := make([]byte, ti.Size)
		if err := f.ReadTensor(ti, 0, buf); err != nil || !bytes.Equal(buf, data[ti.Name]) {
			t.Errorf("%s data differs (%v)", ti.Name, err)
		}
	}
}

// sameValue compares values by type and decoded content, descending into
// (lazy) arrays.
func sameValue(t *testing.T, a, b Value) bool {
	if a.Type != b.Type {
		return false
	}
	if a.Type != ValueArray {
		return a.bits == b.bits && a.str == b.str
	}
	if a.arr.Elem != b.arr.Elem || a.arr.Len != b.arr.Len {
		return false
	}
	av, err1 := a.arr.Values()
	bv, err2 := b.arr.Values()
	if err1 != nil || err2 != nil || len(av) != len(bv) {
		t.Logf("values: %v %v", err1, err2)
		return false
	}
	for i := range av {
		if !sameValue(t, av[i], bv[i]) {
			return false
		}
	}
	return true
}

func TestWriterRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	// To a file (mapped on read) and to a buffer (read through ReaderAt).
	path := filepath.Join(t.TempDir(), "rt.gguf")
	out, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := NewWriter(out)
	data := writeTestFile(t, w, rng)
	out.Close()
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Size != w.FileSize() {
		t.Errorf("file %d bytes, writer says %d", f.Size, w.FileSize())
	}
	checkTestFile(t, f, data)

	var buf bytes.Buffer
	data = writeTestFile(t, NewWriter(&buf), rng)
	g, err := OpenReaderAt(bytes.NewReader(buf.Bytes()), int64(buf.Len()), "buf")
	if err != nil {
		t.Fatal(err)
	}
	checkTestFile(t, g, data)

	// Typed accessors on what was written.
	if v, ok := g.Uint("t.u8"); !ok || v != 200 {
		t.Errorf("Uint(t.u8) %d %v", v, ok)
	}
	if v, ok := g.Int("t.i32"); !ok || v != -2e9 {
		t.Errorf("Int(t.i32) %d %v", v, ok)
	}
	if _, ok := g.Uint("t.i8"); ok {
		t.Error("Uint of a negative int8 should fail")
	}
	if _, ok := g.Int("t.u64"); ok {
		t.Error("Int of 1<<63 should fail")
	}
	if _, ok := g.Uint("t.str"); ok {
		t.Error("Uint of a string should fail")
	}
	if v, ok := g.Float("t.f32"); !ok || v != 1.5 {
		t.Errorf("Float(t.f32) %v %v", v, ok)
	}
	if v, ok := g.Bool("t.bool"); !ok || !v {
		t.Errorf("Bool %v %v", v, ok)
	}
	if v, ok := g.String("t.str"); !ok || v != "héllo\x00world" {
		t.Errorf("String %q %v", v, ok)
	}
	if v, ok := g.Strings("a.str"); !ok || !reflect.DeepEqual(v, []string{"a", "", "ccc", "<0x0A>"}) {
		t.Errorf("Strings %q %v", v, ok)
	}
	if v, ok := g.Float32s("a.f32"); !ok || !reflect.DeepEqual(v, []float32{0.25, -2}) {
		t.Errorf("Float32s %v %v", v, ok)
	}
	if v, ok := g.Int32s("a.u8"); !ok || !reflect.DeepEqual(v, []int32{1, 2, 255}) {
		t.Errorf("Int32s(a.u8) %v %v", v, ok)
	}
	if _, ok := g.Int32s("a.u64"); ok {
		t.Error("Int32s of 1<<40 should fail")
	}
	if _, ok := g.Strings("a.u8"); ok {
		t.Error("Strings of uint8 array should fail")
	}
}

// Rewriting a bundled llama.cpp file with the Writer, metadata copied as
// read (lazy arrays included) and tensors streamed from the mapping, gives
// back the same bytes: the Writer lays files out exactly as llama.cpp does.
func TestWriterReproducesLlamaCpp(t *testing.T) {
	for _, name := range []string{"stories260K-Q4_K_M.gguf", "synth-kq-Q6_K.gguf"} {
		path := testmodels.Path(t, name)
		f, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		w := NewWriter(&buf)
		for _, kv := range f.Metadata {
			if err := w.AddKV(kv.Key, kv.Value); err != nil {
				t.Fatal(err)
			}
		}
		for _, ti := range f.Tensors {
			if err := w.AddTensor(ti.Name, ti.Type, ti.Dims...); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.WriteHeader(); err != nil {
			t.Fatal(err)
		}
		for i := range f.Tensors {
			view, err := f.TensorData(&f.Tensors[i])
			if err != nil {
				t.Fatal(err)
			}
			if err := w.WriteTensorData(f.Tensors[i].Name, view); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		orig, _ := os.ReadFile(path)
		if !bytes.Equal(orig, buf.Bytes()) {
			t.Errorf("%s: rewrite differs (%d vs %d bytes)", name, buf.Len(), len(orig))
		}
		f.Close()
	}
}

func TestWriterMisuse(t *testing.T) {
	cases := []struct {
		name string
		do   func(w *Writer) error
		want string
	}{
		{"duplicate key", func(w *Writer) error { w.AddUint32("k", 1); return w.AddUint32("k", 2) }, "duplicate key"},
		{"duplicate tensor", func(w *Writer) error { w.AddTensor("t", TypeF32, 4); return w.AddTensor("t", TypeF32, 4) }, "duplicate tensor"},
		{"zero dim", func(w *Writer) error { return w.AddTensor("t", TypeF32, 4, 0) }, "zero dim"},
		{"five dims", func(w *Writer) error { return w.AddTensor("t", TypeF32, 1, 1, 1, 1, 1) }, "5 dims"},
		{"block size", func(w *Writer) error { return w.AddTensor("t", TypeQ4_K, 64) }, "block size"},
		{"unknown type", func(w *Writer) error { return w.AddTensor("t", Type(99), 64) }, "unknown type 99"},
		{"bad alignment", func(w *Writer) error { return w.AddUint32("general.alignment", 48) }, "power of two"},
		{"out of order", func(w *Writer) error {
			w.AddTensor("a", TypeF32, 1)
			w.AddTensor("b", TypeF32, 1)
			w.WriteHeader()
			return w.WriteTensorData("b", make([]byte, 4))
		}, `"a" is due`},
		{"wrong size", func(w *Writer) error {
			w.AddTensor("a", TypeF32, 2)
			w.WriteHeader()
			return w.WriteTensorData("a", make([]byte, 4))
		}, "4 bytes, want 8"},
		{"unwritten", func(w *Writer) error { w.AddTensor("a", TypeF32, 2); w.WriteHeader(); return w.Close() }, "1 of 1 tensors unwritten"},
		{"after header", func(w *Writer) error { w.WriteHeader(); return w.AddUint32("k", 1) }, "after WriteHeader"},
	}
	for _, c := range cases {
		err := c.do(NewWriter(&bytes.Buffer{}))
		if err == nil || !bytes.Contains([]byte(err.Error()), []byte(c.want)) {
			t.Errorf("%s: error %v, want it to mention %q", c.name, err, c.want)
		}
	}
}

// Non-default alignment and SkipTensorData on a writer that cannot seek.
func TestWriterAlignmentAndSkip(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	w.AddUint32("general.alignment", 64)
	w.AddTensor("a", TypeF32, 3)
	w.AddTensor("b", TypeQ8_0, 32, 2)
	w.WriteHeader()
	w.WriteTensorData("a", []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})
	if err := w.SkipTensorData("b"); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := OpenReaderAt(bytes.NewReader(buf.Bytes()), int64(buf.Len()), "buf")
	if err != nil {
		t.Fatal(err)
	}
	if f.Alignment != 64 || f.DataOffset%64 != 0 || f.Tensors[1].Offset != 64 || f.Size != f.DataOffset+192 {
		t.Errorf("alignment %d data %d offset %d size %d", f.Alignment, f.DataOffset, f.Tensors[1].Offset, f.Size)
	}
	b := make([]byte, 68)
	b[0] = 1
	if err := f.ReadTensor(&f.Tensors[1], 0, b); err != nil || !bytes.Equal(b, make([]byte, 68)) {
		t.Errorf("skipped tensor not zero: %v", err)
	}
}

// The first error sticks: later calls and Close return it.
func TestWriterStickyError(t *testing.T) {
	w := NewWriter(&bytes.Buffer{})
	w.AddUint32("k", 1)
	first := w.AddUint32("k", 2)
	if err := w.AddTensor("t", TypeF32, 4); err != first {
		t.Errorf("AddTensor after error: %v", err)
	}
	if err := w.Close(); err != first {
		t.Errorf("Close after error: %v, want %v", err, first)
	}
}

// A sparse file written through SkipTensorData reads back with the right
// size and zero tensors, and takes (almost) no disk blocks.
func TestWriterSparseFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sparse.gguf")
	out, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := NewWriter(out)
	w.AddString("general.architecture", "llama")
	w.AddTensor("a", TypeF32, 4)
	w.AddTensor("big", TypeQ4_K, 256, 1<<20) // 144 MiB
	w.WriteHeader()
	w.WriteTensorData("a", []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16})
	w.SkipTensorData("big")
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	out.Close()
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Size != w.FileSize() || f.Size < 144<<20 {
		t.Fatalf("size %d, writer says %d", f.Size, w.FileSize())
	}
	big, _ := f.Tensor("big")
	buf := make([]byte, 4096)
	buf[0] = 9
	if err := f.ReadTensor(big, big.Size-4096, buf); err != nil || !bytes.Equal(buf, make([]byte, 4096)) {
		t.Errorf("tail of skipped tensor: %v", err)
	}
	if blocks := diskBytes(t, path); blocks > 1<<20 {
		t.Errorf("sparse file uses %d bytes of disk", blocks)
	}
}
