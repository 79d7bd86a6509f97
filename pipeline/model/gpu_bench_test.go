package model

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/gpu"
)

// llamaCppRef is llama.cpp's llama-bench on the same H100 (CUDA, flash
// attention), Q4_K_M, by model shape: the figures the issue asks forge to
// meet (decode ≥ 1.0×, prompt ≥ 0.8×).
type llamaCppRef struct {
	name   string
	tg, pp float64 // tg128, pp512 tokens/s
}

func refFor(c Config) (llamaCppRef, bool) {
	switch {
	case c.Embd == 4096 && c.FF == 14336 && c.Layers == 32:
		return llamaCppRef{"llama3-8b", 273, 9213}, true
	case c.Embd == 4096 && c.FF == 11008 && c.Layers == 32:
		return llamaCppRef{"llama2-7b", 277, 9631}, true
	}
	return llamaCppRef{}, false
}

// TestGPUDecodeBench measures, for each GGUF file in FORGE_BIG_MODEL
// (comma-separated), what llama-bench measures: pp512 (a 512-token prompt
// into an empty cache) and tg128 (128 single-token decode steps from
// position 0, greedy), as the median of several runs after a warm-up, with
// the decode step recorded and replayed (the default) and op by op. It
// prints the ratio to llama.cpp's figures for the shape and the decode's
// share of the bandwidth ceiling: the bytes one step reads (every weight
// but the embedding table, one row of which is read) times tokens/s over a
// device-to-device copy measured in the same process. Then it times the
// kernels of one decode step and of the prompt step (each launch between
// two events, so the sum is above the step's real time). A measurement,
// not a check: it asserts only that the runs work and that the replayed
// decode gives the op-by-op decode's ids.
func TestGPUDecodeBench(t *testing.T) {
	paths := os.Getenv("FORGE_BIG_MODEL")
	if paths == "" {
		t.Skip("set FORGE_BIG_MODEL to GGUF files (comma-separated) to measure decode and prompt rates on the GPU")
	}
	be := openGPU(t)
	copyGBs, err := be.CopyBandwidth()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("GPU-BENCH device-to-device copy: %.0f GB/s (read + written)", copyGBs)
	var summary []string
	for _, path := range strings.Split(paths, ",") {
		summary = append(summary, benchFile(t, be, path, copyGBs)...)
	}
	for _, s := range summary {
		t.Log(s)
	}
}

