package gguf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// rawFile builds GGUF bytes field by field, so a test can break exactly one
// rule. The zero overrides leave a valid file.
type rawFile struct {
	magic    string
	version  uint32
	nTensors *uint64 // override the count written
	nKV      *uint64
	kvs      []rawKV
	ts       []rawTensor
	dataLen  int // bytes after the data offset
	align    uint64
	noPad    bool // end the file right after the tensor infos
}

type rawKV struct {
	key    string
	typ    uint32
	val    []byte
	keyLen uint64 // written instead of len(key) when non-zero
}

type rawTensor struct {
	name string
	dims []uint64
	typ  uint32
	off  uint64
}

type enc []byte

func (b enc) u32(v uint32) enc      { return binary.LittleEndian.AppendUint32(b, v) }
func (b enc) u64(v uint64) enc      { return binary.LittleEndian.AppendUint64(b, v) }
func (b enc) str(s string) enc      { return append(b.u64(uint64(len(s))), s...) }
func (b enc) raw(p ...byte) enc     { return append(b, p...) }
func strVal(s string) []byte        { return enc(nil).str(s) }
func u32Val(v uint32) []byte        { return enc(nil).u32(v) }
func arrHdr(t uint32, n uint64) enc { return enc(nil).u32(t).u64(n) }

func validRaw() rawFile {
	return rawFile{
		magic: "GGUF", version: 3, align: 32,
		kvs: []rawKV{
			{"general.architecture", uint32(ValueString), strVal("llama"), 0},
			{"general.alignment", uint32(ValueUint32), u32Val(32), 0},
			{"tokenizer.ggml.tokens", uint32(ValueArray), arrHdr(uint32(ValueString), 2).str("a").str("bc"), 0},
		},
		ts: []rawTensor{
			{"a", []uint64{8}, uint32(TypeF32), 0},
			{"b", []uint64{32, 2}, uint32(TypeQ8_0), 32},
		},
		dataLen: 128,
	}
}

func (r rawFile) bytes() []byte {
	b := enc(r.magic).u32(r.version)
	nt, nkv := uint64(len(r.ts)), uint64(len(r.kvs))
	if r.nTensors != nil {
		nt = *r.nTensors
	}
	if r.nKV != nil {
		nkv = *r.nKV
	}
	b = b.u64(nt).u64(nkv)
	for _, kv := range r.kvs {
		n := uint64(len(kv.key))
		if kv.keyLen != 0 {
			n = kv.keyLen
		}
		b = b.u64(n).raw([]byte(kv.key)...).u32(kv.typ).raw(kv.val...)
	}
	for _, t := range r.ts {
		b = b.str(t.name).u32(uint32(len(t.dims)))
		for _, d := range t.dims {
			b = b.u64(d)
		}
		b = b.u32(t.typ).u64(t.off)
	}
	for uint64(len(b))%r.align != 0 && !r.noPad {
		b = append(b, 0)
	}
	return append(b, make([]byte, r.dataLen)...)
}

func ptr(v uint64) *uint64 { return &v }

// openBytes opens b both ways (mapped from a temporary file, and through a
// ReaderAt) and checks that they agree on success or failure.
func openBytes(t *testing.T, b []byte) (*File, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "f.gguf")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if f != nil {
		f.Close()
	}
	g, err2 := OpenReaderAt(bytes.NewReader(b), int64(len(b)), path)
	if (err == nil) != (err2 == nil) || (err != nil && err.Error() != err2.Error()) {
		t.Fatalf("Open and OpenReaderAt disagree: %v / %v", err, err2)
	}
	return g, err
}

func TestValidRaw(t *testing.T) {
	f, err := openBytes(t, validRaw().bytes())
	if err != nil {
		t.Fatal(err)
	}
	if s, ok := f.Strings("tokenizer.ggml.tokens"); !ok || len(s) != 2 || s[1] != "bc" {
		t.Errorf("tokens %q", s)
	}
}

