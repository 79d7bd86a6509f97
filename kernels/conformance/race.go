//go:build race

package conformance

// raceEnabled: the race detector slows every memory access of the float64
// reference (and of plain-Go kernels) by an order of magnitude; the real
// model shapes then run only in normal test runs (see shapesFor).
const raceEnabled = true
