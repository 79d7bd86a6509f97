package gpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/conformance"
	"github.com/forge-llm/forge/kernels/cpu"
)

// TestMoEOpsMatchComposition: on the device, one token's mixture routed
// and run by the ExpertRouter ops gives what the host path composes from
// MatMul, Scale and Add, bit for bit: RouteTopK's ids and weights are the
// host router's (routeRef), ExpertMatMuls' rows each expert's MatMul
// (gate and up in one launch on the shared input, down on one input row
// per slot, the rows quantized together as SiLUMul leaves them), MixSlots
// the Scale/Add sum; GatherRows and MixRows are the CPU backend's. Each
// for experts of Q4_K, Q6_K, Q8_0 (8-bit blocks and the float kernel) and
// F32, 128 experts, k = 1…8.
func TestMoEOpsMatchComposition(t *testing.T) {
	b := gpuBackend(t, false)
	rng := rand.New(rand.NewPCG(rand.Uint64(), 21))
	const E = 128
	for _, c := range []struct {
		typ        gguf.Type
		rows, cols int // gate/up: rows×cols; down: cols×rows
	}{{gguf.TypeQ4_K, 768, 2048}, {gguf.TypeQ6_K, 512, 1024}, {gguf.TypeQ8_0, 768, 2048}, {gguf.TypeF32, 64, 96}} {
		for _, k := range []int{1, 3, 8} {
			t.Run(fmt.Sprintf("%s/k%d", c.typ, k), func(t *testing.T) {
				moeOpsCase(t, b, rng, c.typ, E, c.rows, c.cols, k)
			})
		}
	}
}

