package dequant

import (
	"bytes"
	"encoding/binary"
	"math"
	"testing"

	"github.com/forge-llm/forge/gguf"
)

// Hand-computed blocks: each case builds one block field by field, and the
// expected outputs were worked out on paper from the formulas in the block
// doc comments. They exercise signs, scale extremes (f16 max, subnormal,
// negative scales), every high-bit plane of Q5/Q6/Q3 and the packed 6-bit
// scales of the K types.

// span sets want[from:to] = v.
type span struct {
	from, to int
	v        float32
}

// expect builds an n-element expectation from spans, later ones winning.
func expect(n int, spans ...span) []float32 {
	w := make([]float32, n)
	for _, s := range spans {
		for i := s.from; i < s.to; i++ {
			w[i] = s.v
		}
	}
	return w
}

// at is a one-element span.
func at(i int, v float32) span { return span{i, i + 1, v} }

func blockBytes(t *testing.T, block any) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := binary.Write(&buf, binary.LittleEndian, block); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Half-precision bit patterns used below.
const (
	h1      = 0x3C00 // 1
	hHalf   = 0x3800 // 0.5
	hQuart  = 0x3400 // 0.25
	hTwo    = 0x4000 // 2
	hNeg1   = 0xBC00 // -1
	hNegTwo = 0xC000 // -2
	hNeg8   = 0xC800 // -8
	hMax    = 0x7BFF // 65504, the largest finite half
	hSub    = 0x0001 // 2^-24, the smallest subnormal half
)

type handCase struct {
	name  string
	typ   gguf.Type
	block any
	want  []float32
}

