package gpu

import (
	"testing"

	"github.com/forge-llm/forge/kernels"
)

// TestBatchStepKey: a decode group (one table per row) records one graph
// per row count with attn_paged_fine, whatever its positions; other
// layouts, and every layout with pagedFine off, are keyed by
// attn_paged's splits rounded up to a power of two; fineLayout agrees.
func TestBatchStepKey(t *testing.T) {
	decode := &kernels.Layout{Pos: []int32{5, 700, 1030}, Seq: []int32{0, 1, 2}, Tables: [][]int32{{0}, {1}, {2}}}
	piece := &kernels.Layout{Pos: []int32{299, 300}, Seq: []int32{0, 0}, Tables: [][]int32{{0}}}
	var b Backend
	old := pagedFine
	defer func() { pagedFine = old }()
	for _, fine := range []bool{true, false} {
		pagedFine = fine
		for _, c := range []struct {
			l    *kernels.Layout
			want int
		}{{decode, 8}, {piece, 2}} { // 1031 positions: 5 splits of 256, rounded to 8
			want := c.want
			if fine && c.l == decode {
				want = 1
			}
			if got := b.BatchStepKey(c.l); got != want {
				t.Errorf("pagedFine %v, layout %v: key %d, want %d", fine, c.l.Pos, got, want)
			}
			ls := layoutState{pos: c.l.Pos}
			for _, tab := range c.l.Tables {
				ls.tabLen = append(ls.tabLen, int32(len(tab)))
			}
			if got, want := fineLayout(&ls), fine && c.l == decode; got != want {
				t.Errorf("pagedFine %v, layout %v: fineLayout %v, want %v", fine, c.l.Pos, got, want)
			}
		}
	}
}
