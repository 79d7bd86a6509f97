package gpu

// Continuous batching on the GPU (kernels.Batcher): a paged KV pool, the
// per-row layout of a step in device buffers, RoPE at per-row positions,
// attention through block tables, and a MatMul whose rows up to
// kernels.MaxBatchRows come out bit for bit as they would alone.

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"

	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/rocm"
)

var _ kernels.Batcher = (*Backend)(nil)

// pagedSplit is attn.cu's PAGED_SPLIT: the positions one block of
// attn_paged covers.
const pagedSplit = 256

// pagedFine runs the attention of a decode group (one row per sequence,
// see fineLayout) through pagedfine.cu's attn_paged_fine (a row's
// positions in up to pagedFineSplits splits, by its own length) instead
// of attn_paged (splits of pagedSplit positions): a short decode row then
// spreads over many blocks per head, not one, and the grid no longer
// depends on the positions. Groups with several rows of a sequence (a
// prompt piece, merged pieces) keep attn_paged, whose part buffer grows
// with the positions in use rather than by pagedFineSplits per row. A
// decode row is always in a decode group, so which kernel a row gets never
// depends on the other rows of its step. Tests set pagedFine false to keep
// attn_paged throughout (bench/results/2026-11-25-serve-graph-h100.md
// measured both: 282 against 251 tokens/s for one client).
var pagedFine = true

// pagedFineSplits is pagedfine.cu's PF_SPLITS.
const pagedFineSplits = 16

// fineLayout reports whether the current layout's attention goes through
// attn_paged_fine: pagedFine, and one sequence (table) per row.
func fineLayout(ls *layoutState) bool {
	return pagedFine && len(ls.tabLen) == len(ls.pos)
}

// mxRows is how many activation rows one launch of the generic matvec
// kernel mv_{type} multiplies (its MV_MAXNX).
const mxRows = mvMaxN

// kvPool is a KVPool's storage: for each layer, keys then values, each
// [blocks·blockSize][kvDim] elements of esize bytes (as kvBuf, with a
// block's positions as consecutive rows).
type kvPool struct {
	base  rocm.DevPtr
	size  int64
	esize int
}

// NewKVPool allocates a zeroed pool (f16, or f32 with Options.KVF32).
func (b *Backend) NewKVPool(layers, blocks, blockSize, kvDim int) (*kernels.KVPool, error) {
	if layers <= 0 || blocks <= 0 || blockSize <= 0 || kvDim <= 0 {
		return nil, fmt.Errorf("gpu: kv pool %d layers × %d blocks × %d positions × %d", layers, blocks, blockSize, kvDim)
	}
	if int64(blocks)*int64(blockSize) > math.MaxInt32 {
		return nil, fmt.Errorf("gpu: kv pool of %d blocks × %d positions: the kernels index rows with 32 bits", blocks, blockSize)
	}
	es := 2
	if b.opts.KVF32 {
		es = 4
	}
	size := int64(layers) * 2 * int64(blocks) * int64(blockSize) * int64(kvDim) * int64(es)
	b.mu.Lock()
	defer b.mu.Unlock()
	var p rocm.DevPtr
	err := b.do(func(c *rocm.Ctx) error {
		var err error
		if p, err = c.Malloc(size); err != nil {
			return err
		}
		return c.MemsetD8Async(p, 0, int(size), b.stream)
	})
	if err != nil {
		return nil, fmt.Errorf("gpu: kv pool of %d bytes: %w", size, err)
	}
	return &kernels.KVPool{Layers: layers, Blocks: blocks, BlockSize: blockSize, KVDim: kvDim,
		Impl: &kvPool{base: p, size: size, esize: es}}, nil
}

// FreeKVPool releases a pool made by NewKVPool (after the work queued on
// it).
func (b *Backend) FreeKVPool(p *kernels.KVPool) {
	if p == nil {
		return
	}
	kp, ok := p.Impl.(*kvPool)
	if !ok || kp.base == 0 {
		return
	}
	b.freeAfterQueue("kv pool", kp.base, kp.size)
	kp.base = 0
	p.Impl = nil
}

