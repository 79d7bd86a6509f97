package model_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/gguf/ggufedit"
	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/pipeline/model"
	"github.com/forge-llm/forge/pipeline/synth"
)

// TestMixtralAgainstReference runs a synthetic Mixtral (a "llama" file
// with 8 experts, 2 per token) through a 7-token prompt in one step (each
// expert on the rows of the tokens that chose it) and 5 decode steps (one
// row), and checks the logits against the float64 reference's mixture.
func TestMixtralAgainstReference(t *testing.T) {
	dir := t.TempDir()
	for _, mix := range []synth.Mix{synth.MixF32, synth.MixQ8_0} {
		path := filepath.Join(dir, "mixtral-"+string(mix)+".gguf")
		if err := synth.WriteFile(context.Background(), path, synth.Options{Shape: synth.Presets["tiny-mixtral"], Mix: mix, Seed: 3}); err != nil {
			t.Fatal(err)
		}
		for _, b := range model.Backends(t) {
			t.Run(b.Name+"/"+string(mix), func(t *testing.T) {
				model.CheckAgainstReference(t, path, b.Backend, model.Tolerance(b.Name, mix != synth.MixF32))
			})
		}
	}
}

// rewriteTensors copies src to dst with each tensor's dims replaced by
// edit's, or the tensor left out where edit says so.
func rewriteTensors(t *testing.T, src, dst string, edit func(name string, dims []uint64) ([]uint64, bool)) {
	t.Helper()
	f, err := gguf.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	w := gguf.NewWriter(out)
	for _, kv := range f.Metadata {
		w.AddKV(kv.Key, kv.Value)
	}
	var keep []*gguf.TensorInfo
	for i := range f.Tensors {
		ti := &f.Tensors[i]
		if dims, ok := edit(ti.Name, ti.Dims); ok {
			w.AddTensor(ti.Name, ti.Type, dims...)
			keep = append(keep, ti)
		}
	}
	w.WriteHeader()
	for _, ti := range keep {
		data, err := f.TensorData(ti)
		if err != nil {
			t.Fatal(err)
		}
		w.WriteTensorData(ti.Name, data)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestMoEBadFiles: a mixture-of-experts file whose expert keys disagree
// with each other or with its tensors, or that lacks an expert tensor or
// stores one in the wrong 3-D shape, is refused at load with an error
// naming the key or the tensor and the shape it should have.
func TestMoEBadFiles(t *testing.T) {
	dir := t.TempDir()
	srcs := map[string]string{}
	for _, preset := range []string{"tiny-qwen3moe", "tiny-mixtral"} {
		srcs[preset] = filepath.Join(dir, preset+".gguf")
		if err := synth.WriteFile(context.Background(), srcs[preset], synth.Options{Shape: synth.Presets[preset], Mix: synth.MixF32, Seed: 1}); err != nil {
			t.Fatal(err)
		}
	}
	set := func(k string, v uint32) ggufedit.Edit {
		return ggufedit.Edit{Set: map[string]gguf.Value{k: gguf.Uint32(v)}}
	}
	reshape := func(name string, to ...uint64) func(string, []uint64) ([]uint64, bool) {
		return func(n string, dims []uint64) ([]uint64, bool) {
			if n == name {
				return to, to != nil
			}
			return dims, true
		}
	}
	for _, c := range []struct {
		name, preset string
		meta         *ggufedit.Edit
		tensors      func(string, []uint64) ([]uint64, bool)
		want         string
	}{
		{name: "used > count", preset: "tiny-qwen3moe", meta: ptr(set("qwen3moe.expert_used_count", 17)),
			want: "qwen3moe.expert_used_count = 17 exceeds qwen3moe.expert_count = 16"},
		{name: "used > count (mixtral)", preset: "tiny-mixtral", meta: ptr(set("llama.expert_used_count", 9)),
			want: "llama.expert_used_count = 9 exceeds llama.expert_count = 8"},
		{name: "no expert_count", preset: "tiny-qwen3moe", meta: &ggufedit.Edit{Drop: []string{"qwen3moe.expert_count"}},
			want: "qwen3moe.expert_count is missing or 0"},
		{name: "no expert_used_count", preset: "tiny-mixtral", meta: &ggufedit.Edit{Drop: []string{"llama.expert_used_count"}},
			want: "llama.expert_used_count is missing or 0 (llama.expert_count = 8)"},
		{name: "too many experts", preset: "tiny-qwen3moe", meta: ptr(set("qwen3moe.expert_count", 4096)),
			want: "qwen3moe.expert_count = 4096: must be at most 512"},
		{name: "count disagrees with tensors", preset: "tiny-qwen3moe", meta: ptr(set("qwen3moe.expert_count", 8)),
			want: `tensor "blk.0.ffn_gate_inp.weight" has shape [256 16], want [256 8]`},
		{name: "expert width disagrees", preset: "tiny-qwen3moe", meta: ptr(set("qwen3moe.expert_feed_forward_length", 64)),
			want: `tensor "blk.0.ffn_gate_exps.weight" has shape [256 128 16], want [256 64 16] (16 experts)`},
		{name: "missing expert tensor", preset: "tiny-qwen3moe", tensors: reshape("blk.1.ffn_up_exps.weight"),
			want: `tensor "blk.1.ffn_up_exps.weight" missing`},
		{name: "missing router", preset: "tiny-mixtral", tensors: reshape("blk.0.ffn_gate_inp.weight"),
			want: `tensor "blk.0.ffn_gate_inp.weight" missing`},
		{name: "3-D dims swapped", preset: "tiny-qwen3moe", tensors: reshape("blk.0.ffn_gate_exps.weight", 256, 16, 128),
			want: `tensor "blk.0.ffn_gate_exps.weight" has shape [256 16 128], want [256 128 16] (16 experts)`},
		{name: "experts flattened to 2-D", preset: "tiny-mixtral", tensors: reshape("blk.1.ffn_down_exps.weight", 256, 2048),
			want: `tensor "blk.1.ffn_down_exps.weight" has shape [256 2048], want [256 256 8] (8 experts)`},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "bad.gguf")
			if c.meta != nil {
				if err := ggufedit.Copy(srcs[c.preset], p, *c.meta); err != nil {
					t.Fatal(err)
				}
			} else {
				rewriteTensors(t, srcs[c.preset], p, c.tensors)
			}
			err := loadModelFile(p)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// loadModelFile reads the configuration, checks the shapes and builds the
// weights of the file at p, as a load does.
func loadModelFile(p string) error {
	f, err := gguf.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	cfg, err := model.ConfigFromFile(f)
	if err != nil {
		return err
	}
	if err := model.CheckShapes(f, cfg); err != nil {
		return err
	}
	if _, err := model.NewFileWeights(f, cfg); err != nil {
		return fmt.Errorf("weights: %w", err)
	}
	return nil
}

// TestMoEPresetShapes: the real mixture presets read back as their
// models' published shapes (experts, experts per token, an expert's width)
// and parameter counts (Qwen3-30B-A3B: 30.5 B; Mixtral 8x7B: 46.7 B).
func TestMoEPresetShapes(t *testing.T) {
	for _, c := range []struct {
		preset             string
		experts, used, eff int
		lo, hi             float64
	}{
		{"qwen3-30b-a3b", 128, 8, 768, 30.3e9, 30.7e9},
		{"mixtral-8x7b", 8, 2, 14336, 46.5e9, 46.9e9},
	} {
		s := synth.Presets[c.preset]
		cfg, err := s.Config()
		if err != nil {
			t.Fatalf("%s: %v", c.preset, err)
		}
		if cfg.Experts != c.experts || cfg.ExpertsUsed != c.used || cfg.ExpertFF != c.eff {
			t.Errorf("%s: %d experts, %d per token, %d wide; want %d, %d, %d", c.preset, cfg.Experts, cfg.ExpertsUsed, cfg.ExpertFF, c.experts, c.used, c.eff)
		}
		if p := float64(s.Params()); p < c.lo || p > c.hi {
			t.Errorf("%s: %.3g parameters, want %.3g…%.3g", c.preset, p, c.lo, c.hi)
		}
	}
}

// TestMoEDecodeSharedInputBitIdentical: a decode step's experts' gate and
// up products in one MatMuls (one quantized input on the CPU) give the
// per-expert path's logits bit for bit, over a prompt and 8 greedy decode
// steps, for both mixtures in float and quantized mixes on every backend.
func TestMoEDecodeSharedInputBitIdentical(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	prompt := []int32{1, 403, 407, 261, 378}
	for _, preset := range []string{"tiny-qwen3moe", "tiny-mixtral"} {
		for _, mix := range []synth.Mix{synth.MixF32, synth.MixQ8_0, synth.MixQ4_KM} {
			path := filepath.Join(dir, preset+"-"+string(mix)+".gguf")
			if err := synth.WriteFile(ctx, path, synth.Options{Shape: synth.Presets[preset], Mix: mix, Seed: 7}); err != nil {
				t.Fatal(err)
			}
			for _, b := range model.Backends(t) {
				t.Run(preset+"/"+string(mix)+"/"+b.Name, func(t *testing.T) {
					shared := model.OpenModel(t, path, b.Backend, model.Options{Ctx: 64})
					each := model.OpenModel(t, path, b.Backend, model.Options{Ctx: 64})
					model.MoEPerExpert(each)
					toks, pos := prompt, 0
					for step := range 9 {
						got, err := shared.Forward(ctx, toks, pos)
						if err != nil {
							t.Fatal(err)
						}
						got = slices.Clone(got)
						want, err := each.Forward(ctx, toks, pos)
						if err != nil {
							t.Fatal(err)
						}
						for i := range want {
							if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
								t.Fatalf("step %d, logit %d: %v, expert by expert %v", step, i, got[i], want[i])
							}
						}
						pos += len(toks)
						toks = []int32{argmaxOf(got)}
					}
					if b.Name == "cpu" && model.MoESharedDecodes(shared) == 0 {
						t.Fatal("the CPU ran no decode step's experts in one MatMuls")
					}
					if model.MoESharedDecodes(each) != 0 {
						t.Fatal("the per-expert model shared a product")
					}
				})
			}
		}
	}
}

func argmaxOf(v []float32) int32 {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return int32(best)
}

// TestMoEStepBatchMatchesForward: the mixtures through the batched steps
// of serving (several sequences' rows in one step, so an expert's rows
// come from several sequences, prompts in pieces, merged or not) give
// each sequence's logits as it alone would get them, bit for bit, on the
// CPU (where a row's product does not depend on the others'); gpt-oss's
// sinks and windows through the paged pool too.
func TestMoEStepBatchMatchesForward(t *testing.T) {
	dir := t.TempDir()
	for _, preset := range []string{"tiny-qwen3moe", "tiny-mixtral", "tiny-gpt-oss"} {
		path := filepath.Join(dir, preset+".gguf")
		if err := synth.WriteFile(context.Background(), path, synth.Options{Shape: synth.Presets[preset], Mix: synth.MixQ4_KM, Seed: 5}); err != nil {
			t.Fatal(err)
		}
		for _, merge := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/merge=%v", preset, merge), func(t *testing.T) { model.StepBatchMatchesForward(t, path, merge) })
		}
	}
}

// BenchmarkMoEDecode times decode steps of a Qwen3-MoE-like model (4
// blocks of 32 experts, 8 per token, 1024 wide, Q4_K_M) on the CPU, with
// the experts' gate and up in one MatMuls (shared) and expert by expert.
func BenchmarkMoEDecode(b *testing.B) {
	s := synth.Presets["tiny-qwen3moe"]
	s.Embd, s.FF, s.Layers, s.Heads, s.KVHeads, s.HeadDim = 1024, 3072, 4, 16, 4, 64
	s.Experts, s.ExpertsUsed, s.ExpertFF = 32, 8, 512
	benchMoEDecode(b, s, synth.MixQ4_KM, 512)
}

// benchMoEDecode times one-token Forward steps of a synthetic mixture of
// shape s on the CPU (positions cycling through ctx), with the chosen
// experts' input shared (one MatMuls) and expert by expert.
func benchMoEDecode(b *testing.B, s synth.Shape, mix synth.Mix, ctx int) {
	path := filepath.Join(b.TempDir(), "moe.gguf")
	if err := synth.WriteFile(context.Background(), path, synth.Options{Shape: s, Mix: mix, Seed: 1, Fill: synth.FillBlocks}); err != nil {
		b.Fatal(err)
	}
	be := cpu.New(runtime.NumCPU())
	defer be.Close()
	for _, perExpert := range []bool{false, true} {
		name := "shared"
		if perExpert {
			name = "per-expert"
		}
		b.Run(name, func(b *testing.B) {
			m := model.OpenModel(b, path, be, model.Options{Ctx: ctx})
			if perExpert {
				model.MoEPerExpert(m)
			}
			for i := range b.N {
				if _, err := m.Forward(context.Background(), []int32{1}, i%(ctx-12)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
