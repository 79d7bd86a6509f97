package gpu

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/conformance"
	"github.com/forge-llm/forge/rocm"
)

// Benchmarks time the device with events around a batch of launches queued
// in one Do (host overhead overlaps the kernels), and report bandwidth as a
// share of a device-to-device copy measured in the same binary.
//
//	bin/device/kernels-gpu.test -test.run '^$' -test.bench . -test.benchtime 200x

var copyBW struct {
	once sync.Once
	gbs  float64 // read + written bytes per second / 1e9
	err  error
}

// d2dCopyGBs is CopyBandwidth, measured once per binary.
func d2dCopyGBs(b *testing.B, bk *Backend) float64 {
	copyBW.once.Do(func() { copyBW.gbs, copyBW.err = bk.CopyBandwidth() })
	if copyBW.err != nil {
		b.Fatal(copyBW.err)
	}
	return copyBW.gbs
}

// timeGraph runs warm calls of fn, captures reps more into one graph on s,
// replays the graph once to warm up and then `replays` times between two
// events, and returns the milliseconds per replay: the launches of a
// replayed graph (as forge's decode step will run) instead of queued ones.
func timeGraph(c *rocm.Ctx, s rocm.Stream, warm, reps int, fn func(i int) error) (float32, error) {
	for i := range warm {
		if err := fn(i); err != nil {
			return 0, err
		}
	}
	if err := c.SyncStream(s); err != nil {
		return 0, err
	}
	if err := c.BeginCapture(s); err != nil {
		return 0, err
	}
	var ferr error
	for i := range reps {
		if ferr = fn(warm + i); ferr != nil {
			break
		}
	}
	g, err := c.EndCapture(s)
	if ferr != nil || err != nil {
		if g != nil {
			_ = c.DestroyGraph(g)
		}
		return 0, errors.Join(ferr, err)
	}
	defer c.DestroyGraph(g)
	const replays = 5
	ms, err := timeOn(c, s, 1, replays, func(int) error { return c.LaunchGraph(g, s) })
	return ms / replays, err
}

// weightCopies uploads enough copies of w that rotating over them reads at
// least 512 MB, ten times the H100's 50 MB L2, so the cache cannot serve
// the weights.
// The caller frees them with free.
func weightCopies(b *testing.B, bk *Backend, w *kernels.Weight) (copies []*kernels.Weight, free func()) {
	size := len(w.Host)
	n := max(4, (512<<20+size-1)/size)
	out := make([]*kernels.Weight, n)
	for i := range out {
		c := *w
		c.Dev = 0
		if err := bk.LoadWeight(&c); err != nil {
			b.Fatal(err)
		}
		out[i] = &c
	}
	return out, func() {
		for _, c := range out {
			bk.FreeWeight(c)
		}
	}
}

// BenchmarkCopyD2D reports the copy bandwidth the matvec figures are
// compared with.
func BenchmarkCopyD2D(b *testing.B) {
	bk := gpuBackend(b, false)
	b.ReportMetric(d2dCopyGBs(b, bk), "GB/s(r+w)")
}

