// Package testmodels finds the real GGUF files bundled with the repository
// (gguf/testdata: stories260K and its quantized variants, the synthetic
// K-quant models, tokenizer vocabularies and llama.cpp's expected outputs).
// Tests in any package use it so that no test hard-codes a relative path.
package testmodels

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// Dir is the absolute path of gguf/testdata.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "testdata")
}

// Path returns the absolute path of a bundled file (e.g.
// "stories260K-Q4_0.gguf" or "tokenizer/ggml-vocab-gpt-2.gguf") and fails
// the test if it is missing.
func Path(tb testing.TB, name string) string {
	tb.Helper()
	p := filepath.Join(Dir(), name)
	if _, err := os.Stat(p); err != nil {
		tb.Fatalf("testmodels: bundled file %s: %v", name, err)
	}
	return p
}

// Glob returns the bundled files matching pattern (filepath.Match syntax,
// relative to gguf/testdata).
func Glob(tb testing.TB, pattern string) []string {
	tb.Helper()
	m, err := filepath.Glob(filepath.Join(Dir(), pattern))
	if err != nil || len(m) == 0 {
		tb.Fatalf("testmodels: no bundled file matches %s (%v)", pattern, err)
	}
	return m
}
