// Package store finds GGUF files that other tools already downloaded, so a
// model can be named instead of located:
//
//   - Ollama keeps models under ~/.ollama/models (or $OLLAMA_MODELS): a
//     manifest per name and tag at manifests/<registry>/<namespace>/<model>/<tag>
//     lists layers by digest, and the layer of media type
//     application/vnd.ollama.image.model is the GGUF file, stored as
//     blobs/sha256-<hex>. "llama3.2" means registry.ollama.ai/library/llama3.2:latest.
//   - The Hugging Face hub cache (~/.cache/huggingface/hub, or $HF_HUB_CACHE,
//     or $HF_HOME/hub) keeps a repository org/name under
//     models--org--name/snapshots/<revision>/, with refs/main naming the
//     revision to use. "org/name" picks its one .gguf file, "org/name:Q4_K_M"
//     the file whose name contains the quantization, "org/name/file.gguf" a
//     file by name.
//
// Nothing is downloaded: a name that is not in a store is an error.
package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// ErrNotFound is wrapped by Resolve when no store has the model.
var ErrNotFound = errors.New("store: model not found")

// Stores are the directories to search; empty fields are skipped.
type Stores struct {
	Ollama string // Ollama's models directory (holding manifests/ and blobs/)
	HF     string // the Hugging Face hub cache (holding models--*)
}

// Default returns the stores of the current user, honouring OLLAMA_MODELS,
// HF_HUB_CACHE and HF_HOME as the tools do.
func Default() Stores {
	home, _ := os.UserHomeDir()
	s := Stores{}
	if d := os.Getenv("OLLAMA_MODELS"); d != "" {
		s.Ollama = d
	} else if home != "" {
		s.Ollama = filepath.Join(home, ".ollama", "models")
	}
	switch {
	case os.Getenv("HF_HUB_CACHE") != "":
		s.HF = os.Getenv("HF_HUB_CACHE")
	case os.Getenv("HF_HOME") != "":
		s.HF = filepath.Join(os.Getenv("HF_HOME"), "hub")
	case home != "":
		s.HF = filepath.Join(home, ".cache", "huggingface", "hub")
	}
	return s
}

