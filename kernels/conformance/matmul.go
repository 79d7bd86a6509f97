package conformance

import (
	"math"
	"strings"
	"testing"

	"github.com/forge-llm/forge/dequant"
	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
)

// mmShape is one MatMul case: a rows×cols weight (cols is ggml's ne0, the
// row length) times n activation rows.
type mmShape struct {
	rows, cols int
	ns         []int
	big        bool // real-model sizes: skipped with -short and under -race
}

// shapesFor lists the shapes tried for a type: small and odd ones (odd row
// counts, odd numbers of blocks) and the 86M model's rows for every type;
// for the types real models use at scale also the row shapes of Llama 2 7B
// / Llama 3 8B attention (4096×4096) and feed-forward (14336×4096,
// 4096×14336), and Llama 70B's feed-forward (28672×8192) for Q4_K and Q8_0.
// The big ones are left out with -short and under the race detector (which
// slows the float64 reference tenfold); a normal `go test` runs them all.
func shapesFor(t gguf.Type) []mmShape {
	bs := t.BlockSize()
	if bs == 1 {
		bs = 32
	}
	out := []mmShape{
		{1, bs, []int{1, 2}, false},
		{7, 3 * bs, []int{1, 3}, false},
		{33, 5 * bs, []int{1, 4, 17}, false},
		{257, 2 * bs, []int{1, 9}, false},
		{768, 768, []int{1, 5}, false},
		{2048, 768, []int{1}, false},
		{512, 768, []int{1, 7}, false}, // an LM head of 512 tokens
		{4096, 4096, []int{1, 2}, true},
	}
	switch t {
	case gguf.TypeQ4_0, gguf.TypeQ8_0, gguf.TypeQ4_K, gguf.TypeQ6_K, gguf.TypeF16:
		out = append(out, mmShape{14336, 4096, []int{1}, true}, mmShape{4096, 14336, []int{1, 3}, true})
	}
	if t == gguf.TypeQ4_K || t == gguf.TypeQ8_0 {
		out = append(out, mmShape{28672, 8192, []int{1}, true})
	}
	return out
}

func (s *suite) matMul(t *testing.T) {
	for _, typ := range MatMulTypes {
		t.Run(typ.String(), func(t *testing.T) {
			t.Parallel()
			b := s.newBackend(t)
			rng := s.rng(t)
			for _, sh := range shapesFor(typ) {
				if sh.big && (testing.Short() || raceEnabled) {
					t.Logf("%d×%d: left out with -short or -race", sh.rows, sh.cols)
					continue
				}
				w := RandomWeight(rng, "w", typ, sh.rows, sh.cols)
				load(t, b, w)
				for _, n := range sh.ns {
					// x is a view into a larger buffer, as the model's
					// activation slices are.
					xv := RandomVector(rng, n*sh.cols, 1)
					buf := alloc(t, b, n*sh.cols+13)
					if err := b.Write(buf, 5, xv); err != nil {
						t.Fatal(err)
					}
					x := buf.View(5, n*sh.cols)
					dst := alloc(t, b, n*sh.rows)
					if err := b.MatMul(dst, w, x, n); err != nil {
						t.Fatalf("%d×%d n=%d: %v", sh.rows, sh.cols, n, err)
					}
					want, scale, err := matMulRef(w, xv, n)
					if err != nil {
						t.Fatal(err)
					}
					e := checkScaled(t, name("%s %d×%d n=%d", typ, sh.rows, sh.cols, n), download(t, b, dst), want, scale, fewOutputs(MatMulBound(typ), n*sh.rows))
					t.Logf("%d×%d n=%d: relative error %.2e", sh.rows, sh.cols, n, e)
				}
				if l, ok := b.(WeightLoader); ok {
					l.FreeWeight(w)
				}
			}
		})
	}
}

// fewOutputs widens bound for a product of fewer than 8 outputs. The bound
// holds the RMS of the outputs' relative errors, which over many outputs
// is steady; over N < 8 it is the RMS of N draws of a heavy-tailed ratio
// (one dot product's 8-bit rounding of x, weighed by few large weights:
// an MXFP4 block's E2M1 values span 0.5…6 of one scale, and the 1×32
// shape's single output once measured 0.0211 against 0.02), so the bound
// grows as that RMS spreads, by √(8/N).
func fewOutputs(bound float64, outputs int) float64 {
	if outputs >= 8 {
		return bound
	}
	return bound * math.Sqrt(8/float64(outputs))
}

// matMulRef computes dst[i][r] = Σ_c w[r][c]·x[i][c] in float64 from the
// decoded weights, one row at a time. scale[i][r] = ‖w[r]‖·‖x[i]‖/√cols is
// the size such a dot product has for uncorrelated data; errors are
// measured against it (see checkScaled).
func matMulRef(w *kernels.Weight, x []float32, n int) (out, scale []float64, err error) {
	out = make([]float64, n*w.Rows)
	scale = make([]float64, n*w.Rows)
	tmp := make([]float32, w.Cols)
	row := make([]float64, w.Cols)
	xf := f64(x)
	xn := make([]float64, n)
	for i := range n {
		for _, v := range xf[i*w.Cols : (i+1)*w.Cols] {
			xn[i] += v * v
		}
	}
	for r := range w.Rows {
		if err := dequantRow(w, r, tmp, row); err != nil {
			return nil, nil, err
		}
		var wn float64
		for _, v := range row {
			wn += v * v
		}
		for i := range n {
			xi := xf[i*w.Cols : (i+1)*w.Cols]
			var d float64
			for c, v := range row {
				d += v * xi[c]
			}
			out[i*w.Rows+r] = d
			scale[i*w.Rows+r] = math.Sqrt(wn * xn[i] / float64(w.Cols))
		}
	}
	return out, scale, nil
}

