package store

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// fakeOllama lays out a manifest and its blobs as Ollama does.
func fakeOllama(t *testing.T, dir, manifestPath, hex string) string {
	blob := filepath.Join(dir, "blobs", "sha256-"+hex)
	write(t, blob, "GGUF…")
	write(t, filepath.Join(dir, "blobs", "sha256-tmpl"), "{{ .Prompt }}")
	write(t, filepath.Join(dir, "manifests", manifestPath), `{"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.v2+json",
"config":{"mediaType":"application/vnd.docker.container.image.v1+json","digest":"sha256:cfg","size":10},
"layers":[{"mediaType":"application/vnd.ollama.image.template","digest":"sha256:tmpl","size":13},
{"mediaType":"application/vnd.ollama.image.model","digest":"sha256:`+hex+`","size":6}]}`)
	return blob
}

func TestOllama(t *testing.T) {
	dir := t.TempDir()
	latest := fakeOllama(t, dir, "registry.ollama.ai/library/llama3.2/latest", "aaa1")
	tagged := fakeOllama(t, dir, "registry.ollama.ai/library/llama3.2/1b", "bbb2")
	user := fakeOllama(t, dir, "registry.ollama.ai/someone/tiny/q4", "ccc3")
	other := fakeOllama(t, dir, "hf.co/org/repo/Q8_0", "ddd4")
	s := Stores{Ollama: dir}
	for name, want := range map[string]string{
		"llama3.2": latest, "llama3.2:latest": latest, "llama3.2:1b": tagged,
		"someone/tiny:q4": user, "hf.co/org/repo:Q8_0": other,
	} {
		got, err := s.Resolve(name)
		if err != nil || got != want {
			t.Errorf("Resolve(%q) = %q, %v; want %q", name, got, err, want)
		}
	}
	for _, name := range []string{"llama3.2:8b", "mistral", "../../etc/passwd:x"} {
		if _, err := s.Resolve(name); !errors.Is(err, ErrNotFound) {
			t.Errorf("Resolve(%q): %v, want ErrNotFound", name, err)
		}
	}
	// A manifest without a model layer says so.
	write(t, filepath.Join(dir, "manifests/registry.ollama.ai/library/empty/latest"), `{"layers":[]}`)
	if _, err := s.Resolve("empty"); err == nil || !strings.Contains(err.Error(), "no application/vnd.ollama.image.model layer") {
		t.Errorf("empty manifest: %v", err)
	}
}

func TestHF(t *testing.T) {
	dir := t.TempDir()
	repo := filepath.Join(dir, "models--TheOrg--Tiny-GGUF")
	write(t, filepath.Join(repo, "refs", "main"), "abc123\n")
	snap := filepath.Join(repo, "snapshots", "abc123")
	q4 := filepath.Join(snap, "tiny.Q4_K_M.gguf")
	q8 := filepath.Join(snap, "tiny.Q8_0.gguf")
	write(t, q4, "GGUF")
	write(t, q8, "GGUF")
	write(t, filepath.Join(snap, "README.md"), "hi")
	write(t, filepath.Join(repo, "snapshots", "old000", "tiny.F16.gguf"), "GGUF") // not the ref
	single := filepath.Join(dir, "models--a--b", "snapshots", "r1", "only.gguf")
	write(t, filepath.Join(dir, "models--a--b", "refs", "main"), "r1")
	write(t, single, "GGUF")

	s := Stores{HF: dir}
	for name, want := range map[string]string{
		"TheOrg/Tiny-GGUF:Q4_K_M": q4, "TheOrg/Tiny-GGUF:q8_0": q8, "hf.co/TheOrg/Tiny-GGUF:Q8_0": q8,
		"TheOrg/Tiny-GGUF/tiny.Q8_0.gguf": q8, "a/b": single,
	} {
		got, err := s.Resolve(name)
		if err != nil || got != want {
			t.Errorf("Resolve(%q) = %q, %v; want %q", name, got, err, want)
		}
	}
	if _, err := s.Resolve("TheOrg/Tiny-GGUF"); err == nil || !strings.Contains(err.Error(), "ambiguous") {
		t.Errorf("two files: %v", err)
	}
	if _, err := s.Resolve("TheOrg/Tiny-GGUF:F16"); !errors.Is(err, ErrNotFound) {
		t.Errorf("old snapshot only: %v", err)
	}
	if _, err := s.Resolve("TheOrg/Tiny-GGUF/../../x.gguf"); err == nil {
		t.Error("path escape accepted")
	}
}

func TestFileAndDefault(t *testing.T) {
	p := filepath.Join(t.TempDir(), "m.gguf")
	write(t, p, "GGUF")
	if got, err := (Stores{}).Resolve(p); err != nil || got != p {
		t.Errorf("file: %q %v", got, err)
	}
	if _, err := (Stores{}).Resolve("nothing"); !errors.Is(err, ErrNotFound) {
		t.Errorf("no stores: %v", err)
	}
	t.Setenv("OLLAMA_MODELS", "/x/ollama")
	t.Setenv("HF_HUB_CACHE", "")
	t.Setenv("HF_HOME", "/x/hf")
	d := Default()
	if d.Ollama != "/x/ollama" || d.HF != "/x/hf/hub" {
		t.Errorf("Default() = %+v", d)
	}
}
