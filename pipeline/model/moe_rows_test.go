package model_test

import (
	"context"
	"math"
	"path/filepath"
	"slices"
	"testing"

	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/pipeline/model"
	"github.com/forge-llm/forge/pipeline/synth"
)

// TestMoERowMixerBitIdentical: on the CPU backend, a mixture's rows
// gathered in one op and summed in one op (kernels.RowMixer) give the
// logits of the composition (a Scale per gathered row, a Scale and an Add
// per (token, expert) pair), bit for bit, over a 12-token prompt (experts
// shared by some of its tokens, others by all) and 8 greedy decode steps,
// for both softmax mixtures in float and quantized mixes.
func TestMoERowMixerBitIdentical(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	be := cpu.New(2)
	defer be.Close()
	prompt := []int32{1, 403, 407, 261, 378, 12, 99, 300, 17, 5, 250, 401}
	for _, preset := range []string{"tiny-qwen3moe", "tiny-mixtral"} {
		for _, mix := range []synth.Mix{synth.MixF32, synth.MixQ4_KM} {
			path := filepath.Join(dir, preset+"-"+string(mix)+".gguf")
			if err := synth.WriteFile(ctx, path, synth.Options{Shape: synth.Presets[preset], Mix: mix, Seed: 3}); err != nil {
				t.Fatal(err)
			}
			t.Run(preset+"/"+string(mix), func(t *testing.T) {
				rows := model.OpenModel(t, path, be, model.Options{Ctx: 64})
				plain := model.OpenModel(t, path, be, model.Options{Ctx: 64})
				model.MoENoMixer(plain)
				sameLogitBits(t, rows, plain, prompt, 9, "composed")
				if !model.MoEMixer(rows) || model.MoEMixer(plain) {
					t.Fatalf("row mixer in use: %v, in the composed model: %v", model.MoEMixer(rows), model.MoEMixer(plain))
				}
			})
		}
	}
}

// sameLogitBits runs a and b over prompt and steps−1 greedy tokens (a's
// choice fed to both) and fails at the first logit whose bits differ;
// what names b in the message.
func sameLogitBits(t *testing.T, a, b *model.Model, prompt []int32, steps int, what string) {
	t.Helper()
	ctx := context.Background()
	toks, pos := prompt, 0
	for step := range steps {
		got, err := a.Forward(ctx, toks, pos)
		if err != nil {
			t.Fatal(err)
		}
		got = slices.Clone(got)
		want, err := b.Forward(ctx, toks, pos)
		if err != nil {
			t.Fatal(err)
		}
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("step %d, logit %d: %v, %s %v", step, i, got[i], what, want[i])
			}
		}
		pos += len(toks)
		toks = []int32{argmaxOf(got)}
	}
}
