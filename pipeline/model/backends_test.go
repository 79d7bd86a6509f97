package model

import (
	"testing"

	"github.com/forge-llm/forge/kernels/cpu"
)

func init() {
	// The model tests run on the plain host backend and on the CPU backend
	// with two threads (so the parallel paths run under -race).
	testBackends = func(t *testing.T) []testBackend {
		b := cpu.New(2)
		t.Cleanup(b.Close)
		return []testBackend{{"host", hostBackend{}}, {"cpu", b}}
	}
}
