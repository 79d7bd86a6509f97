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

// MoENoRows makes m run a short prompt's mixture without the products by
// id (mixtureRows).
func MoENoRows(m *Model) { m.moeState().noRows = true }

// MoERowRuns is how many layers' mixtures m ran as products by id
// (mixtureRows).
func MoERowRuns(m *Model) int {
	if m.moe == nil {
		return 0
	}
	return m.moe.rowRuns
}
