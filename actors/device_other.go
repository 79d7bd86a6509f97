//go:build !linux

package actors

// anonMemory: elsewhere the ring is pinned by the driver's allocator.
func anonMemory(n int) []byte { return nil }

func freeAnonMemory(b []byte) error { return nil }

func populateWrite(b []byte) {
	for k := 0; k < len(b); k += pageSize {
		b[k] = 0
	}
}
