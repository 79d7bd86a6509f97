package dequant

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

// halfValue is an independent definition of a binary16 value, in float64.
func halfValue(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp := int(h>>10) & 0x1f
	mant := float64(h & 0x3ff)
	switch exp {
	case 0:
		return sign * math.Ldexp(mant, -24)
	case 0x1f:
		if mant != 0 {
			return math.NaN()
		}
		return sign * math.Inf(1)
	}
	return sign * math.Ldexp(1024+mant, exp-25)
}

func TestF16ToF32Exhaustive(t *testing.T) {
	for i := 0; i < 1<<16; i++ {
		h := uint16(i)
		got, want := float64(F16ToF32(h)), halfValue(h)
		if math.IsNaN(want) {
			if !math.IsNaN(got) {
				t.Fatalf("F16ToF32(%#04x) = %v, want NaN", h, got)
			}
			continue
		}
		if got != want || math.Signbit(got) != math.Signbit(want) {
			t.Fatalf("F16ToF32(%#04x) = %v, want %v", h, got, want)
		}
		if back := F32ToF16(float32(got)); back != h {
			t.Fatalf("F32ToF16(F16ToF32(%#04x)) = %#04x", h, back)
		}
		if f16ToF32Table[h] != F16ToF32(h) && !math.IsNaN(want) {
			t.Fatalf("table[%#04x] disagrees", h)
		}
	}
}

// refF32ToF16 rounds |f| to the nearest of the sorted non-negative halves
// (with 65536 standing in for infinity), ties to the even bit pattern.
func refF32ToF16(lattice []float64, f float32) uint16 {
	sign := uint16(0)
	if math.Signbit(float64(f)) {
		sign = 0x8000
	}
	a := math.Abs(float64(f))
	if math.IsInf(a, 1) || a >= 65536 {
		return sign | 0x7c00
	}
	k := sort.SearchFloat64s(lattice, a) // lattice[k-1] < a <= lattice[k]
	if lattice[k] == a {
		return sign | uint16(k)
	}
	lo, hi := k-1, k
	dl, dh := a-lattice[lo], lattice[hi]-a
	switch {
	case dl < dh:
		return sign | uint16(lo)
	case dh < dl:
		return sign | uint16(hi)
	case lo%2 == 0:
		return sign | uint16(lo)
	}
	return sign | uint16(hi)
}

func TestF32ToF16RoundsToNearestEven(t *testing.T) {
	lattice := make([]float64, 0x7c01) // index = bit pattern of a non-negative half
	for h := 0; h < 0x7c00; h++ {
		lattice[h] = halfValue(uint16(h))
	}
	lattice[0x7c00] = 65536
	check := func(f float32) {
		t.Helper()
		if got, want := F32ToF16(f), refF32ToF16(lattice, f); got != want {
			t.Fatalf("F32ToF16(%g = %#08x) = %#04x, want %#04x", f, math.Float32bits(f), got, want)
		}
	}
	// Every midpoint between neighbouring halves, and its float32 neighbours:
	// the cases where rounding direction and ties matter.
	for h := 0; h < 0x7c00; h++ {
		mid := float32((lattice[h] + lattice[h+1]) / 2) // exact: 12 significant bits
		for _, f := range []float32{mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, math.MaxFloat32)} {
			check(f)
			check(-f)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 1 << 20 {
		f := math.Float32frombits(r.Uint32())
		if math.IsNaN(float64(f)) {
			if got := F32ToF16(f); got&0x7fff != 0x7e00 {
				t.Fatalf("F32ToF16(NaN %#08x) = %#04x, want quiet NaN 0x7e00", math.Float32bits(f), got)
			}
			continue
		}
		check(f)
	}
	for _, f := range []float32{0, 65504, 65519.99, 65520, 1e10, 0x1p-25, 0x1.000002p-25, 0x1p-26, 0x1.8p-24, 0x1p-14 - 0x1p-26} {
		check(f)
		check(-f)
	}
}

func TestBF16(t *testing.T) {
	for _, c := range []struct {
		f    uint32
		want uint16
	}{
		{0x3F800000, 0x3F80}, // 1
		{0x3F808000, 0x3F80}, // tie, even stays
		{0x3F818000, 0x3F82}, // tie, odd rounds up
		{0x3F808001, 0x3F81}, // above the tie
		{0xBF80FFFF, 0xBF81}, // negative, rounds away in magnitude
		{0x7F7FFFFF, 0x7F80}, // largest float rounds to infinity
		{0x00000001, 0x0000}, // smallest subnormal rounds to zero
		{0x00018000, 0x0002}, // subnormals are kept, not flushed
		{0x7F800000, 0x7F80}, // +inf
		{0xFF800000, 0xFF80}, // -inf
		{0x7F800001, 0x7FC0}, // signalling NaN forced quiet
		{0xFFC12345, 0xFFC1}, // quiet NaN keeps its top bits
	} {
		if got := F32ToBF16(math.Float32frombits(c.f)); got != c.want {
			t.Errorf("F32ToBF16(%#08x) = %#04x, want %#04x", c.f, got, c.want)
		}
	}
	for i := 0; i < 1<<16; i++ {
		h := uint16(i)
		f := BF16ToF32(h)
		if math.Float32bits(f) != uint32(h)<<16 {
			t.Fatalf("BF16ToF32(%#04x) = %#08x", h, math.Float32bits(f))
		}
		if !math.IsNaN(float64(f)) && F32ToBF16(f) != h {
			t.Fatalf("BF16 round trip of %#04x", h)
		}
	}
}
