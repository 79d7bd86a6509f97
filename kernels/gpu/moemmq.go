package gpu

// A prompt's expert products grouped (kernels.ExpertGrouper, cu/moemmq.cu):
// every expert's rows of one kind of matrix in one launch of the mmq
// arithmetic, each expert's matrix taken from the decode path's tables of
// device addresses (NewExpertTable).

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/rocm"
)

var _ kernels.ExpertGrouper = (*Backend)(nil)

// moeGroupTile is the rows of x of one block of the grouped kernels (their
// NT = 2).
const moeGroupTile = 16

// moeGroups is the last start array GroupedMatMuls uploaded, with its tile
// list, and where: the products of a layer after the first find their
// groups on the device already.
type moeGroups struct {
	p     rocm.DevPtr
	start []int32
	tiles int
}

// GroupsFit implements kernels.ExpertGrouper: the mmq kernels' conditions
// (mmqFits: CUDA sm_80 on, 32-lane warps, mmq not turned off) for a table
// of Q4_K or Q6_K matrices that the decode tables multiply on 8-bit x
// (16-byte aligned: plan moe_mv_q4_k / moe_mv_q6_k).
func (b *Backend) GroupsFit(t kernels.ExpertTable) bool {
	et, ok := t.(*expertTable)
	if !ok || et == nil || et.p == 0 || b.mmqOff || b.warp != 32 {
		return false
	}
	d := b.w.Device
	if d.Backend != rocm.CUDA || d.CCMajor < 8 {
		return false
	}
	if et.typ != gguf.TypeQ4_K && et.typ != gguf.TypeQ6_K || et.rows > 65535*16 || et.cols%256 != 0 {
		return false
	}
	kt, _ := kernelType(et.typ)
	return et.plan.Kernel == "moe_mv_"+kt
}

// GroupedMatMuls implements kernels.ExpertGrouper: x quantized once for
// all rows, then one launch of moemmq_{type} over every (expert, tile of
// 16 rows) the host lists and every tile of 16 weight rows, for both
// tables.
func (b *Backend) GroupedMatMuls(dsts []kernels.Tensor, tables []kernels.ExpertTable, x kernels.Tensor, start []int32) error {
	if len(tables) == 0 || len(tables) > 2 || len(dsts) != len(tables) || len(start) < 2 {
		return fmt.Errorf("gpu: grouped matmuls: %d outputs for %d tables (1 or 2), %d group bounds", len(dsts), len(tables), len(start))
	}
	var ts [2]*expertTable
	for i, t := range tables {
		et, ok := t.(*expertTable)
		if !ok || !b.GroupsFit(t) {
			return fmt.Errorf("gpu: grouped matmuls: table %d is not a live table of this backend that the grouped kernels fit", i)
		}
		if i > 0 && (et.typ != ts[0].typ || et.rows != ts[0].rows || et.cols != ts[0].cols) {
			return fmt.Errorf("gpu: grouped matmuls: the tables differ in type or shape")
		}
		ts[i] = et
	}
	t0 := ts[0]
	E := len(start) - 1
	if E > t0.n {
		return fmt.Errorf("gpu: grouped matmuls: %d groups for a table of %d experts", E, t0.n)
	}
	if start[0] != 0 {
		return fmt.Errorf("gpu: grouped matmuls: the first group starts at row %d, not 0", start[0])
	}
	for e := range E {
		if start[e+1] < start[e] {
			return fmt.Errorf("gpu: grouped matmuls: group %d ends (%d) before it starts (%d)", e, start[e+1], start[e])
		}
	}
	n := int(start[E])
	if n == 0 {
		return nil
	}
	if err := checkTensor("grouped matmuls: x", x, n*t0.cols); err != nil {
		return err
	}
	for i, d := range dsts {
		if err := checkTensor(fmt.Sprintf("grouped matmuls: dst %d", i), d, n*t0.rows); err != nil {
			return err
		}
	}
	var t1p, y1 rocm.DevPtr
	if ts[1] != nil {
		t1p, y1 = ts[1].p, dptr(dsts[1])
	}
	kt, _ := kernelType(t0.typ)
	threads := 128 // mmq's warps per super-block residue: 4 for Q4_K, 8 for Q6_K
	if t0.typ == gguf.TypeQ6_K {
		threads = 256
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.do(func(c *rocm.Ctx) error {
		g, err := b.moeGroupsOn(c, start)
		if err != nil {
			return err
		}
		xq, xd, err := b.quantizeX(c, dptr(x), n*t0.cols) // groups of 32 within a row, as each expert's MatMul
		if err != nil {
			return err
		}
		var a rocm.Args
		a.Ptr(t0.p).Ptr(t1p).Ptr(xq).Ptr(xd).Ptr(dptr(dsts[0])).Ptr(y1).Ptr(g.p).Ptr(g.p + rocm.DevPtr(4*len(start))).
			I32(int32(t0.rows)).I32(int32(t0.cols))
		grid := rocm.Dim3{X: uint32(g.tiles), Y: uint32(ceilDiv(t0.rows, 16)), Z: uint32(len(tables))}
		return b.launch(c, "moemmq_"+kt, grid, rocm.D1(threads), &a)
	})
}

// moeGroupTiles lists start's tiles: (expert, first row within it) for
// every moeGroupTile rows of each expert, appended to raw after start.
func moeGroupTiles(start []int32) (raw []byte, tiles int) {
	raw = make([]byte, 0, 4*len(start)+8*(int(start[len(start)-1])/moeGroupTile+len(start)))
	for _, s := range start {
		raw = binary.LittleEndian.AppendUint32(raw, uint32(s))
	}
	for e := range len(start) - 1 {
		for x0 := int32(0); x0 < start[e+1]-start[e]; x0 += moeGroupTile {
			raw = binary.LittleEndian.AppendUint32(raw, uint32(e))
			raw = binary.LittleEndian.AppendUint32(raw, uint32(x0))
			tiles++
		}
	}
	return raw, tiles
}

// moeGroupsOn returns start's groups on the device: the last upload where
// it had the same start, else a new one (upload: after the queued work).
// Call with b.mu held, on the worker.
func (b *Backend) moeGroupsOn(c *rocm.Ctx, start []int32) (moeGroups, error) {
	raw, tiles := moeGroupTiles(start)
	if g := b.groups; g.p != 0 && slices.Equal(g.start, start) {
		if d, ok := b.scratch["moe-groups"]; ok && d.ptr == g.p && d.size >= int64(len(raw)) {
			return g, nil
		}
	}
	p, err := b.upload(c, "moe-groups", raw)
	if err != nil {
		b.groups = moeGroups{}
		return moeGroups{}, err
	}
	b.groups = moeGroups{p: p, start: append(b.groups.start[:0], start...), tiles: tiles}
	return b.groups, nil
}
