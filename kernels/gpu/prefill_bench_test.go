package gpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/forge-llm/forge/kernels"
)

// BenchmarkPrefillTurn times the paged attention of a conversation turn's
// prompt piece in the 8B shape (32 heads, 8 KV heads, D = 128, an f16 pool
// of 16-position blocks, as the serving engine makes it): 330 rows at
// position 0 (the turn's text alone) and at position 2000 (after a cached
// history of 2000 positions), through each of prefill.cu's kernels and the
// per-row kernel. Each launch is timed on the device between events
// (StartProfile); ms/attn is the attention kernels' time of one layer's
// call (the key/value store excluded), ms/32layers the same times 32.
//
//	gpu.test -test.run '^$' -test.bench PrefillTurn -test.benchtime 20x
func BenchmarkPrefillTurn(b *testing.B) {
	bk := gpuBackend(b, false)
	a := kernels.Attn{Heads: 32, KVHeads: 8, HeadDim: 128, Scale: float32(1 / math.Sqrt(128))}
	kvDim, qDim := a.KVHeads*a.HeadDim, a.Heads*a.HeadDim
	const bs, history, n = 16, 2000, 330
	perSeq := (history + n + bs - 1) / bs
	pool, err := bk.NewKVPool(1, 2*perSeq, bs, kvDim)
	if err != nil {
		b.Fatal(err)
	}
	defer bk.FreeKVPool(pool)
	rng := rand.New(rand.NewPCG(5, 6))
	tabs := [][]int32{make([]int32, perSeq), make([]int32, perSeq)}
	for i, p := range rng.Perm(2 * perSeq) {
		tabs[i/perSeq][i%perSeq] = int32(p)
	}
	// call runs one PagedAttention of rows [pos0, pos0+m) of sequence s.
	call := func(s, pos0, m int, out, q, k, v kernels.Tensor) {
		l := kernels.Layout{Tables: [][]int32{tabs[s]}} // a step lays out its own sequences only
		for i := range m {
			l.Pos = append(l.Pos, int32(pos0+i))
			l.Seq = append(l.Seq, 0)
		}
		if err := bk.SetLayout(&l); err != nil {
			b.Fatal(err)
		}
		if err := bk.PagedAttention(out, q, k, v, pool, 0, m, a); err != nil {
			b.Fatal(err)
		}
	}
	const piece = 500 // the history goes in as prompt pieces of this size
	hq, hk, hv := upload(b, bk, randVec(rng, piece*qDim, 1)), upload(b, bk, randVec(rng, piece*kvDim, 1)), upload(b, bk, randVec(rng, piece*kvDim, 1))
	hout, err := bk.Alloc(piece * qDim)
	if err != nil {
		b.Fatal(err)
	}
	for p := 0; p < history; p += piece {
		call(0, p, min(piece, history-p), hout, hq, hk, hv)
	}
	q, k, v := upload(b, bk, randVec(rng, n*qDim, 1)), upload(b, bk, randVec(rng, n*kvDim, 1)), upload(b, bk, randVec(rng, n*kvDim, 1))
	out, err := bk.Alloc(n * qDim)
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		for _, x := range []kernels.Tensor{hq, hk, hv, hout, q, k, v, out} {
			bk.Free(x)
		}
	}()
	defer func(m int) { prefillMode = m }(prefillMode)
	modes := []struct {
		name string
		mode int
	}{{"split", prefillAuto}, {"pipe", prefillWhole}, {"v1", prefillV1}, {"plain", prefillPlain}, {"per-row", prefillOff}}
	for _, md := range modes {
		for _, c := range []struct{ seq, pos0 int }{{1, 0}, {0, history}} {
			b.Run(fmt.Sprintf("%s/pos0=%d", md.name, c.pos0), func(b *testing.B) {
				prefillMode = md.mode
				call(c.seq, c.pos0, n, out, q, k, v) // warm: compiles and loads the kernel
				if err := bk.Sync(); err != nil {
					b.Fatal(err)
				}
				bk.StartProfile()
				for range b.N {
					call(c.seq, c.pos0, n, out, q, k, v)
				}
				prof, err := bk.StopProfile()
				if err != nil {
					b.Fatal(err)
				}
				var attn float64
				var names []string
				for _, kt := range prof {
					if strings.HasPrefix(kt.Name, "kv_store") {
						continue
					}
					attn += kt.Ms
					names = append(names, kt.Name)
				}
				per := attn / float64(b.N)
				b.ReportMetric(per, "ms/attn")
				b.ReportMetric(32*per, "ms/32layers")
				b.Logf("%s, %d rows at position %d: %.3f ms per call (%s)", md.name, n, c.pos0, per, strings.Join(names, ", "))
			})
		}
	}
}
