package model_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/pipeline/model"
	"github.com/forge-llm/forge/pipeline/synth"
)

// TestGptOssDecodeSharedInputBitIdentical: a gpt-oss decode step's experts'
// gate and up products in one MatMuls (their MXFP4 rows beside each
// other, the input quantized once), with each expert's biases and one
// clamped SwiGLU over all of them, give the per-expert path's logits bit
// for bit, over a prompt and 8 greedy decode steps, in every mix (the
// experts MXFP4 in all, the rest F32, Q8_0 or Q4_K_M), on the CPU (the
// only backend with gpt-oss's ops).
func TestGptOssDecodeSharedInputBitIdentical(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	prompt := []int32{1, 403, 407, 261, 378}
	be := cpu.New(2)
	t.Cleanup(be.Close) // after the models' own cleanups (LIFO)
	for _, mix := range []synth.Mix{synth.MixF32, synth.MixQ8_0, synth.MixQ4_KM} {
		t.Run(string(mix), func(t *testing.T) {
			path := filepath.Join(dir, "tiny-gpt-oss-"+string(mix)+".gguf")
			if err := synth.WriteFile(ctx, path, synth.Options{Shape: synth.Presets["tiny-gpt-oss"], Mix: mix, Seed: 7}); err != nil {
				t.Fatal(err)
			}
			shared := model.OpenModel(t, path, be, model.Options{Ctx: 64})
			each := model.OpenModel(t, path, be, model.Options{Ctx: 64})
			model.MoEPerExpert(each)
			sameLogitBits(t, shared, each, prompt, 9, "expert by expert")
			// 8 decode steps of 4 blocks each, and the prompt's last block,
			// which runs its mixture on the one row whose logits are read.
			if n := model.MoESharedDecodes(shared); n != 8*synth.Presets["tiny-gpt-oss"].Layers+1 {
				t.Fatalf("%d mixtures ran their experts in one MatMuls, want every decode step's", n)
			}
			if model.MoESharedDecodes(each) != 0 {
				t.Fatal("the per-expert model shared its experts' input")
			}
		})
	}
}

// BenchmarkGptOssDecode times decode steps of a gpt-oss-like model (4
// blocks of 32 MXFP4 experts, 4 per token, 1024 wide, the rest Q8_0) on
// the CPU, with the experts' gate and up in one MatMuls (shared) and
// expert by expert.
func BenchmarkGptOssDecode(b *testing.B) {
	s := synth.Presets["tiny-gpt-oss"]
	s.Embd, s.FF, s.Layers, s.Heads, s.KVHeads, s.HeadDim = 1024, 1024, 4, 16, 4, 64
	s.Experts, s.ExpertsUsed, s.ExpertFF = 32, 4, 1024
	benchMoEDecode(b, s, synth.MixQ8_0, 256)
}
