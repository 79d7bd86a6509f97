package dequant

import (
	"encoding/binary"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/forge-llm/forge/gguf"
)

// benchBlocks returns realistic encoded data for n elements of typ: real
// quantizer output where Quantize supports typ, otherwise random codes
// with finite, moderate scales (so no NaN or subnormal slow paths skew
// the timing).
func benchBlocks(typ gguf.Type, n int) []byte {
	r := rand.New(rand.NewPCG(11, 12))
	size, _ := typ.RowBytes(uint64(n))
	b := make([]byte, size)
	if encoderFor(typ) != nil {
		if err := Quantize(typ, randomData(r, "normal", n), b); err != nil {
			panic(err)
		}
		return b
	}
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	bb := typ.BlockBytes()
	scale := func(blk []byte, off int) {
		binary.LittleEndian.PutUint16(blk[off:], F32ToF16(float32(0.01+0.01*r.Float64())))
	}
	for blk := b; len(blk) >= bb; blk = blk[bb:] {
		switch typ {
		case gguf.TypeQ2_K:
			scale(blk, 80)
			scale(blk, 82)
		case gguf.TypeQ3_K:
			scale(blk, 108)
		case gguf.TypeIQ4_NL, gguf.TypeIQ4_XS:
			scale(blk, 0)
		case gguf.TypeMXFP4:
			blk[0] = byte(118 + r.IntN(8))
		}
	}
	return b
}

// cpuThroughput runs the benchmark loop body on one locked OS thread and
// also reports MB of input per CPU-second of that thread ("cpuMB/s"),
// which, unlike the wall-clock MB/s, does not drop when other processes
// take the core.
func cpuThroughput(b *testing.B, bytes int, body func()) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.SetBytes(int64(bytes))
	t0, ok := threadCPU()
	n := 0
	for b.Loop() {
		body()
		n++
	}
	if t1, ok1 := threadCPU(); ok && ok1 && t1 > t0 {
		b.ReportMetric(float64(bytes)*float64(n)/(t1-t0).Seconds()/1e6, "cpuMB/s")
	}
}

// BenchmarkToFloat32 measures decoding throughput in bytes of encoded
// input per second. BenchmarkToFloat32/<type> is one goroutine decoding
// 64 Ki elements into a buffer that stays in cache (the executor's use:
// a block range into a small scratch buffer); BenchmarkToFloat32/
// parallel/<type> is ParallelToFloat32 over 4 Mi elements on all cores.
func BenchmarkToFloat32(b *testing.B) {
	for _, typ := range supportedTypes {
		const n = 1 << 16
		src := benchBlocks(typ, n)
		dst := make([]float32, n)
		b.Run(typ.String(), func(b *testing.B) {
			cpuThroughput(b, len(src), func() {
				if err := ToFloat32(typ, src, dst); err != nil {
					b.Fatal(err)
				}
			})
		})
	}
	for _, typ := range supportedTypes {
		const n = 1 << 22
		src := benchBlocks(typ, n)
		dst := make([]float32, n)
		b.Run("parallel/"+typ.String(), func(b *testing.B) {
			b.SetBytes(int64(len(src)))
			for b.Loop() {
				if err := ParallelToFloat32(typ, src, dst, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkQuantize measures the reference quantizers (bytes of float32
// input per second); they are for tests and model generation, not hot
// paths.
func BenchmarkQuantize(b *testing.B) {
	r := rand.New(rand.NewPCG(13, 14))
	const n = 1 << 16
	x := randomData(r, "normal", n)
	for _, typ := range quantizableTypes {
		size, _ := typ.RowBytes(n)
		dst := make([]byte, size)
		b.Run(typ.String(), func(b *testing.B) {
			cpuThroughput(b, 4*n, func() {
				if err := Quantize(typ, x, dst); err != nil {
					b.Fatal(err)
				}
			})
		})
	}
}

// BenchmarkToFloat32OneBlock is the smallest useful call, one block (32 or
// 256 elements), to show the fixed cost per call.
func BenchmarkToFloat32OneBlock(b *testing.B) {
	for _, typ := range []gguf.Type{gguf.TypeQ4_0, gguf.TypeQ8_0, gguf.TypeQ4_K, gguf.TypeQ6_K} {
		src := benchBlocks(typ, 256)
		dst := make([]float32, typ.BlockSize())
		b.Run(typ.String(), func(b *testing.B) {
			cpuThroughput(b, typ.BlockBytes(), func() {
				if err := ToFloat32(typ, src, dst); err != nil {
					b.Fatal(err)
				}
			})
		})
	}
}

// BenchmarkToFloat16 measures decoding to half precision (bytes of encoded
// input per second), 64 Ki elements per call.
func BenchmarkToFloat16(b *testing.B) {
	for _, typ := range []gguf.Type{gguf.TypeF32, gguf.TypeF16, gguf.TypeBF16, gguf.TypeQ4_0, gguf.TypeQ8_0, gguf.TypeQ4_K, gguf.TypeQ6_K} {
		const n = 1 << 16
		src := benchBlocks(typ, n)
		dst := make([]uint16, n)
		b.Run(typ.String(), func(b *testing.B) {
			cpuThroughput(b, len(src), func() {
				if err := ToFloat16(typ, src, dst); err != nil {
					b.Fatal(err)
				}
			})
		})
	}
}
