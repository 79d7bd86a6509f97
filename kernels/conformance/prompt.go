package conformance

import (
	"testing"

	"github.com/forge-llm/forge/kernels"
)

// promptShapes are the prompt-piece products tried for every type: piece
// lengths on both sides of the GPU's thresholds (16 rows, where
// MatMulPrompt leaves the multi-row kernels; 64, kernels.MaxBatchRows;
// tiles of 16, 32 and 64 rows) and weights of odd row and block counts.
// The LM-head shape of 512 rows × 768 is left out with -short and under
// the race detector.
func promptShapes(bs int) []mmShape {
	return []mmShape{
		{33, 5 * bs, []int{16, 65}, false},
		{257, 2 * bs, []int{17, 130}, false},
		{512, 768, []int{33, 129}, true},
	}
}

// matMulPrompt checks the product a prompt piece takes: MatMulPrompt where
// the backend has one (kernels.PromptMatMuler; the GPU chooses other
// kernels for it than for MatMul), else MatMul, which is what the model
// calls then. Same reference and bound as MatMul.
func (s *suite) matMulPrompt(t *testing.T) {
	for _, typ := range MatMulTypes {
		t.Run(typ.String(), func(t *testing.T) {
			t.Parallel()
			b := s.newBackend(t)
			mm := b.MatMul
			if p, ok := kernels.As[kernels.PromptMatMuler](b); ok {
				mm = p.MatMulPrompt
			}
			rng := s.rng(t)
			bs := max(typ.BlockSize(), 32)
			for _, sh := range promptShapes(bs) {
				if sh.big && (testing.Short() || raceEnabled) {
					t.Logf("%d×%d: left out with -short or -race", sh.rows, sh.cols)
					continue
				}
				w := RandomWeight(rng, "w", typ, sh.rows, sh.cols)
				load(t, b, w)
				for _, n := range sh.ns {
					xv := RandomVector(rng, n*sh.cols, 1)
					x := alloc(t, b, n*sh.cols)
					if err := b.Write(x, 0, xv); err != nil {
						t.Fatal(err)
					}
					dst := alloc(t, b, n*sh.rows)
					if err := mm(dst, w, x, n); err != nil {
						t.Fatalf("%d×%d n=%d: %v", sh.rows, sh.cols, n, err)
					}
					want, scale, err := matMulRef(w, xv, n)
					if err != nil {
						t.Fatal(err)
					}
					e := checkScaled(t, name("%s %d×%d n=%d (prompt)", typ, sh.rows, sh.cols, n), download(t, b, dst), want, scale, MatMulBound(typ))
					t.Logf("%d×%d n=%d: relative error %.2e", sh.rows, sh.cols, n, e)
				}
				if l, ok := b.(WeightLoader); ok {
					l.FreeWeight(w)
				}
			}
		})
	}
}
