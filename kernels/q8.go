package kernels

import "fmt"

// Q8 is the 8-bit copy of Rows activation rows of Cols values each (Cols a
// multiple of 32), in the form a GPU's matrix–vector kernels read their
// input: per row Cols int8 codes, and per 32 codes one float32 scale (x ≈
// code·scale). Codes holds the codes of every row, row after row, four to
// a float32 element; Scales the scales, row after row. The storage is the
// caller's (Q8In carves it out of a Tensor); the zero Q8 holds nothing.
//
// A Q8 is a value the caller holds: the op that wrote x fills it (where
// it can at no extra cost, see Q8Ops) and the caller hands it to the
// products that read x, so that they do not quantize x again. Nothing in
// the backend remembers it, so nothing there can go stale: it stays x's
// copy for as long as the caller leaves x and the storage alone.
type Q8 struct {
	Codes, Scales Tensor
	Rows, Cols    int
}

// q8Align is the alignment, in float32 elements, of the codes and of the
// scales within a Q8In piece: 256 bytes, as a device allocation's start,
// so that the kernels' 16-byte loads of codes are aligned in every row.
const q8Align = 64

// Q8Floats is the length of the Tensor that Q8In needs for rows×cols: the
// codes, then the scales, each from a multiple of 256 bytes on; a whole
// number of 256-byte units, so that pieces laid one after the other stay
// aligned.
func Q8Floats(rows, cols int) int {
	up := func(n int) int { return (n + q8Align - 1) / q8Align * q8Align }
	return up(rows*cols/4) + up(rows*cols/32)
}

// Q8In returns the Q8 for rows×cols whose storage is t (at least
// Q8Floats(rows, cols) elements, starting at a 256-byte boundary on a
// device).
func Q8In(t Tensor, rows, cols int) (Q8, error) {
	if rows <= 0 || cols <= 0 || cols%32 != 0 {
		return Q8{}, fmt.Errorf("kernels: q8 of %d rows of %d values: need rows > 0 and whole blocks of 32", rows, cols)
	}
	if n := Q8Floats(rows, cols); t.Len < n {
		return Q8{}, fmt.Errorf("kernels: q8 of %d rows of %d values needs %d floats, the tensor holds %d", rows, cols, n, t.Len)
	}
	nc := rows * cols / 4
	off := (nc + q8Align - 1) / q8Align * q8Align
	return Q8{Codes: t.View(0, nc), Scales: t.View(off, rows*cols/32), Rows: rows, Cols: cols}, nil
}

// Empty reports whether q holds nothing (the zero Q8).
func (q Q8) Empty() bool { return q.Rows == 0 }

// View returns rows [first, first+n) of q; the zero Q8 for n = 0 or an
// empty q.
func (q Q8) View(first, n int) Q8 {
	if q.Empty() || n == 0 {
		return Q8{}
	}
	if first < 0 || n < 0 || first+n > q.Rows {
		panic("kernels: q8 view out of range")
	}
	return Q8{
		Codes:  q.Codes.View(first*q.Cols/4, n*q.Cols/4),
		Scales: q.Scales.View(first*q.Cols/32, n*q.Cols/32),
		Rows:   n, Cols: q.Cols,
	}
}

// Q8Ops is a Backend whose products can take their input's 8-bit copy from
// the caller (a GPU's: there quantizing an activation is one more kernel
// launch per product, and the op that writes the activation can quantize
// it on the side for nothing). The CPU backend quantizes inside each
// product and does not implement it.
//
// The ops that write an activation (…Q8) compute exactly what the plain op
// computes; where a kernel of theirs can quantize the result on the side,
// they also fill q (which must have the result's shape, or be empty) and
// return it; otherwise they leave q alone and return the zero Q8, and the
// products that follow quantize for themselves. A product given a non-empty
// xq reads it instead of quantizing x: xq must be what an op of this
// backend returned for x, with x (and xq's storage) unchanged since, and
// xq.Rows = n, xq.Cols = the weights' Cols. Given the zero Q8, the products
// are MatMul and SharedInputMatMuler.MatMuls. Either way every result is
// bit for bit the plain op's.
type Q8Ops interface {
	// RMSNormQ8 is RMSNorm, with dst's copy in q where it can.
	RMSNormQ8(dst, x Tensor, w *Weight, n int, eps float32, q Q8) (Q8, error)
	// AddRMSNormQ8 is ResidualNormer.AddRMSNorm, with dst's copy in q
	// where it can.
	AddRMSNormQ8(dst, x, r Tensor, w *Weight, n int, eps float32, q Q8) (Q8, error)
	// AttentionQ8 is Attention, with out's copy in oq where it can.
	AttentionQ8(out, q, k, v Tensor, c *KVCache, layer, pos0, n int, a Attn, oq Q8) (Q8, error)
	// SiLUMulQ8 is SiLUMul over n = q.Rows·q.Cols values (q empty: any n),
	// with dst's copy in q where it can.
	SiLUMulQ8(dst, gate, up Tensor, n int, q Q8) (Q8, error)
	// MatMulQ8 is MatMul on x, reading xq when it is not empty.
	MatMulQ8(dst Tensor, w *Weight, x Tensor, xq Q8, n int) error
	// MatMulsQ8 is SharedInputMatMuler.MatMuls on x, reading xq when it is
	// not empty; when xq is empty, x is quantized once (if some product
	// reads 8 bits) and that copy handed to every weight's product.
	MatMulsQ8(dsts []Tensor, ws []*Weight, x Tensor, xq Q8, n int) error
}

// SharedInputPromptMatMuler is SharedInputMatMuler for the prompt pieces
// of a batched step: MatMulsPrompt computes what PromptMatMuler's
// MatMulPrompt computes for each weight, reading xq (x's 8-bit copy, as
// Q8Ops' products do) where it is not empty, else with x quantized at
// most once for them all. A backend without it multiplies such pieces one
// MatMulPrompt per weight.
type SharedInputPromptMatMuler interface {
	MatMulsPrompt(dsts []Tensor, ws []*Weight, x Tensor, xq Q8, n int) error
}
