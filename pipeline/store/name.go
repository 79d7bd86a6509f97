package store

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// ErrBadName is wrapped (with ErrNotFound) for a name that is not a
// well-formed store name. Names come from HTTP clients, so they are parsed
// strictly: every part is a plain component (letters, digits, '.', '_',
// '-', not starting with '.'), so that no name can climb out of a store
// or point at a file the store does not hold.
var ErrBadName = errors.New("store: malformed model name")

// MaxNameLen bounds a model name.
const MaxNameLen = 512

// maxComponent bounds one part of a name.
const maxComponent = 128

// OllamaName is a parsed Ollama model name: [host/][namespace/]model[:tag].
type OllamaName struct {
	Host, Namespace, Model, Tag string
}

// HFName is a parsed Hugging Face name: [hf.co/]org/repo[:QUANT] or
// [hf.co/]org/repo/path/to/file.gguf.
type HFName struct {
	Repo  string // org/repo
	File  string // slash-separated path inside the snapshot, or ""
	Quant string
}

func badName(name, why string) error {
	if len(name) > 64 {
		name = name[:64] + "…"
	}
	return fmt.Errorf("%w: %w: %q: %s", ErrNotFound, ErrBadName, name, why)
}

// component reports whether s is a plain path component.
func component(s string) bool {
	if s == "" || len(s) > maxComponent || s[0] == '.' || s[0] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// host reports whether s is a registry host, with an optional :port.
func host(s string) bool {
	h, port, ok := strings.Cut(s, ":")
	if ok {
		if port == "" || len(port) > 5 {
			return false
		}
		for i := 0; i < len(port); i++ {
			if port[i] < '0' || port[i] > '9' {
				return false
			}
		}
	}
	return component(h) && !strings.Contains(h, "_")
}

// ParseOllama parses an Ollama model name with Ollama's defaults
// (registry.ollama.ai, library, latest).
func ParseOllama(name string) (OllamaName, error) {
	n := OllamaName{Host: "registry.ollama.ai", Namespace: "library", Tag: "latest"}
	if name == "" || len(name) > MaxNameLen {
		return n, badName(name, "empty or too long")
	}
	rest := name
	if i := strings.LastIndexByte(rest, ':'); i > strings.LastIndexByte(rest, '/') {
		rest, n.Tag = rest[:i], rest[i+1:]
		if !component(n.Tag) {
			return n, badName(name, "bad tag")
		}
	}
	parts := strings.Split(rest, "/")
	switch len(parts) {
	case 1:
		n.Model = parts[0]
	case 2:
		n.Namespace, n.Model = parts[0], parts[1]
	case 3:
		n.Host, n.Namespace, n.Model = parts[0], parts[1], parts[2]
		if !host(n.Host) {
			return n, badName(name, "bad registry host")
		}
	default:
		return n, badName(name, "more than host/namespace/model")
	}
	if !component(n.Namespace) || !component(n.Model) {
		return n, badName(name, "bad namespace or model")
	}
	return n, nil
}

// ParseHF parses a Hugging Face cache name.
func ParseHF(name string) (HFName, error) {
	var n HFName
	if name == "" || len(name) > MaxNameLen {
		return n, badName(name, "empty or too long")
	}
	rest := name
	rest = strings.TrimPrefix(rest, "hf.co/")
	rest = strings.TrimPrefix(rest, "huggingface.co/")
	if i := strings.LastIndexByte(rest, ':'); i >= 0 {
		rest, n.Quant = rest[:i], rest[i+1:]
		if !component(n.Quant) {
			return n, badName(name, "bad quantization")
		}
	}
	parts := strings.Split(rest, "/")
	if len(parts) < 2 {
		return n, badName(name, "not org/name")
	}
	for _, p := range parts {
		if !component(p) {
			return n, badName(name, "bad path component")
		}
	}
	n.Repo = parts[0] + "/" + parts[1]
	if len(parts) > 2 {
		if n.Quant != "" {
			return n, badName(name, "both a file and a quantization")
		}
		n.File = strings.Join(parts[2:], "/")
	}
	return n, nil
}

// maxManifest bounds an Ollama manifest or a Hugging Face ref: both are
// small JSON or text files.
const maxManifest = 1 << 20

// readSmall reads a regular file of at most limit bytes. It opens without
// blocking (a FIFO would otherwise hold the caller forever) and checks the
// opened file, not the name, so that a swap between check and read cannot
// hand it a device or a pipe.
func readSmall(path string, limit int64) ([]byte, error) {
	f, err := openNonblock(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", st.Name())
	}
	if st.Size() > limit {
		return nil, fmt.Errorf("%s: %d bytes, more than %d", st.Name(), st.Size(), limit)
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: more than %d bytes", st.Name(), limit)
	}
	return b, nil
}

// regularFile checks that path (after symlinks) is a regular file.
func regularFile(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s: not a regular file", st.Name())
	}
	return nil
}
