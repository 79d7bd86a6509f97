package model

import (
	"testing"

	"github.com/forge-llm/forge/kernels"
)

// What the external tests (package model_test) use of the internal test
// helpers.

// TestBackend is one backend the model tests run on.
type TestBackend struct {
	Name    string
	Backend kernels.Backend
}

// Backends returns the backends to test (the host reference, and the
// CPU and GPU backends where backends_test.go adds them).
func Backends(t *testing.T) []TestBackend {
	var out []TestBackend
	for _, b := range testBackends(t) {
		out = append(out, TestBackend{b.name, b.be})
	}
	return out
}

// OpenModel opens the model at path on be for one test.
func OpenModel(t testing.TB, path string, be kernels.Backend, o Options) *Model {
	m, _ := openModel(t, path, be, o)
	return m
}

// OpenModelErr opens the model at path on be for one test, returning
// model.New's error instead of failing.
func OpenModelErr(t testing.TB, path string, be kernels.Backend, o Options) (*Model, error) {
	t.Helper()
	_, cfg, w := openWeights(t, path)
	m, err := New(be, cfg, w, o)
	if err != nil {
		return nil, err
	}
	t.Cleanup(m.Close)
	return m, nil
}

// RopeParams is the RoPE description the model gives its backend.
func RopeParams(m *Model) kernels.Rope { return m.ropes[0] }

var (
	CheckAgainstReference = checkAgainstReference
	Tolerance             = tolerance
)

// OpenGPU opens device 0 for one test, skipping where there is none.
var OpenGPU = openGPU