func moeOpsCase(t *testing.T, b *Backend, rng *rand.Rand, typ gguf.Type, E, F, D, k int) {
	alloc := func(n int) kernels.Tensor {
		x, err := b.Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Free(x) })
		return x
	}
	var kinds [3][]*kernels.Weight // gate, up [F][D]; down [D][F]
	for i := range kinds {
		for range E {
			r, cl := F, D
			if i == 2 {
				r, cl = D, F
			}
			w := conformance.RandomWeight(rng, "w", typ, r, cl)
			kinds[i] = append(kinds[i], w)
			t.Cleanup(func() { b.FreeWeight(w) })
		}
	}
	var tabs [3]kernels.ExpertTable
	for i := range tabs {
		tab, err := b.NewExpertTable(kinds[i])
		if err != nil {
			t.Fatal(err)
		}
		tabs[i] = tab
		t.Cleanup(func() { b.FreeExpertTable(tab) })
	}
	logits := randVec(rng, E, 2)
	lt, ids, wts := upload(t, b, logits), alloc(k), alloc(k)
	if err := b.RouteTopK(ids, wts, lt, 1, E, k, kernels.RouteSoftmax); err != nil {
		t.Fatal(err)
	}
	sel, w := routeRef(logits, 1, E, k, kernels.RouteSoftmax)
	gotIDs, gotW := download(t, b, ids), download(t, b, wts)
	for j := range sel {
		if kernels.IDOf(gotIDs[j]) != sel[j] || math.Float32bits(gotW[j]) != math.Float32bits(w[j]) {
			t.Fatalf("route: slot %d: expert %d weight %v, host %d %v", j, kernels.IDOf(gotIDs[j]), gotW[j], sel[j], w[j])
		}
	}
	x := upload(t, b, randVec(rng, D, 1))
	gate, up, hb, out, dst := alloc(k*F), alloc(k*F), alloc(k*F), alloc(k*D), alloc(D)
	if err := b.ExpertMatMuls([]kernels.Tensor{gate, up}, []kernels.ExpertTable{tabs[0], tabs[1]}, ids, x, k, true); err != nil {
		t.Fatal(err)
	}
	if err := b.SiLUMul(hb, gate, up, k*F); err != nil {
		t.Fatal(err)
	}
	if err := b.ExpertMatMuls([]kernels.Tensor{out}, []kernels.ExpertTable{tabs[2]}, ids, hb, k, false); err != nil {
		t.Fatal(err)
	}
	if err := b.MixSlots(dst, out, wts, 1, k, D); err != nil {
		t.Fatal(err)
	}
	// the composition, expert by expert
	rg, ru, rh, ro, rd := alloc(F), alloc(F), alloc(F), alloc(k*D), alloc(D)
	for j, e := range sel {
		if err := b.MatMul(rg, kinds[0][e], x, 1); err != nil {
			t.Fatal(err)
		}
		if err := b.MatMul(ru, kinds[1][e], x, 1); err != nil {
			t.Fatal(err)
		}
		same(t, fmt.Sprintf("gate of slot %d", j), download(t, b, gate)[j*F:(j+1)*F], download(t, b, rg))
		same(t, fmt.Sprintf("up of slot %d", j), download(t, b, up)[j*F:(j+1)*F], download(t, b, ru))
		if err := b.SiLUMul(rh, rg, ru, F); err != nil {
			t.Fatal(err)
		}
		o := ro.View(j*D, D)
		if err := b.MatMul(o, kinds[2][e], rh, 1); err != nil {
			t.Fatal(err)
		}
		same(t, fmt.Sprintf("down of slot %d", j), download(t, b, out)[j*D:(j+1)*D], download(t, b, o))
		if j == 0 {
			if err := b.Scale(rd, o, w[0], D); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := b.Scale(o, o, w[j], D); err != nil {
			t.Fatal(err)
		}
		if err := b.Add(rd, rd, o, D); err != nil {
			t.Fatal(err)
		}
	}
	same(t, "weighted sum", download(t, b, dst), download(t, b, rd))
	moeQ8Case(t, b, rng, tabs, ids, x, k, F, D, alloc)
	// the prompt ops against the CPU backend's
	const n = 5
	src := randVec(rng, n*k*D, 1)
	rows := make([]int32, n*k)
	ws := make([]float32, n*k)
	for i := range rows {
		rows[i], ws[i] = int32(rng.IntN(n*k)), float32(rng.Float64())
	}
	st, g, m := upload(t, b, src), alloc(n*k*D), alloc(n*D)
	if err := b.GatherRows(g, st, rows, D); err != nil {
		t.Fatal(err)
	}
	if err := b.MixRows(m, st, rows, ws, n, k, D); err != nil {
		t.Fatal(err)
	}
	cpuRef(t, func(c *cpu.Backend) {
		cs := cpuTensor(t, c, src)
		cg, _ := c.Alloc(n * k * D)
		cm, _ := c.Alloc(n * D)
		if err := c.GatherRows(cg, cs, rows, D); err != nil {
			t.Fatal(err)
		}
		if err := c.MixRows(cm, cs, rows, ws, n, k, D); err != nil {
			t.Fatal(err)
		}
		same(t, "gather rows", download(t, b, g), cpuRead(t, c, cg))
		same(t, "mix rows", download(t, b, m), cpuRead(t, c, cm))
	})
}