// BenchmarkMatVec: decode matrix–vector products reading blocks directly.
// GB/s counts weight bytes read; %copy is that over the D2D copy's
// read+write bandwidth.
func BenchmarkMatVec(b *testing.B) {
	bk := gpuBackend(b, false)
	copyGBs := d2dCopyGBs(b, bk)
	rng := rand.New(rand.NewPCG(1, 2))
	for _, typ := range []gguf.Type{gguf.TypeQ4_K, gguf.TypeQ6_K, gguf.TypeQ8_0, gguf.TypeQ4_0, gguf.TypeQ5_0, gguf.TypeQ4_1, gguf.TypeQ5_1} {
		for _, sh := range [][2]int{{14336, 4096}, {4096, 14336}, {4096, 4096}} {
			rows, cols := sh[0], sh[1]
			w := conformance.RandomWeight(rng, "w", typ, rows, cols)
			// "": the backend's choice (MatMul's path, x quantized in it
			// where the kernel takes 8-bit x); "g": the generic float
			// kernel; "b{R}": 32-blocks on 8-bit x, R rows per warp
			// "+g": the launches captured in a graph and replayed
			variants := []string{"g", "b2", "b4", "", "+g"}
			switch typ {
			case gguf.TypeQ4_K:
				// "k": the kernel alone, x quantized once before timing
				// "@N": grid capped at N blocks per multiprocessor
				variants = []string{"q12k", "q21k@8", "n12k@8", "n12k@4", "n14k@4", "n14k@8", "n22k@4",
					"q12k+g", "n12k@8+g", "", "+g"}
			case gguf.TypeQ6_K:
				variants = []string{"q21k", "t2k@12", "c2k@3", "c2k@4", "c2k@5", "c1k@4",
					"q21k+g", "t2k@12+g", "c2k@4+g", "", "+g"}
			}
			copies, free := weightCopies(b, bk, w)
			x := upload(b, bk, conformance.RandomVector(rng, cols, 1))
			for _, r := range variants {
				name := fmt.Sprintf("%s/%dx%d", typ, rows, cols)
				if r != "" {
					name += "/" + r
				}
				b.Run(name, func(b *testing.B) {
					y, _ := bk.Alloc(rows)
					defer bk.Free(y)
					kt, _ := kernelType(typ)
					// "…k": the kernel alone, x quantized once before timing
					// (as when several matrices share an input)
					r, graph := strings.CutSuffix(r, "+g")
					v, perSM, _ := strings.Cut(r, "@")
					kernelOnly := strings.HasSuffix(v, "k")
					bk.mvVariant = strings.TrimSuffix(v, "k")
					bk.mvBlocksPerSM, _ = strconv.Atoi(perSM)
					defer func() { bk.mvVariant, bk.mvBlocksPerSM = "", 0 }()
					var ms float32
					err := bk.do(func(c *rocm.Ctx) error {
						var err error
						var xq, xd rocm.DevPtr
						if kernelOnly {
							if xq, xd, err = bk.quantizeX(c, dptr(x), cols); err != nil {
								return err
							}
						}
						timer := timeOn
						if graph {
							timer = timeGraph
						}
						ms, err = timer(c, bk.stream, 2*len(copies), b.N, func(i int) error {
							cw := copies[i%len(copies)]
							if kernelOnly {
								return bk.mvQ8(c, kt, bk.mvVariant, cw, rocm.DevPtr(cw.Dev), dptr(y), xq, xd)
							}
							return bk.matvec(c, kt, cw, rocm.DevPtr(cw.Dev), dptr(y), dptr(x), 1, nil)
						})
						return err
					})
					if err != nil {
						b.Fatal(err)
					}
					sec := float64(ms) / 1e3 / float64(b.N)
					gbs := float64(len(w.Host)) / sec / 1e9
					b.ReportMetric(sec*1e6, "us/op")
					b.ReportMetric(gbs, "GB/s")
					b.ReportMetric(100*gbs/copyGBs, "%copy")
				})
			}
			free()
		}
	}
}

