package model

import (
	"fmt"
	"math"
	"sync"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/cpu"
)

// q8Checker is a backend with kernels.Q8Ops on the host: every op is its
// inner backend's (the CPU's), so the results are the CPU's bit for bit,
// and its 8-bit copies hold no codes: it records, for each row of a copy's
// storage, which row of which tensor it was made from and that row's
// values then, and fails a product handed a copy that was not made from
// the product's input or whose input has changed since. That is the
// contract a GPU's copies rest on (kernels.Q8Ops), checked on every
// architecture without a GPU.
type q8Checker struct {
	kernels.Backend
	// fill says whether an op makes the copy of rows rows it is offered
	// (a GPU: one row); the others return the zero Q8.
	fill func(rows int) bool

	mu           sync.Mutex
	made         map[*float32]q8Source // by the first code element of a copy's row
	filled, read int                   // rows copied; products that read a copy
}

// q8Source is what one row of a copy was made from.
type q8Source struct {
	row  *float32  // the first value of the source row
	vals []float32 // the row's values when the copy was made
	op   string
}

var _ kernels.Q8Ops = (*q8Checker)(nil)

func newQ8Checker(inner kernels.Backend, fill func(rows int) bool) *q8Checker {
	return &q8Checker{Backend: inner, fill: fill, made: map[*float32]q8Source{}}
}

// Unwrap lets the model find the inner backend's other capabilities
// (kernels.As); its own Q8Ops are found first.
func (c *q8Checker) Unwrap() kernels.Backend { return c.Backend }

// counts returns the rows copied and the products that read a copy.
func (c *q8Checker) counts() (filled, read int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.filled, c.read
}

