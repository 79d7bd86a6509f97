package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Entry is one model found in a store.
type Entry struct {
	// Name resolves to this model (Resolve): name:tag, or
	// namespace/name:tag and host/namespace/name:tag outside Ollama's
	// library; org/name for a Hugging Face repository with one GGUF file,
	// org/name/FILE for each file of one with several.
	Name  string
	Store string // "ollama" or "hf"
	Path  string // the GGUF file
	Size  int64  // bytes
}

// List returns the models of both stores, Ollama's first, each sorted by
// name. A store that does not exist lists nothing; an entry that cannot
// be resolved (a manifest without a model layer, a missing blob) is left
// out. Errors reading a store that exists are returned with what was found.
func (s Stores) List() ([]Entry, error) {
	var out []Entry
	var errs []error
	if s.Ollama != "" {
		es, err := s.listOllama()
		out = append(out, es...)
		errs = append(errs, err)
	}
	if s.HF != "" {
		es, err := s.listHF()
		out = append(out, es...)
		errs = append(errs, err)
	}
	return out, errors.Join(errs...)
}

// ollamaDefaultHost and ollamaDefaultNS are left out of listed names, as
// Ollama's own list does.
const (
	ollamaDefaultHost = "registry.ollama.ai"
	ollamaDefaultNS   = "library"
)

func (s Stores) listOllama() ([]Entry, error) {
	root := filepath.Join(s.Ollama, "manifests")
	if _, err := os.Stat(root); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	var out []Entry
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		parts := strings.Split(filepath.ToSlash(rel), "/")
		if len(parts) != 4 { // host/namespace/model/tag
			return nil
		}
		host, ns, model, tag := parts[0], parts[1], parts[2], parts[3]
		name := model + ":" + tag
		switch {
		case host != ollamaDefaultHost:
			name = host + "/" + ns + "/" + name
		case ns != ollamaDefaultNS:
			name = ns + "/" + name
		}
		blob, err := s.ollama(name)
		if err != nil {
			return nil // not a model this store can resolve
		}
		fi, err := os.Stat(blob)
		if err != nil {
			return nil
		}
		out = append(out, Entry{Name: name, Store: "ollama", Path: blob, Size: fi.Size()})
		return nil
	})
	if err != nil {
		err = fmt.Errorf("store: listing %s: %w", root, err)
	}
	slices.SortFunc(out, func(a, b Entry) int { return strings.Compare(a.Name, b.Name) })
	return out, err
}

func (s Stores) listHF() ([]Entry, error) {
	dirs, err := os.ReadDir(s.HF)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("store: listing %s: %w", s.HF, err)
	}
	var out []Entry
	for _, d := range dirs {
		rest, ok := strings.CutPrefix(d.Name(), "models--")
		if !ok || !d.IsDir() {
			continue
		}
		org, name, ok := strings.Cut(rest, "--")
		if !ok || strings.Contains(name, "--") {
			continue
		}
		repo := org + "/" + name
		rev := "main"
		if b, err := readSmall(filepath.Join(s.HF, d.Name(), "refs", "main"), maxManifest); err == nil {
			rev = strings.TrimSpace(string(b))
		}
		snap := filepath.Join(s.HF, d.Name(), "snapshots", rev)
		var files []string
		filepath.WalkDir(snap, func(p string, e fs.DirEntry, err error) error {
			if err == nil && !e.IsDir() && strings.HasSuffix(strings.ToLower(e.Name()), ".gguf") {
				if rel, err := filepath.Rel(snap, p); err == nil {
					files = append(files, filepath.ToSlash(rel))
				}
			}
			return nil
		})
		slices.Sort(files)
		for _, f := range files {
			n := repo + "/" + f
			if len(files) == 1 {
				n = repo
			}
			p, err := s.hf(n)
			if err != nil {
				continue
			}
			fi, err := os.Stat(p)
			if err != nil {
				continue
			}
			out = append(out, Entry{Name: n, Store: "hf", Path: p, Size: fi.Size()})
		}
	}
	return out, nil
}
