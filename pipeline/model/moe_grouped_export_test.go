package model

// MoENoGrouped makes m run a prompt's mixture expert by expert
// (eachExpert) even where the backend has kernels.ExpertGrouper, keeping
// its row mixer and device routing.
func MoENoGrouped(m *Model) { m.moeState().noGrouped = true }

// MoEGroupedRuns is how many layers' mixtures m ran with grouped expert
// products (mixtureGrouped).
func MoEGroupedRuns(m *Model) int {
	if m.moe == nil {
		return 0
	}
	return m.moe.groupedRuns
}
