package model

import "testing"

// MoEPerExpert makes m run every mixture-of-experts step expert by
// expert, a decode step too (no shared gate and up product), for
// comparisons.
func MoEPerExpert(m *Model) {
	m.moe = newMoeState(m.Cfg, m.batch)
	m.moe.perExpert = true
}

// MoESharedDecodes is how many decode steps' mixtures ran their experts'
// gate and up products as one MatMuls.
func MoESharedDecodes(m *Model) int {
	if m.moe == nil {
		return 0
	}
	return m.moe.decodes
}

// StepBatchMatchesForward is batch_test.go's check (batched steps give
// Forward's logits bit for bit) on the model file at path.
func StepBatchMatchesForward(t *testing.T, path string, merge bool) {
	stepBatchMatchesForward(t, path, merge)
}
