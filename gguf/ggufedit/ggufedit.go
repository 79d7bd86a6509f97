// Package ggufedit copies a GGUF file with edits: metadata values replaced
// or removed and tensor bytes changed. Tests use it to make hostile models
// (a NaN epsilon, a block count of 2³² − 1, NaN weights) from the bundled
// ones with the repository's own writer, so each file breaks exactly one
// rule.
package ggufedit

import (
	"fmt"
	"maps"
	"os"
	"slices"

	"github.com/forge-llm/forge/gguf"
)

// Edit says what changes between the source and the copy.
type Edit struct {
	// Set replaces (or adds, after the others) metadata values by key.
	Set map[string]gguf.Value
	// Drop removes metadata keys.
	Drop []string
	// Tensor, when set, may change a copy of each tensor's bytes in place.
	Tensor func(t *gguf.TensorInfo, data []byte)
}

// Copy writes src with e applied to dst.
func Copy(src, dst string, e Edit) error {
	f, err := gguf.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	w := gguf.NewWriter(out)
	drop := map[string]bool{}
	for _, k := range e.Drop {
		drop[k] = true
	}
	done := map[string]bool{}
	for _, kv := range f.Metadata {
		if drop[kv.Key] {
			continue
		}
		v := kv.Value
		if nv, ok := e.Set[kv.Key]; ok {
			v, done[kv.Key] = nv, true
		}
		w.AddKV(kv.Key, v)
	}
	for _, k := range slices.Sorted(maps.Keys(e.Set)) { // a deterministic file
		if !done[k] {
			w.AddKV(k, e.Set[k])
		}
	}
	for i := range f.Tensors {
		t := &f.Tensors[i]
		w.AddTensor(t.Name, t.Type, t.Dims...)
	}
	w.WriteHeader()
	for i := range f.Tensors {
		t := &f.Tensors[i]
		data, err := f.TensorData(t)
		if err != nil {
			out.Close()
			return fmt.Errorf("ggufedit: %s: %w", t.Name, err)
		}
		if e.Tensor != nil {
			data = append([]byte(nil), data...)
			e.Tensor(t, data)
		}
		w.WriteTensorData(t.Name, data)
	}
	err = w.Close() // errors are sticky: the first one of any call above
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("ggufedit: writing %s: %w", dst, err)
	}
	return nil
}
