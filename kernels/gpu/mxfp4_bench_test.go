package gpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/conformance"
	"github.com/forge-llm/forge/rocm"
)

// BenchmarkMXFP4: MXFP4 products at gpt-oss-20b's shapes (2880 wide; its
// experts are 2880×2880), mxfp4.cu's kernels on 8-bit x against the
// generic float kernel they replace. GB/s counts weight bytes read; %copy
// is that over the D2D copy's read+write bandwidth.
//
//   - MatMul/{rows}x{cols}/{v}: one row of x through MatMul (x quantized
//     in it where the kernel takes 8-bit x), over copies of the weight
//     that together are ten times the L2; v: "g" the generic kernel,
//     "m{R}" R rows per warp, "auto" MatMul's choice.
//
//   - Experts/{gate+up|down}/{kernel}: ExpertMatMuls of 4 slots
//     over tables of 32 experts of 2880×2880 (gate and up on one shared x
//     in one launch, or down on one x row per slot), each launch's 4
//     experts the next of 8 disjoint sets, so that a launch does not find
//     the previous one's experts in the L2; planMoe's moe_mv_mxfp4_21
//     and the generic moe_mv_g_mxfp4.
//
//   - Other/{type}/{rows}x{cols}/{variant}: gpt-oss-20b's output head
//     (Q8_0) and query projection (Q5_0) through MatMul: the staged
//     kernels (m11, m21, auto) and the generic float kernel (g).
//
//     gpu.test -test.run '^$' -test.bench MXFP4 -test.benchtime 200x
func BenchmarkMXFP4(b *testing.B) {
	bk := gpuBackend(b, false)
	copyGBs := d2dCopyGBs(b, bk)
	rng := rand.New(rand.NewPCG(1, 21))
	report := func(b *testing.B, ms float32, bytes int) {
		sec := float64(ms) / 1e3 / float64(b.N)
		gbs := float64(bytes) / sec / 1e9
		b.ReportMetric(sec*1e6, "us/op")
		b.ReportMetric(gbs, "GB/s")
		b.ReportMetric(100*gbs/copyGBs, "%copy")
	}
	for _, sh := range [][2]int{{2880, 2880}, {5760, 2880}, {2880, 5760}} {
		rows, cols := sh[0], sh[1]
		w := conformance.RandomWeight(rng, "w", gguf.TypeMXFP4, rows, cols)
		copies, free := weightCopies(b, bk, w)
		x := upload(b, bk, conformance.RandomVector(rng, cols, 1))
		variants := []string{"g"}
		for _, o := range mxfp4VariantList() {
			variants = append(variants, o.Variant)
		}
		for _, v := range append(variants, "auto") {
			b.Run(fmt.Sprintf("MatMul/%dx%d/%s", rows, cols, v), func(b *testing.B) {
				benchMatvecVariant(b, bk, "mxfp4", v, copies, x, 2*len(copies), report)
			})
		}
		free()
	}
	// gpt-oss-20b's other decode products: its output head is Q8_0 and its
	// attention projections Q5_0 (2880 columns are not whole Q4_K
	// super-blocks), 90 blocks a row, which the b{R} kernels (whole runs of
	// warpSize blocks) do not take: the staged kernels m11 and m21
	// (b32any.go; auto: MatMul's choice) against the generic float kernel
	// (g) they replace.
	for _, o := range []struct {
		typ        gguf.Type
		rows, cols int
	}{{gguf.TypeQ8_0, 201088, 2880}, {gguf.TypeQ5_0, 4096, 2880}} {
		w := conformance.RandomWeight(rng, "w", o.typ, o.rows, o.cols)
		copies, free := weightCopies(b, bk, w)
		x := upload(b, bk, conformance.RandomVector(rng, o.cols, 1))
		kt, _ := kernelType(o.typ)
		for _, v := range []string{"g", "m11", "m21", "auto"} {
			b.Run(fmt.Sprintf("Other/%s/%dx%d/%s", o.typ, o.rows, o.cols, v), func(b *testing.B) {
				benchMatvecVariant(b, bk, kt, v, copies, x, len(copies), report)
			})
		}
		free()
	}
	// the experts
	const E, k, sets = 32, 4, 8
	const F, D = 2880, 2880
	var tabs [3]*expertTable
	var ws [3][]*kernels.Weight
	for i := range tabs {
		for range E {
			w := conformance.RandomWeight(rng, "w", gguf.TypeMXFP4, F, D)
			if err := bk.LoadWeight(w); err != nil {
				b.Fatal(err)
			}
			ws[i] = append(ws[i], w)
		}
		tab, err := bk.NewExpertTable(ws[i])
		if err != nil {
			b.Fatal(err)
		}
		tabs[i] = tab.(*expertTable)
	}
	defer func() {
		for i := range tabs {
			bk.FreeExpertTable(tabs[i])
			for _, w := range ws[i] {
				bk.FreeWeight(w)
			}
		}
	}()
	var idSets []kernels.Tensor
	perm := rng.Perm(E)
	for s := range sets {
		ids := make([]float32, k)
		for j := range ids {
			ids[j] = math.Float32frombits(uint32(perm[(s*k+j)%E]))
		}
		idSets = append(idSets, upload(b, bk, ids))
	}
	x := upload(b, bk, conformance.RandomVector(rng, k*D, 1))
	out0, out1 := upload(b, bk, make([]float32, k*F)), upload(b, bk, make([]float32, k*F))
	withPlan := func(t *expertTable, pl moePlan) *expertTable {
		g := *t
		g.plan = pl
		return &g
	}
	expertBytes := len(ws[0][0].Host)
	for _, pl := range []moePlan{{"moe_mv_g_mxfp4", 1, false}, {mxfp4Moe, mxfp4MoeR, true}} {
		gate, up, down := withPlan(tabs[0], pl), withPlan(tabs[1], pl), withPlan(tabs[2], pl)
		kind := pl.Kernel
		b.Run("Experts/gate+up/"+kind, func(b *testing.B) {
			var ms float32
			err := bk.do(func(c *rocm.Ctx) error {
				var err error
				ms, err = timeOn(c, bk.stream, sets, b.N, func(i int) error {
					return benchExperts(bk, c, gate, up, out0, out1, idSets[i%sets], x, k, 0)
				})
				return err
			})
			if err != nil {
				b.Fatal(err)
			}
			report(b, ms, 2*k*expertBytes)
		})
		b.Run("Experts/down/"+kind, func(b *testing.B) {
			var ms float32
			err := bk.do(func(c *rocm.Ctx) error {
				var err error
				ms, err = timeOn(c, bk.stream, sets, b.N, func(i int) error {
					return benchExperts(bk, c, down, nil, out0, kernels.Tensor{}, idSets[i%sets], x, k, D)
				})
				return err
			})
			if err != nil {
				b.Fatal(err)
			}
			report(b, ms, k*expertBytes)
		})
	}
}

