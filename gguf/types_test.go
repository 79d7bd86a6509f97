package gguf

import "testing"

// The block byte counts are ggml's struct sizes; a wrong one would silently
// shift every tensor after it, so each is pinned here against the layout
// written out field by field.
func TestTypeTableSizes(t *testing.T) {
	want := map[Type][2]int{
		TypeF32: {1, 4}, TypeF16: {1, 2}, TypeBF16: {1, 2}, TypeF64: {1, 8},
		TypeI8: {1, 1}, TypeI16: {1, 2}, TypeI32: {1, 4}, TypeI64: {1, 8},
		TypeQ4_0: {32, 18}, TypeQ4_1: {32, 20}, TypeQ5_0: {32, 22}, TypeQ5_1: {32, 24},
		TypeQ8_0: {32, 34}, TypeQ8_1: {32, 36},
		TypeQ2_K: {256, 84}, TypeQ3_K: {256, 110}, TypeQ4_K: {256, 144},
		TypeQ5_K: {256, 176}, TypeQ6_K: {256, 210}, TypeQ8_K: {256, 292},
		TypeIQ2_XXS: {256, 66}, TypeIQ2_XS: {256, 74}, TypeIQ3_XXS: {256, 98},
		TypeIQ1_S: {256, 50}, TypeIQ4_NL: {32, 18}, TypeIQ3_S: {256, 110},
		TypeIQ2_S: {256, 82}, TypeIQ4_XS: {256, 136}, TypeIQ1_M: {256, 56},
		TypeTQ1_0: {256, 54}, TypeTQ2_0: {256, 66}, TypeMXFP4: {32, 17},
	}
	if len(want) != len(typeTable) {
		t.Fatalf("type table has %d types, test pins %d", len(typeTable), len(want))
	}
	for typ, w := range want {
		if typ.BlockSize() != w[0] || typ.BlockBytes() != w[1] {
			t.Errorf("%v: block %d/%d bytes, want %d/%d", typ, typ.BlockSize(), typ.BlockBytes(), w[0], w[1])
		}
		if got, ok := TypeByName(typ.String()); !ok || got != typ {
			t.Errorf("TypeByName(%q) = %v, %v", typ.String(), got, ok)
		}
	}
}

func TestRowBytes(t *testing.T) {
	if n, err := TypeQ4_K.RowBytes(4096); err != nil || n != 16*144 {
		t.Errorf("Q4_K 4096: %d, %v", n, err)
	}
	if _, err := TypeQ4_0.RowBytes(33); err == nil {
		t.Error("Q4_0 33 elements: want block-size error")
	}
	if _, err := Type(4).RowBytes(32); err == nil {
		t.Error("removed type 4: want unknown-type error")
	}
	if _, err := TypeF32.RowBytes(1 << 63); err == nil {
		t.Error("F32 2^63 elements: want overflow error")
	}
	if Type(4).String() != "type(4)" {
		t.Errorf("unknown type name %q", Type(4).String())
	}
}