// moeQ8Case: ExpertMatMulsQ8 on the 8-bit copies RMSNormQ8 (gate and up,
// one shared row) and SiLUMulQ8 (down, k rows) made gives ExpertMatMuls'
// bits on the same rows, which quantizes them itself.
func moeQ8Case(t *testing.T, b *Backend, rng *rand.Rand, tabs [3]kernels.ExpertTable, ids, x kernels.Tensor, k, F, D int, alloc func(int) kernels.Tensor) {
	t.Helper()
	q8 := func(rows, cols int) kernels.Q8 {
		q, err := kernels.Q8In(alloc(kernels.Q8Floats(rows, cols)), rows, cols)
		if err != nil {
			t.Fatal(err)
		}
		return q
	}
	nw := conformance.F32Weight("norm", randVec(rng, D, 1))
	t.Cleanup(func() { b.FreeWeight(nw) })
	xn := alloc(D)
	xq, err := b.RMSNormQ8(xn, x, nw, 1, 1e-6, q8(1, D))
	if err != nil {
		t.Fatal(err)
	}
	if xq.Empty() {
		t.Fatalf("RMSNormQ8 of one row of %d made no copy", D)
	}
	g1, u1, g2, u2 := alloc(k*F), alloc(k*F), alloc(k*F), alloc(k*F)
	if err := b.ExpertMatMuls([]kernels.Tensor{g1, u1}, []kernels.ExpertTable{tabs[0], tabs[1]}, ids, xn, k, true); err != nil {
		t.Fatal(err)
	}
	if err := b.ExpertMatMulsQ8([]kernels.Tensor{g2, u2}, []kernels.ExpertTable{tabs[0], tabs[1]}, ids, xn, xq, k, true); err != nil {
		t.Fatal(err)
	}
	same(t, "gate on the norm's 8-bit copy", download(t, b, g2), download(t, b, g1))
	same(t, "up on the norm's 8-bit copy", download(t, b, u2), download(t, b, u1))
	hb := alloc(k * F)
	hq, err := b.SiLUMulQ8(hb, g1, u1, k*F, q8(k, F))
	if err != nil {
		t.Fatal(err)
	}
	if hq.Empty() {
		t.Fatalf("SiLUMulQ8 of %d×%d made no copy", k, F)
	}
	o1, o2 := alloc(k*D), alloc(k*D)
	if err := b.ExpertMatMuls([]kernels.Tensor{o1}, []kernels.ExpertTable{tabs[2]}, ids, hb, k, false); err != nil {
		t.Fatal(err)
	}
	if err := b.ExpertMatMulsQ8([]kernels.Tensor{o2}, []kernels.ExpertTable{tabs[2]}, ids, hb, hq, k, false); err != nil {
		t.Fatal(err)
	}
	same(t, "down on SiLUMul's 8-bit copy", download(t, b, o2), download(t, b, o1))
	if tabs[2].(*expertTable).plan.Q8 { // a product on 8-bit x refuses a copy of another shape
		if err := b.ExpertMatMulsQ8([]kernels.Tensor{o2}, []kernels.ExpertTable{tabs[2]}, ids, hb, xq, k, false); err == nil {
			t.Error("ExpertMatMulsQ8 took a copy of the wrong shape")
		}
	}
}

func same(t *testing.T, what string, got, want []float32) {
	t.Helper()
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s: value %d is %v, want %v", what, i, got[i], want[i])
		}
	}
}

// TestEvenSpacing: the addresses of a stacked tensor's experts are found
// evenly spaced (the table is then filled on the device); any other
// spacing, a stride an int cannot hold or a single expert is not.
func TestEvenSpacing(t *testing.T) {
	put := func(ps ...uint64) []byte {
		raw := make([]byte, 8*len(ps))
		for i, p := range ps {
			binary.LittleEndian.PutUint64(raw[8*i:], p)
		}
		return raw
	}
	for _, c := range []struct {
		raw          []byte
		base, stride uint64
		ok           bool
	}{
		{put(0x1000, 0x1800, 0x2000, 0x2800), 0x1000, 0x800, true},
		{put(0x7f0000000000, 0x7f0000d2f000), 0x7f0000000000, 0xd2f000, true},
		{put(0x1000, 0x1800, 0x2100), 0, 0, false},
		{put(0x2000, 0x1000, 0x0), 0, 0, false},
		{put(0x1000, 0x1000), 0, 0, false},
		{put(0, 1<<31, 1<<32), 0, 0, false},
		{put(0x1000), 0, 0, false},
	} {
		base, stride, ok := evenSpacing(c.raw)
		if ok != c.ok || (ok && (base != c.base || uint64(stride) != c.stride)) {
			t.Errorf("evenSpacing(%x) = %#x, %#x, %v; want %#x, %#x, %v", c.raw, base, stride, ok, c.base, c.stride, c.ok)
		}
	}
}