// checkScaled compares MatMul outputs with errors measured against scale
// rather than the reference itself: a single dot product of random data can
// cancel to almost nothing, which would make its relative error meaningless
// noise. It fails t when the norm of the errors exceeds bound·‖scale‖, or
// any single output is off by more than 8·bound·scale (a broken block or
// row shows up there even in a large matrix).
func checkScaled(t *testing.T, what string, got []float32, want, scale []float64, bound float64) float64 {
	t.Helper()
	var num, den float64
	for i, w := range want {
		g := float64(got[i])
		d := g - w
		if math.IsNaN(d) || math.IsInf(d, 0) || math.Abs(d) > 8*bound*scale[i] {
			t.Errorf("%s: output %d = %g, want %g (error %.3g of its scale %.3g, limit %.3g)", what, i, g, w, d/scale[i], scale[i], 8*bound)
			return math.Inf(1)
		}
		num += d * d
		den += scale[i] * scale[i]
	}
	e := math.Sqrt(num / den)
	if !(e <= bound) {
		t.Errorf("%s: relative error %.3g > %.3g", what, e, bound)
	}
	return e
}

// embed looks up rows (repeated, first, last) of a table of every type; the
// rows must equal dequant's decoding to float32 rounding.
func (s *suite) embed(t *testing.T) {
	b := s.newBackend(t)
	rng := s.rng(t)
	for _, typ := range MatMulTypes {
		for _, sh := range [][2]int{{37, 256}, {512, 768}, {3, 4096}} {
			rows, cols := sh[0], sh[1]
			w := RandomWeight(rng, "token_embd", typ, rows, cols)
			load(t, b, w)
			ids := []int32{0, int32(rows - 1), int32(rng.IntN(rows)), 0, int32(rng.IntN(rows))}
			dst := alloc(t, b, len(ids)*cols)
			if err := b.Embed(dst, w, ids); err != nil {
				t.Fatalf("%s %d×%d: %v", typ, rows, cols, err)
			}
			want := make([]float64, len(ids)*cols)
			tmp := make([]float32, cols)
			for i, id := range ids {
				if err := dequantRow(w, int(id), tmp, want[i*cols:(i+1)*cols]); err != nil {
					t.Fatal(err)
				}
			}
			check(t, name("embed %s %d×%d", typ, rows, cols), download(t, b, dst), want, 1e-6)
		}
	}
}

// errors: bad inputs are refused with an error, never a panic or garbage.
func (s *suite) errors(t *testing.T) {
	b := s.newBackend(t)
	rng := s.rng(t)
	x := alloc(t, b, 4096)
	dst := alloc(t, b, 4096)

	// A type the backend does not multiply: the error names it.
	for _, typ := range []gguf.Type{gguf.TypeIQ2_XXS, gguf.TypeTQ1_0} {
		w := &kernels.Weight{Name: "odd", Type: typ, Rows: 2, Cols: 256, Host: make([]byte, 2*typ.BlockBytes())}
		err := b.MatMul(dst, w, x, 1)
		if err == nil || !strings.Contains(err.Error(), typ.String()) {
			t.Errorf("matmul with %s: error %v, want one naming the type", typ, err)
		}
		if dequant.Supported(typ) {
			continue // a backend may embed types dequant decodes
		}
		if err := b.Embed(dst, w, []int32{0}); err == nil || !strings.Contains(err.Error(), typ.String()) {
			t.Errorf("embed with %s: error %v, want one naming the type", typ, err)
		}
	}
	w := RandomWeight(rng, "w", gguf.TypeQ8_0, 8, 64)
	load(t, b, w)
	if err := b.MatMul(dst, w, x.View(0, 63), 1); err == nil {
		t.Errorf("matmul with a short x returned no error")
	}
	if err := b.MatMul(dst.View(0, 7), w, x, 1); err == nil {
		t.Errorf("matmul with a short dst returned no error")
	}
	short := *w
	short.Host = short.Host[:len(short.Host)-1]
	if err := b.MatMul(dst, &short, x, 1); err == nil {
		t.Errorf("matmul with truncated weight bytes returned no error")
	}
	if err := b.Embed(dst, w, []int32{8}); err == nil {
		t.Errorf("embed of id 8 in an 8-row table returned no error")
	}
	cache, err := b.NewKVCache(2, 4, 64)
	if err != nil {
		t.Fatal(err)
	}
	defer b.FreeKVCache(cache)
	a := kernels.Attn{Heads: 2, KVHeads: 1, HeadDim: 64, Scale: 0.125}
	if err := b.Attention(dst, x, x, x, cache, 0, 3, 2, a); err == nil {
		t.Errorf("attention past the end of the cache returned no error")
	}
	if err := b.Attention(dst, x, x, x, cache, 2, 0, 1, a); err == nil {
		t.Errorf("attention on layer 2 of a 2-layer cache returned no error")
	}
	bad := kernels.Attn{Heads: 3, KVHeads: 2, HeadDim: 32, Scale: 0.1}
	if err := b.Attention(dst, x, x, x, cache, 0, 0, 1, bad); err == nil {
		t.Errorf("attention with 3 heads over 2 kv heads returned no error")
	}
	if err := b.RoPE(x, 1, 2, 64, 0, kernels.Rope{Dim: 65, Base: 10000, Scale: 1}); err == nil {
		t.Errorf("rope with an odd rotated dimension returned no error")
	}
}
