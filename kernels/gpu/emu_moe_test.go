package gpu

import (
	"fmt"
	"math"
	"testing"

	"github.com/forge-llm/forge/kernels/conformance"
	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/rocm"
)

// TestEmuMoeRows: moe.cu's gather_rows and mix_rows (rows from the host,
// and mix_rows over one token's slots with no row list, as MixSlots runs
// it), at both widths, against the CPU backend's GatherRows and MixRows,
// bit for bit: rows repeat and come in any order, k from 1 to 8.
func TestEmuMoeRows(t *testing.T) {
	rng := emuRNG(t)
	for _, ed := range emuDevices {
		warp := ed.dev.Warp
		for k := 1; k <= 8; k++ {
			const cols, srcRows = 300, 23 // cols past one block of 256
			n := 1 + rng.IntN(6)
			src := conformance.RandomVector(rng, srcRows*cols, 1)
			gather := make([]int32, 2*n+1)
			for i := range gather {
				gather[i] = int32(rng.IntN(srcRows))
			}
			rows := make([]int32, n*k)
			w := make([]float32, n*k)
			for i := range rows {
				rows[i] = int32(rng.IntN(srcRows))
				w[i] = float32(rng.Float64())
			}
			var job emuJob
			sb := job.f32(src)
			gd := job.zeros(4*len(gather)*cols, true)
			md := job.zeros(4*n*cols, true)
			sd := job.zeros(4*cols, true)
			job.launch("gather_rows", planMoeRows(len(gather), cols), rocm.D1(256), eP(gd, 0), eP(sb, 0), eP(job.i32(gather), 0),
				eI(len(gather)), eI(cols))
			job.launch("mix_rows", planMoeRows(n, cols), rocm.D1(256), eP(md, 0), eP(sb, 0), eP(job.i32(rows), 0),
				eP(job.f32(w), 0), eI(n), eI(k), eI(cols))
			job.launch("mix_rows", planMoeRows(1, cols), rocm.D1(256), eP(sd, 0), eP(sb, 0), eNull(), eP(job.f32(w[:k]), 0),
				eI(1), eI(k), eI(cols))
			res := runEmu(t, warp, &job)
			cpuRef(t, func(b *cpu.Backend) {
				st := cpuTensor(t, b, src)
				g, _ := b.Alloc(len(gather) * cols)
				if err := b.GatherRows(g, st, gather, cols); err != nil {
					t.Fatal(err)
				}
				emuSame(t, fmt.Sprintf("warp %d k %d: gather_rows", warp, k), res.f32(gd), cpuRead(t, b, g))
				m, _ := b.Alloc(n * cols)
				if err := b.MixRows(m, st, rows, w, n, k, cols); err != nil {
					t.Fatal(err)
				}
				emuSame(t, fmt.Sprintf("warp %d k %d: mix_rows", warp, k), res.f32(md), cpuRead(t, b, m))
				seq := make([]int32, k)
				for j := range seq {
					seq[j] = int32(j)
				}
				if err := b.MixRows(m, st, seq, w[:k], 1, k, cols); err != nil {
					t.Fatal(err)
				}
				emuSame(t, fmt.Sprintf("warp %d k %d: mix_rows of slots", warp, k), res.f32(sd), cpuRead(t, b, m.View(0, cols)))
			})
		}
	}
}

// emuSame fails unless got and want hold the same bits.
func emuSame(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) < len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s: value %d is %v, want %v", what, i, got[i], want[i])
		}
	}
}