// Resolve returns the path of a model: an existing file as it is, else
// the model of that name in a store (see Lookup). It is for a local user
// naming files on the command line; a server answering clients uses
// Lookup, which never takes a path.
func (s Stores) Resolve(name string) (string, error) {
	if name == "" {
		return "", fmt.Errorf("store: empty model name")
	}
	st, err := os.Stat(name)
	if err == nil && st.Mode().IsRegular() {
		return name, nil
	}
	if looksLikePath(name) {
		// A path that is not a regular file is not a store name either:
		// say what is wrong with the file rather than with the name.
		if err == nil {
			err = fmt.Errorf("not a regular file")
		}
		return "", fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	return s.Lookup(name)
}

// Lookup returns the path of the model of that name in Ollama's store,
// else in the Hugging Face cache. Names are parsed strictly (ParseOllama,
// ParseHF): no name reaches outside a store, manifests are read only as
// small regular files, and the model file found must be a regular file.
func (s Stores) Lookup(name string) (string, error) {
	var errs []error
	if s.Ollama != "" {
		p, err := s.ollama(name)
		if err == nil {
			return p, nil
		}
		errs = append(errs, err)
	}
	if s.HF != "" && strings.Contains(name, "/") {
		p, err := s.hf(name)
		if err == nil {
			return p, nil
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return "", fmt.Errorf("%w: %q: no store is configured", ErrNotFound, name)
	}
	return "", fmt.Errorf("%w: %q: %w", ErrNotFound, name, errors.Join(errs...))
}

// manifest is the part of an Ollama manifest we read.
type manifest struct {
	Layers []struct {
		MediaType string `json:"mediaType"`
		Digest    string `json:"digest"`
		Size      int64  `json:"size"`
	} `json:"layers"`
}

const ollamaModelLayer = "application/vnd.ollama.image.model"

func (s Stores) ollama(name string) (string, error) {
	n, err := ParseOllama(name)
	if err != nil {
		return "", fmt.Errorf("ollama: %w", err)
	}
	mpath := filepath.Join(s.Ollama, "manifests", n.Host, n.Namespace, n.Model, n.Tag)
	data, err := readSmall(mpath, maxManifest)
	if err != nil {
		return "", fmt.Errorf("ollama: %w", err)
	}
	var m manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return "", fmt.Errorf("ollama: manifest %s: %w", mpath, err)
	}
	for _, l := range m.Layers {
		if l.MediaType != ollamaModelLayer {
			continue
		}
		hex, ok := strings.CutPrefix(l.Digest, "sha256:")
		if !ok || !component(hex) || strings.Contains(hex, ".") {
			return "", fmt.Errorf("ollama: manifest %s: model layer digest %q is not sha256:<hex>", mpath, l.Digest)
		}
		blob := filepath.Join(s.Ollama, "blobs", "sha256-"+hex)
		if err := regularFile(blob); err != nil {
			return "", fmt.Errorf("ollama: manifest %s: model blob: %w", mpath, err)
		}
		return blob, nil
	}
	return "", fmt.Errorf("ollama: manifest %s has no %s layer", mpath, ollamaModelLayer)
}

func (s Stores) hf(name string) (string, error) {
	n, err := ParseHF(name)
	if err != nil {
		return "", fmt.Errorf("hf: %w", err)
	}
	repo, quant, file := n.Repo, n.Quant, n.File
	dir := filepath.Join(s.HF, "models--"+strings.ReplaceAll(repo, "/", "--"))
	rev := "main"
	if b, err := readSmall(filepath.Join(dir, "refs", "main"), maxManifest); err == nil {
		rev = strings.TrimSpace(string(b))
		if !component(rev) {
			return "", fmt.Errorf("hf: %s: refs/main is not a revision", dir)
		}
	}
	snap := filepath.Join(dir, "snapshots", rev)
	if _, err := os.Stat(snap); err != nil {
		return "", fmt.Errorf("hf: %w", err)
	}
	if file != "" {
		p := filepath.Join(snap, filepath.FromSlash(file))
		if !strings.HasPrefix(p, snap+string(filepath.Separator)) {
			return "", fmt.Errorf("hf: bad file name %q", file)
		}
		if err := regularFile(p); err != nil {
			return "", fmt.Errorf("hf: %w", err)
		}
		return p, nil
	}
	var ggufs []string
	err = filepath.WalkDir(snap, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(strings.ToLower(d.Name()), ".gguf") {
			ggufs = append(ggufs, p)
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("hf: %s: %w", snap, err)
	}
	slices.Sort(ggufs)
	if quant != "" {
		var keep []string
		for _, p := range ggufs {
			if strings.Contains(strings.ToUpper(filepath.Base(p)), strings.ToUpper(quant)) {
				keep = append(keep, p)
			}
		}
		ggufs = keep
	}
	switch len(ggufs) {
	case 0:
		return "", fmt.Errorf("hf: no .gguf file in %s matches %q", snap, name)
	case 1:
		if err := regularFile(ggufs[0]); err != nil {
			return "", fmt.Errorf("hf: %w", err)
		}
		return ggufs[0], nil
	}
	var names []string
	for _, p := range ggufs {
		names = append(names, filepath.Base(p))
	}
	return "", fmt.Errorf("hf: %q is ambiguous in %s: %s (name one as org/name:QUANT or org/name/FILE)", name, snap, strings.Join(names, ", "))
}

// looksLikePath reports whether a command-line model name can only be a
// file: it is absolute or starts with ./ or ../ ("org/name/file.gguf"
// is a Hugging Face name).
func looksLikePath(name string) bool {
	return filepath.IsAbs(name) || strings.HasPrefix(name, "./") || strings.HasPrefix(name, "../")
}
