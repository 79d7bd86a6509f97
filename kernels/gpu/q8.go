package gpu

// The 8-bit copies of activations (kernels.Q8, kernels.Q8Ops). The decode
// products on 8-bit x (the q8 matrix-vector kernels, mmq, mmq32) read x as
// quantize_q8 writes it: codes [rows][cols], then one float scale per 32
// values. The op that writes an activation can write that copy on the side
// in the same kernel (rmsnorm_row, silu_mul_q8, the decode attention: their
// q8_group is quantize_q8's arithmetic), into storage the caller holds and
// hands on to the products that read the activation. The backend keeps no
// record of what it quantized: a product given no copy quantizes x itself,
// once for all the weights of one MatMuls.

import (
	"fmt"

	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/rocm"
)

var _ kernels.Q8Ops = (*Backend)(nil)

// q8x is an 8-bit copy on the device: codes and scales; zero for none.
type q8x struct {
	codes, scales rocm.DevPtr
}

func (q q8x) empty() bool { return q.codes == 0 }

// devQ8 checks that q, when not empty, is a copy of rows×cols values on
// this device whose codes the kernels can load 16 bytes at a time, and
// returns its addresses (zero for the zero Q8).
func devQ8(op string, q kernels.Q8, rows, cols int) (q8x, error) {
	if q.Empty() {
		return q8x{}, nil
	}
	if q.Rows != rows || q.Cols != cols {
		return q8x{}, fmt.Errorf("gpu: %s: an 8-bit copy of %d×%d values for %d×%d", op, q.Rows, q.Cols, rows, cols)
	}
	if cols%32 != 0 {
		return q8x{}, fmt.Errorf("gpu: %s: an 8-bit copy of rows of %d values (whole blocks of 32 only)", op, cols)
	}
	if q.Codes.Dev == 0 || q.Scales.Dev == 0 {
		return q8x{}, fmt.Errorf("gpu: %s: the 8-bit copy is not on the GPU", op)
	}
	if q.Codes.Dev%16 != 0 {
		return q8x{}, fmt.Errorf("gpu: %s: the 8-bit copy's codes are not 16-byte aligned", op)
	}
	if q.Codes.Len < rows*cols/4 || q.Scales.Len < rows*cols/32 {
		return q8x{}, fmt.Errorf("gpu: %s: the 8-bit copy holds %d codes and %d scales, need %d and %d",
			op, 4*q.Codes.Len, q.Scales.Len, rows*cols, rows*cols/32)
	}
	return q8x{codes: rocm.DevPtr(q.Codes.Dev), scales: rocm.DevPtr(q.Scales.Dev)}, nil
}

// q8For returns the 8-bit copy of x [n] (n values: rows×cols, rows whole
// blocks of 32) a product reads: *q where the caller gave one, else x
// quantized now (into the "xq" scratch), kept in *q for the products
// after it in the same op. q nil: quantize, keep nothing. Call with b.mu
// held, on the worker.
func (b *Backend) q8For(c *rocm.Ctx, x rocm.DevPtr, n int, q *q8x) (q8x, error) {
	if q != nil && !q.empty() {
		return *q, nil
	}
	codes, scales, err := b.quantizeX(c, x, n)
	if err != nil {
		return q8x{}, err
	}
	made := q8x{codes: codes, scales: scales}
	if q != nil {
		*q = made
	}
	return made, nil
}
