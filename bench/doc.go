// Package bench holds forge's load and decode benchmarks, strategy
// comparisons and timelines. Results are written to bench/results/.
package bench