// record makes q the copy of src (rows of q.Cols values), where fill says
// so.
func (c *q8Checker) record(op string, q kernels.Q8, src kernels.Tensor) (kernels.Q8, error) {
	if q.Empty() || !c.fill(q.Rows) {
		return kernels.Q8{}, nil
	}
	if q.Cols%32 != 0 || src.Len != q.Rows*q.Cols || q.Codes.Len != q.Rows*q.Cols/4 || q.Scales.Len != q.Rows*q.Cols/32 {
		return kernels.Q8{}, fmt.Errorf("q8 checker: %s: copy %d×%d (%d, %d floats) of %d values", op, q.Rows, q.Cols, q.Codes.Len, q.Scales.Len, src.Len)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range q.Rows {
		row := src.Host[i*q.Cols : (i+1)*q.Cols]
		c.made[&q.Codes.Host[i*q.Cols/4]] = q8Source{row: &row[0], vals: append([]float32(nil), row...), op: op}
	}
	c.filled += q.Rows
	return q, nil
}

// check fails unless xq is empty or the copy of x [n][cols] as it is now.
func (c *q8Checker) check(op string, xq kernels.Q8, x kernels.Tensor, n, cols int) error {
	if xq.Empty() {
		return nil
	}
	if xq.Rows != n || xq.Cols != cols {
		return fmt.Errorf("q8 checker: %s: a copy of %d×%d for %d×%d", op, xq.Rows, xq.Cols, n, cols)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range n {
		src, ok := c.made[&xq.Codes.Host[i*cols/4]]
		if !ok {
			return fmt.Errorf("q8 checker: %s: row %d of the copy was never made", op, i)
		}
		row := x.Host[i*cols : (i+1)*cols]
		if src.row != &row[0] {
			return fmt.Errorf("q8 checker: %s: row %d of the copy was made (by %s) from another tensor than the product's input", op, i, src.op)
		}
		for j, v := range row {
			if math.Float32bits(v) != math.Float32bits(src.vals[j]) {
				return fmt.Errorf("q8 checker: %s: row %d of the input changed (at %d: %g, then %g) since %s made its copy", op, i, j, v, src.vals[j], src.op)
			}
		}
	}
	c.read++
	return nil
}

func (c *q8Checker) RMSNormQ8(dst, x kernels.Tensor, w *kernels.Weight, n int, eps float32, q kernels.Q8) (kernels.Q8, error) {
	if err := c.Backend.RMSNorm(dst, x, w, n, eps); err != nil {
		return kernels.Q8{}, err
	}
	return c.record("rmsnorm", q, dst.View(0, n*w.Cols))
}

func (c *q8Checker) AddRMSNormQ8(dst, x, r kernels.Tensor, w *kernels.Weight, n int, eps float32, q kernels.Q8) (kernels.Q8, error) {
	if rn, ok := kernels.As[kernels.ResidualNormer](c.Backend); ok {
		if err := rn.AddRMSNorm(dst, x, r, w, n, eps); err != nil {
			return kernels.Q8{}, err
		}
	} else {
		if err := c.Backend.Add(x, x, r, n*w.Cols); err != nil {
			return kernels.Q8{}, err
		}
		if err := c.Backend.RMSNorm(dst, x, w, n, eps); err != nil {
			return kernels.Q8{}, err
		}
	}
	return c.record("add·rmsnorm", q, dst.View(0, n*w.Cols))
}

func (c *q8Checker) AttentionQ8(out, q, k, v kernels.Tensor, kc *kernels.KVCache, layer, pos0, n int, a kernels.Attn, oq kernels.Q8) (kernels.Q8, error) {
	if err := c.Backend.Attention(out, q, k, v, kc, layer, pos0, n, a); err != nil {
		return kernels.Q8{}, err
	}
	return c.record("attention", oq, out.View(0, n*a.Heads*a.HeadDim))
}

func (c *q8Checker) SiLUMulQ8(dst, gate, up kernels.Tensor, n int, q kernels.Q8) (kernels.Q8, error) {
	if err := c.Backend.SiLUMul(dst, gate, up, n); err != nil {
		return kernels.Q8{}, err
	}
	return c.record("silu·mul", q, dst.View(0, n))
}

func (c *q8Checker) MatMulQ8(dst kernels.Tensor, w *kernels.Weight, x kernels.Tensor, xq kernels.Q8, n int) error {
	if err := c.check("matmul "+w.Name, xq, x, n, w.Cols); err != nil {
		return err
	}
	return c.Backend.MatMul(dst, w, x, n)
}

func (c *q8Checker) MatMulsQ8(dsts []kernels.Tensor, ws []*kernels.Weight, x kernels.Tensor, xq kernels.Q8, n int) error {
	if len(ws) == 0 {
		return nil
	}
	if err := c.check("matmuls "+ws[0].Name, xq, x, n, ws[0].Cols); err != nil {
		return err
	}
	if mm, ok := kernels.As[kernels.SharedInputMatMuler](c.Backend); ok {
		return mm.MatMuls(dsts, ws, x, n)
	}
	for i, w := range ws {
		if err := c.Backend.MatMul(dsts[i], w, x, n); err != nil {
			return err
		}
	}
	return nil
}

// q8Fills are the fill policies the checker runs with: every copy
// offered, and one-row copies only (as a GPU fuses).
var q8Fills = []struct {
	name string
	fill func(rows int) bool
}{
	{"all", func(int) bool { return true }},
	{"one-row", func(rows int) bool { return rows == 1 }},
}

// TestQ8CheckerCatchesStaleCopy: the checker itself fails a product on a
// copy whose input changed, or that was made from another tensor, and
// passes one on a fresh copy (so that its silence over the models means
// something).
func TestQ8CheckerCatchesStaleCopy(t *testing.T) {
	be := cpu.New(1)
	defer be.Close()
	c := newQ8Checker(be, q8Fills[0].fill)
	const cols = 64
	alloc := func(n int) kernels.Tensor {
		x, err := be.Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	x, y, dst := alloc(2*cols), alloc(2*cols), alloc(2*cols)
	for i := range x.Host {
		x.Host[i], y.Host[i] = float32(i%7)-3, float32(i%5)
	}
	norm := &kernels.Weight{Name: "norm", Type: gguf.TypeF32, Cols: cols, Rows: 1, Host: make([]byte, 4*cols)}
	for i := range cols {
		norm.Host[4*i+3] = 0x3f // 0.5
	}
	w := &kernels.Weight{Name: "w", Type: gguf.TypeF32, Cols: cols, Rows: 3, Host: make([]byte, 4*3*cols)}
	q, err := kernels.Q8In(alloc(kernels.Q8Floats(2, cols)), 2, cols)
	if err != nil {
		t.Fatal(err)
	}
	xb := alloc(2 * cols)
	made, err := c.RMSNormQ8(xb, x, norm, 2, 1e-5, q)
	if err != nil || made.Empty() {
		t.Fatalf("RMSNormQ8: %+v, %v", made, err)
	}
	if err := c.MatMulQ8(dst, w, xb, made, 2); err != nil {
		t.Errorf("product on a fresh copy: %v", err)
	}
	if err := c.MatMulQ8(dst, w, y, made, 2); err == nil {
		t.Error("product of another tensor on xb's copy passed")
	}
	if err := c.MatMulQ8(dst, w, xb.View(cols, cols), made.View(0, 1), 1); err == nil {
		t.Error("product of row 1 on row 0's copy passed")
	}
	if err := c.MatMulQ8(dst, w, xb.View(cols, cols), made.View(1, 1), 1); err != nil {
		t.Errorf("product of row 1 on its copy: %v", err)
	}
	xb.Host[cols+5]++
	if err := c.MatMulsQ8([]kernels.Tensor{dst}, []*kernels.Weight{w}, xb, made, 2); err == nil {
		t.Error("product on a stale copy passed")
	}
	if err := c.MatMulQ8(dst, w, xb, kernels.Q8{}, 2); err != nil {
		t.Errorf("product without a copy: %v", err)
	}
	if _, err := c.RMSNormQ8(xb, y, norm, 2, 1e-5, q); err != nil {
		t.Fatal(err)
	}
	if err := c.MatMulQ8(dst, w, xb, made, 2); err != nil {
		t.Errorf("product on the refilled copy: %v", err)
	}
	if filled, read := c.counts(); filled != 4 || read != 3 {
		t.Errorf("counted %d rows copied, %d products on copies; want 4, 3", filled, read)
	}
}

// TestQ8CheckerStepBatch runs TestStepBatchMatchesForward's sequences with
// the checker's 8-bit copies: batched steps (prompt pieces, decode rows of
// several sequences, merged prompts) and Forward, every logit still the
// CPU's bit for bit, no product on a stale copy.
func TestQ8CheckerStepBatch(t *testing.T) {
	for _, f := range q8Fills {
		for _, merge := range []bool{false, true} {
			for _, file := range []string{"stories260K-Q4_K_M.gguf", "synth-kq-Q4_K_M.gguf"} {
				name := f.name + "/" + file
				if merge {
					name += "/merged"
				}
				t.Run(name, func(t *testing.T) {
					var c *q8Checker
					stepBatchMatchesForwardOn(t, file, merge, func(be kernels.Backend) kernels.Backend {
						c = newQ8Checker(be, f.fill)
						return c
					})
					filled, read := c.counts()
					t.Logf("%d rows copied, %d products on a copy", filled, read)
					if filled == 0 || read == 0 {
						t.Errorf("%d rows copied, %d products on a copy: the copies were not used", filled, read)
					}
				})
			}
		}
	}
}
