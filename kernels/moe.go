package kernels

// The row shuffles of a mixture of experts (pipeline/model/moe.go): an
// optional capability; the model composes the same numbers from Scale and
// Add where a backend lacks it, so a backend implements it only to save
// launches.

// RowMixer is a Backend that moves a mixture's rows in one op each, where
// the composition takes one Scale (a copy) per row gathered and one Scale
// and one Add per (token, expert) pair summed.
type RowMixer interface {
	// GatherRows copies len(rows) rows of cols values:
	//   dst[i] = src[rows[i]]      dst [len(rows)][cols]
	GatherRows(dst, src Tensor, rows []int32, cols int) error
	// MixRows is the weighted sum of a mixture's expert outputs, for t < n:
	//   dst[t] = Σ_{j<k} w[t·k+j] · src[rows[t·k+j]]     dst [n][cols]
	// each product rounded to float32 and the sum taken in j order, as
	// Scale then Add compute it (no fused multiply-add): the composition's
	// bits.
	MixRows(dst, src Tensor, rows []int32, w []float32, n, k, cols int) error
}
