package rocm

import (
	"math"
	"testing"
	"unsafe"
)

func TestParseDevice(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Selection
	}{
		{"auto", Selection{Kind: SelectAuto}},
		{"", Selection{Kind: SelectAuto}},
		{"CPU", Selection{Kind: SelectCPU}},
		{"gpu", Selection{Kind: SelectGPU}},
		{"gpu:0", Selection{Kind: SelectGPU}},
		{"gpu:3", Selection{Kind: SelectGPU, Ordinal: 3}},
	} {
		got, err := ParseDevice(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseDevice(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
		if again, _ := ParseDevice(got.String()); again != got {
			t.Errorf("%v does not round-trip through String (%q)", got, got.String())
		}
	}
	for _, bad := range []string{"gpu:", "gpu:-1", "gpu:x", "tpu", "gpu:1:2"} {
		if _, err := ParseDevice(bad); err == nil {
			t.Errorf("ParseDevice(%q) accepted", bad)
		}
	}
}

func TestChooseCPU(t *testing.T) {
	c, err := Choose(Selection{Kind: SelectCPU})
	if err != nil || !c.CPU || c.Runtime != nil {
		t.Fatalf("cpu: %+v %v", c, err)
	}
}

// On a machine without a GPU, auto must fall back to the CPU and say why.
func TestChooseAutoFallsBack(t *testing.T) {
	if _, err := OpenAny(); err == nil {
		t.Skip("a GPU is present; the fallback is not testable here")
	}
	c, err := Choose(Selection{Kind: SelectAuto})
	if err != nil || !c.CPU || c.Reason == "" {
		t.Fatalf("auto without a GPU: %+v, %v", c, err)
	}
	t.Logf("fallback reason: %s", c.Reason)
	if _, err := Choose(Selection{Kind: SelectGPU}); err == nil {
		t.Fatal("gpu:0 without a GPU must fail")
	}
}

func TestArenaCarving(t *testing.T) {
	a := newArena(0x10000, 4096)
	r1, err := a.Alloc("tok_embd", 100, 0)
	if err != nil || r1.Off != 0 || r1.Ptr != 0x10000 {
		t.Fatalf("first region: %+v %v", r1, err)
	}
	r2, err := a.Alloc("norm", 10, 0)
	if err != nil || r2.Off != 256 || r2.Ptr%256 != 0 {
		t.Fatalf("second region must start at the next 256-byte boundary: %+v %v", r2, err)
	}
	r3, err := a.Alloc("small", 3, 4)
	if err != nil || r3.Off != 268 {
		t.Fatalf("4-aligned region: %+v %v", r3, err)
	}
	if _, err := a.Alloc("norm", 8, 0); err == nil {
		t.Fatal("duplicate name accepted")
	}
	if _, err := a.Alloc("odd", 8, 3); err == nil {
		t.Fatal("non-power-of-two alignment accepted")
	}
	if _, err := a.Alloc("huge", 4096, 0); err == nil {
		t.Fatal("overflow accepted")
	}
	if got, ok := a.Region("norm"); !ok || got != r2 {
		t.Fatalf("lookup: %+v %v", got, ok)
	}
	if len(a.Regions()) != 3 || a.Used() != 271 {
		t.Fatalf("regions %d used %d", len(a.Regions()), a.Used())
	}
	// Fill exactly to the end.
	if _, err := a.Alloc("rest", 4096-512, 0); err != nil {
		t.Fatal(err)
	}
	a.Reset()
	if a.Used() != 0 || len(a.Regions()) != 0 {
		t.Fatal("reset kept regions")
	}
	// An unaligned base still yields aligned addresses.
	b := newArena(0x10004, 1024)
	r, _ := b.Alloc("x", 4, 256)
	if r.Ptr%256 != 0 || r.Off != 252 {
		t.Fatalf("unaligned base: %+v", r)
	}
}

func TestArgsLayout(t *testing.T) {
	var a Args
	a.F32(2.5).Ptr(0x1122334455667788).I32(-3).U64(7)
	if a.Len() != 4 || a.err != nil {
		t.Fatalf("len %d err %v", a.Len(), a.err)
	}
	// float at 0, pointer aligned to 8, int at 16, u64 aligned to 24.
	want := []uint16{0, 8, 16, 24}
	for i, w := range want {
		if a.offs[i] != w {
			t.Fatalf("arg %d at %d, want %d", i, a.offs[i], w)
		}
	}
	if math.Float32frombits(*(*uint32)(unsafe.Pointer(&a.buf[0]))) != 2.5 ||
		*(*uint64)(unsafe.Pointer(&a.buf[8])) != 0x1122334455667788 ||
		*(*int32)(unsafe.Pointer(&a.buf[16])) != -3 {
		t.Fatal("values not stored in C layout")
	}
	a.Reset()
	for i := 0; i < maxArgs+1; i++ {
		a.U32(1)
	}
	if a.err == nil {
		t.Fatal("too many arguments accepted")
	}
}
