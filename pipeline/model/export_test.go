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

// NewQ8Checker wraps inner (the CPU backend) in the q8 checker
// (q8check_test.go): copies made for every row count offered (oneRow
// unset) or for one row only; counts reports the rows copied and the
// products that read a copy.
func NewQ8Checker(inner kernels.Backend, oneRow bool) (be kernels.Backend, counts func() (filled, read int)) {
	fill := q8Fills[0].fill
	if oneRow {
		fill = q8Fills[1].fill
	}
	c := newQ8Checker(inner, fill)
	return c, c.counts
}
