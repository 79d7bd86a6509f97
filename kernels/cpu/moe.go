package cpu

import (
	"fmt"

	"github.com/forge-llm/forge/kernels"
)

// The mixture of experts' row shuffles (kernels.RowMixer): on the CPU they
// save only the per-op locking and checks of the composition, but the
// model then runs one path on every backend that has them.

var _ kernels.RowMixer = (*Backend)(nil)

// GatherRows copies rows: dst[i] = src[rows[i]], rows of cols values.
func (b *Backend) GatherRows(dst, src kernels.Tensor, rows []int32, cols int) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := checkTensor("gather rows: dst", dst, len(rows)*cols); err != nil {
		return err
	}
	for i, r := range rows {
		if r < 0 || (int(r)+1)*cols > src.Len {
			return fmt.Errorf("cpu: gather rows: row %d (entry %d) outside the source of %d values", r, i, src.Len)
		}
		copy(dst.Host[i*cols:(i+1)*cols], src.Host[int(r)*cols:(int(r)+1)*cols])
	}
	return nil
}

// MixRows computes dst[t] = Σ_j w[t·k+j]·src[rows[t·k+j]] for t < n, each
// product rounded to float32 before the add (Scale then Add).
func (b *Backend) MixRows(dst, src kernels.Tensor, rows []int32, w []float32, n, k, cols int) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if k <= 0 || len(rows) < n*k || len(w) < n*k {
		return fmt.Errorf("cpu: mix rows: %d rows and %d weights for %d tokens of %d", len(rows), len(w), n, k)
	}
	if err := checkTensor("mix rows: dst", dst, n*cols); err != nil {
		return err
	}
	for i, r := range rows[:n*k] {
		if r < 0 || (int(r)+1)*cols > src.Len {
			return fmt.Errorf("cpu: mix rows: row %d (entry %d) outside the source of %d values", r, i, src.Len)
		}
	}
	for t := range n {
		d := dst.Host[t*cols : (t+1)*cols]
		for j := range k {
			r, s := int(rows[t*k+j]), w[t*k+j]
			o := src.Host[r*cols : (r+1)*cols]
			if j == 0 {
				for i, v := range o {
					d[i] = v * s
				}
				continue
			}
			for i, v := range o {
				d[i] += float32(v * s) // the conversion rounds the product: no fused multiply-add
			}
		}
	}
	return nil
}
