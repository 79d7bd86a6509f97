package cpu

import (
	"fmt"
	"runtime/debug"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
)

// actKind is the form a weight type wants its activations in (ggml's
// vec_dot_type).
type actKind int

const (
	actF32   actKind = iota // F32 weights: activations as they are
	actF16                  // F16 weights: activations rounded to f16
	actBF16                 // BF16 weights: activations rounded to bf16
	actQ8_0                 // 32-element blocks, f16 scale
	actQ8_1                 // Q8_0 plus ggml's f16 block sums (Q4_1, Q5_1)
	actQ8_K                 // 256-element blocks, f32 scale, per-16 sums
	actQ8_K4                // actQ8_K with the codes in Q4_K's nibble order (q4kOrder)
)

// dotFunc is the dot product of one weight row (its GGUF bytes) with one
// prepared activation row.
type dotFunc func(w []byte, x *qrow) float32

// dot4Func is the dot product of one weight row with the four prepared
// activation rows j…j+3 of a, written to out: the prompt-processing kernel,
// which decodes each weight block once for four tokens.
type dot4Func func(w []byte, a *actBuf, j int, out *[4]float32)

// dot8Func is dot4Func for the eight activation rows j…j+7: the weight
// blocks decoded once for eight tokens (batched decode of 8+ sequences,
// prompts).
type dot8Func func(w []byte, a *actBuf, j int, out *[8]float32)

// dotR4Func is the dot product of the four consecutive weight rows w[0:rb],
// w[rb:2rb], w[2rb:3rb], w[3rb:4rb] with one activation row: for decode,
// where a row at a time leaves the core waiting on memory or on one
// accumulator. Each result equals dot's on that row bit for bit.
type dotR4Func func(w []byte, rb int, x *qrow, out *[4]float32)

// kernel is how MatMul handles one weight type. dot4, dot8 and dotR4 are
// optional; inexact4 marks a dot4 (and dot8) whose float accumulation
// order differs from dot's, so its rows are not bit-identical to the row
// computed alone. MatMul uses such kernels only above kernels.MaxBatchRows
// rows, where the Batcher contract promises no row invariance (long prompt
// chunks).
type kernel struct {
	act      actKind
	dot      dotFunc
	dot4     dot4Func
	inexact4 bool
	dotR4    dotR4Func
	dot8     dot8Func // as exact as dot4, used where dot4 is
	gemm     gemmFunc // four rows × four tokens (gemm.go), exact; wants packed activations
	dot2     dot2Func // dot4 for two tokens (a batch's two rows over), exact
}

// dot2Func is dot4Func for the two activation rows j, j+1.
type dot2Func func(w []byte, a *actBuf, j int, out *[2]float32)

// goKernels are the plain-Go kernels for every supported type; fastKernels
// starts as a copy and the architecture file replaces entries with
// assembly where the CPU has the features (see dot_amd64.go).
var goKernels = map[gguf.Type]kernel{
	gguf.TypeF32:    {actF32, dotWF32Go, nil, false, nil, nil, nil, nil},
	gguf.TypeF16:    {actF16, dotWF16Go, nil, false, nil, nil, nil, nil},
	gguf.TypeBF16:   {actBF16, dotWBF16Go, nil, false, nil, nil, nil, nil},
	gguf.TypeQ4_0:   {actQ8_0, dotQ4_0Go, nil, false, nil, nil, nil, nil},
	gguf.TypeQ4_1:   {actQ8_1, dotQ4_1Go, nil, false, nil, nil, nil, nil},
	gguf.TypeQ5_0:   {actQ8_0, dotQ5_0Go, nil, false, nil, nil, nil, nil},
	gguf.TypeQ5_1:   {actQ8_1, dotQ5_1Go, nil, false, nil, nil, nil, nil},
	gguf.TypeQ8_0:   {actQ8_0, dotQ8_0Go, nil, false, nil, nil, gemmQ8_0Go, nil},
	gguf.TypeQ2_K:   {actQ8_K, dotQ2_KGo, nil, false, nil, nil, nil, nil},
	gguf.TypeQ3_K:   {actQ8_K, dotQ3_KGo, nil, false, nil, nil, nil, nil},
	gguf.TypeQ4_K:   {actQ8_K, dotQ4_KGo, nil, false, nil, nil, nil, nil},
	gguf.TypeQ5_K:   {actQ8_K, dotQ5_KGo, nil, false, nil, nil, nil, nil},
	gguf.TypeQ6_K:   {actQ8_K, dotQ6_KGo, nil, false, nil, nil, nil, nil},
	gguf.TypeIQ4_NL: {actQ8_0, dotIQ4_NLGo, nil, false, nil, nil, nil, nil},
	gguf.TypeIQ4_XS: {actQ8_K, dotIQ4_XSGo, nil, false, nil, nil, nil, nil},
	gguf.TypeMXFP4:  {actQ8_0, dotMXFP4Go, nil, false, nil, nil, nil, nil},
}