// layoutState is the step layout on the device: one buffer of int32 with
// fixed regions, pos [rowCap], seq [rowCap], ids [rowCap] (the rows' token
// ids, for a recorded batched step's embedding; see stepbatch.go), the
// offset of each sequence's table in tabs [seqCap], tabs [tabCap]
// (the tables one after the other), then the pieces kernel's tiles
// [4·rowCap] (prefillTiles; copied only for a layout that runs it). Its address and regions change only
// when a layout outgrows them, so a later recorded step can replay with
// only the contents changing.
// Each SetLayout fills the least recently used of a ring of pinned
// staging buffers and queues one copy from it. Where the copy queued from
// that buffer last time is still pending (the host runs ahead of the
// device), a new buffer joins the ring, up to maxStaging; only then does
// the host wait for that copy (an event). A step of several groups sets a
// layout per group and layer: with two buffers the host waited for the
// device at every layer, and the device for the host's next launches.
type layoutState struct {
	dev                    rocm.DevPtr
	devSize                int64
	rowCap, seqCap, tabCap int
	stage                  []layoutStage // the ring, least recently used at next
	next                   int

	// The host's copy of the current layout, for the ops' checks.
	set      bool
	ids      bool // the ids region holds this layout's rows' token ids
	pos      []int32
	seq      []int32
	tabLen   []int32
	maxBlock int32
	tiles    []int32 // prefillTiles of the rows
	runs     int     // runs of rows (one sequence, consecutive positions)
}

// layoutStage is one pinned staging buffer and the event of the copy last
// queued from it.
type layoutStage struct {
	host *rocm.HostBuf
	ev   rocm.Event
	used bool // ev was recorded
}

// maxStaging bounds the staging ring: a step of two groups sets 2 layouts
// a layer, so the host may run up to 16 layers ahead.
const maxStaging = 32

func (l *layoutState) posPtr() rocm.DevPtr { return l.dev }
func (l *layoutState) seqPtr() rocm.DevPtr { return l.dev + rocm.DevPtr(4*l.rowCap) }
func (l *layoutState) idsPtr() rocm.DevPtr { return l.dev + rocm.DevPtr(4*2*l.rowCap) }
func (l *layoutState) toffPtr() rocm.DevPtr {
	return l.dev + rocm.DevPtr(4*3*l.rowCap)
}
func (l *layoutState) tabsPtr() rocm.DevPtr {
	return l.dev + rocm.DevPtr(4*(3*l.rowCap+l.seqCap))
}
func (l *layoutState) tilesOff() int { return 4 * (3*l.rowCap + l.seqCap + l.tabCap) }
func (l *layoutState) tilesPtr() rocm.DevPtr {
	return l.dev + rocm.DevPtr(l.tilesOff())
}

func pow2AtLeast(n, lo int) int {
	c := lo
	for c < n {
		c *= 2
	}
	return c
}

// SetLayout copies l to the device, in queue order: the RoPEAt and
// PagedAttention ops queued after it read it.
func (b *Backend) SetLayout(l *kernels.Layout) error {
	return b.setLayout(l, nil)
}

