package cpu

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/conformance"
)

// Benchmarks report MB/s of weights read (b.SetBytes) for matrix–vector
// products, which are bound by memory bandwidth, and GFLOP/s for prompt
// batches. BenchmarkCopy measures the machine's copy bandwidth to compare
// the first against. Run: go test -run '^$' -bench . ./kernels/cpu/

var benchShapes = [][2]int{{768, 2048}, {2048, 768}, {4096, 4096}} // rows × cols

func benchMatMul(b *testing.B, typ gguf.Type, rows, cols, n int, table map[gguf.Type]kernel) {
	rng := rand.New(rand.NewPCG(1, 2))
	be := New(0)
	defer be.Close()
	w := conformance.RandomWeight(rng, "w", typ, rows, cols)
	x := kernels.Tensor{Len: n * cols, Host: conformance.RandomVector(rng, n*cols, 1)}
	dst := kernels.Tensor{Len: n * rows, Host: make([]float32, n*rows)}
	b.SetBytes(int64(len(w.Host)))
	b.ReportAllocs()
	b.ResetTimer()
	m := startCPU(b)
	for range b.N {
		if err := be.matmul(dst, w, x, n, table); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(2*rows*cols*n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
	m.report(float64(len(w.Host))/1e9, "GB")
	m.report(float64(2*rows*cols*n)/1e9, "GFLOP")
}

// BenchmarkMatVec: decode (n = 1) with the kernels MatMul uses.
func BenchmarkMatVec(b *testing.B) {
	b.Logf("assembly kernels: %v, threads: %d", asmEnabled, New(0).threads)
	for _, typ := range []gguf.Type{gguf.TypeQ4_0, gguf.TypeQ8_0, gguf.TypeQ4_K, gguf.TypeQ6_K, gguf.TypeQ5_0, gguf.TypeF16} {
		for _, sh := range benchShapes {
			b.Run(fmt.Sprintf("%s/%dx%d", typ, sh[0], sh[1]), func(b *testing.B) {
				benchMatMul(b, typ, sh[0], sh[1], 1, fastKernels)
			})
		}
	}
}

// BenchmarkMatVecGo: the same products with the plain-Go kernels, for the
// speed-up of the assembly.
func BenchmarkMatVecGo(b *testing.B) {
	for _, typ := range []gguf.Type{gguf.TypeQ4_0, gguf.TypeQ8_0, gguf.TypeQ4_K, gguf.TypeQ6_K, gguf.TypeF16} {
		b.Run(fmt.Sprintf("%s/4096x4096", typ), func(b *testing.B) {
			benchMatMul(b, typ, 4096, 4096, 1, goKernels)
		})
	}
}

// BenchmarkMatMul128: a 128-token prompt batch.
func BenchmarkMatMul128(b *testing.B) {
	for _, typ := range []gguf.Type{gguf.TypeQ4_K, gguf.TypeQ8_0, gguf.TypeQ6_K} {
		for _, sh := range benchShapes[:2] {
			b.Run(fmt.Sprintf("%s/%dx%d", typ, sh[0], sh[1]), func(b *testing.B) {
				benchMatMul(b, typ, sh[0], sh[1], 128, fastKernels)
			})
		}
	}
}

// BenchmarkCopy is the memory bandwidth baseline: copy a 64 MiB buffer
// (larger than any cache) split over the same worker pool. MB/s counts
// bytes read, as the MatVec figures do.
func BenchmarkCopy(b *testing.B) {
	be := New(0)
	defer be.Close()
	src := make([]byte, 64<<20)
	dst := make([]byte, 64<<20)
	for i := range src {
		src[i] = byte(i)
	}
	t := &copyTask{dst: dst, src: src}
	b.SetBytes(int64(len(src)))
	b.ResetTimer()
	m := startCPU(b)
	for range b.N {
		be.pool.parallel(t, len(src)>>16, 16)
	}
	m.report(float64(len(src))/1e9, "GB")
}

// BenchmarkRead sums a 64 MiB buffer on the pool: read-only bandwidth,
// which is what a matrix–vector product needs.
func BenchmarkRead(b *testing.B) {
	be := New(0)
	defer be.Close()
	src := make([]float32, 64<<20)
	for i := range src {
		src[i] = float32(i & 7)
	}
	t := &sumTask{src: src, out: make([]float32, be.threads)}
	b.SetBytes(int64(4 * len(src)))
	b.ResetTimer()
	m := startCPU(b)
	for range b.N {
		be.pool.parallel(t, len(src)>>14, 16)
	}
	m.report(float64(4*len(src))/1e9, "GB")
}

type copyTask struct{ dst, src []byte }

func (t *copyTask) run(_, lo, hi int) { copy(t.dst[lo<<16:hi<<16], t.src[lo<<16:hi<<16]) }

type sumTask struct{ src, out []float32 }

func (t *sumTask) run(w, lo, hi int) {
	s := t.src[lo<<14 : hi<<14]
	t.out[w] += dotF32(s, s)
}
