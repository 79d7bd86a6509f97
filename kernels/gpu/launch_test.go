package gpu

import (
	"testing"

	"github.com/forge-llm/forge/gguf"
)

// llama8B lists the matrix shapes of Llama 3 8B (Q4_K_M: Q4_K, with
// attn_v, ffn_down and the output in Q6_K).
var llama8B = []struct {
	name       string
	typ        gguf.Type
	rows, cols int
}{
	{"attn_q", gguf.TypeQ4_K, 4096, 4096},
	{"attn_k", gguf.TypeQ4_K, 1024, 4096},
	{"attn_v", gguf.TypeQ6_K, 1024, 4096},
	{"attn_output", gguf.TypeQ4_K, 4096, 4096},
	{"ffn_gate", gguf.TypeQ4_K, 14336, 4096},
	{"ffn_down", gguf.TypeQ6_K, 4096, 14336},
	{"output", gguf.TypeQ6_K, 128256, 4096},
}

// TestLaunchPlans8B: the kernels and grids launch.go chooses for the 8B
// model's decode products on gfx90a (wave64, 110 CUs) and gfx1030 (wave32,
// 40 CUs). ffn_down (56 super-blocks a row) is staged at both widths: at
// wave64 its last run of 16 super-blocks holds 8 (once q21, issue 27,
// item 6).
func TestLaunchPlans8B(t *testing.T) {
	want := map[string]map[string]mvPlan{
		"gfx90a": {
			"attn_q":      {"mv_q4_k_n12", 880, mvArgsQ8},
			"attn_k":      {"mv_q4_k_n12", 512, mvArgsQ8},
			"attn_v":      {"mv_q6_k_t2", 256, mvArgsQ8},
			"attn_output": {"mv_q4_k_n12", 880, mvArgsQ8},
			"ffn_gate":    {"mv_q4_k_n12", 880, mvArgsQ8},
			"ffn_down":    {"mv_q6_k_t2", 1024, mvArgsQ8},
			"output":      {"mv_q6_k_c2", 440, mvArgsQ8},
		},
		"gfx1030": {
			"attn_q":      {"mv_q4_k_n12", 320, mvArgsQ8},
			"attn_k":      {"mv_q4_k_n12", 256, mvArgsQ8},
			"attn_v":      {"mv_q6_k_t2", 128, mvArgsQ8},
			"attn_output": {"mv_q4_k_n12", 320, mvArgsQ8},
			"ffn_gate":    {"mv_q4_k_n12", 320, mvArgsQ8},
			"ffn_down":    {"mv_q6_k_t2", 480, mvArgsQ8},
			"output":      {"mv_q6_k_c2", 160, mvArgsQ8},
		},
	}
	for _, ed := range emuDevices {
		for _, m := range llama8B {
			p, err := planMatvec(ed.dev, m.typ, m.rows, m.cols, 1, true, true, mvOverrides{})
			if err != nil {
				t.Fatal(err)
			}
			if w := want[ed.name][m.name]; p != w {
				t.Errorf("%s %s %s %d×%d: %+v, want %+v", ed.name, m.name, m.typ, m.rows, m.cols, p, w)
			}
		}
	}
	// multi-row: Q4_K takes 16 rows of x per launch past 8 rows
	for _, ed := range emuDevices {
		p, err := planRows(ed.dev, gguf.TypeQ4_K, 14336, 4096, 12, true, "", "")
		if err != nil {
			t.Fatal(err)
		}
		if want := (rowsPlan{"mv_q4_k_x16r2", 16, 8 * ed.dev.SMs, mvArgsQ8}); p != want {
			t.Errorf("%s rows: %+v, want %+v", ed.name, p, want)
		}
		p, err = planRows(ed.dev, gguf.TypeQ5_K, 4096, 4096, 12, true, "", "")
		if err != nil {
			t.Fatal(err)
		}
		if want := (rowsPlan{"mv_q5_k", 8, 4096 / (128 / ed.dev.Warp), mvArgsGeneric}); p != want {
			t.Errorf("%s rows Q5_K: %+v, want %+v", ed.name, p, want)
		}
	}
	// b32: Q8_0 at 4096 columns fits a wave32 and a wave64 run (128
	// blocks); at 3072 (96 blocks) only wave32
	if !b32Fits(32, gguf.TypeQ8_0, 3072, true) || b32Fits(64, gguf.TypeQ8_0, 3072, true) || !b32Fits(64, gguf.TypeQ8_0, 4096, true) {
		t.Error("b32Fits: Q8_0 fits 3072 columns on wave32 only, 4096 on both")
	}
	// decode attention: 32 heads, one token, 8192 positions
	if s := planAttnDecodeSplits(DeviceGfx90a, 32, 1, 8192); s != 14 {
		t.Errorf("gfx90a decode splits %d, want 14", s)
	}
	if s := planAttnDecodeSplits(DeviceGfx1030, 32, 1, 8192); s != 5 {
		t.Errorf("gfx1030 decode splits %d, want 5", s)
	}
}
