package model_test

import (
	"context"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/gguf/ggufedit"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/pipeline/chat"
	"github.com/forge-llm/forge/pipeline/internal/archtest"
	"github.com/forge-llm/forge/pipeline/model"
	"github.com/forge-llm/forge/pipeline/synth"
)

// tinyGptOss writes tiny-gpt-oss (F32) into dir.
func tinyGptOss(t *testing.T, dir string, mix synth.Mix) string {
	t.Helper()
	p := filepath.Join(dir, "tiny-gpt-oss-"+string(mix)+".gguf")
	if err := synth.WriteFile(context.Background(), p, synth.Options{Shape: synth.Presets["tiny-gpt-oss"], Mix: mix, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestGptOssBadFiles: a gpt-oss file with missing or inconsistent keys,
// or a missing or misshapen sink or bias tensor, is refused at load with
// an error naming the key or the tensor.
func TestGptOssBadFiles(t *testing.T) {
	src := tinyGptOss(t, t.TempDir(), synth.MixF32)
	set := func(k string, v gguf.Value) *ggufedit.Edit {
		return &ggufedit.Edit{Set: map[string]gguf.Value{k: v}}
	}
	drop := func(k ...string) *ggufedit.Edit { return &ggufedit.Edit{Drop: k} }
	reshape := func(name string, to ...uint64) func(string, []uint64) ([]uint64, bool) {
		return func(n string, dims []uint64) ([]uint64, bool) {
			if n == name {
				return to, to != nil
			}
			return dims, true
		}
	}
	for _, c := range []struct {
		name    string
		meta    *ggufedit.Edit
		tensors func(string, []uint64) ([]uint64, bool)
		want    string
	}{
		{name: "no sliding window", meta: drop("gpt-oss.attention.sliding_window"), want: "gpt-oss.attention.sliding_window is missing"},
		{name: "sliding window 0", meta: set("gpt-oss.attention.sliding_window", gguf.Uint32(0)), want: "gpt-oss.attention.sliding_window = 0"},
		{name: "window pattern 0", meta: set("gpt-oss.attention.sliding_window_pattern", gguf.Uint32(0)), want: "gpt-oss.attention.sliding_window_pattern"},
		{name: "window pattern array", meta: set("gpt-oss.attention.sliding_window_pattern", gguf.ArrayOf([]bool{true, false})),
			want: "gpt-oss.attention.sliding_window_pattern must be a count"},
		{name: "no expert width", meta: drop("gpt-oss.expert_feed_forward_length"), want: "set gpt-oss.expert_feed_forward_length"},
		{name: "no expert count", meta: drop("gpt-oss.expert_count"), want: "gpt-oss.expert_count is missing or 0"},
		{name: "used > count", meta: set("gpt-oss.expert_used_count", gguf.Uint32(9)), want: "gpt-oss.expert_used_count = 9 exceeds gpt-oss.expert_count = 8"},
		{name: "yarn without factor", meta: drop("gpt-oss.rope.scaling.factor"), want: "gpt-oss.rope.scaling.factor is missing"},
		{name: "yarn factor below 1", meta: set("gpt-oss.rope.scaling.factor", gguf.Float32(0.5)), want: "gpt-oss.rope.scaling.factor"},
		{name: "yarn original context 0", meta: set("gpt-oss.rope.scaling.original_context_length", gguf.Uint32(0)),
			want: "gpt-oss.rope.scaling.original_context_length = 0"},
		{name: "yarn attn factor NaN", meta: set("gpt-oss.rope.scaling.attn_factor", gguf.Float32(float32(math.NaN()))), want: "gpt-oss.rope.scaling.attn_factor = NaN"},
		{name: "local rope base", meta: set("gpt-oss.rope.freq_base_swa", gguf.Float32(10000)), want: "gpt-oss.rope.freq_base_swa = 10000"},
		{name: "partial rotation", meta: set("gpt-oss.rope.dimension_count", gguf.Uint32(32)), want: "gpt-oss.rope.dimension_count = 32"},
		{name: "missing sinks", tensors: reshape("blk.2.attn_sinks.weight"), want: `tensor "blk.2.attn_sinks.weight" missing`},
		{name: "sinks in two rows", tensors: reshape("blk.0.attn_sinks.weight", 4, 2), want: `tensor "blk.0.attn_sinks.weight" has shape [4 2], want [8 1]`},
		{name: "missing router bias", tensors: reshape("blk.1.ffn_gate_inp.bias"), want: `tensor "blk.1.ffn_gate_inp.bias" missing`},
		{name: "expert bias transposed", tensors: reshape("blk.3.ffn_down_exps.bias", 8, 256),
			want: `tensor "blk.3.ffn_down_exps.bias" has shape [8 256], want [256 8]`},
		{name: "missing output bias", tensors: reshape("blk.0.attn_output.bias"), want: `tensor "blk.0.attn_output.bias" missing`},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "bad.gguf")
			if c.meta != nil {
				if err := ggufedit.Copy(src, p, *c.meta); err != nil {
					t.Fatal(err)
				}
			} else {
				rewriteTensors(t, src, p, c.tensors)
			}
			err := loadModelFile(p)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
		})
	}
	if err := loadModelFile(src); err != nil {
		t.Fatalf("the unedited file: %v", err)
	}
}

