package gguf

import (
	"bytes"
	"errors"
	"flag"
	"math"
	"os"
	"reflect"
	"testing"

	"github.com/forge-llm/forge/gguf/testmodels"
)

// FuzzOpen feeds arbitrary bytes to the reader. Whatever the input, Open
// must return a *FormatError or a File whose every accessor works without
// panicking; a file it accepts must survive a rewrite through the Writer
// unchanged (same metadata, tensors and tensor bytes).
//
// The seeds are the bundled files in compact form (see compactSeed): every
// key, value type, tensor name and type as in the original, but arrays cut
// to a few elements and tensors to one block. Whole files (0.3 to 1.8 MB)
// stall the fuzzer: it minimises every new interesting input for up to a
// minute, at a cost that grows with the input's size.
func FuzzOpen(f *testing.F) {
	paths := append(testmodels.Glob(f, "*.gguf"), testmodels.Glob(f, "tokenizer/*.gguf")...)
	for _, p := range paths {
		g, err := Open(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(compactSeed(f, g))
		g.Close()
	}
	f.Add(validRaw().bytes())
	var buf bytes.Buffer
	w := NewWriter(&buf)
	for _, kv := range allValues() {
		w.AddKV(kv.Key, kv.Value)
	}
	w.AddTensor("t", TypeQ4_K, 256, 2)
	w.WriteHeader()
	w.SkipTensorData("t")
	w.Close()
	f.Add(buf.Bytes())

	f.Fuzz(func(t *testing.T, data []byte) {
		g, err := OpenReaderAt(bytes.NewReader(data), int64(len(data)), "fuzz")
		if err != nil {
			var fe *FormatError
			if !errors.As(err, &fe) {
				t.Fatalf("error is not a *FormatError: %v", err)
			}
			return
		}
		exercise(t, g)
		var out bytes.Buffer
		w := NewWriter(&out)
		for _, kv := range g.Metadata {
			if err := w.AddKV(kv.Key, kv.Value); err != nil {
				t.Fatalf("rewrite %q: %v", kv.Key, err)
			}
		}
		for _, ti := range g.Tensors {
			if err := w.AddTensor(ti.Name, ti.Type, ti.Dims...); err != nil {
				t.Fatalf("rewrite tensor: %v", err)
			}
		}
		if err := w.WriteHeader(); err != nil {
			t.Fatal(err)
		}
		// Written in offset order (the rewrite is laid out in file order, so
		// tensors read back in their original order must match).
		datas := make([][]byte, len(g.Tensors))
		for i := range g.Tensors {
			datas[i] = make([]byte, g.Tensors[i].Size)
			if err := g.ReadTensor(&g.Tensors[i], 0, datas[i]); err != nil {
				t.Fatal(err)
			}
			if err := w.WriteTensorData(g.Tensors[i].Name, datas[i]); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		h, err := OpenReaderAt(bytes.NewReader(out.Bytes()), int64(out.Len()), "rewrite")
		if err != nil {
			t.Fatalf("rewrite does not open: %v", err)
		}
		if len(h.Metadata) != len(g.Metadata) || len(h.Tensors) != len(g.Tensors) {
			t.Fatalf("rewrite: %d kvs %d tensors, want %d %d", len(h.Metadata), len(h.Tensors), len(g.Metadata), len(g.Tensors))
		}
		for i := range g.Metadata {
			if h.Metadata[i].Key != g.Metadata[i].Key || !sameValue(t, h.Metadata[i].Value, g.Metadata[i].Value) {
				t.Fatalf("rewrite: metadata %q changed", g.Metadata[i].Key)
			}
		}
		for i := range g.Tensors {
			a, b := g.Tensors[i], h.Tensors[i]
			if a.Name != b.Name || a.Type != b.Type || a.Size != b.Size || !reflect.DeepEqual(a.Dims, b.Dims) {
				t.Fatalf("rewrite: tensor %q changed: %+v vs %+v", a.Name, a, b)
			}
			got := make([]byte, b.Size)
			if err := h.ReadTensor(&b, 0, got); err != nil || !bytes.Equal(got, datas[i]) {
				t.Fatalf("rewrite: tensor %q data changed (%v)", a.Name, err)
			}
		}
	})
}

// exercise calls every accessor on an accepted file.
func exercise(t *testing.T, g *File) {
	for _, kv := range g.Metadata {
		_ = kv.Value.String()
		if a, ok := kv.Value.Array(); ok {
			vals, err := a.Values()
			if err != nil {
				t.Fatalf("%q: Values: %v", kv.Key, err)
			}
			if uint64(len(vals)) != a.Len {
				t.Fatalf("%q: %d values, Len %d", kv.Key, len(vals), a.Len)
			}
			a.Strings()
			a.Float32s()
			a.Int32s()
		}
	}
	g.Config()
	g.Tokenizer()
	for i := range g.Tensors {
		ti := &g.Tensors[i]
		if ti.Elements() == 0 || ti.Rows() == 0 || ti.Size == 0 {
			t.Fatalf("%q: empty tensor accepted", ti.Name)
		}
		if ti.Offset%g.Alignment != 0 || g.DataOffset+int64(ti.Offset+ti.Size) > g.Size {
			t.Fatalf("%q: bad range accepted", ti.Name)
		}
	}
}

// compactSeed rewrites a file small: the same metadata keys and value types
// with arrays cut to 4 elements, the same tensor names, types and dim counts
// with one block's worth of elements, and the original leading bytes of each
// tensor as its data.
func compactSeed(tb testing.TB, g *File) []byte {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	for _, kv := range g.Metadata {
		v := kv.Value
		if a, ok := v.Array(); ok && a.Len > 4 {
			vals, err := a.Head(4)
			if err != nil {
				tb.Fatal(err)
			}
			v = arrayFromValues(a.Elem, vals)
		}
		if err := w.AddKV(kv.Key, v); err != nil {
			tb.Fatal(err)
		}
	}
	for _, ti := range g.Tensors {
		dims := make([]uint64, len(ti.Dims))
		for i := range dims {
			dims[i] = 1
		}
		dims[0] = uint64(ti.Type.BlockSize())
		if err := w.AddTensor(ti.Name, ti.Type, dims...); err != nil {
			tb.Fatal(err)
		}
	}
	if err := w.WriteHeader(); err != nil {
		tb.Fatal(err)
	}
	for i, ti := range w.Tensors() {
		b := make([]byte, ti.Size)
		if err := g.ReadTensor(&g.Tensors[i], 0, b); err != nil {
			tb.Fatal(err)
		}
		if err := w.WriteTensorData(ti.Name, b); err != nil {
			tb.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

// TestMain caps how long the fuzzer minimises each new interesting input
// (default 60 s) at 2 s unless -fuzzminimizetime is given. Go's minimiser is
// quadratic in the input's length, and FuzzOpen's inputs are whole files of
// kilobytes, so with the default a 20 s run spends nearly all its time
// minimising and hardly fuzzes.
func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.fuzzminimizetime" })
	if fz := flag.Lookup("test.fuzz"); fz != nil && fz.Value.String() != "" && !set {
		flag.Set("test.fuzzminimizetime", "2s")
	}
	os.Exit(m.Run())
}

// arrayFromValues builds an in-memory array of elem from decoded values
// (the inverse of Array.Values).
func arrayFromValues(elem ValueType, vals []Value) Value {
	u := func(i int) uint64 { return vals[i].bits }
	n := len(vals)
	switch elem {
	case ValueUint8:
		s := make([]uint8, n)
		for i := range s {
			s[i] = uint8(u(i))
		}
		return ArrayOf(s)
	case ValueInt8:
		s := make([]int8, n)
		for i := range s {
			s[i] = int8(u(i))
		}
		return ArrayOf(s)
	case ValueUint16:
		s := make([]uint16, n)
		for i := range s {
			s[i] = uint16(u(i))
		}
		return ArrayOf(s)
	case ValueInt16:
		s := make([]int16, n)
		for i := range s {
			s[i] = int16(u(i))
		}
		return ArrayOf(s)
	case ValueUint32:
		s := make([]uint32, n)
		for i := range s {
			s[i] = uint32(u(i))
		}
		return ArrayOf(s)
	case ValueInt32:
		s := make([]int32, n)
		for i := range s {
			s[i] = int32(u(i))
		}
		return ArrayOf(s)
	case ValueUint64:
		s := make([]uint64, n)
		for i := range s {
			s[i] = u(i)
		}
		return ArrayOf(s)
	case ValueInt64:
		s := make([]int64, n)
		for i := range s {
			s[i] = int64(u(i))
		}
		return ArrayOf(s)
	case ValueFloat32:
		s := make([]float32, n)
		for i := range s {
			s[i] = math.Float32frombits(uint32(u(i)))
		}
		return ArrayOf(s)
	case ValueFloat64:
		s := make([]float64, n)
		for i := range s {
			s[i] = math.Float64frombits(u(i))
		}
		return ArrayOf(s)
	case ValueBool:
		s := make([]bool, n)
		for i := range s {
			s[i] = u(i) != 0
		}
		return ArrayOf(s)
	case ValueString:
		s := make([]string, n)
		for i := range s {
			s[i] = vals[i].str
		}
		return ArrayOf(s)
	}
	return ArrayOf(append([]Value{}, vals...))
}
