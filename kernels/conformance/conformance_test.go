package conformance_test

import (
	"testing"

	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/conformance"
	"github.com/forge-llm/forge/kernels/cpu"
)

// TestCPU runs the whole suite on the CPU backend with two workers, so the
// parallel paths (and, under -race, their synchronisation) are exercised.
func TestCPU(t *testing.T) {
	conformance.RunWith(t, func(t *testing.T) kernels.Backend {
		b := cpu.New(2)
		t.Cleanup(b.Close)
		return b
	}, conformance.Options{PagedMatchesAttention: true})
}