func handCases() []handCase {
	sixteen := func(b byte) (q [16]uint8) {
		for i := range q {
			q[i] = b
		}
		return
	}
	var cases []handCase

	// Q4_0: y = (nibble-8)·d; low nibbles are elements 0..15, high 16..31.
	q40 := BlockQ4_0{D: hHalf, Qs: sixteen(0x88)}
	q40.Qs[0] = 0x0F // y0 = 7·0.5, y16 = -8·0.5
	q40.Qs[1] = 0x80 // y1 = -4, y17 = 0
	cases = append(cases, handCase{"Q4_0", gguf.TypeQ4_0, q40,
		expect(32, at(0, 3.5), at(16, -4), at(1, -4))})
	q40max := BlockQ4_0{D: hMax, Qs: sixteen(0x88)}
	q40max.Qs[15] = 0x0F // y15 = 7·65504, y31 = -8·65504
	cases = append(cases, handCase{"Q4_0 max scale", gguf.TypeQ4_0, q40max,
		expect(32, at(15, 458528), at(31, -524032))})
	q40neg := BlockQ4_0{D: hNegTwo, Qs: sixteen(0x88)}
	q40neg.Qs[3] = 0xF0 // y3 = -8·-2 = 16, y19 = 7·-2 = -14
	cases = append(cases, handCase{"Q4_0 negative scale", gguf.TypeQ4_0, q40neg,
		expect(32, at(3, 16), at(19, -14))})
	q40sub := BlockQ4_0{D: hSub, Qs: sixteen(0x00)} // every code -8
	cases = append(cases, handCase{"Q4_0 subnormal scale", gguf.TypeQ4_0, q40sub,
		expect(32, span{0, 32, -8.0 / (1 << 24)})})

	// Q4_1: y = nibble·d + m.
	q41 := BlockQ4_1{D: hQuart, M: hNeg1, Qs: sixteen(0x44)} // 4·0.25-1 = 0
	q41.Qs[0] = 0xF0                                         // y0 = -1, y16 = 15·0.25-1 = 2.75
	cases = append(cases, handCase{"Q4_1", gguf.TypeQ4_1, q41,
		expect(32, at(0, -1), at(16, 2.75))})

	// Q5_0: y = (nibble | qh bit<<4 - 16)·d. Qh bits 0, 17 and 31 set.
	q50 := BlockQ5_0{D: h1, Qh: [4]uint8{0x01, 0x00, 0x02, 0x80}}
	q50.Qs[0] = 0xF5  // y0 = (5|16)-16 = 5, y16 = 15-16 = -1 (bit 16 clear)
	q50.Qs[15] = 0x0A // y15 = 10-16 = -6, y31 = (0|16)-16 = 0
	cases = append(cases, handCase{"Q5_0", gguf.TypeQ5_0, q50,
		expect(32, span{0, 32, -16}, at(0, 5), at(16, -1), at(15, -6), at(31, 0), at(17, 0))})

	// Q5_1: y = (nibble | bit<<4)·d + m.
	q51 := BlockQ5_1{D: hHalf, M: hNeg8, Qh: [4]uint8{0x01, 0, 0, 0}}
	q51.Qs[0] = 0x1F // y0 = 31·0.5-8 = 7.5, y16 = 1·0.5-8 = -7.5
	cases = append(cases, handCase{"Q5_1", gguf.TypeQ5_1, q51,
		expect(32, span{0, 32, -8}, at(0, 7.5), at(16, -7.5))})

	// Q8_0 / Q8_1: y = q·d, q signed.
	q80 := BlockQ8_0{D: hHalf}
	q80.Qs[0], q80.Qs[1], q80.Qs[2] = 127, -128, -1
	cases = append(cases, handCase{"Q8_0", gguf.TypeQ8_0, q80,
		expect(32, at(0, 63.5), at(1, -64), at(2, -0.5))})
	q80n := BlockQ8_0{D: hNegTwo}
	q80n.Qs[31] = 100
	cases = append(cases, handCase{"Q8_0 negative scale", gguf.TypeQ8_0, q80n,
		expect(32, at(31, -200))})
	q81 := BlockQ8_1{D: hQuart, S: 0x7BFF /* ignored by decoding */}
	q81.Qs[31], q81.Qs[5] = -127, 4
	cases = append(cases, handCase{"Q8_1", gguf.TypeQ8_1, q81,
		expect(32, at(31, -31.75), at(5, 1))})

	// Q2_K: y = d·lo(Scales[g])·q - dmin·hi(Scales[g]); element
	// 128h+32s+l is bits 2s of Qs[32h+l]. d = 1, dmin = 0.5.
	q2 := BlockQ2_K{D: h1, Dmin: hHalf}
	q2.Scales[0] = 0x01  // group 0: scale 1, min 0
	q2.Scales[2] = 0x01  // group 2 (elements 32..47): scale 1
	q2.Scales[4] = 0x0F  // group 4 (64..79): scale 15
	q2.Scales[6] = 0x12  // group 6 (96..111): scale 2, min 1 → -0.5
	q2.Scales[15] = 0xF0 // group 15 (240..255): scale 0, min 15 → -7.5
	q2.Qs[0] = 0xE7      // codes 3 (el 0), 1 (el 32), 2 (el 64), 3 (el 96)
	q2.Qs[63] = 0xC0     // el 255: code 3, but scale 0
	cases = append(cases, handCase{"Q2_K", gguf.TypeQ2_K, q2,
		expect(256, at(0, 3), at(32, 1), at(64, 30), span{96, 112, -0.5}, at(96, 5.5), span{240, 256, -7.5})})

	// Q3_K: d = 0.5; 6-bit scales biased by 32 (code 32 → 0 for unused
	// groups: low nibbles 0, high 2-bit fields 2, so bytes 8..11 = 0xAA).
	// group 0: code 63 → 31; group 5: 33 → 1; group 10: 47 → 15;
	// group 15: 0 → -32. q = low2 - (hmask bit ? 0 : 4).
	q3 := BlockQ3_K{D: hHalf}
	q3.Scales = [12]uint8{0x0F, 0, 0xF0, 0, 0, 0x01, 0, 0, 0xAB, 0xAA, 0xAA, 0x2A}
	q3.Qs[0], q3.Hmask[0] = 0x03, 0x01   // el 0: q = 3 → 0.5·31·3
	q3.Hmask[1] = 0x01                   // el 1: q = 0
	q3.Qs[2] = 0x03                      // el 2: q = 3-4 = -1
	q3.Qs[16], q3.Hmask[16] = 0x20, 0x04 // el 80 (s=2, l=16): q = 2
	q3.Qs[47], q3.Hmask[15] = 0x04, 0x20 // el 175 (h=1, s=1, l=15): q = 1
	q3.Qs[63], q3.Hmask[31] = 0xC0, 0x80 // el 255 (h=1, s=3, l=31): q = 3
	cases = append(cases, handCase{"Q3_K", gguf.TypeQ3_K, q3,
		expect(256,
			span{0, 16, -62}, at(0, 46.5), at(1, 0), at(2, -15.5),
			span{80, 96, -2}, at(80, 1),
			span{160, 176, -30}, at(175, 7.5),
			span{240, 256, 64}, at(255, -48))})

	// Q4_K: d = 0.5, dmin = 0.25. Groups (scale, min): 0 (63, 0),
	// 3 (1, 63), 4 (63, 63), 7 (17, 32), others (0, 0); see BlockQ4_K
	// for the packing.
	q4 := BlockQ4_K{D: hHalf, Dmin: hQuart}
	q4.Scales = [12]uint8{0xFF, 0, 0, 0x41, 0xC0, 0, 0, 0xBF, 0xFF, 0, 0, 0x01}
	q4.Qs[0] = 0x0F   // el 0 (group 0): 31.5·15
	q4.Qs[63] = 0xF0  // el 127 (group 3, high nibble of Qs[63]): 0.5·15 - 15.75
	q4.Qs[64] = 0x0A  // el 128 (group 4): 31.5·10 - 15.75
	q4.Qs[127] = 0x30 // el 255 (group 7): 8.5·3 - 8
	cases = append(cases, handCase{"Q4_K", gguf.TypeQ4_K, q4,
		expect(256, at(0, 472.5),
			span{96, 128, -15.75}, at(127, -8.25),
			span{128, 160, -15.75}, at(128, 299.25),
			span{224, 256, -8}, at(255, 17.5))})

	// Q5_K: d = dmin = 1. Groups (scale, min): 0 (1, 0), 1 (2, 1),
	// 6 (1, 16), 7 (63, 0). Fifth bit of element i: bit i/32 of Qh[i%32].
	q5 := BlockQ5_K{D: h1, Dmin: h1}
	q5.Scales = [12]uint8{1, 2, 0, 0xC0, 0, 1, 0x40, 0, 0, 0, 0x01, 0x0F}
	q5.Qs[0] = 0xFF   // el 0: 15 | 16 (Qh[0] bit 0) = 31; el 32: 15 (bit 1 clear) → 2·15-1
	q5.Qh[0] = 0x41   // bits 0 (el 0) and 6 (el 192)
	q5.Qh[1] = 0x02   // el 33: 0 | 16 → 2·16-1
	q5.Qh[31] = 0x80  // el 255: bit 7
	q5.Qs[127] = 0xF0 // el 255: 15 | 16 = 31 → 63·31
	cases = append(cases, handCase{"Q5_K", gguf.TypeQ5_K, q5,
		expect(256, at(0, 31),
			span{32, 64, -1}, at(32, 29), at(33, 31),
			span{192, 224, -16}, at(192, 0),
			at(255, 1953))})

	// Q6_K: d = 0.5, y = d·sc·(q-32). Scales: 0 → 127, 1 → -128, 2 → 1,
	// 4 → 1, 8 → 2, 15 → -1. Planes: Qh bits 0-1 (el l), 2-3 (el l+32),
	// 4-5 (el l+64), 6-7 (el l+96).
	q6 := BlockQ6_K{D: hHalf}
	q6.Scales[0], q6.Scales[1], q6.Scales[2], q6.Scales[4], q6.Scales[8], q6.Scales[15] = 127, -128, 1, 1, 2, -1
	q6.Ql[0] = 0x5F   // el 0: low 15; el 64: high 5
	q6.Qh[0] = 0x27   // el 0: bits 0-1 = 3 → q 63; el 32: bits 2-3 = 1; el 64: bits 4-5 = 2 → q 37
	q6.Ql[32] = 0x03  // el 32: 3 | 1<<4 = 19
	q6.Qh[16] = 0x02  // el 16: q = 0 | 2<<4 = 32 → 0
	q6.Ql[64] = 0x01  // el 128: low 1
	q6.Qh[32] = 0x01  // el 128: bits 0-1 = 1 → q 17
	q6.Ql[127] = 0xF0 // el 255: high 15
	q6.Qh[63] = 0xC0  // el 255: bits 6-7 = 3 → q 63
	cases = append(cases, handCase{"Q6_K", gguf.TypeQ6_K, q6,
		expect(256,
			span{0, 16, -2032}, at(0, 1968.5),
			span{16, 32, 2048}, at(16, 0),
			span{32, 48, -16}, at(32, -6.5),
			span{64, 80, -16}, at(64, 2.5),
			span{128, 144, -32}, at(128, -15),
			span{240, 256, 16}, at(255, -15.5))})

	// Q8_K: float32 d.
	q8k := BlockQ8_K{D: 0.125}
	q8k.Qs[0], q8k.Qs[100], q8k.Qs[255] = 127, -3, -128
	cases = append(cases, handCase{"Q8_K", gguf.TypeQ8_K, q8k,
		expect(256, at(0, 15.875), at(100, -0.375), at(255, -16))})

	// IQ4_NL: y = d·table[code]; table[8] = 1, table[0] = -127, table[15] = 113.
	iq4 := BlockIQ4_NL{D: hTwo, Qs: sixteen(0x88)}
	iq4.Qs[0] = 0xF0 // y0 = 2·-127, y16 = 2·113
	iq4.Qs[7] = 0x78 // y7 = 2·1, y23 = 2·-10
	cases = append(cases, handCase{"IQ4_NL", gguf.TypeIQ4_NL, iq4,
		expect(32, span{0, 32, 2}, at(0, -254), at(16, 226), at(23, -20))})

	// IQ4_XS: d = 1, group scales ls-32: group 0 → 31 (ls 63), group 1 →
	// -32 (ls 0), group 7 → 1 (ls 33), others 0 (ls 32).
	iq4xs := BlockIQ4_XS{D: h1, ScalesH: 0xAAA3, ScalesL: [4]uint8{0x0F, 0, 0, 0x10}}
	iq4xs.Qs[0] = 0x0F   // el 0: 31·113; el 16: 31·-127
	iq4xs.Qs[16] = 0x08  // el 32: -32·1; el 48: -32·-127
	iq4xs.Qs[127] = 0x80 // el 239: 1·-127; el 255: 1·1
	cases = append(cases, handCase{"IQ4_XS", gguf.TypeIQ4_XS, iq4xs,
		expect(256,
			span{0, 32, -3937}, at(0, 3503),
			span{32, 64, 4064}, at(32, -32),
			span{224, 256, -127}, at(255, 1))})

	// MXFP4: y = table[code]·2^(E-128); table = doubled E2M1 values.
	mx := BlockMXFP4{E: 128}
	mx.Qs[0] = 0x7F // y0 = table[15] = -12, y16 = table[7] = 12
	mx.Qs[1] = 0x98 // y1 = table[8] = 0 (E2M1 -0), y17 = table[9] = -1
	mx.Qs[2] = 0x53 // y2 = 3, y18 = 6
	cases = append(cases, handCase{"MXFP4", gguf.TypeMXFP4, mx,
		expect(32, at(0, -12), at(16, 12), at(17, -1), at(2, 3), at(18, 6))})
	for _, e := range []struct {
		e     uint8
		scale float32
	}{{0, 0x1p-128}, {1, 0x1p-127}, {2, 0x1p-126}, {254, 0x1p126}, {255, 0x1p127}} {
		m := BlockMXFP4{E: e.e}
		m.Qs[4] = 0xF7 // y4 = 12·scale, y20 = -12·scale
		cases = append(cases, handCase{"MXFP4 exponent extreme", gguf.TypeMXFP4, m,
			expect(32, at(4, 12*e.scale), at(20, -12*e.scale))})
	}

	// F16 and BF16 elements.
	cases = append(cases, handCase{"F16", gguf.TypeF16,
		[]uint16{h1, hNegTwo, hMax, hSub, 0x8400, 0x3555, 0x7C00, 0xFC00, 0x8000},
		[]float32{1, -2, 65504, 0x1p-24, -0x1p-14, 0.333251953125, float32(math.Inf(1)), float32(math.Inf(-1)), 0}})
	cases = append(cases, handCase{"BF16", gguf.TypeBF16,
		[]uint16{0x3F80, 0xC0A0, 0x7F7F, 0x0001, 0x3EAB, 0xFF80},
		[]float32{1, -5, 0x1.fep127, 0x1p-133, 0.333984375, float32(math.Inf(-1))}})
	cases = append(cases, handCase{"F32", gguf.TypeF32,
		[]float32{1.5, -0x1p-149, math.MaxFloat32},
		[]float32{1.5, -0x1p-149, math.MaxFloat32}})
	return cases
}

