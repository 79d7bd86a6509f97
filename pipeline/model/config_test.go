package model

import (
	"context"
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/gguf/testmodels"
)

func TestConfigFromFile(t *testing.T) {
	f, err := gguf.Open(testmodels.Path(t, "stories260K-Q4_0.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c, err := ConfigFromFile(f)
	if err != nil {
		t.Fatal(err)
	}
	want := Config{Arch: "llama", Embd: 64, FF: 172, Layers: 5, Heads: 8, KVHeads: 4, HeadDim: 8, Vocab: 512, Ctx: 128, NormEps: 1e-5}
	want.Rope.Dim, want.Rope.Base, want.Rope.Scale = 8, 10000, 1
	if c != want {
		t.Errorf("config\n got %+v\nwant %+v", c, want)
	}
}

func TestConfigRejects(t *testing.T) {
	base := gguf.Config{Arch: "llama", EmbeddingLength: 64, BlockCount: 1, FeedForwardLength: 128, HeadCount: 4, HeadCountKV: 4,
		RopeDim: 16, RopeFreqBase: 10000, RopeScalingType: "linear", RopeScalingFactor: 1, VocabSize: 10, ContextLength: 16, NormEps: 1e-5}
	if c, err := configFrom(base); err != nil || c.check() != nil {
		t.Fatalf("valid config rejected: %v %v", err, c.check())
	}
	bad := map[string]func(*gguf.Config){
		"arch":     func(c *gguf.Config) { c.Arch = "gpt2" },
		"yarn":     func(c *gguf.Config) { c.RopeScalingType = "yarn" },
		"gqa":      func(c *gguf.Config) { c.HeadCountKV = 3 },
		"rope dim": func(c *gguf.Config) { c.RopeDim = 32 },
	}
	for name, mod := range bad {
		gc := base
		mod(&gc)
		c, err := configFrom(gc)
		if err == nil {
			err = c.check()
		}
		if err == nil {
			t.Errorf("%s: accepted %+v", name, gc)
		}
	}
}

// TestFileWeightsChecksShapes: a tensor whose shape disagrees with the
// config is reported by name; a file without output.weight ties the head
// to token_embd.
func TestFileWeightsChecksShapes(t *testing.T) {
	f, err := gguf.Open(testmodels.Path(t, "stories260K-F32.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c, err := ConfigFromFile(f)
	if err != nil {
		t.Fatal(err)
	}
	fw, err := NewFileWeights(f, c)
	if err != nil {
		t.Fatal(err)
	}
	if g := fw.Globals(); g.Output == g.Embed || g.RopeFreqs != nil {
		t.Error("stories260K has its own output.weight and no rope_freqs")
	}
	if _, err := fw.Layer(context.Background(), c.Layers); err == nil {
		t.Error("layer past the end returned no error")
	}
	bad := c
	bad.FF = 100
	if _, err := NewFileWeights(f, bad); err == nil || !strings.Contains(err.Error(), "blk.0.ffn_gate.weight") {
		t.Errorf("wrong FF: error %v, want one naming blk.0.ffn_gate.weight", err)
	}
	bad = c
	bad.Arch, bad.Bias = "qwen2", true
	if _, err := NewFileWeights(f, bad); err == nil || !strings.Contains(err.Error(), "attn_q.bias") {
		t.Errorf("qwen2 without biases: error %v, want one naming attn_q.bias", err)
	}
}