func benchFile(t *testing.T, be *gpu.Backend, path string, copyGBs float64) []string {
	_, cfg, fw := openWeights(t, path)
	// Upload everything first (the load pipeline is measured elsewhere),
	// counting what a decode step reads.
	var stepBytes, fileBytes int64
	ws := denseWeights(fw)
	start := time.Now()
	for _, w := range append(ws, fw.g.Embed) {
		if err := be.LoadWeight(w); err != nil {
			t.Fatal(err)
		}
		fileBytes += int64(len(w.Host))
	}
	for _, w := range ws {
		stepBytes += int64(len(w.Host))
	}
	stepBytes += int64(len(fw.g.Embed.Host) / fw.g.Embed.Rows) // one embedding row
	if fw.g.Output == fw.g.Embed {
		stepBytes += int64(len(fw.g.Embed.Host))
	}
	defer func() {
		for _, w := range append(ws, fw.g.Embed) {
			be.FreeWeight(w)
		}
	}()
	t.Logf("GPU-BENCH %s: %d layers, embd %d, ff %d, vocab %d; weights %.2f GiB uploaded in %v; a decode step reads %.3f GB",
		path, cfg.Layers, cfg.Embd, cfg.FF, cfg.Vocab, float64(fileBytes)/(1<<30), time.Since(start).Round(time.Millisecond), float64(stepBytes)/1e9)

	const ppN, tgN, runs = 512, 128, 5
	rng := rand.New(rand.NewPCG(1, 2))
	prompt := make([]int32, ppN)
	for i := range prompt {
		prompt[i] = int32(rng.IntN(cfg.Vocab))
	}
	ctx := context.Background()
	open := func(o Options) *Model {
		o.Ctx = 1024
		m, err := New(be, cfg, fw, o)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	median := func(v []float64) float64 { s := slices.Clone(v); slices.Sort(s); return s[len(s)/2] }

	// pp512: Forward of the whole prompt (its end waits for the logits).
	m := open(Options{})
	defer m.Close()
	var pp []float64
	for r := range runs + 1 {
		t0 := time.Now()
		if _, err := m.Forward(ctx, prompt, 0); err != nil {
			t.Fatal(err)
		}
		if r > 0 { // the first run warms cuBLAS and the scratch buffers
			pp = append(pp, ppN/time.Since(t0).Seconds())
		}
	}
	// tg128: 128 greedy steps from position 0.
	decode := func(m *Model) (rate float64, ids []int32) {
		t0 := time.Now()
		tok := int32(1)
		for pos := range tgN {
			next, err := m.Greedy(ctx, []int32{tok}, pos)
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, next)
			tok = next
		}
		return tgN / time.Since(t0).Seconds(), ids
	}
	var tg []float64
	var graphIDs []int32
	for r := range runs + 1 {
		rate, ids := decode(m)
		if r > 0 { // the first run records the step
			tg = append(tg, rate)
		}
		graphIDs = ids
	}
	if m.graph == nil {
		t.Errorf("%s: the decode step was not recorded", path)
	}
	me := open(Options{NoGraph: true})
	defer me.Close()
	var tgEager []float64
	var eagerIDs []int32
	for r := range 3 {
		rate, ids := decode(me)
		if r > 0 {
			tgEager = append(tgEager, rate)
		}
		eagerIDs = ids
	}
	if !slices.Equal(graphIDs, eagerIDs) {
		t.Errorf("%s: replayed decode ids differ from op-by-op ones\n graph %v\n  ops  %v", path, graphIDs, eagerIDs)
	}

	// Where the time goes: one op-by-op decode step at position 64, the
	// replayed step there, the prompt step, and a short prompt's (a chat
	// turn, issue 21's first token), whose wall time is logged too.
	profiled := func(what string, run func() error) {
		be.StartProfile()
		if err := run(); err != nil {
			t.Fatal(err)
		}
		prof, err := be.StopProfile()
		if err != nil {
			t.Fatal(err)
		}
		logProfile(t, what, prof)
	}
	profiled("decode step op by op (pos 64)", func() error {
		_, err := me.Greedy(ctx, []int32{1}, 64)
		return err
	})
	profiled("replayed decode step (pos 64-73)", func() error {
		for pos := 64; pos < 74; pos++ {
			if _, err := m.Greedy(ctx, []int32{1}, pos); err != nil {
				return err
			}
		}
		return nil
	})
	forward := func(tokens []int32) func() error {
		return func() error {
			_, err := me.Forward(ctx, tokens, 0)
			return err
		}
	}
	profiled("prompt step (512 tokens)", forward(prompt))
	short := prompt[:8]
	t0 := time.Now()
	for range 3 {
		if err := forward(short)(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("GPU-BENCH %s: 8-token prompt step %.2f ms (mean of 3, op by op)", path, float64(time.Since(t0).Microseconds())/3e3)
	profiled("prompt step (8 tokens)", forward(short))

	tgM, ppM, teM := median(tg), median(pp), median(tgEager)
	frac := float64(stepBytes) * tgM / (copyGBs * 1e9)
	line := fmt.Sprintf("GPU-BENCH %s: pp512 %.0f tok/s (runs %s); tg128 %.1f tok/s graph (runs %s), %.1f op by op; decode reads %.2f GB/step = %.0f GB/s = %.0f%% of the %.0f GB/s copy",
		path, ppM, rates(pp), tgM, rates(tg), teM, float64(stepBytes)/1e9, float64(stepBytes)*tgM/1e9, 100*frac, copyGBs)
	out := []string{line}
	if ref, ok := refFor(cfg); ok {
		out = append(out, fmt.Sprintf("GPU-BENCH %s vs llama.cpp (%s Q4_K_M, same H100): tg128 %.2f× of %.0f (goal ≥ 1.0, stretch 1.2), pp512 %.2f× of %.0f (goal ≥ 0.8)",
			path, ref.name, tgM/ref.tg, ref.tg, ppM/ref.pp, ref.pp))
	}
	for _, s := range out {
		t.Log(s)
	}
	return out
}

func rates(v []float64) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprintf("%.0f", x)
	}
	return strings.Join(s, " ")
}

func logProfile(t *testing.T, what string, prof []gpu.KernelTime) {
	total, n := 0.0, 0
	for _, k := range prof {
		total += k.Ms
		n += k.Launches
	}
	t.Logf("GPU-PROFILE %s: %d launches, %.3f ms of kernel time", what, n, total)
	for i, k := range prof {
		if i == 14 {
			break
		}
		t.Logf("GPU-PROFILE   %-22s %5d× %9.3f ms %5.1f%%", k.Name, k.Launches, k.Ms, 100*k.Ms/total)
	}
}

// denseWeights is a dense model's weights that a decode step reads: the
// output norm and head (unless tied to the embedding), then every layer's.
func denseWeights(fw *FileWeights) []*kernels.Weight {
	ws := []*kernels.Weight{fw.g.OutputNorm}
	if fw.g.Output != fw.g.Embed {
		ws = append(ws, fw.g.Output)
	}
	for i := range fw.layers {
		l := &fw.layers[i]
		for _, w := range []*kernels.Weight{l.AttnNorm, l.Q, l.K, l.V, l.QBias, l.KBias, l.VBias, l.O, l.FFNNorm, l.Gate, l.Up, l.Down} {
			if w != nil {
				ws = append(ws, w)
			}
		}
	}
	return ws
}

// uploadDense loads ws on be for the rest of the test.
func uploadDense(t *testing.T, be *gpu.Backend, ws []*kernels.Weight) {
	t.Helper()
	for _, w := range ws {
		if err := be.LoadWeight(w); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { be.FreeWeight(w) })
	}
}

// bigDenseModel opens the GPU and the first file of FORGE_BIG_MODEL with
// its dense weights uploaded, for a measurement that says what it does
// (the skip message) when the variable is unset.
func bigDenseModel(t *testing.T, what string) (*gpu.Backend, Config, *FileWeights) {
	t.Helper()
	paths := os.Getenv("FORGE_BIG_MODEL")
	if paths == "" {
		t.Skip("set FORGE_BIG_MODEL to a GGUF file to " + what)
	}
	be := openGPU(t)
	_, cfg, fw := openWeights(t, strings.Split(paths, ",")[0])
	uploadDense(t, be, append([]*kernels.Weight{fw.g.Embed}, denseWeights(fw)...))
	return be, cfg, fw
}