func TestHandComputedBlocks(t *testing.T) {
	defer func(saved bool) { useAVX2 = saved }(useAVX2)
	if useAVX2 {
		t.Run("AVX2", testHandComputedBlocks)
	}
	useAVX2 = false
	t.Run("generic", testHandComputedBlocks)
}

func testHandComputedBlocks(t *testing.T) {
	seen := map[gguf.Type]bool{}
	for _, c := range handCases() {
		seen[c.typ] = true
		src := blockBytes(t, c.block)
		got := make([]float32, len(c.want))
		if err := ToFloat32(c.typ, src, got); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		for i := range got {
			if got[i] != c.want[i] {
				t.Errorf("%s: y[%d] = %v, want %v", c.name, i, got[i], c.want[i])
			}
		}
		// The same block decoded to half precision must be the f16
		// rounding of the float32 result.
		h := make([]uint16, len(c.want))
		if err := ToFloat16(c.typ, src, h); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		for i := range h {
			if w := F32ToF16(got[i]); h[i] != w {
				t.Errorf("%s: f16 y[%d] = %#04x, want %#04x", c.name, i, h[i], w)
			}
		}
	}
	for _, typ := range supportedTypes {
		if !seen[typ] {
			t.Errorf("no hand-computed block for %s", typ)
		}
	}
}

func TestNaNDecoding(t *testing.T) {
	for _, c := range []struct {
		typ gguf.Type
		b   []byte
	}{
		{gguf.TypeF16, []byte{0x00, 0x7E}},
		{gguf.TypeBF16, []byte{0xC0, 0x7F}},
		{gguf.TypeF32, []byte{0x00, 0x00, 0xC0, 0x7F}},
	} {
		got := make([]float32, 1)
		if err := ToFloat32(c.typ, c.b, got); err != nil {
			t.Fatal(err)
		}
		if !math.IsNaN(float64(got[0])) {
			t.Errorf("%s % x: got %v, want NaN", c.typ, c.b, got[0])
		}
	}
}
