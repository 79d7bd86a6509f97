package dequant

import (
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf"
)

// supportedTypes is the list issue #3 asks for.
var supportedTypes = []gguf.Type{
	gguf.TypeF32, gguf.TypeF16, gguf.TypeBF16,
	gguf.TypeQ4_0, gguf.TypeQ4_1, gguf.TypeQ5_0, gguf.TypeQ5_1, gguf.TypeQ8_0, gguf.TypeQ8_1,
	gguf.TypeQ2_K, gguf.TypeQ3_K, gguf.TypeQ4_K, gguf.TypeQ5_K, gguf.TypeQ6_K, gguf.TypeQ8_K,
	gguf.TypeIQ4_NL, gguf.TypeIQ4_XS, gguf.TypeMXFP4,
}

// quantizableTypes are the types Quantize must handle.
var quantizableTypes = []gguf.Type{
	gguf.TypeF32, gguf.TypeF16, gguf.TypeBF16,
	gguf.TypeQ8_0, gguf.TypeQ8_1, gguf.TypeQ8_K,
	gguf.TypeQ4_0, gguf.TypeQ4_1, gguf.TypeQ5_0, gguf.TypeQ5_1,
	gguf.TypeQ2_K, gguf.TypeQ3_K, gguf.TypeQ4_K, gguf.TypeQ5_K, gguf.TypeQ6_K,
}

// TestBlockSizes walks every block struct and checks its size against
// gguf's type table (the compile-time pins in blocks.go check the literal
// numbers; this checks they are the table's).
func TestBlockSizes(t *testing.T) {
	blocks := map[gguf.Type]any{
		gguf.TypeQ4_0: BlockQ4_0{}, gguf.TypeQ4_1: BlockQ4_1{},
		gguf.TypeQ5_0: BlockQ5_0{}, gguf.TypeQ5_1: BlockQ5_1{},
		gguf.TypeQ8_0: BlockQ8_0{}, gguf.TypeQ8_1: BlockQ8_1{},
		gguf.TypeQ2_K: BlockQ2_K{}, gguf.TypeQ3_K: BlockQ3_K{},
		gguf.TypeQ4_K: BlockQ4_K{}, gguf.TypeQ5_K: BlockQ5_K{},
		gguf.TypeQ6_K: BlockQ6_K{}, gguf.TypeQ8_K: BlockQ8_K{},
		gguf.TypeIQ4_NL: BlockIQ4_NL{}, gguf.TypeIQ4_XS: BlockIQ4_XS{},
		gguf.TypeMXFP4: BlockMXFP4{},
	}
	for typ, b := range blocks {
		if got, want := int(reflect.TypeOf(b).Size()), typ.BlockBytes(); got != want {
			t.Errorf("%s: Go block is %d bytes, ggml's is %d", typ, got, want)
		}
		// encoding/binary must see the same size (no padding anywhere).
		if got := len(blockBytes(t, b)); got != typ.BlockBytes() {
			t.Errorf("%s: binary encoding is %d bytes, want %d", typ, got, typ.BlockBytes())
		}
	}
}

func TestSupported(t *testing.T) {
	want := map[gguf.Type]bool{}
	for _, typ := range supportedTypes {
		want[typ] = true
	}
	for _, typ := range append(gguf.AllTypes(), gguf.Type(99)) {
		if got := Supported(typ); got != want[typ] {
			t.Errorf("Supported(%s) = %v, want %v", typ, got, want[typ])
		}
	}
}

// TestUnsupportedTypesNameTheType: every other type is an error that names
// it, from every entry point, and nothing is written.
func TestUnsupportedTypesNameTheType(t *testing.T) {
	for _, typ := range append(gguf.AllTypes(), gguf.Type(99)) {
		bs := max(1, typ.BlockSize())
		src := make([]byte, 4096)
		dst := make([]float32, bs)
		for i := range dst {
			dst[i] = 42
		}
		check := func(what string, err error, supported bool) {
			t.Helper()
			if supported {
				if err != nil {
					t.Errorf("%s(%s): %v", what, typ, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), typ.String()) {
				t.Errorf("%s(%s): error %v does not name the type", what, typ, err)
			}
		}
		check("ToFloat32", ToFloat32(typ, src, dst), Supported(typ))
		check("ParallelToFloat32", ParallelToFloat32(typ, src, dst, 2), Supported(typ))
		check("ToFloat16", ToFloat16(typ, src, make([]uint16, bs)), Supported(typ))
		check("Quantize", Quantize(typ, make([]float32, bs), src), encoderFor(typ) != nil)
		if !Supported(typ) && dst[0] != 42 {
			t.Errorf("%s: destination written despite the error", typ)
		}
	}
	for _, typ := range quantizableTypes {
		if encoderFor(typ) == nil {
			t.Errorf("Quantize does not handle %s", typ)
		}
	}
}

func TestSizeErrors(t *testing.T) {
	dst := make([]float32, 48) // not a multiple of 32
	if err := ToFloat32(gguf.TypeQ4_0, make([]byte, 100), dst); err == nil || !strings.Contains(err.Error(), "block size") {
		t.Errorf("48 elements of Q4_0: error %v", err)
	}
	dst = make([]float32, 64) // needs 36 bytes
	if err := ToFloat32(gguf.TypeQ4_0, make([]byte, 35), dst); err == nil || !strings.Contains(err.Error(), "need 36 bytes") {
		t.Errorf("short source: error %v", err)
	}
	if err := Quantize(gguf.TypeQ4_K, make([]float32, 256), make([]byte, 143)); err == nil {
		t.Error("short destination: no error")
	}
	// Extra source bytes are ignored.
	if err := ToFloat32(gguf.TypeQ8_0, make([]byte, 100), make([]float32, 64)); err != nil {
		t.Error(err)
	}
}

func TestToFloat32Rows(t *testing.T) {
	const rowLen, rows = 512, 6
	x := randomData(rand.New(rand.NewPCG(15, 16)), "normal", rowLen*rows)
	q := make([]byte, rows*2*144)
	if err := Quantize(gguf.TypeQ4_K, x, q); err != nil {
		t.Fatal(err)
	}
	all := make([]float32, len(x))
	if err := ToFloat32(gguf.TypeQ4_K, q, all); err != nil {
		t.Fatal(err)
	}
	part := make([]float32, 2*rowLen)
	if err := ToFloat32Rows(gguf.TypeQ4_K, q, rowLen, 3, part); err != nil {
		t.Fatal(err)
	}
	sameBits(t, "rows 3..4", part, all[3*rowLen:5*rowLen])
	if err := ToFloat32Rows(gguf.TypeQ4_K, q, rowLen, 5, part); err == nil {
		t.Error("rows 5..6 of 6: no error")
	}
	if err := ToFloat32Rows(gguf.TypeQ4_K, q, 100, 0, make([]float32, 100)); err == nil {
		t.Error("row length 100 of Q4_K: no error")
	}
}
