//go:build unix

package store

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// Names that climb out of the store, are absolute, or have empty or odd
// parts are rejected before any file is touched.
func TestParseRejects(t *testing.T) {
	for _, name := range []string{
		"", "../x", "a/../b", "../../../../proc/self/root/dev:zero", "/etc/passwd", "a//b", "a/b/c/d",
		".hidden", "x:..", "x:", "a/b:c/d", `a\b`, "a b", "a\x00b", "host_name/ns/m", "h:99999999/n/m",
		strings.Repeat("a", 200), "ü",
	} {
		if _, err := ParseOllama(name); !errors.Is(err, ErrBadName) || !errors.Is(err, ErrNotFound) {
			t.Errorf("ParseOllama(%q) = %v, want ErrBadName", name, err)
		}
	}
	for _, name := range []string{"", "org", "org/../x", "org/name/../../x.gguf", "/org/name", "org//name", "org/name:", "org/name/f.gguf:Q4"} {
		if _, err := ParseHF(name); !errors.Is(err, ErrBadName) {
			t.Errorf("ParseHF(%q) = %v, want ErrBadName", name, err)
		}
	}
	n, err := ParseOllama("localhost:11434/me/tiny:q4_0")
	if err != nil || n != (OllamaName{"localhost:11434", "me", "tiny", "q4_0"}) {
		t.Errorf("registry with a port: %+v %v", n, err)
	}
}

// A manifest that is a FIFO, a device or too large is refused at once,
// without blocking and without reading it whole.
func TestOllamaHostileManifests(t *testing.T) {
	dir := t.TempDir()
	mdir := filepath.Join(dir, "manifests", "registry.ollama.ai", "library")
	for _, m := range []string{"fifo", "big", "dev"} {
		if err := os.MkdirAll(filepath.Join(mdir, m), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Mkfifo(filepath.Join(mdir, "fifo", "latest"), 0o644); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(mdir, "big", "latest"), `{"layers":[]}`+strings.Repeat(" ", maxManifest))
	if err := os.Symlink("/dev/zero", filepath.Join(mdir, "dev", "latest")); err != nil {
		t.Fatal(err)
	}
	s := Stores{Ollama: dir}
	for _, name := range []string{"fifo", "big", "dev"} {
		_, err := s.Lookup(name)
		if !errors.Is(err, ErrNotFound) {
			t.Errorf("%s: %v, want ErrNotFound", name, err)
		}
	}
	if _, err := s.Lookup(dir + "/blobs/x"); !errors.Is(err, ErrBadName) {
		t.Errorf("Lookup of a path: %v", err)
	}
}

// FuzzStoreName: the parsers never panic, and every name they accept
// maps to paths inside the store.
func FuzzStoreName(f *testing.F) {
	for _, s := range []string{"llama3.2", "llama3.2:1b", "someone/tiny:q4", "hf.co/org/repo:Q8_0", "org/name/sub/f.gguf",
		"../../../../proc/self/root/dev:zero", "a/./b", "x:y:z", "localhost:8080/a/b:c", "/abs", "a\\b"} {
		f.Add(s)
	}
	root := filepath.FromSlash("/store")
	f.Fuzz(func(t *testing.T, name string) {
		if n, err := ParseOllama(name); err == nil {
			p := filepath.Join(root, "manifests", n.Host, n.Namespace, n.Model, n.Tag)
			want := filepath.Join(root, "manifests", n.Host, n.Namespace, n.Model, n.Tag)
			if p != filepath.Clean(want) || !strings.HasPrefix(p, filepath.Join(root, "manifests")+string(filepath.Separator)) ||
				strings.Count(p[len(root):], string(filepath.Separator)) != 5 {
				t.Fatalf("ParseOllama(%q) = %+v: manifest path %q escapes or skips a level", name, n, p)
			}
		} else if !errors.Is(err, ErrNotFound) {
			t.Fatalf("ParseOllama(%q): %v does not wrap ErrNotFound", name, err)
		}
		if n, err := ParseHF(name); err == nil {
			parts := strings.Split(n.Repo+"/"+n.File, "/")
			if n.File == "" {
				parts = parts[:2]
			}
			for _, c := range parts {
				if !component(c) || c == "." || c == ".." {
					t.Fatalf("ParseHF(%q) = %+v: component %q", name, n, c)
				}
			}
			snap := filepath.Join(root, "snap")
			if n.File != "" && !strings.HasPrefix(filepath.Join(snap, filepath.FromSlash(n.File)), snap+string(filepath.Separator)) {
				t.Fatalf("ParseHF(%q): file %q escapes", name, n.File)
			}
		}
	})
}
