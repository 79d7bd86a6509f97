package model

import "github.com/forge-llm/forge/gguf"

// gemma3Arch is Gemma 3 (text): Gemma 2's block (gemmaLayer) without the
// soft-caps, with per-head Q/K RMS norms, and five local (sliding-window)
// layers for each global one; the local layers rotate with base 10000 and
// no position scaling, the global ones with the file's base and scaling
// (llama.cpp's rule).
var gemma3Arch = Arch{
	Name: "gemma3",
	Configure: func(c *Config, md Metadata) error {
		if err := gemmaConfigure(c, md, "gemma3", 6); err != nil {
			return err
		}
		c.QKNorm = true
		c.RopeBaseLocal = 10000
		return nil
	},
	Block: func(c Config) []TensorSpec { return gemmaBlock(c, true) },
	Layer: gemmaLayer,
	Meta:  func(s Shape, add func(string, gguf.Value)) { gemmaMeta(s, add) },
	Presets: map[string]Shape{
		// Gemma 3 4B: 128K context by linear scaling (factor 8) of the
		// global layers.
		"gemma3-4b": {Embd: 2560, FF: 10240, Layers: 34, Heads: 8, KVHeads: 4, HeadDim: 256, Vocab: 262208, Ctx: 131072, RopeBase: 1e6, NormEps: 1e-6,
			Tied: true, SlidingWindow: 1024, RopeLinear: 8, ChatTemplate: gemmaTemplate},
		// Small: six layers (five local, one global), a window of 8.
		"tiny-gemma3": {Embd: 256, FF: 512, Layers: 6, Heads: 4, KVHeads: 2, HeadDim: 128, Vocab: 512, Ctx: 256, RopeBase: 1e6, NormEps: 1e-6, Tied: true, SlidingWindow: 8, RopeLinear: 8, ChatTemplate: gemmaTemplate},
	},
}