var fastKernels = func() map[gguf.Type]kernel {
	m := make(map[gguf.Type]kernel, len(goKernels))
	for t, k := range goKernels {
		m[t] = k
	}
	return m
}()

// actBuf holds the n activation rows of one MatMul in the form its weight
// type wants. The slices only grow, so steady-state MatMuls allocate
// nothing.
type actBuf struct {
	kind    actKind
	n, cols int
	f       []float32 // [n][cols] (F16/BF16 rounding; F32 points at x)
	q       []int8    // [n][cols]
	d       []float32 // [n][cols/bs]
	s       []float32 // [n][cols/32]
	bs      []int16   // [n][cols/16]
	rows    []qrow    // per-row views
	pack    bool      // also pack the Q8_0 rows, four to a group, into p (packQ8_0x4)
	p       []byte    // [⌈n/4⌉][cols/32][q8x4Block]
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// prepare sizes the buffer for n rows of cols activations of kind k.
func (a *actBuf) prepare(k actKind, n, cols int, x []float32) {
	a.kind, a.n, a.cols = k, n, cols
	a.rows = grow(a.rows, n)
	switch k {
	case actF32:
		for j := range n {
			a.rows[j] = qrow{f: x[j*cols : (j+1)*cols]}
		}
	case actF16, actBF16:
		a.f = grow(a.f, n*cols)
		for j := range n {
			a.rows[j] = qrow{f: a.f[j*cols : (j+1)*cols]}
		}
	case actQ8_0, actQ8_1:
		nb := cols / 32
		a.q, a.d, a.s = grow(a.q, n*cols), grow(a.d, n*nb), grow(a.s, n*nb)
		for j := range n {
			a.rows[j] = qrow{q: a.q[j*cols : (j+1)*cols], d: a.d[j*nb : (j+1)*nb], s: a.s[j*nb : (j+1)*nb]}
		}
		if a.pack {
			a.p = grow(a.p, ((n+3)>>2)*nb*q8x4Block)
		}
	case actQ8_K, actQ8_K4:
		nb := cols / 256
		a.q, a.d, a.bs = grow(a.q, n*cols), grow(a.d, n*nb), grow(a.bs, n*cols/16)
		for j := range n {
			a.rows[j] = qrow{q: a.q[j*cols : (j+1)*cols], d: a.d[j*nb : (j+1)*nb], bs: a.bs[j*cols/16 : (j+1)*cols/16]}
		}
	}
}

// quantRow fills row j from the float activations xr.
func (a *actBuf) quantRow(j int, xr []float32) {
	r := &a.rows[j]
	switch a.kind {
	case actF16:
		for i, v := range xr {
			r.f[i] = f16Round(v)
		}
	case actBF16:
		for i, v := range xr {
			r.f[i] = bf16Round(v)
		}
	case actQ8_0:
		quantQ8_0(xr, r.q, r.d, r.s, false)
		if a.pack {
			a.packQ8_0x4(j)
		}
	case actQ8_1:
		quantQ8_0(xr, r.q, r.d, r.s, true)
	case actQ8_K:
		quantQ8_K(xr, r.q, r.d, r.bs)
	case actQ8_K4:
		quantQ8_K(xr, r.q, r.d, r.bs)
		q4kOrder(r.q)
	}
}

// zeroRow makes row j a padding row: all codes and scales zero, so its
// products are zero (and thrown away; see padRows).
func (a *actBuf) zeroRow(j int) {
	r := &a.rows[j]
	clear(r.f)
	clear(r.q)
	clear(r.d)
	clear(r.s)
	clear(r.bs)
	if a.pack && a.kind == actQ8_0 {
		a.packQ8_0x4(j)
	}
}

// quantTask quantizes activation rows in parallel.
type quantTask struct {
	a    *actBuf
	x    []float32 // n rows; rows past them are padding (zeros)
	n    int
	cols int
}

func (t *quantTask) run(_, lo, hi int) {
	for j := lo; j < hi; j++ {
		if j >= t.n {
			t.a.zeroRow(j)
			continue
		}
		t.a.quantRow(j, t.x[j*t.cols:(j+1)*t.cols])
	}
}

// matmulTask computes a band of weight rows for every activation row. Each
// chunk is a tile of consecutive weight rows that stays in cache while all
// n activation rows pass over it, so for prompts every weight block is read
// from memory once per MatMul, not once per token.
type matmulTask struct {
	dst   []float32
	w     []byte
	rb    int // bytes per weight row
	rows  int
	n     int // activation rows wanted in dst; act.n may add padding rows
	act   *actBuf
	dot   dotFunc
	dot4  dot4Func
	dot8  dot8Func
	dotR4 dotR4Func
	gemm  gemmFunc // set only with packed activations
	dot2  dot2Func
	scr   []workerScratch
}

func (t *matmulTask) run(w, lo, hi int) {
	j := 0
	if t.gemm != nil {
		j = t.runGemm(w, lo, hi)
	}
	if t.dot8 != nil && t.act.n >= 8 {
		o := &t.scr[w].out8
		for ; j+8 <= t.act.n; j += 8 {
			for r := lo; r < hi; r++ {
				t.dot8(t.w[r*t.rb:(r+1)*t.rb], t.act, j, o)
				for k, v := range o[:min(len(o), t.n-j)] {
					t.dst[(j+k)*t.rows+r] = v
				}
			}
		}
	}
	if t.dot4 != nil && t.act.n-j >= 4 {
		o := &t.scr[w].out4 // per-worker, so the call allocates nothing
		for ; j+4 <= t.act.n; j += 4 {
			for r := lo; r < hi; r++ {
				t.dot4(t.w[r*t.rb:(r+1)*t.rb], t.act, j, o)
				for k, v := range o[:min(len(o), t.n-j)] {
					t.dst[(j+k)*t.rows+r] = v
				}
			}
		}
	}
	if t.dot2 != nil && t.n-j >= 2 {
		o := &t.scr[w].out2
		d0, d1 := t.dst[j*t.rows:(j+1)*t.rows], t.dst[(j+1)*t.rows:(j+2)*t.rows]
		for r := lo; r < hi; r++ {
			t.dot2(t.w[r*t.rb:(r+1)*t.rb], t.act, j, o)
			d0[r], d1[r] = o[0], o[1]
		}
		j += 2
	}
	for ; j < t.n; j++ {
		x := &t.act.rows[j]
		out := t.dst[j*t.rows : (j+1)*t.rows]
		r := lo
		if t.dotR4 != nil {
			o := &t.scr[w].out4
			for ; r+4 <= hi; r += 4 {
				t.dotR4(t.w[r*t.rb:(r+4)*t.rb], t.rb, x, o)
				copy(out[r:r+4], o[:])
			}
		}
		for ; r < hi; r++ {
			out[r] = t.dot(t.w[r*t.rb:(r+1)*t.rb], x)
		}
	}
}

// MatMul multiplies n activation rows by a weight matrix in its block form.
// dst must not overlap x.
//
//	x [n][w.Cols], dst [n][w.Rows]: dst[i][r] = Σ_c w[r][c]·x[i][c]
func (b *Backend) MatMul(dst kernels.Tensor, w *kernels.Weight, x kernels.Tensor, n int) (err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	defer recoverFault(&err, debug.SetPanicOnFault(true), "matmul", w)
	return b.matmul(dst, w, x, n, fastKernels)
}

// matmul is MatMul with an explicit kernel table (tests run the Go table).
// A fault reading w on the caller panics out of it (MatMul recovers it); a
// fault on a helper is its error.
func (b *Backend) matmul(dst kernels.Tensor, w *kernels.Weight, x kernels.Tensor, n int, table map[gguf.Type]kernel) error {
	if w == nil {
		return fmt.Errorf("cpu: matmul: nil weight")
	}
	k, ok := table[w.Type]
	if !ok {
		return fmt.Errorf("cpu: matmul: weight %q: type %s is not supported", w.Name, w.Type)
	}
	rb, err := rowBytes(w)
	if err != nil {
		return fmt.Errorf("cpu: matmul: %w", err)
	}
	if n <= 0 {
		return fmt.Errorf("cpu: matmul: weight %q: n = %d rows", w.Name, n)
	}
	if err := checkTensor("matmul: x", x, n*w.Cols); err != nil {
		return err
	}
	if err := checkTensor("matmul: dst", dst, n*w.Rows); err != nil {
		return err
	}
	gemm := k.gemm
	if k.act != actQ8_0 || n < 4 {
		gemm = nil // the tiles want packed Q8_0 activations, four rows of them
	}
	dot4, dot8 := k.dot4, k.dot8
	if k.inexact4 && n <= kernels.MaxBatchRows {
		dot4, dot8 = nil, nil // keep every row bit-identical to n = 1 (batch invariance)
	}
	np := padRows(n, padsRows(k))
	if np != n && k.act == actF32 {
		np = n // F32 activations are x itself: no room for padding
	}
	a, err := b.quantize(k.act, np, n, w.Cols, x.Host, gemm != nil)
	if err != nil {
		return err
	}
	b.mm = matmulTask{dst: dst.Host, w: w.Host, rb: rb, rows: w.Rows, n: n, act: a, dot: k.dot, dot4: dot4, dot8: dot8, dotR4: k.dotR4, gemm: gemm, dot2: k.dot2, scr: b.scratch}
	if np < 4 {
		// Nothing to reuse across tokens: long runs of consecutive rows
		// stream from memory fastest (the hardware prefetchers follow one
		// sequential stream per core), shrinking towards the end so the
		// workers finish together; whole groups of 4 rows for the
		// four-row kernels.
		err = b.pool.parallelGuided(&b.mm, w.Rows, 4)
	} else {
		c := rowChunk(w.Rows, rb, b.threads)
		if gemm != nil && c > 4 {
			c &^= 3 // whole tiles of four rows
		}
		err = b.pool.parallel(&b.mm, w.Rows, c)
	}
	b.mm = matmulTask{}
	if err != nil {
		return opFault("matmul", w, err)
	}
	return nil
}

// quantize puts n rows of cols activations into the backend's activation
// buffer in the form kind a kernel reads (quantized in parallel, one row a
// work item), and returns it: the nx rows of x, then n−nx zero rows of
// padding (padRows); pack also packs Q8_0 rows for the tile kernels.
func (b *Backend) quantize(kind actKind, n, nx, cols int, x []float32, pack bool) (*actBuf, error) {
	a := &b.act
	a.pack = pack
	a.prepare(kind, n, cols, x)
	if kind != actF32 {
		b.qt = quantTask{a: a, x: x, n: nx, cols: cols}
		if err := b.pool.parallel(&b.qt, n, 1); err != nil {
			return nil, opFault("matmul: quantizing activations", nil, err)
		}
	}
	return a, nil
}

// padRows is how many activation rows a MatMul of n rows computes: with
// kernels that take four (or eight) tokens at a time, n rounded up to a
// multiple of four where it leaves three rows over (3, 7, 11, 15), the
// rows added being zeros whose results are dropped. Three rows over would
// cost a two-token pass and a one-row pass over the weights (or three
// one-row passes); one padded four-token pass costs less. One row over
// stays cheaper alone (measured on a Zen 4 core: a one-row kernel reaches
// ~60 % of a four-token kernel's rate per row), and two rows over take a
// two-token kernel where the type has one (Q4_K). Every real row keeps the arithmetic it has alone (the
// multi-token kernels are exact), so batch invariance holds.
func padRows(n int, multi bool) int {
	if !multi || n%4 != 3 {
		return n
	}
	return n + 1
}

// rowChunk picks how many weight rows one work item of a multi-token
// MatMul covers: a tile of about 16 KiB of weights (it stays in L1/L2
// while the activation rows pass over it), but small enough that every
// worker gets several items.
func rowChunk(rows, rb, threads int) int {
	c := max(1, (16<<10)/max(rb, 1))
	c = min(c, max(1, rows/(4*threads)))
	return c
}

var _ kernels.SharedInputMatMuler = (*Backend)(nil)

// MatMuls implements kernels.SharedInputMatMuler: several weights times the
// same activation rows (a layer's Q, K and V; its gate and up). For a
// decode step (n < 4, less the three rows MatMul pads to four) whose weights take the same activation form and
// width, x is quantized once and the rows of every weight are shared out
// in one parallel loop: one hand-off to the workers instead of one per
// weight, which on a small model is a good part of a token's time. Each
// row is computed by the same kernel as MatMul computes it, so the results
// are MatMul's bit for bit. Otherwise it is one MatMul per weight.
func (b *Backend) MatMuls(dsts []kernels.Tensor, ws []*kernels.Weight, x kernels.Tensor, n int) (err error) {
	if len(dsts) != len(ws) || len(ws) == 0 {
		return fmt.Errorf("cpu: matmuls: %d outputs for %d weights", len(dsts), len(ws))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	defer recoverFault(&err, debug.SetPanicOnFault(true), "matmuls", ws[0])
	if padRows(n, multiToken(ws, fastKernels)) >= 4 || len(ws) > len(b.mms) || !sharedInput(ws, fastKernels) {
		for i := range ws {
			if err := b.matmul(dsts[i], ws[i], x, n, fastKernels); err != nil {
				return err
			}
		}
		return nil
	}
	k := fastKernels[ws[0].Type]
	if n <= 0 {
		return fmt.Errorf("cpu: matmuls: n = %d rows", n)
	}
	if err := checkTensor("matmuls: x", x, n*ws[0].Cols); err != nil {
		return err
	}
	total := 0
	for i, w := range ws {
		kw := fastKernels[w.Type]
		rb, err := rowBytes(w)
		if err != nil {
			return fmt.Errorf("cpu: matmuls: %w", err)
		}
		if err := checkTensor("matmuls: dst", dsts[i], n*w.Rows); err != nil {
			return err
		}
		b.mms[i] = matmulTask{dst: dsts[i].Host, w: w.Host, rb: rb, rows: w.Rows, n: n, act: &b.act, dot: kw.dot, dotR4: kw.dotR4, dot2: kw.dot2, scr: b.scratch}
		b.multi.off[i] = total
		total += w.Rows
	}
	if _, err := b.quantize(k.act, n, n, ws[0].Cols, x.Host, false); err != nil {
		return err
	}
	b.multi.tasks, b.multi.k = b.mms[:len(ws)], len(ws)
	b.multi.off[len(ws)] = total
	err = b.pool.parallelGuided(&b.multi, total, 4)
	for i := range b.mms {
		b.mms[i] = matmulTask{}
	}
	b.multi = multiTask{}
	if err != nil {
		return opFault("matmuls", ws[0], err)
	}
	return nil
}

// padsRows reports whether MatMul pads a batch of three rows over to
// four for k (padRows): a type with exact four-token kernels whose one-row
// decode kernel is the plain one. Q8_0 is left out: its four-row decode
// kernel (dotR4) streams the weights well enough that three one-row passes
// beat a padded tile on bench86m (rows3 in BenchmarkLlama86M).
func padsRows(k kernel) bool {
	return !k.inexact4 && k.dot4 != nil && k.gemm == nil
}

// multiToken reports whether MatMul pads rows (padsRows) for every weight
// of ws.
func multiToken(ws []*kernels.Weight, table map[gguf.Type]kernel) bool {
	for _, w := range ws {
		if w == nil {
			return false
		}
		k, ok := table[w.Type]
		if !ok || !padsRows(k) {
			return false
		}
	}
	return true
}

// sharedInput reports whether ws can share one quantized activation: every
// weight supported, of one activation form and one width.
func sharedInput(ws []*kernels.Weight, table map[gguf.Type]kernel) bool {
	for _, w := range ws {
		if w == nil {
			return false
		}
	}
	k0, ok := table[ws[0].Type]
	if !ok {
		return false
	}
	for _, w := range ws {
		k, ok := table[w.Type]
		if !ok || k.act != k0.act || w.Cols != ws[0].Cols {
			return false
		}
	}
	return true
}

// multiTask is one parallel loop over the rows of several weights laid end
// to end: rows [off[i], off[i+1]) are weight i's.
type multiTask struct {
	tasks []matmulTask
	k     int
	off   [maxMulti + 1]int
}

// maxMulti is the most weights one MatMuls shares a loop between: a
// mixture of experts' decode step multiplies its input by 2 per chosen
// expert (Qwen3-MoE: 8 experts' gate and up).
const maxMulti = 16

func (t *multiTask) run(w, lo, hi int) {
	for i := range t.k {
		a, b := max(lo, t.off[i]), min(hi, t.off[i+1])
		if a < b {
			t.tasks[i].run(w, a-t.off[i], b-t.off[i])
		}
	}
}
