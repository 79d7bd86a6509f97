package gpu

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/rocm"
)

// A mixture of experts' ops (kernels.RowMixer, kernels.ExpertRouter); the
// kernels are in cu/moe.cu.

var (
	_ kernels.RowMixer     = (*Backend)(nil)
	_ kernels.ExpertRouter = (*Backend)(nil)
)

// planMoeRows is the grid of gather_rows and mix_rows: 256-thread blocks
// over a row's cols values, one block row per row (grid-striding past
// 65535).
func planMoeRows(n, cols int) rocm.Dim3 {
	return rocm.Dim3{X: uint32(min(ceilDiv(max(cols, 1), 256), 65535)), Y: uint32(min(max(n, 1), 65535)), Z: 1}
}

// upload copies raw to the scratch buffer key in the stream's order (after
// the queued ops, one of which may still read the buffer; before the ops
// queued next). Call with b.mu held, on the worker; never while capturing.
func (b *Backend) upload(c *rocm.Ctx, key string, raw []byte) (rocm.DevPtr, error) {
	if b.step.capturing {
		return 0, fmt.Errorf("gpu: uploading %s while capturing a decode step", key)
	}
	p, err := b.scratchBuf(c, key, int64(len(raw)))
	if err != nil {
		return 0, err
	}
	return p, c.CopyHtoDStream(p, raw, b.stream)
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
		p, err := b.upload(c, "moe-mix", raw)
		if err != nil {
			return err
		}
		var a rocm.Args
		a.Ptr(dptr(dst)).Ptr(dptr(src)).Ptr(p).Ptr(p + rocm.DevPtr(4*n*k)).I32(int32(n)).I32(int32(k)).I32(int32(cols))
		return b.launch(c, "mix_rows", planMoeRows(n, cols), rocm.D1(256), &a)
	})
}

