package model_test

// Each architecture's tiny preset, written by synth with a fixed seed,
// must give llama.cpp's greedy tokens. The expected tokens are committed
// (gguf/testdata/arch-expected.json) so that CI checks forge without
// llama.cpp; TestArchLlamaCpp checks the file against llama.cpp itself
// where bench/llamacpp.sh has fetched it, and rewrites it with
// FORGE_UPDATE_ARCH_EXPECTED=1.

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/gguf/testmodels"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/pipeline/internal/archtest"
	"github.com/forge-llm/forge/pipeline/model"
	"github.com/forge-llm/forge/pipeline/synth"
)

// greedyMargins runs n greedy steps from prompt and returns the ids and
// each step's top-1 minus top-2 logit.
func greedyMargins(t testing.TB, m *model.Model, prompt []int32, n int) ([]int32, []float64) {
	t.Helper()
	ctx := context.Background()
	logits, err := m.Forward(ctx, prompt, 0)
	if err != nil {
		t.Fatal(err)
	}
	var ids []int32
	var margins []float64
	pos := len(prompt)
	for {
		best, second := -1, -1
		for i, v := range logits {
			switch {
			case best < 0 || v > logits[best]:
				best, second = i, best
			case second < 0 || v > logits[second]:
				second = i
			}
		}
		ids = append(ids, int32(best))
		margins = append(margins, float64(logits[best]-logits[second]))
		if len(ids) == n {
			return ids, margins
		}
		if logits, err = m.Forward(ctx, []int32{int32(best)}, pos); err != nil {
			t.Fatal(err)
		}
		pos++
	}
}

// decisivePrefix is the number of steps before the first near-tie.
func decisivePrefix(margins []float64) int {
	for i, m := range margins {
		if m < archtest.DecisiveMargin {
			return i
		}
	}
	return len(margins)
}

// How checkArchGreedy runs the greedy steps.
const (
	viaLogits = iota // Forward, the ids and the top-2 margins compared
	viaIDs           // Forward, the ids compared (a GPU's F16 KV cache moves the margins)
	viaDevice        // Model.Greedy: the backend's argmax and recorded decode step
)

// checkArchGreedy runs every tiny preset on be and compares the greedy ids
// with llama.cpp's, up to the decisive prefix, which must cover
// archtest.Tokens steps.
func checkArchGreedy(t *testing.T, be kernels.Backend, how int) {
	exp := archtest.Read(t)
	dir := t.TempDir()
	for _, preset := range archtest.Presets {
		t.Run(preset, func(t *testing.T) {
			c := exp.Case(t, preset)
			path := archtest.WriteFile(t, dir, preset, c)
			m, err := model.OpenModelErr(t, path, be, model.Options{Ctx: 64})
			if err != nil {
				// An architecture whose ops the backend lacks (gpt-oss's
				// attention sinks on the GPU) must be refused by name, never
				// run on something else.
				if !strings.Contains(err.Error(), "run gpt-oss on the CPU backend") || be.Name() == "cpu" || be.Name() == "host" {
					t.Fatal(err)
				}
				t.Logf("refused as it must be: %v", err)
				return
			}
			how := how
			if how == viaLogits && be.Name() == "host" && quantizedFile(t, path) {
				// The host reference multiplies quantized weights by float32
				// activations; llama.cpp and the CPU backend quantize the
				// activations (Q8_0 for MXFP4), which moves the margins by
				// more than the tolerance. Its ids must still match.
				how = viaIDs
			}
			var got []int32
			if how == viaDevice {
				got = greedyDevice(t, m, c.PromptIDs, archtest.Tokens)
			} else {
				var margins []float64
				got, margins = greedyMargins(t, m, c.PromptIDs, archtest.Tokens)
				for i := range archtest.Tokens {
					if how != viaLogits {
						break
					}
					if d := math.Abs(margins[i] - c.Top2Margins[i]); d > 0.02+0.01*c.Top2Margins[i] {
						t.Errorf("step %d: top-2 margin %.4f, llama.cpp %.4f", i, margins[i], c.Top2Margins[i])
					}
				}
			}
			if !slices.Equal(got, c.GeneratedIDs[:archtest.Tokens]) {
				t.Fatalf("greedy ids\n got %v\nwant %v (llama.cpp)", got, c.GeneratedIDs[:archtest.Tokens])
			}
		})
	}
}

// quantizedFile reports whether the file at path holds a tensor of a
// quantized type (gpt-oss's MXFP4 experts).
func quantizedFile(t *testing.T, path string) bool {
	t.Helper()
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, ti := range f.Tensors {
		if ti.Type != gguf.TypeF32 && ti.Type != gguf.TypeF16 {
			return true
		}
	}
	return false
}