// plainBackend hides the CPU backend's optional ops (it does not unwrap),
// as a backend without attention sinks looks to the model.
type plainBackend struct{ kernels.Backend }

// TestGptOssRefusesBackendWithoutSinks: a backend without attention sinks
// and the clamped SwiGLU gets a clear error at New, not wrong numbers.
func TestGptOssRefusesBackendWithoutSinks(t *testing.T) {
	p := tinyGptOss(t, t.TempDir(), synth.MixF32)
	cfg, w := archtest.OpenWeights(t, p)
	be := cpu.New(1)
	defer be.Close()
	_, err := model.New(plainBackend{be}, cfg, w, model.Options{Ctx: 32})
	if err == nil || !strings.Contains(err.Error(), "no attention sinks") || !strings.Contains(err.Error(), "gpt-oss") {
		t.Fatalf("error %v, want one saying the backend has no attention sinks", err)
	}
	m, err := model.New(be, cfg, w, model.Options{Ctx: 32})
	if err != nil {
		t.Fatalf("the CPU backend: %v", err)
	}
	m.Close()
}

// TestGptOssMXFP4Experts: in every mix the experts are MXFP4 (as gpt-oss
// was published and llama.cpp's converter keeps them), the biases, norms
// and router F32, the rest the mix's type; a Q8_0 file runs on the CPU
// backend. (The F32 file's greedy tokens are llama.cpp's: TestArchGreedy.)
func TestGptOssMXFP4Experts(t *testing.T) {
	dir := t.TempDir()
	for _, mix := range []synth.Mix{synth.MixF32, synth.MixQ8_0} {
		p := tinyGptOss(t, dir, mix)
		f, err := gguf.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		base := gguf.TypeF32
		if mix == synth.MixQ8_0 {
			base = gguf.TypeQ8_0
		}
		for _, ti := range f.Tensors {
			want := base
			switch {
			case strings.HasSuffix(ti.Name, "_exps.weight"):
				want = gguf.TypeMXFP4
			case strings.HasSuffix(ti.Name, ".bias") || ti.Rows() == 1 || strings.HasSuffix(ti.Name, "ffn_gate_inp.weight"):
				want = gguf.TypeF32
			}
			if ti.Type != want {
				t.Errorf("%s: %s is %v, want %v", mix, ti.Name, ti.Type, want)
			}
		}
		f.Close()
		if mix != synth.MixQ8_0 {
			continue
		}
		be := cpu.New(2)
		t.Cleanup(be.Close) // after the model's own cleanup (LIFO)
		m := model.OpenModel(t, p, be, model.Options{Ctx: 64})
		ids, _ := greedyMargins(t, m, []int32{1, 403, 407, 261, 378}, 4)
		for _, id := range ids {
			if id < 0 || id >= 512 {
				t.Fatalf("greedy ids %v outside the vocabulary", ids)
			}
		}
	}
}

// TestGptOssPresetShape: gpt-oss-20b reads back as the published shape
// (20.9 B parameters, a window on every other layer, YaRN ×32 from 4096).
func TestGptOssPresetShape(t *testing.T) {
	s := synth.Presets["gpt-oss-20b"]
	c, err := s.Config()
	if err != nil {
		t.Fatal(err)
	}
	if c.Experts != 32 || c.ExpertsUsed != 4 || c.ExpertFF != 2880 || c.HeadDim != 64 || c.QDim() != 4096 || c.KVDim() != 512 ||
		c.Window != 128 || !c.Local(0) || c.Local(1) || c.YaRNFactor != 32 || c.YaRNOrigCtx != 4096 || !c.Sinks {
		t.Fatalf("config %+v", c)
	}
	if p := float64(s.Params()) / 1e9; p < 20.8 || p > 21.0 {
		t.Errorf("%.2f B parameters, want gpt-oss-20b's 20.9 B", p)
	}
}

// TestGptOssTemplate: the presets' conversation format is Harmony to
// pipeline/chat (its tool calls parsed as gpt-oss writes them), and it
// renders a turn as gpt-oss reads it.
func TestGptOssTemplate(t *testing.T) {
	tpl, err := chat.Parse(synth.Presets["gpt-oss-20b"].ChatTemplate)
	if err != nil {
		t.Fatal(err)
	}
	if tpl.Family != chat.Harmony {
		t.Fatalf("family %q, want %q", tpl.Family, chat.Harmony)
	}
	got, err := tpl.Render([]chat.Message{{Role: "user", Content: "Hi"}, {Role: "assistant", Content: "Hello"}, {Role: "user", Content: "Bye"}},
		chat.Options{AddGenerationPrompt: true})
	if err != nil {
		t.Fatal(err)
	}
	want := "<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>final<|message|>Hello<|end|><|start|>user<|message|>Bye<|end|><|start|>assistant"
	if got != want {
		t.Fatalf("rendered\n%q\nwant\n%q", got, want)
	}
}
