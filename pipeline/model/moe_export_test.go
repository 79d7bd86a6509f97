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

// MoENoMixer makes m move its mixture's rows with Scale and Add (the
// composition) even where the backend has kernels.RowMixer.
func MoENoMixer(m *Model) {
	m.moe = newMoeState(m.Cfg, m.batch)
	m.moe.noMixer = true
}

// MoEMixer reports whether m's mixtures move their rows with the
// backend's RowMixer.
func MoEMixer(m *Model) bool { return m.moe != nil && m.moe.rowMixer() != nil }

// RouteOnHost is the host router of Mixtral and Qwen3-MoE (route), for a
// test backend that routes "on the device" with it.
func RouteOnHost(logits []float32, n, experts, k int, sel []int32, w []float32) {
	route(logits, n, experts, k, sel, w, make([]float32, experts))
}

// MoEDeviceSteps is how many layers' one-token mixtures m routed on the
// device (kernels.ExpertRouter).
func MoEDeviceSteps(m *Model) int {
	if m.moe == nil {
		return 0
	}
	return m.moe.dev.steps
}

// DecodeGraphRecorded reports whether m replays a recorded decode step.
func DecodeGraphRecorded(m *Model) bool { return m.graph != nil }

// RouteTopKOnHost is gpt-oss's host router (routeTopK), for a test
// backend's RouteTopK.
func RouteTopKOnHost(logits []float32, n, experts, k int, sel []int32, w []float32) {
	routeTopK(logits, n, experts, k, sel, w)
}

// MoENoMixNorm keeps m's device-routed weighted sums their own op.
func MoENoMixNorm(m *Model) { m.moeState().dev.noMixNorm = true }

// MixNormed is how many weighted sums m fused with the norm after them.
func MixNormed(m *Model) int { return m.mixNormed }

// MoENoFusedRoute keeps m's device-routed router product and routing
// their own ops.
func MoENoFusedRoute(m *Model) { m.moeState().dev.noFusedRoute = true }
