package synth

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"strings"
	"sync"

	"github.com/forge-llm/forge/dequant"
	"github.com/forge-llm/forge/gguf"
)

// Fill chooses how weight matrices get their values.
type Fill int

const (
	// FillQuantize draws Gaussian weights and encodes them with ggml's
	// reference quantizers (package dequant), so the blocks look like
	// llama-quantize's output for a Gaussian model. The K-quant encoders
	// are CPU-bound (~16 MB/s of Q4_K_M on two cores). It is the zero
	// value so that callers that predate Fill keep their exact bytes.
	FillQuantize Fill = iota
	// FillBlocks writes random blocks directly: every code comes from a
	// fast counter-based generator, and only the floating-point scale
	// fields are then set, to values chosen so that the dequantized
	// weights have the target standard deviation and zero mean. F16 and
	// F32 matrices come from a table of normal quantiles. It runs at
	// several GB/s per core, so `forge gen` writes at the disk's speed.
	// Types without a block recipe (blockFillable) still go through the
	// quantizer.
	FillBlocks
)

// Fills lists the fill modes in the order the CLI documents them.
func Fills() []Fill { return []Fill{FillBlocks, FillQuantize} }

func (f Fill) String() string {
	switch f {
	case FillQuantize:
		return "quantize"
	case FillBlocks:
		return "blocks"
	}
	return fmt.Sprintf("Fill(%d)", int(f))
}

// ParseFill accepts "blocks" or "quantize" in any case.
func ParseFill(s string) (Fill, error) {
	for _, f := range Fills() {
		if strings.EqualFold(s, f.String()) {
			return f, nil
		}
	}
	return 0, fmt.Errorf("synth: unknown fill %q (want blocks or quantize)", s)
}

// blockFillable reports whether FillBlocks has a recipe for weight type t:
// every type the mixes and their fallbacks produce.
func blockFillable(t gguf.Type) bool {
	switch t {
	case gguf.TypeF32, gguf.TypeF16, gguf.TypeQ4_0, gguf.TypeQ4_1, gguf.TypeQ5_0, gguf.TypeQ5_1,
		gguf.TypeQ8_0, gguf.TypeQ4_K, gguf.TypeQ5_K, gguf.TypeQ6_K, gguf.TypeMXFP4:
		return true
	}
	return false
}

// rng is wyrand: a 64-bit counter run through a 128-bit multiply and fold.
// One step yields 8 random bytes for an add and a multiply, which is what
// lets the block fill outrun a disk; its quality is far beyond what random
// weights need.
type rng uint64

func (r *rng) next() uint64 {
	*r += 0xa0761d6478bd642f
	hi, lo := bits.Mul64(uint64(*r), uint64(*r)^0xe7037ed1a0b428db)
	return hi ^ lo
}

// mix64 is SplitMix64's finaliser: it turns (seed, tensor, chunk) keys
// into unrelated generator states.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// chunkRNG is the generator of chunk c of tensor idx: its stream depends
// only on the seed and the chunk's place in the file, never on which
// worker fills it.
func chunkRNG(seed, idx uint64, c int) rng {
	return rng(mix64(mix64(seed^0x6a09e667f3bcc909) + idx*0x9e3779b97f4a7c15 + mix64(uint64(c)+1)))
}

// fillRandom fills b with random bytes, 8 per generator step.
func (r *rng) fillRandom(b []byte) {
	i := 0
	for ; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.next())
	}
	if i < len(b) {
		var t [8]byte
		binary.LittleEndian.PutUint64(t[:], r.next())
		copy(b[i:], t[:])
	}
}

// Scale recipes. With uniformly random codes, a block's dequantized values
// have a known second moment per unit of d (the f16 super-scale); d is
// then std/√(that moment). The recipes below keep every value finite and
// centre each group:
//
//   - Q4_0, Q5_0, Q8_0 (y = d·(q - z)): the codes' mean is -d/2, so each
//     block gets a random sign on d (ggml's own quantizer stores negative
//     d for half the blocks too), which cancels it on average.
//   - Q4_1, Q5_1 (y = d·q + m): m = -d·(2^bits - 1)/2 centres the block.
//   - Q4_K, Q5_K (y = d·sc·q - dmin·mn per group of 32): random 6-bit
//     group scales sc in [32, 63], dmin = 8d (Q4_K) or 16d (Q5_K), and
//     mn = round(sc·15/16) or round(sc·31/32), which puts each group's mean
//     within 4·d of zero (under 3 % of its spread).
//   - Q6_K (y = d·sc·(q - 32) per group of 16): signed group scales with
//     |sc| in [32, 63] and a random sign, which cancels the codes' -d/2.
const (
	kScaleLo = 32 // K-quant group scales are kScaleLo | 5 random bits
)