// One hand-made file per validation rule. Each must be rejected with a
// *FormatError whose text names the problem (and, where given, the offset
// of the offending field).
func TestMalformed(t *testing.T) {
	// Offsets in the valid layout, for the cases that check them.
	const kv0 = 24                             // first key
	const kv1 = kv0 + 8 + 20 + 4 + 8 + 5       // second key (general.alignment)
	const kv2 = kv1 + 8 + 17 + 4 + 4           // third key (tokens)
	const ti0 = kv2 + 8 + 21 + 4 + 12 + 9 + 10 // first tensor info
	const ti1 = ti0 + 8 + 1 + 4 + 8 + 4 + 8    // second tensor info

	cases := []struct {
		name string
		mod  func(r *rawFile)
		want string
		at   int64 // -1: not checked
	}{
		{"bad magic", func(r *rawFile) { r.magic = "GGUX" }, "not a GGUF file", 0},
		{"version 1", func(r *rawFile) { r.version = 1 }, "version 1 is not supported", 4},
		{"version 4", func(r *rawFile) { r.version = 4 }, "unsupported GGUF version 4", 4},
		{"version 0", func(r *rawFile) { r.version = 0 }, "unsupported GGUF version 0", 4},
		{"big-endian", func(r *rawFile) { r.version = 3 << 24 }, "big-endian", 4},
		{"metadata count too large", func(r *rawFile) { r.nKV = ptr(1 << 40) }, "metadata count: 1099511627776 entries cannot fit", 16},
		{"tensor count too large", func(r *rawFile) { r.nTensors = ptr(math.MaxUint64) }, "tensor count: 18446744073709551615 tensors cannot fit", 8},
		{"metadata count larger than present", func(r *rawFile) { r.nKV = ptr(4) }, "", -1},
		{"key length past end", func(r *rawFile) { r.kvs[1].keyLen = 1 << 40 }, "metadata key 1: string length 1099511627776 runs past the end", kv1},
		{"string value length past end", func(r *rawFile) { r.kvs[0].val = enc(nil).u64(1 << 50) }, `metadata "general.architecture": string length 1125899906842624 runs past the end`, kv0 + 8 + 20 + 4},
		{"array length past end", func(r *rawFile) { r.kvs[2].val = arrHdr(uint32(ValueUint32), 1<<40) }, "array of 1099511627776 uint32 (4 bytes each) runs past the end", kv2 + 8 + 21 + 4 + 4},
		{"string array count past end", func(r *rawFile) { r.kvs[2].val = arrHdr(uint32(ValueString), 1<<40) }, "array of 1099511627776 string runs past the end", -1},
		{"string array element past end", func(r *rawFile) { r.kvs[2].val = arrHdr(uint32(ValueString), 2).str("a").u64(1 << 40) }, "string 1 of 2: length 1099511627776 runs past the end", -1},
		{"unknown value type", func(r *rawFile) { r.kvs[1].typ = 13 }, `metadata "general.alignment": unknown value type 13`, kv1 + 8 + 17},
		{"unknown array element type", func(r *rawFile) { r.kvs[2].val = arrHdr(42, 0) }, "unknown array element type 42", -1},
		{"arrays nested too deep", func(r *rawFile) {
			v := arrHdr(uint32(ValueUint8), 0)
			for range 10 {
				v = append(arrHdr(uint32(ValueArray), 1), v...)
			}
			r.kvs[2].val = v
		}, "nested deeper than 8", -1},
		{"bool not 0 or 1", func(r *rawFile) { r.kvs[1] = rawKV{"x.flag", uint32(ValueBool), []byte{2}, 0} }, "bool value 2 is neither 0 nor 1", -1},
		{"bool array element not 0 or 1", func(r *rawFile) { r.kvs[2].val = append(arrHdr(uint32(ValueBool), 3), 0, 1, 7) }, "bool array element 2 is 7", -1},
		{"duplicate key", func(r *rawFile) {
			r.kvs[1].key = "general.architecture"
			r.kvs[1].typ = uint32(ValueString)
			r.kvs[1].val = strVal("x")
		}, `duplicate key "general.architecture"`, kv1},
		{"key too long", func(r *rawFile) { r.kvs[0].key = strings.Repeat("k", maxNameLen+1) }, "string length 65537 exceeds the limit", kv0},
		{"alignment not a power of two", func(r *rawFile) { r.kvs[1].val = u32Val(48) }, "general.alignment: 48 is not a power of two", kv1},
		{"alignment zero", func(r *rawFile) { r.kvs[1].val = u32Val(0) }, "general.alignment: 0 is not a power of two", kv1},
		{"alignment not an integer", func(r *rawFile) { r.kvs[1].typ = uint32(ValueString); r.kvs[1].val = strVal("32") }, "general.alignment", kv1},
		{"duplicate tensor name", func(r *rawFile) { r.ts[1].name = "a" }, `tensor "a": duplicate tensor name`, ti1},
		{"tensor name too long", func(r *rawFile) { r.ts[0].name = strings.Repeat("n", maxNameLen+1) }, "tensor 0 name: string length 65537 exceeds the limit", ti0},
		{"zero dims", func(r *rawFile) { r.ts[0].dims = nil }, `tensor "a": 0 dims, want 1 to 4`, ti0 + 9},
		{"five dims", func(r *rawFile) { r.ts[0].dims = []uint64{8, 1, 1, 1, 1} }, "5 dims, want 1 to 4", ti0 + 9},
		{"dim of zero", func(r *rawFile) { r.ts[1].dims = []uint64{32, 0} }, `tensor "b": dim 1 is zero`, ti1 + 9 + 4 + 8},
		{"unknown tensor type", func(r *rawFile) { r.ts[1].typ = 99 }, `tensor "b": unknown tensor type 99`, ti1 + 9 + 4 + 16},
		{"removed tensor type", func(r *rawFile) { r.ts[1].typ = 4 }, "unknown tensor type 4", -1},
		{"row not a multiple of the block size", func(r *rawFile) { r.ts[1].dims = []uint64{48, 2} }, "row length 48 is not a multiple of the Q8_0 block size 32", ti1 + 9},
		{"element count overflows", func(r *rawFile) { r.ts[0].dims = []uint64{1 << 32, 1 << 32} }, "element count [4294967296 4294967296] overflows int64", -1},
		{"byte size overflows", func(r *rawFile) { r.ts[0].dims = []uint64{1 << 62} }, "byte size of [4611686018427387904] F32 overflows", -1},
		{"misaligned offset", func(r *rawFile) { r.ts[1].off = 48 }, `tensor "b": data offset 48 is not a multiple of the alignment 32`, ti1 + 9 + 4 + 16 + 4},
		{"offset plus size overflows", func(r *rawFile) { r.ts[1].off = math.MaxUint64 &^ 31 }, "overflows", -1},
		{"tensor past the data section", func(r *rawFile) { r.ts[1].off = 64 }, `tensor "b": data [64, 132) runs past the end of the data section (128 bytes`, -1},
		{"tensors overlap", func(r *rawFile) { r.ts[1].off = 0 }, `data [0, 68) overlaps tensor "a"`, -1},
	}
	if len(cases) < 20 {
		t.Fatalf("only %d cases", len(cases))
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := validRaw()
			c.mod(&r)
			_, err := openBytes(t, r.bytes())
			if err == nil {
				t.Fatal("accepted")
			}
			var fe *FormatError
			if !errors.As(err, &fe) {
				t.Fatalf("%v: not a *FormatError", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not mention %q", err, c.want)
			}
			if c.at >= 0 && fe.Offset != c.at {
				t.Errorf("error at offset %d, want %d (%v)", fe.Offset, c.at, err)
			}
		})
	}
}

