package gpu

import (
	"slices"

	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/rocm"
)

// prefillRows is prefill.cu's PF_ROWS: the query rows one block takes.
const prefillRows = 64

// Prefill kernel choice for PagedAttention's prompt pieces (prefill.cu).
const (
	prefillAuto  = iota // on sm_80+ attn_prefill_split_f16_d* + attn_paged_merge where a row lies past the first split (fixed splits of the prefix), else attn_prefill_f16_d*
	prefillPlain        // attn_prefill_plain_f16_d*: the plain path on every device
	prefillOff          // attn_paged for every row (the per-row kernel)
	prefillV1           // attn_prefill_v1_f16_d*: the first tensor-core path (synchronous staging), for comparisons
	prefillWhole        // attn_prefill_f16_d* on sm_80+ too: the pipelined path, one block walking a tile's whole prefix
)

// prefillSplit is prefill.cu's PP_SPLIT: the positions one block of the
// split form (attn_prefill_split_*) walks.
const prefillSplit = 1024

// prefillMode selects the kernel of a prompt piece; tests set it to check
// both paths of prefill.cu against the per-row kernel and the CPU.
var prefillMode = prefillAuto

// prefillPlan is how PagedAttention computes a step's rows with
// prefill.cu's tiled kernels.
type prefillPlan struct {
	name string
	// One piece: its sequence and the position of its first row.
	seq, pos0 int32
	// Several pieces (attn_prefill_pieces_*): the layout's tiles
	// (layoutState.tiles), one row of blocks each; 0 for one piece.
	tiles int
	// splits is the split form's count of PP_SPLIT ranges of positions
	// (its grid's third dimension; 0 for the other kernels).
	splits int
}

// prefillKernel plans the attention of the current layout's n rows with
// a tiled kernel where they are prompt pieces: n ≥ 2 rows over an f16
// pool, with a head dimension prefill.cu is built for, either one piece
// (the rows of one sequence at consecutive positions) or several whose
// rows mostly lie in runs (piecesLayout: a merged group of a batched
// step, its pieces perhaps deep into their sequences). Otherwise ok is
// false and PagedAttention runs its per-row kernel (decode rows, f32
// pools). Called with b.mu held.
func (b *Backend) prefillKernel(n int, at kernels.Attn, esize int) (pl prefillPlan, ok bool) {
	if prefillMode == prefillOff || n < 2 || esize != 2 {
		return pl, false
	}
	var sfx string
	switch at.HeadDim {
	case 64:
		sfx = "d64"
	case 128:
		sfx = "d128"
	default:
		return pl, false
	}
	ls := &b.lay
	d := b.w.Device
	// the split form where a row lies past the first split (or with sinks,
	// which the merge folds in): its rows' bits are the split form's
	// wherever they are computed, since a piece within the first split
	// takes the unsplit form, which normalises as the merge does
	split := func(maxPos int) int {
		if prefillMode == prefillAuto && d.Backend == rocm.CUDA && d.CCMajor >= 8 && b.warp == 32 &&
			(at.Sinks != nil || maxPos+1 > prefillSplit) {
			return ceilDiv(maxPos+1, prefillSplit)
		}
		return 0
	}
	pl.seq, pl.pos0 = ls.seq[0], ls.pos[0]
	one := true
	for i := 1; i < n && one; i++ {
		one = ls.seq[i] == pl.seq && ls.pos[i] == pl.pos0+int32(i)
	}
	if !one {
		// Several pieces: the pieces kernels run the default bodies only
		// (the plain and v1 modes, kept for comparisons, take the per-row
		// kernel for such a step, as before).
		if n != len(ls.pos) || !piecesLayout(n, ls.runs) || (prefillMode != prefillAuto && prefillMode != prefillWhole) {
			return prefillPlan{}, false
		}
		pl.tiles = len(ls.tiles) / 4
		if pl.splits = split(int(slices.Max(ls.pos[:n]))); pl.splits > 0 {
			pl.name = "attn_prefill_pieces_split_f16_" + sfx
		} else {
			pl.name = "attn_prefill_pieces_f16_" + sfx
		}
		return pl, true
	}
	switch {
	case prefillMode == prefillPlain:
		pl.name = "attn_prefill_plain_f16_" + sfx
	case prefillMode == prefillV1:
		pl.name = "attn_prefill_v1_f16_" + sfx
	default:
		if pl.splits = split(int(pl.pos0) + n - 1); pl.splits > 0 {
			pl.name = "attn_prefill_split_f16_" + sfx
		} else {
			pl.name = "attn_prefill_f16_" + sfx
		}
	}
	return pl, true
}

// piecesLayout says whether a layout of n rows in runs runs (rows of one
// sequence at consecutive positions) goes through the pieces kernel: more
// than one run, on average at least two rows each. A step of decode rows
// (a run each) stays with the per-row kernel, which splits each row's
// prefix across blocks; a merged group's few long pieces (and the moved
// last rows, a run each) read each chunk of a prefix once per tile.
func piecesLayout(n, runs int) bool { return runs > 1 && n >= 2*runs }

// prefillTiles appends to dst the tiles of the layout's rows for the
// pieces kernel, four int32 each: the tile's first row, its rows (1 … 64),
// its first row's position and its sequence; every run of rows (one
// sequence, consecutive positions) is cut into tiles of prefillRows from
// its first row, as a one-piece launch cuts its piece. It also returns
// the count of runs.
func prefillTiles(dst, pos, seq []int32) ([]int32, int) {
	runs := 0
	for a := 0; a < len(pos); {
		e := a + 1
		for e < len(pos) && seq[e] == seq[a] && pos[e] == pos[e-1]+1 {
			e++
		}
		for t := a; t < e; t += prefillRows {
			dst = append(dst, int32(t), int32(min(prefillRows, e-t)), pos[t], seq[a])
		}
		runs++
		a = e
	}
	return dst, runs
}