// setLayout is SetLayout, with the rows' token ids (one per row) copied
// along where ids is not nil.
func (b *Backend) setLayout(l *kernels.Layout, ids []int32) error {
	if l == nil || len(l.Pos) == 0 {
		return fmt.Errorf("gpu: set layout: no rows")
	}
	n := len(l.Pos)
	if ids != nil && len(ids) != n {
		return fmt.Errorf("gpu: set layout: %d token ids for %d rows", len(ids), n)
	}
	if len(l.Seq) != n {
		return fmt.Errorf("gpu: set layout: %d positions for %d sequence ids", n, len(l.Seq))
	}
	for i := range n {
		if l.Pos[i] < 0 {
			return fmt.Errorf("gpu: set layout: row %d at position %d", i, l.Pos[i])
		}
		if l.Seq[i] < 0 || int(l.Seq[i]) >= len(l.Tables) {
			return fmt.Errorf("gpu: set layout: row %d of sequence %d, but %d tables", i, l.Seq[i], len(l.Tables))
		}
	}
	total := 0
	maxBlock := int32(-1)
	for s, tab := range l.Tables {
		total += len(tab)
		for _, blk := range tab {
			if blk < 0 {
				return fmt.Errorf("gpu: set layout: sequence %d lists block %d", s, blk)
			}
			maxBlock = max(maxBlock, blk)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.step.capturing {
		return fmt.Errorf("gpu: set layout while capturing a decode step")
	}
	ls := &b.lay
	ls.tiles, ls.runs = prefillTiles(ls.tiles[:0], l.Pos, l.Seq)
	err := b.do(func(c *rocm.Ctx) error {
		if n > ls.rowCap || len(l.Tables) > ls.seqCap || total > ls.tabCap {
			if err := b.growLayout(c, n, len(l.Tables), total); err != nil {
				return err
			}
		}
		st, err := b.layoutStage(c)
		if err != nil {
			return err
		}
		buf := st.host.Bytes()
		put := func(i int, v int32) {
			buf[4*i], buf[4*i+1], buf[4*i+2], buf[4*i+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
		}
		for i := range n {
			put(i, l.Pos[i])
			put(ls.rowCap+i, l.Seq[i])
		}
		for i, id := range ids {
			put(2*ls.rowCap+i, id)
		}
		o := 0
		for s, tab := range l.Tables {
			put(3*ls.rowCap+s, int32(o))
			for j, blk := range tab {
				put(3*ls.rowCap+ls.seqCap+o+j, blk)
			}
			o += len(tab)
		}
		used := 4 * (3*ls.rowCap + ls.seqCap + total)
		if err := c.CopyHtoDAsync(ls.dev, st.host.Ptr, used, b.stream); err != nil {
			return fmt.Errorf("gpu: set layout: %w", err)
		}
		if piecesLayout(n, ls.runs) {
			to := ls.tilesOff()
			for i, v := range ls.tiles {
				put(to/4+i, v)
			}
			if err := c.CopyHtoDAsync(ls.tilesPtr(), st.host.Ptr+uintptr(to), 4*len(ls.tiles), b.stream); err != nil {
				return fmt.Errorf("gpu: set layout: tiles: %w", err)
			}
		}
		if err := c.Record(st.ev, b.stream); err != nil {
			return fmt.Errorf("gpu: set layout: %w", err)
		}
		st.used = true
		return nil
	})
	if err != nil {
		ls.set = false
		return err
	}
	ls.set, ls.ids = true, ids != nil
	ls.pos = append(ls.pos[:0], l.Pos...)
	ls.seq = append(ls.seq[:0], l.Seq...)
	ls.tabLen = ls.tabLen[:0]
	for _, tab := range l.Tables {
		ls.tabLen = append(ls.tabLen, int32(len(tab)))
	}
	ls.maxBlock = maxBlock
	return nil
}

// growLayout reallocates the layout buffers for at least rows rows, seqs
// sequences and tabs table entries (capacities in powers of two), after
// the work that may still read the old ones.
func (b *Backend) growLayout(c *rocm.Ctx, rows, seqs, tabs int) error {
	ls := &b.lay
	if err := c.SyncStream(b.stream); err != nil {
		return err
	}
	rowCap := pow2AtLeast(max(rows, ls.rowCap), kernels.MaxBatchRows)
	seqCap := pow2AtLeast(max(seqs, ls.seqCap), 64)
	tabCap := pow2AtLeast(max(tabs, ls.tabCap), 1024)
	ls.rowCap, ls.seqCap, ls.tabCap = 0, 0, 0 // until everything below is there
	if err := b.freeLayout(c); err != nil {
		return err
	}
	size := 4 * (3*rowCap + seqCap + tabCap + 4*rowCap)
	fail := func(err error) error {
		if ferr := b.freeLayout(c); ferr != nil {
			slog.Error("gpu: free layout buffers", "err", ferr)
		}
		return fmt.Errorf("gpu: layout buffers of %d bytes: %w", size, err)
	}
	p, err := c.Malloc(int64(size))
	if err != nil {
		return fail(err)
	}
	ls.dev, ls.devSize = p, int64(size)
	for range 2 {
		if err := b.addLayoutStage(c, 0, size); err != nil {
			return fail(err)
		}
	}
	ls.rowCap, ls.seqCap, ls.tabCap = rowCap, seqCap, tabCap
	return nil
}

// layoutStage returns the staging buffer the next layout fills: the least
// recently used, once the copy queued from it is done; a new one where
// that copy is still pending and the ring has room (the host is ahead).
func (b *Backend) layoutStage(c *rocm.Ctx) (*layoutStage, error) {
	ls := &b.lay
	k := ls.next
	if st := &ls.stage[k]; st.used {
		done, err := c.Query(st.ev)
		if err != nil {
			return nil, err
		}
		switch {
		case done:
		case len(ls.stage) < maxStaging:
			if err := b.addLayoutStage(c, k, st.host.Size); err != nil {
				return nil, err
			}
		default:
			if err := c.SyncEvent(st.ev); err != nil {
				return nil, err
			}
		}
	}
	ls.next = (k + 1) % len(ls.stage)
	return &ls.stage[k], nil
}

// addLayoutStage puts a new staging buffer of size bytes into the ring at
// k (before the least recently used, which stays next after it).
func (b *Backend) addLayoutStage(c *rocm.Ctx, k, size int) error {
	h, err := c.HostAlloc(size)
	if err != nil {
		return err
	}
	ev, err := c.NewEvent(false)
	if err != nil {
		return errors.Join(err, c.FreeHost(h))
	}
	ls := &b.lay
	ls.stage = slices.Insert(ls.stage, k, layoutStage{host: h, ev: ev})
	return nil
}

// freeLayout releases the layout buffers (the stream must be idle).
func (b *Backend) freeLayout(c *rocm.Ctx) error {
	ls := &b.lay
	var first error
	keep := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	if ls.dev != 0 {
		keep(c.Free(ls.dev, ls.devSize))
		ls.dev, ls.devSize = 0, 0
	}
	for _, st := range ls.stage {
		if st.host != nil {
			keep(c.FreeHost(st.host))
		}
		if st.ev != 0 {
			keep(c.DestroyEvent(st.ev))
		}
	}
	ls.stage, ls.next = nil, 0
	ls.set = false
	return first
}

// checkLayout checks that the current layout covers n rows.
func (b *Backend) checkLayout(op string, n int) error {
	if !b.lay.set {
		return fmt.Errorf("gpu: %s: no layout (SetLayout)", op)
	}
	if n > len(b.lay.pos) {
		return fmt.Errorf("gpu: %s: %d rows, but the layout has %d", op, n, len(b.lay.pos))
	}
	return nil
}

// RoPEAt rotates n rows of heads×headDim values in place, row i at
// position Layout.Pos[i] (the same arithmetic as RoPE).
func (b *Backend) RoPEAt(x kernels.Tensor, n, heads, headDim int, r kernels.Rope) error {
	if heads <= 0 {
		return fmt.Errorf("gpu: rope at: %d heads", heads)
	}
	dim, scale, neox, err := ropeArgs("rope at", "rope at: x", x, n, heads, headDim, r)
	if err != nil || n <= 0 {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.checkLayout("rope at", n); err != nil {
		return err
	}
	fp, err := b.ropeFreqs(r, dim)
	if err != nil {
		return err
	}
	return b.do(func(c *rocm.Ctx) error {
		var a rocm.Args
		a.Ptr(dptr(x)).I32(int32(n)).I32(int32(heads)).I32(int32(headDim)).Ptr(b.lay.posPtr()).I32(int32(dim)).
			F32(r.Base).F32(scale).Ptr(fp).I32(neox)
		return b.launch(c, "rope_at", grid1(n*heads*dim/2), rocm.D1(256), &a)
	})
}

// PagedAttention stores row i's key and value in the pool at position
// Pos[i] of sequence Seq[i], then computes causal grouped-query attention
// of each row over positions 0…Pos[i] of its own sequence: one block per
// (head, row, split of pagedSplit positions), then one per (head, row) to
// merge the splits. A row's result depends only on its sequence's keys,
// values and length (the split size is fixed), never on the other rows.
func (b *Backend) PagedAttention(out, q, k, v kernels.Tensor, p *kernels.KVPool, layer, n int, at kernels.Attn) error {
	if p == nil {
		return fmt.Errorf("gpu: paged attention: nil kv pool")
	}
	kp, ok := p.Impl.(*kvPool)
	if !ok || kp.base == 0 {
		return fmt.Errorf("gpu: paged attention: kv pool was not made by this backend (or was freed)")
	}
	if err := checkAttn("paged attention", "pool", at, p.KVDim, p.Layers, layer); err != nil {
		return err
	}
	kvDim := at.KVHeads * at.HeadDim
	qDim := at.Heads * at.HeadDim
	for _, c := range []struct {
		what string
		t    kernels.Tensor
		n    int
	}{{"q", q, n * qDim}, {"out", out, n * qDim}, {"k", k, n * kvDim}, {"v", v, n * kvDim}} {
		if err := checkTensor("paged attention: "+c.what, c.t, c.n); err != nil {
			return err
		}
	}
	if n <= 0 {
		return nil
	}
	if n > 65535 {
		return fmt.Errorf("gpu: paged attention: %d rows in one step (at most 65535)", n)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.checkLayout("paged attention", n); err != nil {
		return err
	}
	ls := &b.lay
	if int(ls.maxBlock) >= p.Blocks {
		return fmt.Errorf("gpu: paged attention: the layout lists block %d of a pool of %d", ls.maxBlock, p.Blocks)
	}
	maxPos := int32(0)
	for i := range n {
		s, pos := ls.seq[i], ls.pos[i]
		if int(pos)/p.BlockSize >= int(ls.tabLen[s]) {
			return fmt.Errorf("gpu: paged attention: row %d at position %d of sequence %d, whose table holds %d blocks of %d",
				i, pos, s, ls.tabLen[s], p.BlockSize)
		}
		maxPos = max(maxPos, pos)
	}
	pf, prefill := b.prefillKernel(n, at, kp.esize)
	zs := pf.splits
	fine := fineLayout(ls)
	if b.step.batch {
		prefill = false
		b.step.poolBase, b.step.poolBlocks, b.step.poolBS = kp.base, p.Blocks, p.BlockSize
		if !fine {
			// A recorded batched step: the grid has the graph's splits,
			// those past a row's end empty (adding exact zeros in the
			// merge).
			if need := ceilDiv(int(maxPos)+1, pagedSplit); need > b.step.splits {
				return fmt.Errorf("gpu: paged attention: row at position %d needs %d splits, the recorded step has %d", maxPos, need, b.step.splits)
			}
			maxPos = int32(b.step.splits*pagedSplit - 1)
		}
	}
	sfx := "f16"
	if kp.esize == 4 {
		sfx = "f32"
	}
	splits, attnL, mergeL := planPaged(sfx, at.Heads, n, int(maxPos))
	if fine {
		splits, attnL, mergeL = planPagedFine(sfx, at.Heads, n)
	}
	layerBytes := int64(p.Blocks) * int64(p.BlockSize) * int64(kvDim) * int64(kp.esize)
	kc := kp.base + rocm.DevPtr(int64(2*layer)*layerBytes)
	vc := kc + rocm.DevPtr(layerBytes)
	sp, err := b.sinkPtr("paged attention", at)
	if err != nil {
		return err
	}
	return b.do(func(c *rocm.Ctx) error {
		part, err := b.scratchBuf(c, "paged-part", int64(n)*int64(at.Heads)*int64(splits)*int64(at.HeadDim+2)*4)
		if err != nil {
			return err
		}
		var a rocm.Args
		a.Ptr(kc).Ptr(vc).Ptr(dptr(k)).Ptr(dptr(v)).I32(int32(n)).I32(int32(kvDim)).I32(int32(p.BlockSize)).
			Ptr(ls.posPtr()).Ptr(ls.seqPtr()).Ptr(ls.toffPtr()).Ptr(ls.tabsPtr())
		if err := b.launch(c, "kv_store_paged_"+sfx, grid1(n*kvDim), rocm.D1(256), &a); err != nil {
			return err
		}
		a.Reset()
		if prefill { // a prompt piece: tiles of rows read each chunk of the prefix once (prefill.cu)
			dst := dptr(out)
			if zs > 0 { // the split form writes the merge's parts
				pp, err := b.scratchBuf(c, "prefill-part", int64(n)*int64(at.Heads)*int64(zs)*int64(at.HeadDim+2)*4)
				if err != nil {
					return err
				}
				dst = pp
			}
			var l kLaunch
			if pf.tiles > 0 { // several pieces: a row of blocks per tile (prefillTiles)
				a.Ptr(dst).Ptr(dptr(q)).Ptr(kc).Ptr(vc).I32(int32(at.Heads)).I32(int32(at.KVHeads)).
					F32(at.Scale).I32(int32(p.BlockSize)).Ptr(ls.tilesPtr()).Ptr(ls.toffPtr()).Ptr(ls.tabsPtr()).
					I32(int32(at.Window)).Ptr(sp)
				l = planPrefillTiles(pf.name, at.Heads, pf.tiles, zs)
			} else {
				a.Ptr(dst).Ptr(dptr(q)).Ptr(kc).Ptr(vc).I32(int32(n)).I32(int32(at.Heads)).I32(int32(at.KVHeads)).
					F32(at.Scale).I32(int32(p.BlockSize)).I32(pf.pos0).I32(pf.seq).Ptr(ls.toffPtr()).Ptr(ls.tabsPtr()).
					I32(int32(at.Window)).Ptr(sp)
				l = planPrefill(pf.name, at.Heads, n, zs)
			}
			if err := b.launch(c, l.Kernel, l.Grid, l.Block, &a); err != nil || zs == 0 {
				return err
			}
			a.Reset()
			a.Ptr(dptr(out)).Ptr(dst).I32(int32(at.Heads)).I32(int32(at.HeadDim)).I32(int32(zs)).Ptr(sp) // the sinks join in the merge
			return b.launch(c, "attn_paged_merge", rocm.Dim3{X: uint32(at.Heads), Y: uint32(n), Z: 1}, rocm.D1(128), &a)
		}
		a.Ptr(part).Ptr(dptr(q)).Ptr(kc).Ptr(vc).I32(int32(at.Heads)).I32(int32(at.KVHeads)).I32(int32(at.HeadDim)).
			F32(at.Scale).I32(int32(p.BlockSize)).Ptr(ls.posPtr()).Ptr(ls.seqPtr()).Ptr(ls.toffPtr()).Ptr(ls.tabsPtr()).
			I32(int32(at.Window))
		if err := b.launch(c, attnL.Kernel, attnL.Grid, attnL.Block, &a); err != nil {
			return err
		}
		a.Reset()
		a.Ptr(dptr(out)).Ptr(part).I32(int32(at.Heads)).I32(int32(at.HeadDim)).I32(int32(splits)).Ptr(sp)
		return b.launch(c, mergeL.Kernel, mergeL.Grid, mergeL.Block, &a)
	})
}

// rowKernel is rowFamily (launch.go) for w at device address wp.
func (b *Backend) rowKernel(w *kernels.Weight, wp rocm.DevPtr) string {
	return rowFamily(b.warp, w.Type, w.Cols, uintptr(wp)%16 == 0, b.mvVariant)
}

// matvecRows queues dst [n][rows] = x [n][cols] · wᵀ for 2 ≤ n ≤
// kernels.MaxBatchRows through the tensor-core kernels (mmq.go) where they
// fit, else the multi-row matvec kernels planRows chooses, 8 or 16 rows per
// launch: each row bit for bit what MatMul gives it alone (see rowFamily),
// the weight read once per launch. The kernels on 8-bit x read q's copy
// (q8For).
func (b *Backend) matvecRows(c *rocm.Ctx, kt string, w *kernels.Weight, wp rocm.DevPtr, dst, x kernels.Tensor, n int, q *q8x) error {
	p, err := planRows(b.launchDevice(), w.Type, w.Rows, w.Cols, n, uintptr(wp)%16 == 0, b.mvVariant, b.mxVariant)
	if err != nil {
		return err
	}
	if p.Args == mvArgsGeneric { // every group of rows in one launch
		return b.mvGeneric(c, p.Kernel, w, wp, dptr(dst), dptr(x), n)
	}
	x8, err := b.q8For(c, dptr(x), n*w.Cols, q) // row by row as for one row: groups of 32 within a row
	if err != nil {
		return err
	}
	xq, xd := x8.codes, x8.scales
	if b.mmqUse(w, wp, n) {
		return b.mmqRows(c, kt, w, wp, xq, xd, dst, n)
	}
	for i0 := 0; i0 < n; i0 += p.Group {
		nx := min(p.Group, n-i0)
		var a rocm.Args
		a.Ptr(wp).Ptr(xq + rocm.DevPtr(i0*w.Cols)).Ptr(xd + rocm.DevPtr(4*i0*(w.Cols/32))).Ptr(off(dst, i0*w.Rows)).
			I32(int32(w.Rows)).I32(int32(w.Cols)).I32(int32(nx))
		if err := b.launch(c, p.Kernel, rocm.D1(p.Grid), rocm.D1(mvBlock), &a); err != nil {
			return err
		}
	}
	return nil
}

// batchRows is the most rows MatMul multiplies row-invariantly.
func (b *Backend) batchRows() int {
	if b.rowsMax > 0 {
		return b.rowsMax
	}
	return kernels.MaxBatchRows
}
