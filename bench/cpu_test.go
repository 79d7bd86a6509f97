package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/pipeline/model"
	"github.com/forge-llm/forge/pipeline/synth"
)

// llama.cpp's CPU figures for the bench86m model on this kind of machine
// (2 cores, AVX-512), 2 threads, from issue 4: decode (tg) and prompt
// (pp128) tokens per second. The benchmarks report their own rate divided
// by these as "x_llama.cpp".
var llamaCPP = map[string]struct{ decode, prompt float64 }{
	"bench86m-q4_k_m": {262, 579},
	"bench86m-q8_0":   {230, 779},
}

const (
	promptLen = 128 // pp128
	decodeLen = 128 // tg128: tokens decoded from an empty context
)

// models finds the benchmark models: bundled files, or bench86m in a mix,
// generated on first use into the top-level benchmark's temporary
// directory (removed when it ends).
type models struct {
	dir   string
	made  map[string]bool
	vocab *gguf.TokenizerMeta
}

func newModels(b *testing.B) *models {
	voc, err := synth.VocabFromFile(testmodels.Path(b, "stories260K-F32.gguf"))
	if err != nil {
		b.Fatal(err)
	}
	return &models{dir: b.TempDir(), made: map[string]bool{}, vocab: voc}
}

func (ms *models) path(b *testing.B, name string) string {
	var mix synth.Mix
	switch name {
	case "bench86m-q4_k_m":
		mix = synth.MixQ4_KM
	case "bench86m-q8_0":
		mix = synth.MixQ8_0
	default:
		return testmodels.Path(b, name+".gguf")
	}
	p := filepath.Join(ms.dir, name+".gguf")
	if !ms.made[name] {
		o := synth.Options{Shape: synth.Presets["bench86m"], Mix: mix, Vocab: ms.vocab, Seed: 1}
		if err := synth.WriteFile(context.Background(), p, o); err != nil {
			b.Fatal(err)
		}
		ms.made[name] = true
	}
	return p
}

func openBench(b *testing.B, path string, threads int) *model.Model {
	f, err := gguf.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close() })
	cfg, err := model.ConfigFromFile(f)
	if err != nil {
		b.Fatal(err)
	}
	w, err := model.NewFileWeights(f, cfg)
	if err != nil {
		b.Fatal(err)
	}
	be := cpu.New(threads)
	b.Cleanup(be.Close)
	m, err := model.New(be, cfg, w, model.Options{Ctx: max(promptLen, decodeLen) + 8})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(m.Close)
	return m
}

var benchModels = []string{"stories260K-Q4_0", "stories260K-Q8_0", "bench86m-q4_k_m", "bench86m-q8_0"}

func threads() int { return runtime.GOMAXPROCS(0) }

func report(b *testing.B, name string, tokens int, rate func(decode, prompt float64) float64) {
	tps := float64(tokens) / b.Elapsed().Seconds()
	b.ReportMetric(tps, "tok/s")
	b.ReportMetric(0, "ns/op")
	if ref, ok := llamaCPP[name]; ok {
		b.ReportMetric(tps/rate(ref.decode, ref.prompt), "x_llama.cpp")
	}
}

// BenchmarkCPU reports CPU tokens/s for each model (threads =
// GOMAXPROCS):
//
//	decode: 128 tokens decoded one at a time from an empty context per
//	        iteration (llama-bench's tg128);
//	prompt: a 128-token prompt evaluated per iteration, logits of the last
//	        token only (llama-bench's pp128).
//
// One top-level benchmark so that the generated bench86m files are made
// once (quantizing 86M weights to Q4_K takes a while) and removed at the end.
func BenchmarkCPU(b *testing.B) {
	ms := newModels(b)
	for _, name := range benchModels {
		path := ms.path(b, name)
		b.Run(fmt.Sprintf("decode/%s/threads=%d", name, threads()), func(b *testing.B) {
			m := openBench(b, path, threads())
			ctx := context.Background()
			var tok [1]int32
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				for pos := range decodeLen {
					tok[0] = int32(pos*7+1) % int32(m.Cfg.Vocab)
					if _, err := m.Forward(ctx, tok[:], pos); err != nil {
						b.Fatal(err)
					}
				}
			}
			report(b, name, b.N*decodeLen, func(d, _ float64) float64 { return d })
		})
		b.Run(fmt.Sprintf("prompt/%s/threads=%d", name, threads()), func(b *testing.B) {
			m := openBench(b, path, threads())
			ctx := context.Background()
			prompt := make([]int32, promptLen)
			for i := range prompt {
				prompt[i] = int32(i*13+1) % int32(m.Cfg.Vocab)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if _, err := m.Forward(ctx, prompt, 0); err != nil {
					b.Fatal(err)
				}
			}
			report(b, name, b.N*promptLen, func(_, p float64) float64 { return p })
		})
	}
}
