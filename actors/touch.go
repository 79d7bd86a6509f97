package actors

import (
	"fmt"
	"runtime/debug"
	"sync/atomic"
)

// pageSize is the stride at which touch faults pages in. 4 KiB is the
// smallest page on the platforms forge runs on; touching more often costs
// nothing extra.
const pageSize = 4096

// touch reads one byte of every page of b (a view of the mapped file), so
// the pages are in memory before the executor needs them, and turns the
// fault of a page past the end of a truncated file (SIGBUS) or an I/O error
// into an error instead of a crash.
func touch(b []byte) (err error) {
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if r := recover(); r != nil {
			if e, ok := r.(interface{ Addr() uintptr }); ok {
				err = fmt.Errorf("memory fault at %#x reading the mapped file (file truncated or I/O error)", e.Addr())
				return
			}
			panic(r)
		}
	}()
	var sum byte
	for i := 0; i < len(b); i += pageSize {
		sum += b[i]
	}
	if len(b) > 0 {
		sum += b[len(b)-1]
	}
	sink.Add(uint32(sum))
	return nil
}

// sink keeps the compiler from dropping touch's reads.
var sink atomic.Uint32
