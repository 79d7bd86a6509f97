//go:build !linux

package actors

// pageIn makes the pages of b (a view of the mapped file) resident by
// touching them.
func pageIn(b []byte) error { return touch(b) }