// greedyDevice runs n greedy steps through Model.Greedy (the backend's own
// argmax, and its recorded decode step where it has one).
func greedyDevice(t *testing.T, m *model.Model, prompt []int32, n int) []int32 {
	t.Helper()
	ctx := context.Background()
	id, err := m.Greedy(ctx, prompt, 0)
	if err != nil {
		t.Fatal(err)
	}
	ids := []int32{id}
	for pos := len(prompt); len(ids) < n; pos++ {
		if id, err = m.Greedy(ctx, []int32{id}, pos); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// TestArchGreedy: every architecture's tiny preset gives llama.cpp's
// greedy tokens (and its top-2 margins) on the host reference and the CPU
// backend.
func TestArchGreedy(t *testing.T) {
	for _, b := range model.Backends(t) {
		t.Run(b.Name, func(t *testing.T) { checkArchGreedy(t, b.Backend, viaLogits) })
	}
}

// TestArchPresetsCovered: every registered architecture has a tiny preset
// in archtest.Presets.
func TestArchPresetsCovered(t *testing.T) {
	covered := map[string]bool{"llama": true, "qwen2": true} // stories260K, synth-kq; TestQwen2AgainstReference
	for _, p := range archtest.Presets {
		covered[synth.Presets[p].Arch] = true
	}
	for _, a := range model.ArchNames() {
		if !covered[a] {
			t.Errorf("architecture %s has no preset checked against llama.cpp", a)
		}
	}
}

// llamaCpp is the llama.cpp wrapper that bench/llamacpp.sh installs, or
// FORGE_LLAMACPP; "" when neither exists.
func llamaCpp() string {
	if p := os.Getenv("FORGE_LLAMACPP"); p != "" {
		return p
	}
	_, file, _, _ := runtime.Caller(0)
	p := filepath.Join(filepath.Dir(file), "..", "..", "bench", "llamacpp", "llama")
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// TestArchLlamaCpp runs llama.cpp (its server, greedy, on the CPU with
// F32 KV cache and flash attention off) on every tiny preset's file and
// checks its ids against the committed ones. With
// FORGE_UPDATE_ARCH_EXPECTED=1 it writes the file instead: for a preset
// without a case it first picks the seed (the first of 1…256 whose
// 16-token greedy run, with weights of standard deviation 0.25 (gpt-oss: 0.1), on
// forge's host reference, has every top-2 margin at least 0.15, no
// end-of-text and at least 8 distinct tokens; a model that scales its
// embeddings up gets embeddings of deviation 0.06 and norm weights near 8).
func TestArchLlamaCpp(t *testing.T) {
	lc := llamaCpp()
	if lc == "" {
		t.Skip("llama.cpp is not installed: run bench/llamacpp.sh (or set FORGE_LLAMACPP) to check against it")
	}
	update := os.Getenv("FORGE_UPDATE_ARCH_EXPECTED") == "1"
	exp := &archtest.Expected{Cases: map[string]*archtest.Case{}}
	if b, err := os.ReadFile(filepath.Join(testmodels.Dir(), archtest.File)); err == nil {
		if err := json.Unmarshal(b, exp); err != nil {
			t.Fatal(err)
		}
	} else if !update {
		t.Fatal(err)
	}
	version, err := exec.Command(lc, "llama-server", "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("llama.cpp: %v: %s", err, version)
	}
	dir := t.TempDir()
	for _, preset := range archtest.Presets {
		c := exp.Cases[preset]
		if c == nil {
			if !update {
				t.Fatalf("%s has no case for %s (FORGE_UPDATE_ARCH_EXPECTED=1 adds it)", archtest.File, preset)
			}
			c = pickSeed(t, dir, preset)
		}
		path := archtest.WriteFile(t, dir, preset, c)
		ids, margins := llamaCppGreedy(t, lc, path, c.PromptIDs, archtest.Tokens)
		t.Logf("%s: llama.cpp %v, margins %.3f", preset, ids, margins)
		if update {
			c.GeneratedIDs, c.Top2Margins, c.DecisivePrefix = ids, margins, decisivePrefix(margins)
			exp.Cases[preset] = c
			continue
		}
		k := c.DecisivePrefix
		if !slices.Equal(ids[:k], c.GeneratedIDs[:k]) {
			t.Errorf("%s: llama.cpp gives %v, the committed file %v", preset, ids, c.GeneratedIDs)
		}
	}
	if update {
		exp.About = "llama.cpp's greedy ids for each architecture's tiny preset (forge gen's synthetic weights: pipeline/model archs_test.go writes the file from the preset, seed, std and mix). " +
			"Ids must equal llama.cpp's up to decisive_prefix: the steps before the first top-2 logit margin under 0.05."
		exp.LlamaCpp = strings.TrimSpace(strings.ReplaceAll(string(version), "\n", "; "))
		exp.Command = "FORGE_UPDATE_ARCH_EXPECTED=1 go test ./pipeline/model -run TestArchLlamaCpp (llama-server -c 256 -fa off -ctk f32 -ctv f32 -np 1; POST /completion {prompt: ids, n_predict: 16, temperature: 0, n_probs: 2, return_tokens: true})"
		b, err := json.MarshalIndent(exp, "", " ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(testmodels.Dir(), archtest.File), append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// pickSeed finds a seed whose greedy run is decisive (see TestArchLlamaCpp).
func pickSeed(t *testing.T, dir, preset string) *archtest.Case {
	cfg, err := synth.Presets[preset].Config()
	if err != nil {
		t.Fatal(err)
	}
	std, embedStd, normMean := 0.25, 0.0, 0.0
	if cfg.SwiGLULimit > 0 {
		// gpt-oss's clamped SwiGLU multiplies the gate by up+1: with
		// weights of deviation 0.25 the random model is chaotic, and the
		// last-bit differences of any two implementations (the experts'
		// inputs quantized to Q8_0 for MXFP4) move its logits by more
		// than their margins.
		std = 0.1
	}
	if cfg.EmbedScale > 0 {
		// A tied head and embeddings scaled by √Embd: with weights like the
		// others', each token's own embedding outweighs what the blocks add
		// and the model only repeats its last token.
		embedStd, normMean = 0.06, 8
	}
	for seed := uint64(1); seed <= 256; seed++ {
		c := &archtest.Case{Seed: seed, Std: std, EmbedStd: embedStd, NormMean: normMean, Mix: "F32", PromptIDs: archtest.Prompt}
		path := archtest.WriteFile(t, dir, preset, c)
		m := model.OpenModel(t, path, model.Backends(t)[0].Backend, model.Options{Ctx: 64})
		ids, margins := greedyMargins(t, m, c.PromptIDs, archtest.Tokens)
		m.Close()
		os.Remove(path)
		t.Logf("%s seed %d: %v, smallest margin %.3f", preset, seed, ids, slices.Min(margins))
		distinct := map[int32]bool{}
		for _, id := range ids {
			distinct[id] = true
		}
		if slices.Min(margins) >= 0.15 && !slices.Contains(ids, 2) && len(distinct) >= archtest.Tokens/2 {
			return c
		}
	}
	t.Fatalf("%s: no seed in 1…256 gives a decisive greedy run", preset)
	return nil
}

// llamaCppGreedy starts llama-server on path and asks it for n greedy
// tokens after prompt, with the top-2 log-probabilities of each step
// (their difference is the logits' margin).
func llamaCppGreedy(t *testing.T, lc, path string, prompt []int32, n int) ([]int32, []float64) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var logs bytes.Buffer
	cmd := exec.CommandContext(ctx, lc, "llama-server", "-m", path, "-c", "256", "--port", strconv.Itoa(port),
		"-fa", "off", "-ctk", "f32", "-ctv", "f32", "-np", "1", "--no-warmup", "-t", "2")
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	defer func() {
		cmd.Process.Kill()
		<-exited
	}()
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	for {
		select {
		case <-exited:
			t.Fatalf("llama-server exited: %s", logs.String())
		default:
		}
		if r, err := http.Get(base + "/health"); err == nil {
			r.Body.Close()
			if r.StatusCode == http.StatusOK {
				break
			}
		}
		if ctx.Err() != nil {
			cmd.Process.Kill()
			<-exited // its output is complete
			t.Fatalf("llama-server did not start: %s", logs.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	// One token more than wanted: the server gives no probabilities for
	// the last one.
	req, _ := json.Marshal(map[string]any{"prompt": prompt, "n_predict": n + 1, "temperature": 0, "n_probs": 2,
		"return_tokens": true, "cache_prompt": false})
	r, err := http.Post(base+"/completion", "application/json", bytes.NewReader(req))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	var out struct {
		Tokens []int32 `json:"tokens"`
		Probs  []struct {
			Top []struct {
				ID      int32   `json:"id"`
				Logprob float64 `json:"logprob"`
			} `json:"top_logprobs"`
		} `json:"completion_probabilities"`
	}
	if err := json.NewDecoder(r.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	if len(out.Tokens) < n || len(out.Probs) < n {
		t.Fatalf("llama-server returned %d tokens and %d steps of probabilities, want %d", len(out.Tokens), len(out.Probs), n)
	}
	margins := make([]float64, n)
	for i, p := range out.Probs[:n] {
		if len(p.Top) < 2 || p.Top[0].ID != out.Tokens[i] {
			t.Fatalf("step %d: top log-probabilities %+v do not start with the sampled %d (tokens %v, probabilities %+v)", i, p.Top, out.Tokens[i], out.Tokens, out.Probs)
		}
		margins[i] = math.Round((p.Top[0].Logprob-p.Top[1].Logprob)*1e4) / 1e4
	}
	return out.Tokens[:n], margins
}