// benchExperts queues ExpertMatMuls' launch (moe.go) of table t0 (and t1
// when not nil) on the worker: x quantized, then the table's kernel.
// xstride 0: one shared x, else one row per slot.
func benchExperts(bk *Backend, c *rocm.Ctx, t0, t1 *expertTable, y0, y1, ids, x kernels.Tensor, k, xstride int) error {
	tabs := 1
	var t1p, y1p rocm.DevPtr
	if t1 != nil {
		t1p, y1p, tabs = t1.p, dptr(y1), 2
	}
	xn := t0.cols
	if xstride != 0 {
		xn = k * t0.cols
	}
	return bk.queueExperts(c, t0, t1p, dptr(y0), y1p, tabs, dptr(ids), dptr(x), xn, k, xstride, q8x{})
}

// benchMatvecVariant times the one-row product of kernel type kt forced to
// variant v ("auto": MatMul's own choice) over copies of one weight in
// turn (so each launch reads its weight from memory, not the cache), after
// warm launches, and reports the weight's bytes through report.
func benchMatvecVariant(b *testing.B, bk *Backend, kt, v string, copies []*kernels.Weight, x kernels.Tensor, warm int,
	report func(b *testing.B, ms float32, bytes int)) {
	w := copies[0]
	y, _ := bk.Alloc(w.Rows)
	defer bk.Free(y)
	bk.mvVariant = v
	if v == "auto" {
		bk.mvVariant = ""
	}
	defer func() { bk.mvVariant = "" }()
	var ms float32
	err := bk.do(func(c *rocm.Ctx) error {
		var err error
		ms, err = timeOn(c, bk.stream, warm, b.N, func(i int) error {
			cw := copies[i%len(copies)]
			return bk.matvec(c, kt, cw, rocm.DevPtr(cw.Dev), dptr(y), dptr(x), 1, nil)
		})
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	report(b, ms, len(w.Host))
}
