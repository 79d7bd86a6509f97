package pipeline

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/pipeline/synth"
)

// profileOf reads the profile dir holds for the file at path (nil: none).
func profileOf(t *testing.T, dir, path string) *expertProfile {
	t.Helper()
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	id, err := fileIdentity(f)
	if err != nil {
		t.Fatal(err)
	}
	prof, err := loadProfile(dir, id)
	if err != nil {
		t.Fatal(err)
	}
	return prof
}

// usesOf is a closed model's count of tokens routed to each expert.
func usesOf(m *Model) [][]int64 {
	u := make([][]int64, m.Config().Layers)
	for l := range u {
		u[l] = make([]int64, m.sys.Experts(l))
		for e := range u[l] {
			u[l][e] = m.sys.ExpertUses(l, e)
		}
	}
	return u
}

// TestExpertProfileBatched: requests run together by the batching
// scheduler (forge serve's path) record their routing in the profile as
// the same requests run one at a time on the single-request path do:
// the mixture op counts for both, and on the CPU a batched step routes
// each row as Forward does, so the two profiles are equal.
func TestExpertProfileBatched(t *testing.T) {
	path := writeMoE(t, "tiny-mixtral", synth.MixQ4_KM)
	prompts := [][]int32{{1, 5, 9}, {2, 7}, {3}}
	const maxTokens = 4
	run := func(dir string, batching Batching) {
		m, err := Open(context.Background(), path, Options{Threads: 2, ExpertProfiles: dir, Batching: batching})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make([]error, len(prompts))
		for i, p := range prompts {
			wg.Go(func() {
				_, errs[i] = m.Generate(context.Background(), "", GenerateOptions{PromptIDs: p, MaxTokens: maxTokens, IgnoreEOG: true})
			})
			if !batching.On {
				wg.Wait() // one at a time
			}
		}
		wg.Wait()
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
		for i, err := range errs {
			if err != nil {
				t.Fatalf("prompt %v: %v", prompts[i], err)
			}
		}
	}
	single, batched := t.TempDir(), t.TempDir()
	run(single, Batching{})
	run(batched, Batching{On: true, Deterministic: true})
	want, got := profileOf(t, single, path), profileOf(t, batched, path)
	if got == nil || want == nil {
		t.Fatalf("profiles: batched %v, single %v", got, want)
	}
	shape := synth.Presets["tiny-mixtral"]
	tokens := 0
	for _, p := range prompts {
		tokens += len(p) + maxTokens - 1 // the last token is not evaluated
	}
	var sum int64
	for _, k := range got.Uses[0] {
		sum += k
	}
	if want := int64(tokens * shape.ExpertsUsed); sum != want {
		t.Fatalf("block 0: %d (token, expert) uses recorded from batched steps, want %d", sum, want)
	}
	if fmt.Sprint(got.Uses) != fmt.Sprint(want.Uses) {
		t.Fatalf("batched requests' profile %v, the same requests one at a time %v", got.Uses, want.Uses)
	}
}

// TestExpertProfileConcurrentClose: two models of the same file, with the
// same profile folder, closing at once (an engine unloading two, or two
// processes) each add their counts: the profile holds the sum of both,
// whole, with no temporary file left behind.
func TestExpertProfileConcurrentClose(t *testing.T) {
	path := writeMoE(t, "tiny-qwen3moe", synth.MixQ4_KM)
	dir := t.TempDir()
	prompts := [][]int32{{1, 5, 9}, {4, 2, 8, 6}}
	models := make([]*Model, len(prompts))
	for i, p := range prompts {
		m, err := Open(context.Background(), path, Options{Threads: 1, ExpertProfiles: dir})
		if err != nil {
			t.Fatal(err)
		}
		models[i] = m
		if _, err := m.Generate(context.Background(), "", GenerateOptions{PromptIDs: p, MaxTokens: 3, IgnoreEOG: true}); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, len(models))
	for i, m := range models {
		wg.Go(func() {
			<-start
			errs[i] = m.Close()
		})
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	a, b := usesOf(models[0]), usesOf(models[1])
	prof := profileOf(t, dir, path)
	if prof == nil {
		t.Fatal("no profile after Close")
	}
	var total int64
	for l := range a {
		for e := range a[l] {
			if got := prof.uses(l, e); got != a[l][e]+b[l][e] {
				t.Fatalf("layer %d expert %d: %d tokens in the profile, want %d + %d", l, e, got, a[l][e], b[l][e])
			}
			total += prof.uses(l, e)
		}
	}
	if total == 0 {
		t.Fatal("nothing recorded")
	}
	assertNoTemp(t, dir)
}

// assertNoTemp fails if dir holds anything but profiles and their locks.
func assertNoTemp(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") && !strings.HasSuffix(e.Name(), ".json.lock") {
			t.Fatalf("left in the profile folder: %s", e.Name())
		}
	}
}

// TestAddToProfileConcurrent: many writers adding to one profile at once
// lose no count (each merges under the lock into what the last wrote).
func TestAddToProfileConcurrent(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "profiles") // made by the first writer
	const id, writers = "0123456789abcdef", 16
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			add := [][]int64{{1, 0, int64(w)}, {2, 3}}
			if err := addToProfile(dir, id, add); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	prof, err := loadProfile(dir, id)
	if err != nil || prof == nil {
		t.Fatalf("profile: %v, %v", prof, err)
	}
	want := [][]int64{{writers, 0, writers * (writers - 1) / 2}, {2 * writers, 3 * writers}}
	if !slices.EqualFunc(prof.Uses, want, slices.Equal) {
		t.Fatalf("profile %v, want %v", prof.Uses, want)
	}
	assertNoTemp(t, dir)
}