// MixSlots implements kernels.ExpertRouter: mix_rows over each of n
// tokens' k consecutive rows, the weights read on the device.
func (b *Backend) MixSlots(dst, src, w kernels.Tensor, n, k, cols int) error {
	if n <= 0 || k <= 0 || cols <= 0 {
		return fmt.Errorf("gpu: mix slots: %d tokens of %d slots of %d values", n, k, cols)
	}
	for _, c := range []struct {
		what string
		t    kernels.Tensor
		n    int
	}{{"dst", dst, n * cols}, {"src", src, n * k * cols}, {"w", w, n * k}} {
		if err := checkTensor("mix slots: "+c.what, c.t, c.n); err != nil {
			return err
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.do(func(c *rocm.Ctx) error {
		var a rocm.Args
		a.Ptr(dptr(dst)).Ptr(dptr(src)).Ptr(0).Ptr(dptr(w)).I32(int32(n)).I32(int32(k)).I32(int32(cols))
		return b.launch(c, "mix_rows", planMoeRows(n, cols), rocm.D1(256), &a)
	})
}

var _ kernels.MixNormer = (*Backend)(nil)

// MixAddRMSNormQ8 implements kernels.MixNormer: mix_add_rmsnorm_row, one
// block of rmsnorm_row's size, also filling q where rmsnorm_row would.
func (b *Backend) MixAddRMSNormQ8(dst, x, r, src, w kernels.Tensor, k int, nw *kernels.Weight, eps float32, q kernels.Q8) (kernels.Q8, error) {
	const op = "mix, add and rmsnorm"
	if nw == nil || k <= 0 {
		return kernels.Q8{}, fmt.Errorf("gpu: %s: %d slots, norm %v", op, k, nw)
	}
	cols := nw.Cols
	for _, c := range []struct {
		what string
		t    kernels.Tensor
		n    int
	}{{"dst", dst, cols}, {"x", x, cols}, {"r", r, cols}, {"src", src, k * cols}, {"w", w, k}} {
		if err := checkTensor(op+": "+c.what, c.t, c.n); err != nil {
			return kernels.Q8{}, err
		}
	}
	dq, err := devQ8(op, q, 1, cols)
	if err != nil {
		return kernels.Q8{}, err
	}
	l, fuse := planNorm(1, cols, true, !b.noFuse)
	if !fuse {
		dq, q = q8x{}, kernels.Q8{}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	wp, err := b.normWeight(op, nw, cols)
	if err != nil {
		return kernels.Q8{}, err
	}
	err = b.do(func(c *rocm.Ctx) error {
		var a rocm.Args
		a.Ptr(dptr(dst)).Ptr(dptr(x)).Ptr(dptr(r)).Ptr(dptr(src)).Ptr(dptr(w)).I32(int32(k)).Ptr(wp).I32(int32(cols)).F32(eps).
			Ptr(dq.codes).Ptr(dq.scales)
		return b.launch(c, "mix_add_rmsnorm_row", l.Grid, l.Block, &a)
	})
	if err != nil {
		return kernels.Q8{}, err
	}
	return q, nil
}

// AddExpertBias implements kernels.ExpertBiaser (moe_add_bias).
func (b *Backend) AddExpertBias(dst kernels.Tensor, table kernels.ExpertTable, ids kernels.Tensor, k, cols int) error {
	t, ok := table.(*expertTable)
	if !ok || t == nil {
		return fmt.Errorf("gpu: expert bias: not a table of this backend")
	}
	if t.typ != gguf.TypeF32 || t.rows*t.cols != cols || k <= 0 {
		return fmt.Errorf("gpu: expert bias: a table of %s %d×%d for %d slots of %d values", t.typ, t.rows, t.cols, k, cols)
	}
	for _, c := range []struct {
		what string
		t    kernels.Tensor
		n    int
	}{{"dst", dst, k * cols}, {"ids", ids, k}} {
		if err := checkTensor("expert bias: "+c.what, c.t, c.n); err != nil {
			return err
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.do(func(c *rocm.Ctx) error {
		var a rocm.Args
		a.Ptr(dptr(dst)).Ptr(t.p).Ptr(dptr(ids)).I32(int32(k)).I32(int32(cols))
		return b.launch(c, "moe_add_bias", rocm.Dim3{X: uint32(ceilDiv(cols, 256)), Y: uint32(k), Z: 1}, rocm.D1(256), &a)
	})
}

var _ kernels.ExpertBiaser = (*Backend)(nil)

// moeMaxExperts is moe.cu's MOE_MAXE.
const moeMaxExperts = 512

// RouteTopK implements kernels.ExpertRouter: one warp per token
// (moe_route).
func (b *Backend) RouteTopK(ids, w, logits kernels.Tensor, n, experts, k int, r kernels.Routing) error {
	if experts <= 0 || experts > moeMaxExperts || k <= 0 || k > experts || n <= 0 {
		return fmt.Errorf("gpu: route: top-%d of %d experts for %d tokens (at most %d experts)", k, experts, n, moeMaxExperts)
	}
	if r != kernels.RouteSoftmax && r != kernels.RouteTopKSoftmax {
		return fmt.Errorf("gpu: route: unknown rule %d", r)
	}
	for _, c := range []struct {
		what string
		t    kernels.Tensor
		n    int
	}{{"ids", ids, n * k}, {"w", w, n * k}, {"logits", logits, n * experts}} {
		if err := checkTensor("route: "+c.what, c.t, c.n); err != nil {
			return err
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.do(func(c *rocm.Ctx) error {
		var a rocm.Args
		a.Ptr(dptr(logits)).Ptr(dptr(ids)).Ptr(dptr(w)).I32(int32(experts)).I32(int32(k)).I32(int32(r))
		return b.launch(c, "moe_route", rocm.D1(n), rocm.D1(b.warp), &a)
	})
}

var _ kernels.RouterFuser = (*Backend)(nil)

// RouteFused implements kernels.RouterFuser for an F32 gate (the type
// llama.cpp keeps routers in): moe_router_f32, whose blocks compute the
// logits with the generic float kernel's grid and arithmetic and whose
// last block routes them.
func (b *Backend) RouteFused(ids, w, logits, x kernels.Tensor, gate, bias *kernels.Weight, k int, r kernels.Routing) (bool, error) {
	if gate == nil || gate.Type != gguf.TypeF32 {
		return false, nil
	}
	experts := gate.Rows
	if experts <= 0 || experts > moeMaxExperts || k <= 0 || k > experts {
		return false, fmt.Errorf("gpu: route: top-%d of %d experts (at most %d experts)", k, experts, moeMaxExperts)
	}
	if r != kernels.RouteSoftmax && r != kernels.RouteTopKSoftmax {
		return false, fmt.Errorf("gpu: route: unknown rule %d", r)
	}
	if bias != nil && (bias.Type != gguf.TypeF32 || bias.Cols != experts) {
		return false, nil
	}
	for _, c := range []struct {
		what string
		t    kernels.Tensor
		n    int
	}{{"ids", ids, k}, {"w", w, k}, {"logits", logits, experts}, {"x", x, gate.Cols}} {
		if err := checkTensor("route: "+c.what, c.t, c.n); err != nil {
			return false, err
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	gp, err := b.weightPtr(gate)
	if err != nil {
		return false, err
	}
	var bp rocm.DevPtr
	if bias != nil {
		if bp, err = b.normWeight("router bias", bias, experts); err != nil {
			return false, err
		}
	}
	l, err := planMatvec(b.launchDevice(), gguf.TypeF32, experts, gate.Cols, 1, false, false, mvOverrides{})
	if err != nil {
		return false, err
	}
	return true, b.do(func(c *rocm.Ctx) error {
		count, err := b.zeroedScratch(c, "router-count", 4)
		if err != nil {
			return err
		}
		var a rocm.Args
		a.Ptr(gp).Ptr(dptr(x)).Ptr(bp).Ptr(dptr(logits)).I32(int32(experts)).I32(int32(gate.Cols)).
			Ptr(dptr(ids)).Ptr(dptr(w)).I32(int32(k)).I32(int32(r)).Ptr(count).I32(b2i(b.tune.routeWide))
		return b.launch(c, "moe_router_f32", rocm.D1(l.Grid), rocm.D1(mvBlock), &a)
	})
}

// expertTable is the kernels.ExpertTable of this backend: the device
// array of every expert's matrix address, the matrices' type and shape,
// and the launch of their products.
type expertTable struct {
	p          rocm.DevPtr
	n          int
	typ        gguf.Type
	rows, cols int
	plan       moePlan
}

// moePlan is the experts' product for one kind of matrix: its kernel, the
// weight rows per warp, and whether x goes in as 8 bits (else floats).
type moePlan struct {
	Kernel string
	R      int
	Q8     bool
}

// planMoe chooses the expert product for matrices of type t and cols
// columns (aligned: they start 16-byte aligned on the device): the family
// planMatvec picks for one of them alone with no overrides, so each row
// is that MatMul's bit for bit.
func planMoe(warp int, t gguf.Type, cols int, aligned bool) (moePlan, error) {
	kt, ok := kernelType(t)
	if !ok {
		return moePlan{}, fmt.Errorf("gpu: expert product: type %s is not supported on the GPU", t)
	}
	switch {
	case (t == gguf.TypeQ4_K || t == gguf.TypeQ6_K) && aligned:
		r := 1
		if t == gguf.TypeQ6_K {
			r = 2
		}
		return moePlan{"moe_mv_" + kt, r, true}, nil
	case mxfp4Q8(t, ""):
		return moePlan{mxfp4Moe, mxfp4MoeR, true}, nil
	case b32Fits(warp, t, cols, aligned):
		return moePlan{"moe_mv_" + kt + "_b", 2, true}, nil
	case b32Staged(t, ""): // MatMul's staged family (b32any.go)
		return moePlan{"moe_mv_" + kt + "_m21", 2, true}, nil
	}
	return moePlan{"moe_mv_g_" + kt, 1, false}, nil
}

// NewExpertTable implements kernels.ExpertRouter. Every weight is made
// resident (uploaded if it is not) and must be of one type and shape, and
// all aligned alike (so one product family serves them all); the
// backend's test overrides of the matrix-vector kernels (which change
// MatMul's choice) refuse it.
func (b *Backend) NewExpertTable(ws []*kernels.Weight) (kernels.ExpertTable, error) {
	if len(ws) == 0 || ws[0] == nil {
		return nil, fmt.Errorf("gpu: expert table: no weights")
	}
	w0 := ws[0]
	if b.mvVariant != "" {
		return nil, fmt.Errorf("gpu: expert table %q: matrix-vector variant %q forced", w0.Name, b.mvVariant)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	raw := make([]byte, 8*len(ws))
	var plan moePlan
	for i, w := range ws {
		if w == nil || w.Type != w0.Type || w.Rows != w0.Rows || w.Cols != w0.Cols {
			return nil, fmt.Errorf("gpu: expert table %q: expert %d is not of its type and shape", w0.Name, i)
		}
		p, err := b.weightPtr(w)
		if err != nil {
			return nil, err
		}
		pl, err := planMoe(b.warp, w.Type, w.Cols, uintptr(p)%16 == 0)
		if err != nil {
			return nil, err
		}
		if i > 0 && pl != plan {
			return nil, fmt.Errorf("gpu: expert table %q: experts 0 and %d are aligned differently on the device", w0.Name, i)
		}
		plan = pl
		binary.LittleEndian.PutUint64(raw[8*i:], uint64(p))
	}
	t := &expertTable{n: len(ws), typ: w0.Type, rows: w0.Rows, cols: w0.Cols, plan: plan}
	base, stride, even := evenSpacing(raw)
	err := b.do(func(c *rocm.Ctx) error {
		p, err := c.Malloc(int64(len(raw)))
		if err != nil {
			return err
		}
		if even { // the experts of a stacked tensor: filled on the device, in stream order
			var a rocm.Args
			a.Ptr(p).Ptr(rocm.DevPtr(base)).I32(int32(stride)).I32(int32(len(ws)))
			err = b.launch(c, "moe_table", rocm.D1(ceilDiv(len(ws), 256)), rocm.D1(256), &a)
		} else {
			err = b.copyInWait(c, p, raw)
		}
		if err != nil {
			c.Free(p, int64(len(raw)))
			return err
		}
		t.p = p
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("gpu: expert table %q: %w", w0.Name, err)
	}
	return t, nil
}

// evenSpacing reports whether the addresses in raw (little-endian 64-bit)
// are base + i·stride with a stride a kernel's int argument holds: the
// experts of one stacked tensor, back to back, whose table moe_table
// fills on the device. Uploading a table instead waits for the stream
// (its source is Go memory), which during a prompt drained the queued
// work once per table, six tables a layer.
func evenSpacing(raw []byte) (base uint64, stride int64, ok bool) {
	n := len(raw) / 8
	if n < 2 {
		return 0, 0, false
	}
	base = binary.LittleEndian.Uint64(raw)
	stride = int64(binary.LittleEndian.Uint64(raw[8:]) - base)
	if stride <= 0 || stride > math.MaxInt32 {
		return 0, 0, false
	}
	for i := 2; i < n; i++ {
		if binary.LittleEndian.Uint64(raw[8*i:]) != base+uint64(i)*uint64(stride) {
			return 0, 0, false
		}
	}
	return base, stride, true
}

// FreeExpertTable implements kernels.ExpertRouter (after the queued work,
// which may still read it).
func (b *Backend) FreeExpertTable(t kernels.ExpertTable) {
	if et, ok := t.(*expertTable); ok && et != nil && et.p != 0 {
		b.freeAfterQueue("expert table", et.p, int64(8*et.n))
		et.p = 0
	}
}

// ExpertMatMuls implements kernels.ExpertRouter: one launch of the tables'
// product (planMoe) over every table (at most two, of one type, shape and
// kernel) and slot; on 8-bit x, x quantized once for all slots, each
// block of 32 alone, as a product of one row would (ExpertMatMulsQ8 takes
// the copy the op that wrote x made instead).
func (b *Backend) ExpertMatMuls(dsts []kernels.Tensor, tables []kernels.ExpertTable, ids, x kernels.Tensor, k int, shared bool) error {
	return b.expertMatMuls(dsts, tables, ids, x, kernels.Q8{}, k, shared)
}

var _ kernels.ExpertQ8MatMuler = (*Backend)(nil)

// ExpertMatMulsQ8 implements kernels.ExpertQ8MatMuler: ExpertMatMuls with
// x's 8-bit copy xq (one row when shared, else k, of the tables' width)
// made by the op that wrote x, so a product on 8-bit x does not quantize
// it again.
func (b *Backend) ExpertMatMulsQ8(dsts []kernels.Tensor, tables []kernels.ExpertTable, ids, x kernels.Tensor, xq kernels.Q8, k int, shared bool) error {
	return b.expertMatMuls(dsts, tables, ids, x, xq, k, shared)
}

func (b *Backend) expertMatMuls(dsts []kernels.Tensor, tables []kernels.ExpertTable, ids, x kernels.Tensor, xq kernels.Q8, k int, shared bool) error {
	if len(tables) == 0 || len(tables) > 2 || len(dsts) != len(tables) || k <= 0 {
		return fmt.Errorf("gpu: expert matmuls: %d outputs for %d tables (1 or 2) of %d slots", len(dsts), len(tables), k)
	}
	var ts [2]*expertTable
	for i, t := range tables {
		et, ok := t.(*expertTable)
		if !ok || et == nil || et.p == 0 {
			return fmt.Errorf("gpu: expert matmuls: table %d is not a live table of this backend", i)
		}
		if i > 0 && (et.typ != ts[0].typ || et.rows != ts[0].rows || et.cols != ts[0].cols) {
			return fmt.Errorf("gpu: expert matmuls: the tables differ in type or shape")
		}
		ts[i] = et
		if err := checkTensor("expert matmuls: dst", dsts[i], k*et.rows); err != nil {
			return err
		}
	}
	t0 := ts[0]
	xn, xstride := t0.cols, 0
	if !shared {
		xn, xstride = k*t0.cols, t0.cols
	}
	if err := checkTensor("expert matmuls: x", x, xn); err != nil {
		return err
	}
	if err := checkTensor("expert matmuls: ids", ids, k); err != nil {
		return err
	}
	pl := t0.plan
	var t1p, y1 rocm.DevPtr
	if ts[1] != nil {
		if ts[1].plan != pl {
			return fmt.Errorf("gpu: expert matmuls: the tables take different kernels")
		}
		t1p, y1 = ts[1].p, dptr(dsts[1])
	}
	var q8 q8x
	if !xq.Empty() && pl.Q8 {
		var err error
		rows, cols := k, t0.cols
		if shared {
			rows = 1
		}
		if q8, err = devQ8("expert matmuls", xq, rows, cols); err != nil {
			return err
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.do(func(c *rocm.Ctx) error {
		return b.queueExperts(c, t0, t1p, dptr(dsts[0]), y1, len(tables), dptr(ids), dptr(x), xn, k, xstride, q8)
	})
}

// queueExperts queues the expert products of tables t0 (and the one at
// t1p when tabs is 2) into y0 (and y1) for the k slots of ids: where the
// plan reads 8 bits, x [xn] quantized first unless q8 is its copy, then
// the plan's kernel. Call with b.mu held, on the worker (benchmarks call
// it directly).
func (b *Backend) queueExperts(c *rocm.Ctx, t0 *expertTable, t1p, y0, y1 rocm.DevPtr, tabs int, ids, x rocm.DevPtr, xn, k, xstride int, q8 q8x) error {
	pl := t0.plan
	var a rocm.Args
	a.Ptr(t0.p).Ptr(t1p).Ptr(y0).Ptr(y1).Ptr(ids)
	if pl.Q8 {
		made, err := b.q8For(c, x, xn, &q8)
		if err != nil {
			return err
		}
		a.Ptr(made.codes).Ptr(made.scales)
	} else {
		a.Ptr(x)
	}
	a.I32(int32(t0.rows)).I32(int32(t0.cols)).I32(int32(k)).I32(int32(xstride))
	grid := rocm.Dim3{X: uint32(ceilDiv(t0.rows, mvBlock/b.warp*pl.R)), Y: uint32(k * tabs), Z: 1}
	return b.launch(c, pl.Kernel, grid, rocm.D1(mvBlock), &a)
}

// b2i is a kernel's int flag.
func b2i(v bool) int32 {
	if v {
		return 1
	}
	return 0
}
