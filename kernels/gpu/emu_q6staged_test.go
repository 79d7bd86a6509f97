package gpu

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels/conformance"
	"github.com/forge-llm/forge/rocm"
)

// TestEmuQ6KStagedMatchesRows: the staged one-row Q6_K kernel on rows of
// any number of super-blocks (15 and 43: rows starting off 16-byte
// boundaries, a partial last run) gives each row of x the bits that the
// multi-row kernel (mv_q6_k_x8r2, a batched step's) and the direct one
// (q21) give it, at both widths: a sequence's tokens do not depend on the
// batch it decodes in. mv_q4_k_n12m6 (this Q6_K weight in one launch with
// two Q4_K ones) gives every row the bits of the one-weight kernels.
func TestEmuQ6KStagedMatchesRows(t *testing.T) {
	rng := emuRNG(t)
	const nx = 3
	for _, c := range []struct{ rows, cols int }{{67, 3840}, {21, 11008}} {
		w := conformance.RandomWeight(rng, "w", gguf.TypeQ6_K, c.rows, c.cols)
		qa := conformance.RandomWeight(rng, "qa", gguf.TypeQ4_K, 45, c.cols)
		x := conformance.RandomVector(rng, nx*c.cols, 1)
		for _, ed := range emuDevices {
			t.Run(fmt.Sprintf("%s/%dx%d", ed.name, c.rows, c.cols), func(t *testing.T) {
				var job emuJob
				wb, xb := job.bytes(w.Host), job.f32(x)
				xq, xd := job.zeros(nx*c.cols, true), job.zeros(4*nx*c.cols/32, true)
				job.launch("quantize_q8", rocm.D1(ceilDiv(nx*c.cols, 256)), rocm.D1(256), eP(xb, 0), eP(xq, 0), eP(xd, 0), eI(nx*c.cols))
				one := map[string]int{}
				for _, v := range []string{"t2", "t1", "q21"} {
					p := planQ8(ed.dev, "q6_k", v, c.rows, c.cols, 1) // one block per CU: warps stride over rows
					if p.Kernel != "mv_q6_k_"+v {
						t.Fatalf("variant %s planned as %s", v, p.Kernel)
					}
					one[v] = job.zeros(4*nx*c.rows, true)
					for i := range nx {
						job.launch(p.Kernel, rocm.D1(p.Grid), rocm.D1(mvBlock), eP(wb, 0), eP(xq, i*c.cols), eP(xd, 4*i*(c.cols/32)),
							eP(one[v], 4*i*c.rows), eI(c.rows), eI(c.cols))
					}
				}
				// mv_q4_k_n12m6: two Q4_K weights and this Q6_K one in one launch, on x's first row
				q4a := job.bytes(qa.Host)
				ya, y6 := job.zeros(4*qa.Rows, true), job.zeros(4*c.rows, true)
				yb := job.zeros(4*qa.Rows, true)
				job.launch("mv_q4_k_n12m6", rocm.D1(planQ4KMulti(ed.dev, 2*qa.Rows+c.rows, 1)), rocm.D1(mvBlock),
					eP(q4a, 0), eP(ya, 0), eI(qa.Rows), eP(q4a, 0), eP(yb, 0), eI(qa.Rows), eP(wb, 0), eP(y6, 0), eI(c.rows),
					eP(xq, 0), eP(xd, 0), eI(c.cols))
				yq := job.zeros(4*qa.Rows, true)
				pq := planQ8(ed.dev, "q4_k", "n12", qa.Rows, c.cols, 1)
				job.launch(pq.Kernel, rocm.D1(pq.Grid), rocm.D1(mvBlock), eP(q4a, 0), eP(xq, 0), eP(xd, 0), eP(yq, 0), eI(qa.Rows), eI(c.cols))
				rp, err := planRows(ed.dev, gguf.TypeQ6_K, c.rows, c.cols, nx, true, "", "")
				if err != nil {
					t.Fatal(err)
				}
				multi := job.zeros(4*nx*c.rows, true)
				job.launch(rp.Kernel, rocm.D1(rp.Grid), rocm.D1(mvBlock), eP(wb, 0), eP(xq, 0), eP(xd, 0), eP(multi, 0),
					eI(c.rows), eI(c.cols), eI(nx))
				res := runEmu(t, ed.dev.Warp, &job)
				for v, y := range one {
					if !bytes.Equal(res.bufs[y], res.bufs[multi]) {
						t.Errorf("mv_q6_k_%s and %s differ", v, rp.Kernel)
					}
				}
				if !bytes.Equal(res.bufs[y6], res.bufs[one["t2"]][:4*c.rows]) {
					t.Errorf("mv_q4_k_n12m6's Q6_K rows and mv_q6_k_t2 differ")
				}
				for _, y := range []int{ya, yb} {
					if !bytes.Equal(res.bufs[y], res.bufs[yq]) {
						t.Errorf("mv_q4_k_n12m6's Q4_K rows and %s differ", pq.Kernel)
					}
				}
				emuCheck(t, "t2", res.f32(one["t2"]), cpuMatMul(t, w, x, nx), conformance.MatMulBound(gguf.TypeQ6_K))
			})
		}
	}
}