// kMin[bits][sc] is the 6-bit group min that centres a Q4_K (bits 4) or
// Q5_K (bits 5) group of scale sc.
var kMin = func() (t [6][64]uint8) {
	for sc := range 64 {
		t[4][sc] = uint8(math.Round(float64(sc) * 15 / 16))
		t[5][sc] = uint8(math.Round(float64(sc) * 31 / 32))
	}
	return
}()

// unitMoment is E[y²]/d² for a block of type t filled by fixBlocks.
func unitMoment(t gguf.Type) float64 {
	uniform := func(n float64) (mean, m2 float64) { // codes 0..n-1
		return (n - 1) / 2, (n*n - 1) / 12
	}
	switch t {
	case gguf.TypeQ4_0, gguf.TypeQ5_0, gguf.TypeQ8_0:
		n := map[gguf.Type]float64{gguf.TypeQ4_0: 16, gguf.TypeQ5_0: 32, gguf.TypeQ8_0: 256}[t]
		_, v := uniform(n)
		return v + 0.25 // the centred codes' mean is -1/2
	case gguf.TypeQ4_1:
		_, v := uniform(16)
		return v
	case gguf.TypeQ5_1:
		_, v := uniform(32)
		return v
	case gguf.TypeQ4_K, gguf.TypeQ5_K:
		b, ratio := 4, 8.0
		if t == gguf.TypeQ5_K {
			b, ratio = 5, 16
		}
		mean, v := uniform(float64(int(1) << b))
		s := 0.0
		for sc := kScaleLo; sc < 64; sc++ {
			off := mean*float64(sc) - ratio*float64(kMin[b][sc])
			s += float64(sc*sc)*v + off*off
		}
		return s / float64(64-kScaleLo)
	case gguf.TypeQ6_K:
		_, v := uniform(64)
		s := 0.0
		for sc := kScaleLo; sc < 64; sc++ {
			s += float64(sc*sc) * (v + 0.25)
		}
		return s / float64(64-kScaleLo)
	}
	return 1
}

// blockScales are the f16 scale fields of one tensor's blocks.
type blockScales struct {
	d, m uint16 // d; dmin for K-quants, m for Q4_1/Q5_1
	// tab maps 16 random bits to a weight (F16 as half bits in tab16,
	// F32 as float32 in tab32): quantiles of a normal distribution of the
	// target std.
	tab16 *[1 << 16]uint16
	tab32 *[1 << 16]float32
}

// normalQuantiles[k] is the (k+½)/65536 quantile of the standard normal:
// indexing it with 16 random bits draws an approximately normal value
// with no transcendental functions per draw.
var normalQuantiles = sync.OnceValue(func() *[1 << 16]float64 {
	var t [1 << 16]float64
	for k := range t {
		p := (float64(k) + 0.5) / (1 << 16)
		t[k] = math.Sqrt2 * math.Erfinv(2*p-1)
	}
	// Rescale to unit variance: the table's tails are cut at ±4.3σ.
	s := 0.0
	for _, x := range t {
		s += x * x
	}
	r := math.Sqrt(float64(len(t)) / s)
	for k := range t {
		t[k] *= r
	}
	return &t
})

// newBlockScales computes the scale fields that give type t's blocks a
// standard deviation of std.
func newBlockScales(t gguf.Type, std float64) *blockScales {
	s := &blockScales{}
	switch t {
	case gguf.TypeF16:
		var tab [1 << 16]uint16
		for k, x := range normalQuantiles() {
			tab[k] = dequant.F32ToF16(float32(std * x))
		}
		s.tab16 = &tab
		return s
	case gguf.TypeF32:
		var tab [1 << 16]float32
		for k, x := range normalQuantiles() {
			tab[k] = float32(std * x)
		}
		s.tab32 = &tab
		return s
	}
	if t == gguf.TypeMXFP4 {
		// The block scale is a power of two (E8M0, halved): the nearest
		// one to std over the codes' root mean square, √34.25 (the 16
		// E2M1 values, doubled, equally likely), so the deviation is
		// std's within a factor √2.
		e := math.Round(math.Log2(std/math.Sqrt(34.25))) + 128
		s.d = uint16(min(max(e, 0), 255))
		return s
	}
	d := dequant.F16ToF32(dequant.F32ToF16(float32(std / math.Sqrt(unitMoment(t)))))
	s.d = dequant.F32ToF16(d)
	switch t {
	case gguf.TypeQ4_1:
		s.m = dequant.F32ToF16(-7.5 * d)
	case gguf.TypeQ5_1:
		s.m = dequant.F32ToF16(-15.5 * d)
	case gguf.TypeQ4_K:
		s.m = dequant.F32ToF16(8 * d)
	case gguf.TypeQ5_K:
		s.m = dequant.F32ToF16(16 * d)
	}
	return s
}

