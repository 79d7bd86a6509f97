//go:build !unix

package pipeline

// willNeed is a no-op where madvise is missing.
func willNeed(b []byte) {}
