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
// batch it decodes in.
func TestEmuQ6KStagedMatchesRows(t *testing.T) {
	rng := emuRNG(t)
	const nx = 3
	for _, c := range []struct{ rows, cols int }{{67, 3840}, {21, 11008}} {
		w := conformance.RandomWeight(rng, "w", gguf.TypeQ6_K, c.rows, c.cols)
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
				emuCheck(t, "t2", res.f32(one["t2"]), cpuMatMul(t, w, x, nx), conformance.MatMulBound(gguf.TypeQ6_K))
			})
		}
	}
}
