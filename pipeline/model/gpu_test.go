package model

import (
	"context"
	"errors"
	"os"
	"slices"
	"testing"

	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/kernels/gpu"
	"github.com/forge-llm/forge/rocm"
)

// envRequireGPU turns "no GPU" from a skip into a failure, as in the other
// GPU packages: the GPU machine sets it so a missing driver can not pass.
const envRequireGPU = "FORGE_REQUIRE_GPU"

// openGPU opens a GPU backend on device 0 for one test, skipping (or
// failing, with FORGE_REQUIRE_GPU=1) where there is none.
func openGPU(t testing.TB) *gpu.Backend {
	t.Helper()
	// FORGE_TEST_GPU_MMQ is gpu.Options.MMQ for these tests (bench/mmq-h100.sh
	// compares the int8 kernels' settings in one build).
	b, err := gpu.Open(0, gpu.Options{CacheDir: os.Getenv("FORGE_CACHE_DIR"), MMQ: os.Getenv("FORGE_TEST_GPU_MMQ")})
	if err != nil {
		if (errors.Is(err, rocm.ErrNoDevice) || errors.Is(err, rocm.ErrNoDriver)) && os.Getenv(envRequireGPU) != "1" {
			t.Skipf("no GPU (set %s=1 to make this a failure): %v", envRequireGPU, err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// TestGPUGraphDecode: on the GPU, the decode step recorded once and
// replayed per token gives exactly the logits of the same step run op by
// op (the same kernels on the same grids) at every position, and the
// greedy ids that llama.cpp gives (stories260K,
// all 64; synth-kq-Q4_K_M up to a reference's decisive prefix), also when
// only the device's argmax comes back.
func TestGPUGraphDecode(t *testing.T) {
	be := openGPU(t)
	var stories storiesExpected
	readJSON(t, "stories260K-expected.json", &stories)
	var synth synthExpected
	readJSON(t, "synth-kq-expected.json", &synth)
	type tcase struct {
		file   string
		prompt []int32
		n      int
		// ok reports whether greedy ids are right.
		ok func(ids []int32) bool
	}
	var cases []tcase
	for _, typ := range []string{"F32", "Q4_0", "Q8_0", "Q4_K_M"} {
		name := "stories260K-" + typ + ".gguf"
		e, ok := stories.Models[name]
		if !ok {
			t.Fatalf("no expected output for %s", name)
		}
		cases = append(cases, tcase{name, e.PromptIDs, len(e.GeneratedIDs), func(ids []int32) bool { return slices.Equal(ids, e.GeneratedIDs) }})
	}
	refs := synth.Models["synth-kq-Q4_K_M.gguf"]
	var synthPrompt []int32
	for _, r := range refs {
		synthPrompt = r.PromptIDs
	}
	cases = append(cases, tcase{"synth-kq-Q4_K_M.gguf", synthPrompt, 16, func(ids []int32) bool {
		for _, r := range refs {
			if k := r.DecisivePrefix; slices.Equal(ids[:k], r.GeneratedIDs[:k]) {
				return true
			}
		}
		return false
	}})
	ctx := context.Background()
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			path := testmodels.Path(t, c.file)
			eager, _ := openModel(t, path, be, Options{NoGraph: true})
			graph, _ := openModel(t, path, be, Options{})
			if eager.graphs != nil || graph.graphs == nil {
				t.Fatalf("NoGraph model records steps: %v; default model records: %v", eager.graphs != nil, graph.graphs != nil)
			}
			le, err := eager.Forward(ctx, c.prompt, 0)
			if err != nil {
				t.Fatal(err)
			}
			le = slices.Clone(le)
			lg, err := graph.Forward(ctx, c.prompt, 0)
			if err != nil {
				t.Fatal(err)
			}
			var ids []int32
			worst := 0.0
			pos := len(c.prompt)
			for {
				if e := relErr(lg, f64s(le)); !(e == 0) {
					t.Fatalf("position %d: replayed step's logits differ from the ops' by %.3g", pos, e)
				} else {
					worst = max(worst, e)
				}
				id, idg := argmax(le), argmax(lg)
				if id != idg {
					t.Fatalf("position %d: replayed step picks %d, the ops %d", pos, idg, id)
				}
				ids = append(ids, id)
				if len(ids) == c.n {
					break
				}
				if le, err = eager.Forward(ctx, []int32{id}, pos); err != nil {
					t.Fatal(err)
				}
				le = slices.Clone(le)
				if lg, err = graph.Forward(ctx, []int32{id}, pos); err != nil {
					t.Fatal(err)
				}
				pos++
			}
			if graph.graph == nil || graph.graphOff {
				t.Fatal("the decode step was not recorded")
			}
			if !c.ok(ids) {
				t.Fatalf("greedy ids %v are not llama.cpp's", ids)
			}
			// Again from position 0 with the device's argmax only: the
			// recorded step serves the new positions.
			next, err := graph.Greedy(ctx, c.prompt, 0)
			if err != nil {
				t.Fatal(err)
			}
			got := []int32{next}
			for p := len(c.prompt); len(got) < c.n; p++ {
				if next, err = graph.Greedy(ctx, []int32{next}, p); err != nil {
					t.Fatal(err)
				}
				got = append(got, next)
			}
			if !slices.Equal(got, ids) {
				t.Fatalf("greedy on the device\n got %v\nwant %v", got, ids)
			}
			t.Logf("%d ids equal llama.cpp's; worst logits difference replay vs ops %.2e", len(ids), worst)
		})
	}
}

func f64s(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}
