package dequant

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/forge-llm/forge/gguf"
)

// roundTripBound is the largest relative RMS error accepted when fresh
// random data is quantized and dequantized, per type and distribution.
// They are the measured values (logged by the test) plus 25%, rounded.
// The formats' step sizes explain them: uniform data on [-1, 1) quantized
// with step s has RMS error s/√12 against a signal RMS of 1/√3, so Q4_1
// (s ≈ 2/15) sits near 0.067 and Q8_0 (s ≈ 2/254) near 0.004; the K types
// fit per-group scales that do a little better at the same bits.
var roundTripBound = map[gguf.Type]map[string]float64{
	gguf.TypeF32:  {"normal": 0, "uniform": 0, "heavy": 0},
	gguf.TypeF16:  {"normal": 3e-4, "uniform": 3e-4, "heavy": 3e-4},
	gguf.TypeBF16: {"normal": 2.5e-3, "uniform": 2.5e-3, "heavy": 2.5e-3},
	gguf.TypeQ8_0: {"normal": 0.0067, "uniform": 0.0048, "heavy": 0.0090},
	gguf.TypeQ8_1: {"normal": 0.0067, "uniform": 0.0048, "heavy": 0.0090},
	gguf.TypeQ8_K: {"normal": 0.0087, "uniform": 0.0050, "heavy": 0.0142},
	gguf.TypeQ6_K: {"normal": 0.022, "uniform": 0.0165, "heavy": 0.029},
	gguf.TypeQ5_0: {"normal": 0.054, "uniform": 0.039, "heavy": 0.072},
	gguf.TypeQ5_1: {"normal": 0.047, "uniform": 0.037, "heavy": 0.058},
	gguf.TypeQ5_K: {"normal": 0.045, "uniform": 0.035, "heavy": 0.056},
	gguf.TypeQ4_0: {"normal": 0.107, "uniform": 0.082, "heavy": 0.144},
	gguf.TypeQ4_1: {"normal": 0.098, "uniform": 0.076, "heavy": 0.119},
	gguf.TypeQ4_K: {"normal": 0.089, "uniform": 0.068, "heavy": 0.110},
	gguf.TypeQ3_K: {"normal": 0.189, "uniform": 0.157, "heavy": 0.233},
	gguf.TypeQ2_K: {"normal": 0.371, "uniform": 0.291, "heavy": 0.438},
}

// randomData returns n values from one of three distributions: standard
// normal, uniform on [-1, 1), and heavy-tailed (normal divided by the
// square root of an exponential, so occasional large outliers).
func randomData(r *rand.Rand, dist string, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		switch dist {
		case "normal":
			x[i] = float32(r.NormFloat64())
		case "uniform":
			x[i] = float32(2*r.Float64() - 1)
		case "heavy":
			x[i] = float32(r.NormFloat64() / math.Sqrt(r.ExpFloat64()+0.05))
		}
	}
	return x
}

func TestRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const n = 256 * 256
	for _, typ := range quantizableTypes {
		for _, dist := range []string{"normal", "uniform", "heavy"} {
			x := randomData(r, dist, n)
			rowBytes, _ := typ.RowBytes(n)
			q := make([]byte, rowBytes)
			if err := Quantize(typ, x, q); err != nil {
				t.Fatal(err)
			}
			y := make([]float32, n)
			if err := ToFloat32(typ, q, y); err != nil {
				t.Fatal(err)
			}
			e := relRMS(y, x)
			bound := roundTripBound[typ][dist]
			t.Logf("%-5s %-7s rel RMS error %.5f (bound %.4f)", typ, dist, e, bound)
			if e > bound {
				t.Errorf("%s %s: relative RMS error %.5f > %.4f", typ, dist, e, bound)
			}
		}
	}
}

// TestRoundTripExactCases: conversions that must be exact, and the
// special blocks every quantizer must handle (all zero, constant).
func TestRoundTripExactCases(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	x := randomData(r, "heavy", 4096)
	for _, typ := range []gguf.Type{gguf.TypeF32, gguf.TypeF16, gguf.TypeBF16} {
		q := make([]byte, 4096*typ.BlockBytes())
		if err := Quantize(typ, x, q); err != nil {
			t.Fatal(err)
		}
		y := make([]float32, len(x))
		if err := ToFloat32(typ, q, y); err != nil {
			t.Fatal(err)
		}
		for i := range x {
			var want float32
			switch typ {
			case gguf.TypeF32:
				want = x[i]
			case gguf.TypeF16:
				want = F16ToF32(F32ToF16(x[i]))
			case gguf.TypeBF16:
				want = BF16ToF32(F32ToBF16(x[i]))
			}
			if y[i] != want {
				t.Fatalf("%s: y[%d] = %v, want %v", typ, i, y[i], want)
			}
		}
	}
	for _, typ := range quantizableTypes {
		bs := typ.BlockSize()
		if bs == 1 {
			bs = 32
		}
		for _, c := range []float32{0, 1.5, -3} {
			x := make([]float32, bs)
			for i := range x {
				x[i] = c
			}
			q := make([]byte, bs/typ.BlockSize()*typ.BlockBytes())
			if err := Quantize(typ, x, q); err != nil {
				t.Fatal(err)
			}
			y := make([]float32, bs)
			if err := ToFloat32(typ, q, y); err != nil {
				t.Fatal(err)
			}
			for i := range y {
				// A constant block is exact up to the f16 rounding of its
				// scale: relative 2^-11 (plus one step of 1/63 or 1/127 of
				// the scale for the K types' 6-bit and 8-bit scales).
				if d := math.Abs(float64(y[i] - c)); d > 0.02*math.Abs(float64(c)) || (c == 0 && y[i] != 0) {
					t.Fatalf("%s constant %v: y[%d] = %v", typ, c, i, y[i])
				}
			}
		}
	}
}

// TestQ8Sums checks the derived fields of the activation formats: Q8_1's
// s = d·Σq and Q8_K's per-16 sums.
func TestQ8Sums(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	x := randomData(r, "normal", 1024)
	q81 := make([]byte, 32*36)
	if err := Quantize(gguf.TypeQ8_1, x, q81); err != nil {
		t.Fatal(err)
	}
	for b := 0; b < 32; b++ {
		blk := q81[36*b:]
		sum := 0
		for _, v := range blk[4:36] {
			sum += int(int8(v))
		}
		d := F16ToF32(binary.LittleEndian.Uint16(blk))
		// s is rounded from the float32 d before d itself is rounded to
		// f16, so compare within f16 precision of both.
		s := F16ToF32(binary.LittleEndian.Uint16(blk[2:]))
		if want := float64(sum) * float64(d); math.Abs(float64(s)-want) > 2e-3*math.Abs(want)+1e-6 {
			t.Errorf("Q8_1 block %d: s = %v, want d·Σq = %v", b, s, want)
		}
	}
	q8k := make([]byte, 4*292)
	if err := Quantize(gguf.TypeQ8_K, x, q8k); err != nil {
		t.Fatal(err)
	}
	for b := 0; b < 4; b++ {
		blk := q8k[292*b:]
		for g := 0; g < 16; g++ {
			sum := 0
			for _, v := range blk[4+16*g : 4+16*g+16] {
				sum += int(int8(v))
			}
			if got := int(int16(binary.LittleEndian.Uint16(blk[260+2*g:]))); got != sum {
				t.Errorf("Q8_K block %d: bsums[%d] = %d, want %d", b, g, got, sum)
			}
		}
	}
}
