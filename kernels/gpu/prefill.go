package gpu

import (
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

// prefillKernel names the tiled kernel that computes the attention of the
// current layout's n rows when they are one prompt piece: n ≥ 2 rows of
// one sequence at consecutive positions, over an f16 pool, with a head
// dimension prefill.cu is built for. Then it returns the sequence and the
// first row's position too; otherwise ok is false and PagedAttention runs
// its per-row kernel (decode rows, steps of several sequences, f32 pools).
// splits is the split form's count of PP_SPLIT ranges of positions (its
// grid's third dimension; 0 for the other kernels). Called with b.mu held.
func (b *Backend) prefillKernel(n int, at kernels.Attn, esize int) (name string, seq, pos0 int32, splits int, ok bool) {
	if prefillMode == prefillOff || n < 2 || esize != 2 {
		return "", 0, 0, 0, false
	}
	var sfx string
	switch at.HeadDim {
	case 64:
		sfx = "d64"
	case 128:
		sfx = "d128"
	default:
		return "", 0, 0, 0, false
	}
	ls := &b.lay
	seq, pos0 = ls.seq[0], ls.pos[0]
	for i := 1; i < n; i++ {
		if ls.seq[i] != seq || ls.pos[i] != pos0+int32(i) {
			return "", 0, 0, 0, false
		}
	}
	d := b.w.Device
	switch {
	case prefillMode == prefillPlain:
		name = "attn_prefill_plain_f16_" + sfx
	case prefillMode == prefillV1:
		name = "attn_prefill_v1_f16_" + sfx
	case prefillMode == prefillAuto && d.Backend == rocm.CUDA && d.CCMajor >= 8 && b.warp == 32 &&
		(at.Sinks != nil || int(pos0)+n > prefillSplit):
		// A piece with a row past the first split (or with sinks, which the
		// merge folds in): its rows' bits are the split form's wherever they
		// are computed, since a piece within the first split takes the
		// unsplit form, which normalises as the merge does.
		name, splits = "attn_prefill_split_f16_"+sfx, ceilDiv(int(pos0)+n, prefillSplit)
	default:
		name = "attn_prefill_f16_" + sfx
	}
	return name, seq, pos0, splits, true
}