// fillBlocks fills b (whole rows of type t) with random blocks whose
// dequantized values have the scales s give them.
func fillBlocks(t gguf.Type, b []byte, s *blockScales, r *rng) {
	switch t {
	case gguf.TypeF16:
		tab := s.tab16
		i := 0
		for ; i+8 <= len(b); i += 8 {
			x := r.next()
			binary.LittleEndian.PutUint64(b[i:], uint64(tab[uint16(x)])|uint64(tab[uint16(x>>16)])<<16|
				uint64(tab[uint16(x>>32)])<<32|uint64(tab[uint16(x>>48)])<<48)
		}
		for ; i+2 <= len(b); i += 2 {
			binary.LittleEndian.PutUint16(b[i:], tab[uint16(r.next())])
		}
		return
	case gguf.TypeF32:
		tab := s.tab32
		i := 0
		for ; i+16 <= len(b); i += 16 {
			x := r.next()
			binary.LittleEndian.PutUint64(b[i:], uint64(math.Float32bits(tab[uint16(x)]))|uint64(math.Float32bits(tab[uint16(x>>16)]))<<32)
			binary.LittleEndian.PutUint64(b[i+8:], uint64(math.Float32bits(tab[uint16(x>>32)]))|uint64(math.Float32bits(tab[uint16(x>>48)]))<<32)
		}
		for ; i+4 <= len(b); i += 4 {
			binary.LittleEndian.PutUint32(b[i:], math.Float32bits(tab[uint16(r.next())]))
		}
		return
	}
	r.fillRandom(b)
	bb := int(t.BlockBytes())
	d0, d1, m0, m1 := byte(s.d), byte(s.d>>8), byte(s.m), byte(s.m>>8)
	switch t {
	case gguf.TypeMXFP4:
		for o := 0; o+bb <= len(b); o += bb {
			b[o] = d0 // the shared exponent; the codes stay random
		}
	case gguf.TypeQ4_0, gguf.TypeQ5_0, gguf.TypeQ8_0:
		// d is the first field; keep the random top bit as its sign.
		for o := 0; o+bb <= len(b); o += bb {
			b[o], b[o+1] = d0, d1|b[o+1]&0x80
		}
	case gguf.TypeQ4_1, gguf.TypeQ5_1:
		for o := 0; o+bb <= len(b); o += bb {
			b[o], b[o+1], b[o+2], b[o+3] = d0, d1, m0, m1
		}
	case gguf.TypeQ4_K, gguf.TypeQ5_K:
		mins := &kMin[4]
		if t == gguf.TypeQ5_K {
			mins = &kMin[5]
		}
		for o := 0; o+bb <= len(b); o += bb {
			blk := b[o : o+16 : o+16]
			rnd := binary.LittleEndian.Uint64(blk[4:12]) // the random scale bytes
			var sc, mn [8]uint8
			for j := range sc {
				sc[j] = kScaleLo | uint8(rnd>>(5*j))&31
				mn[j] = mins[sc[j]]
			}
			blk[0], blk[1], blk[2], blk[3] = d0, d1, m0, m1
			// Pack as BlockQ4_K documents: groups 0..3 in the low 6 bits
			// of bytes 0..7, groups 4..7 in nibbles of bytes 8..11 plus
			// the top 2 bits of bytes 0..7.
			s := blk[4:16]
			for k := range 4 {
				s[k] = sc[k] | (sc[k+4]>>4)<<6
				s[k+4] = mn[k] | (mn[k+4]>>4)<<6
				s[k+8] = sc[k+4]&15 | (mn[k+4]&15)<<4
			}
		}
	case gguf.TypeQ6_K:
		for o := 0; o+bb <= len(b); o += bb {
			blk := b[o : o+bb : o+bb]
			for j, v := range blk[192:208] {
				// |sc| = 32 | 5 random bits, negated (branch-free, the
				// sign is a coin flip) when the random top bit is set.
				neg := byte(int8(v) >> 7)
				blk[192+j] = (kScaleLo | v&31) ^ neg - neg
			}
			blk[208], blk[209] = d0, d1
		}
	default:
		panic(fmt.Sprintf("synth: no block recipe for %s", t)) // blockFillable guards
	}
}