// Every prefix of a valid file that cuts into its last tensor, which includes
// a cut at every section boundary (magic, version, counts, each key, type
// and value, each tensor info field, the padding, the data), is rejected as
// truncated. (Only the padding after the last tensor may be missing.)
func TestTruncatedEverywhere(t *testing.T) {
	full := validRaw().bytes()
	end := len(full) - 128 + 100 // data offset + end of tensor "b"
	if _, err := OpenReaderAt(bytes.NewReader(full[:end]), int64(end), "cut"); err != nil {
		t.Fatalf("file without its final padding: %v", err)
	}
	for n := 0; n < end; n++ {
		_, err := OpenReaderAt(bytes.NewReader(full[:n]), int64(n), "cut")
		if err == nil {
			t.Fatalf("prefix of %d bytes accepted", n)
		}
		var fe *FormatError
		msg := err.Error()
		if !errors.As(err, &fe) || !(strings.Contains(msg, "truncated") || strings.Contains(msg, "past the end")) {
			t.Errorf("prefix %d: %v", n, err)
		}
	}
	// A cut through the mapped path as well, at a few boundaries.
	for _, n := range []int{0, 3, 4, 8, 16, 24, 30, len(full) - 128, end - 1} {
		if _, err := openBytes(t, full[:n]); err == nil {
			t.Errorf("mapped prefix %d accepted", n)
		}
	}
}

// A file of metadata only may end right after its header (llama.cpp's
// vocabulary files do), but a file with tensors may not.
func TestMetadataOnly(t *testing.T) {
	// The last value is an empty array ending exactly at the end of the
	// file (a fuzzer's find: reading its zero bytes there must not fail).
	r := validRaw()
	r.ts, r.dataLen = nil, 0
	r.kvs = append(r.kvs, rawKV{"x.empty", uint32(ValueArray), arrHdr(uint32(ValueString), 0), 0})
	r.noPad = true
	f, err := openBytes(t, r.bytes())
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Tensors) != 0 || len(f.Metadata) != 4 || f.DataOffset <= f.Size {
		t.Errorf("%d tensors, %d kvs, data offset %d, size %d", len(f.Tensors), len(f.Metadata), f.DataOffset, f.Size)
	}
	if s, ok := f.Strings("x.empty"); !ok || len(s) != 0 {
		t.Errorf("empty array at the end: %q %v", s, ok)
	}
	a, _ := f.Array("x.empty")
	if v, err := a.Values(); err != nil || len(v) != 0 {
		t.Errorf("Values: %v %v", v, err)
	}
}

// Version 2 has the same layout as version 3 (64-bit counts and lengths)
// and is read the same way.
func TestVersion2(t *testing.T) {
	r := validRaw()
	r.version = 2
	f, err := openBytes(t, r.bytes())
	if err != nil {
		t.Fatal(err)
	}
	if f.Version != 2 || len(f.Tensors) != 2 || len(f.Metadata) != 3 {
		t.Errorf("version %d, %d tensors, %d kvs", f.Version, len(f.Tensors), len(f.Metadata))
	}
	if _, err := Open(filepath.Join(t.TempDir(), "missing.gguf")); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("missing file: %v", err)
	}
}
