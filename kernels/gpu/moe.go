package gpu

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/rocm"
)

// A mixture of experts' ops (kernels.RowMixer); the kernels are in
// cu/moe.cu.

var _ kernels.RowMixer = (*Backend)(nil)

// planMoeRows is the grid of gather_rows and mix_rows: 256-thread blocks
// over a row's cols values, one block row per row (grid-striding past
// 65535).
func planMoeRows(n, cols int) rocm.Dim3 {
	return rocm.Dim3{X: uint32(min(ceilDiv(max(cols, 1), 256), 65535)), Y: uint32(min(max(n, 1), 65535)), Z: 1}
}

// upload copies raw to the scratch buffer key once the queued work is done
// (an earlier op may still read the buffer). Call with b.mu held, on the
// worker; never while capturing.
func (b *Backend) upload(c *rocm.Ctx, key string, raw []byte) (rocm.DevPtr, error) {
	if b.step.capturing {
		return 0, fmt.Errorf("gpu: uploading %s while capturing a decode step", key)
	}
	p, err := b.scratchBuf(c, key, int64(len(raw)))
	if err != nil {
		return 0, err
	}
	if err := c.SyncStream(b.stream); err != nil {
		return 0, err
	}
	return p, c.CopyHtoD(p, raw)
}

// checkMoeRows checks row indices against a source of srcRows rows.
func checkMoeRows(op string, rows []int32, srcRows int) error {
	for i, r := range rows {
		if r < 0 || int(r) >= srcRows {
			return fmt.Errorf("gpu: %s: row %d (entry %d) outside the source's %d rows", op, r, i, srcRows)
		}
	}
	return nil
}

// GatherRows implements kernels.RowMixer: the row list is uploaded (after
// the queued work), then one launch copies every row.
func (b *Backend) GatherRows(dst, src kernels.Tensor, rows []int32, cols int) error {
	if len(rows) == 0 || cols <= 0 {
		return nil
	}
	if err := checkTensor("gather rows: dst", dst, len(rows)*cols); err != nil {
		return err
	}
	if err := checkTensor("gather rows: src", src, cols); err != nil {
		return err
	}
	if err := checkMoeRows("gather rows", rows, src.Len/cols); err != nil {
		return err
	}
	raw := make([]byte, 4*len(rows))
	for i, r := range rows {
		binary.LittleEndian.PutUint32(raw[4*i:], uint32(r))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.do(func(c *rocm.Ctx) error {
		b.q8Written(dst)
		p, err := b.upload(c, "moe-gather", raw)
		if err != nil {
			return err
		}
		var a rocm.Args
		a.Ptr(dptr(dst)).Ptr(dptr(src)).Ptr(p).I32(int32(len(rows))).I32(int32(cols))
		return b.launch(c, "gather_rows", planMoeRows(len(rows), cols), rocm.D1(256), &a)
	})
}

// MixRows implements kernels.RowMixer: rows and weights are uploaded
// together (after the queued work), then one launch sums every token's
// rows.
func (b *Backend) MixRows(dst, src kernels.Tensor, rows []int32, w []float32, n, k, cols int) error {
	if n <= 0 || cols <= 0 {
		return nil
	}
	if k <= 0 || len(rows) < n*k || len(w) < n*k {
		return fmt.Errorf("gpu: mix rows: %d rows and %d weights for %d tokens of %d", len(rows), len(w), n, k)
	}
	if err := checkTensor("mix rows: dst", dst, n*cols); err != nil {
		return err
	}
	if err := checkTensor("mix rows: src", src, cols); err != nil {
		return err
	}
	if err := checkMoeRows("mix rows", rows[:n*k], src.Len/cols); err != nil {
		return err
	}
	raw := make([]byte, 8*n*k)
	for i := range n * k {
		binary.LittleEndian.PutUint32(raw[4*i:], uint32(rows[i]))
		binary.LittleEndian.PutUint32(raw[4*(n*k+i):], math.Float32bits(w[i]))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.do(func(c *rocm.Ctx) error {
		b.q8Written(dst)
		p, err := b.upload(c, "moe-mix", raw)
		if err != nil {
			return err
		}
		var a rocm.Args
		a.Ptr(dptr(dst)).Ptr(dptr(src)).Ptr(p).Ptr(p + rocm.DevPtr(4*n*k)).I32(int32(n)).I32(int32(k)).I32(int32(cols))
		return b.launch(c, "mix_rows", planMoeRows(n, cols), rocm.D1(256), &a)
	})
}