// BenchmarkPromptMatMul: 512 tokens through MatMul's prompt path
// (dequantize to f16, convert x, GEMM through cuBLAS where found: "full"),
// gemm.cu alone on the f16 operands ("gemm" with ldmatrix, "gemm_lds"), and
// cuBLAS's GemmEx alone ("cublas").
func BenchmarkPromptMatMul(b *testing.B) {
	bk := gpuBackend(b, false)
	modes := []string{"full", "gemm", "gemm_lds"}
	vg, err := bk.OpenVendorGEMM() // a second handle, for the "cublas" mode
	if err != nil {
		b.Logf("no vendor GEMM to compare with: %v", err)
	} else {
		b.Logf("vendor GEMM: %s", vg.Path())
		defer bk.CloseVendorGEMM(vg)
		modes = append(modes, "cublas")
	}
	rng := rand.New(rand.NewPCG(3, 4))
	const n = 512
	for _, typ := range []gguf.Type{gguf.TypeQ4_K, gguf.TypeQ6_K} {
		for _, sh := range [][2]int{{14336, 4096}, {4096, 14336}, {4096, 4096}} {
			rows, cols := sh[0], sh[1]
			w := conformance.RandomWeight(rng, "w", typ, rows, cols)
			if err := bk.LoadWeight(w); err != nil {
				b.Fatal(err)
			}
			x := upload(b, bk, conformance.RandomVector(rng, n*cols, 1))
			y, _ := bk.Alloc(n * rows)
			kt, _ := kernelType(typ)
			flop := 2 * float64(rows) * float64(cols) * n
			for _, mode := range modes {
				b.Run(fmt.Sprintf("%s/%dx%d/n%d/%s", typ, rows, cols, n, mode), func(b *testing.B) {
					var ms float32
					err := bk.do(func(c *rocm.Ctx) error {
						if err := bk.gemm(c, kt, w, rocm.DevPtr(w.Dev), y, x, n); err != nil { // sizes the scratch
							return err
						}
						wh, xh := bk.scratch["gemm-w"].ptr, bk.scratch["gemm-x"].ptr
						var err error
						ms, err = timeOn(c, bk.stream, 3, b.N, func(int) error {
							switch mode {
							case "full":
								return bk.gemm(c, kt, w, rocm.DevPtr(w.Dev), y, x, n)
							case "cublas":
								return vg.gemm(dptr(y), wh, xh, rows, n, cols)
							case "gemm_lds":
								bk.gemmKernel = "gemm_f16_lds"
								defer func() { bk.gemmKernel = "" }()
							case "gemm":
								bk.gemmKernel = "gemm_f16"
								defer func() { bk.gemmKernel = "" }()
							}
							return bk.gemmF16(c, wh, xh, dptr(y), rows, n, cols)
						})
						return err
					})
					if err != nil {
						b.Fatal(err)
					}
					sec := float64(ms) / 1e3 / float64(b.N)
					b.ReportMetric(sec*1e6, "us/op")
					b.ReportMetric(flop/sec/1e12, "TFLOP/s")
				})
			}
			bk.Free(y)
			bk.FreeWeight(w)
		}
	}
}

// BenchmarkAttentionDecode: the decode attention kernel alone, one token
// against a zeroed f16 cache of ctx positions, Llama 3 8B heads.
func BenchmarkAttentionDecode(b *testing.B) {
	bk := gpuBackend(b, false)
	rng := rand.New(rand.NewPCG(5, 6))
	a := kernels.Attn{Heads: 32, KVHeads: 8, HeadDim: 128, Scale: 0.088}
	for _, ctx := range []int{512, 4096, 32768} {
		b.Run(fmt.Sprintf("ctx%d", ctx), func(b *testing.B) {
			c, err := bk.NewKVCache(1, ctx+1, 1024)
			if err != nil {
				b.Fatal(err)
			}
			defer bk.FreeKVCache(c)
			q := upload(b, bk, conformance.RandomVector(rng, 4096, 1))
			out, _ := bk.Alloc(4096)
			defer bk.Free(out)
			kb := c.Impl.(*kvBuf)
			var ms float32
			err = bk.do(func(cx *rocm.Ctx) error {
				// The output quantized on the side, as in a decode step.
				oq, od, err := bk.q8Buf(cx, 4096)
				if err != nil {
					return err
				}
				ms, err = timeOn(cx, bk.stream, 2, b.N, func(int) error {
					return bk.attnDecode(cx, "f16", out, q, kb.base, kb.base+rocm.DevPtr(int64(c.Ctx)*1024*2), 0, ctx-1, 1, c.Ctx, a, q8x{oq, od}, nil)
				})
				return err
			})
			if err != nil {
				b.Fatal(err)
			}
			sec := float64(ms) / 1e3 / float64(b.N)
			b.ReportMetric(sec*1e6, "us/op")
			b.ReportMetric(float64(2*ctx*1024*2)/sec/1e9, "GB/s(kv)")
		})
	}
}
