package kernels

import "math"

// The row shuffles and the device routing of a mixture of experts
// (pipeline/model/moe.go). Both are optional capabilities: the model
// composes the same numbers from Scale, Add and MatMul where a backend
// lacks them, so a backend implements them only to save launches and the
// router's read-back.

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

// Routing is a router's rule for one token's logits over the experts.
type Routing int

const (
	// RouteSoftmax (Mixtral, Qwen3-MoE): the softmax over every expert's
	// logit, its k largest probabilities best first (ties: the lower
	// expert; NaN below any number), renormalised to sum to 1 with the
	// sum clamped at 2⁻¹⁴.
	RouteSoftmax Routing = iota
	// RouteTopKSoftmax (gpt-oss): the k largest logits best first (ties
	// and NaN as above), weighted by the softmax over those k alone.
	RouteTopKSoftmax
)

// ExpertTable is a backend's table of the device addresses of one kind of
// matrix (gate, up or down) of every expert of a layer, in expert order;
// only the backend that made it knows what it holds.
type ExpertTable any

// ExpertRouter is a Backend that runs a one-token mixture with its routing
// on the device: the chosen experts' ids and weights never reach the host,
// so a decode step of a mixture waits for nothing and can be recorded
// (StepCapturer). An ids tensor holds int32 values in its float32 slots
// (IDBits, IDOf).
type ExpertRouter interface {
	// NewExpertTable lists the device addresses of ws (every expert's
	// matrix of one kind: one type and shape), which must all be
	// resident; an error where the backend's expert products cannot run
	// them (type, alignment), so the model keeps its host path.
	NewExpertTable(ws []*Weight) (ExpertTable, error)
	FreeExpertTable(t ExpertTable)
	// RouteTopK routes n tokens: logits [n][experts] to ids [n][k] (int32
	// in float32 slots) and their weights w [n][k], by rule r.
	RouteTopK(ids, w, logits Tensor, n, experts, k int, r Routing) error
	// ExpertMatMuls computes, for every table i and slot j < k,
	//   dsts[i][j] [rows] = x_j · T_i[ids[j]]ᵀ
	// with x_j = x [cols] for every j when shared, else row j of x
	// [k][cols]; each row bit for bit what MatMul of that expert gives.
	ExpertMatMuls(dsts []Tensor, tables []ExpertTable, ids, x Tensor, k int, shared bool) error
	// MixSlots is MixRows for n tokens whose k expert outputs each are
	// consecutive rows of src [n·k][cols] and whose weights w [n·k] are on
	// the device:
	//   dst[t] = Σ_{j<k} w[t·k+j]·src[t·k+j]   (rounded as MixRows)
	MixSlots(dst, src, w Tensor, n, k, cols int) error
}

// RouterFuser is an ExpertRouter that computes a decode step's router
// product (with its bias, gpt-oss) and the routing from it in one op: one
// launch instead of two or three. The model falls back to MatMul, AddBias
// and RouteTopK, whose bits it must give.
type RouterFuser interface {
	// RouteFused is MatMul(logits, gate, x, 1), AddBias(logits, bias, 1)
	// where bias is set, then RouteTopK(ids, w, logits, 1, gate.Rows, k,
	// rule); false, with nothing done, where it cannot (the gate's type).
	RouteFused(ids, w, logits, x Tensor, gate, bias *Weight, k int, rule Routing) (bool, error)
}

// MixNormer is an ExpertRouter that fuses a decode step's weighted sum of
// its experts' outputs with the residual add and the RMSNorm that follow
// it (the next block's pre-norm): one launch instead of two. The model
// falls back to MixSlots then Q8Ops.AddRMSNormQ8, whose bits it must give.
type MixNormer interface {
	// MixAddRMSNormQ8 is MixSlots(r, src, w, 1, k, nw.Cols), then x += r,
	// dst = rmsnorm(x) ⊙ nw for the one row, with dst's 8-bit copy in q
	// where q is not empty (AddRMSNormQ8's rules); it returns the copy
	// made.
	MixAddRMSNormQ8(dst, x, r, src, w Tensor, k int, nw *Weight, eps float32, q Q8) (Q8, error)
}

// ExpertQ8MatMuler is an ExpertRouter whose expert products take x's
// 8-bit copy from the op that wrote x (a decode step's norm for the gate
// and up products, Q8Ops.SiLUMulQ8 for the down ones): the products that
// read 8 bits skip quantizing x again, a launch less each. xq holds x's
// rows (one when shared, else k) of the tables' width; the results are
// ExpertMatMuls' bit for bit.
type ExpertQ8MatMuler interface {
	ExpertMatMulsQ8(dsts []Tensor, tables []ExpertTable, ids, x Tensor, xq Q8, k int, shared bool) error
}

// ExpertBiaser is an ExpertRouter that also adds each chosen expert's
// bias (gpt-oss): for slot j < k,
//
//	dst[j] [cols] += T[ids[j]]
//
// with T a table (NewExpertTable) of the experts' F32 bias rows of cols
// values, each add rounded as AddBias rounds it.
type ExpertBiaser interface {
	AddExpertBias(dst Tensor, table ExpertTable, ids Tensor, k, cols int) error
}

// IDBits is the float32 whose bits are the int32 id: how an ids tensor
// holds an expert's id on a backend with host storage.
func IDBits(id int32) float32 { return math.Float32frombits(uint32(id)) }

// IDOf is the id an ids tensor's slot v holds.
func IDOf(v float32) int32 { return int32(math.Float32bits(v)) }

// ExpertGrouper is an ExpertRouter that runs a prompt's expert products
// grouped: every expert's rows of one kind of matrix in one op, where the
// composition runs one MatMul per expert some token chose (hundreds per
// layer of a long prompt). The rows are the (token, expert) pairs'
// inputs gathered in expert order (RowMixer.GatherRows): expert e's rows
// are [start[e], start[e+1]).
type ExpertGrouper interface {
	// GroupsFit reports whether GroupedMatMuls can multiply by the
	// matrices of table t (their type and placement, the device); where
	// not, the model keeps one MatMul per expert.
	GroupsFit(t ExpertTable) bool
	// GroupedMatMuls computes, for every table i, expert e < len(start)-1
	// and row r in [start[e], start[e+1]):
	//   dsts[i][r] [T_i's rows] = x[r] · T_i[e]ᵀ      x [start[E]][cols]
	// (at most two tables, of one type and shape, sharing x). Each row is
	// bit for bit what MatMul of that expert gives it over at most
	// MaxBatchRows rows (the row-invariant kernels). A backend may keep
	// the last start it was given on the device, so that a layer's
	// products after the first with the same groups upload nothing.
	GroupedMatMuls(dsts []Tensor, tables []ExpertTable, x Tensor, start []int32) error
}
