package store

import (
	"path/filepath"
	"testing"
)

// TestList: both stores listed, each entry under a name that resolves to
// its file; unresolvable manifests and old snapshots left out; missing
// stores list nothing.
func TestList(t *testing.T) {
	odir, hdir := t.TempDir(), t.TempDir()
	latest := fakeOllama(t, odir, "registry.ollama.ai/library/llama3.2/latest", "aaa1")
	user := fakeOllama(t, odir, "registry.ollama.ai/someone/tiny/q4", "ccc3")
	other := fakeOllama(t, odir, "hf.co/org/repo/Q8_0", "ddd4")
	write(t, filepath.Join(odir, "manifests/registry.ollama.ai/library/empty/latest"), `{"layers":[]}`)

	repo := filepath.Join(hdir, "models--TheOrg--Tiny-GGUF")
	write(t, filepath.Join(repo, "refs", "main"), "abc123\n")
	q4 := filepath.Join(repo, "snapshots", "abc123", "tiny.Q4_K_M.gguf")
	q8 := filepath.Join(repo, "snapshots", "abc123", "tiny.Q8_0.gguf")
	write(t, q4, "GGUF")
	write(t, q8, "GGUF1")
	write(t, filepath.Join(repo, "snapshots", "old000", "tiny.F16.gguf"), "GGUF")
	single := filepath.Join(hdir, "models--a--b", "snapshots", "r1", "only.gguf")
	write(t, filepath.Join(hdir, "models--a--b", "refs", "main"), "r1")
	write(t, single, "GGUF")

	s := Stores{Ollama: odir, HF: hdir}
	got, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	want := []Entry{
		{"hf.co/org/repo:Q8_0", "ollama", other, 7},
		{"llama3.2:latest", "ollama", latest, 7},
		{"someone/tiny:q4", "ollama", user, 7},
		{"TheOrg/Tiny-GGUF/tiny.Q4_K_M.gguf", "hf", q4, 4},
		{"TheOrg/Tiny-GGUF/tiny.Q8_0.gguf", "hf", q8, 5},
		{"a/b", "hf", single, 4},
	}
	if len(got) != len(want) {
		t.Fatalf("List: %+v\nwant %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("entry %d: %+v, want %+v", i, got[i], want[i])
		}
		if p, err := s.Resolve(got[i].Name); err != nil || p != got[i].Path {
			t.Errorf("Resolve(%q) = %q, %v; want %q", got[i].Name, p, err, got[i].Path)
		}
	}
	none, err := Stores{Ollama: filepath.Join(odir, "nope"), HF: filepath.Join(hdir, "nope")}.List()
	if err != nil || len(none) != 0 {
		t.Errorf("missing stores: %v, %v", none, err)
	}
}
