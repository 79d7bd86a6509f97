package actors

import (
	"errors"
	"sync/atomic"

	"github.com/forge-llm/forge/gguf"
)

// pageSize is the stride at which touch faults pages in. 4 KiB is the
// smallest page on the platforms forge runs on; touching more often costs
// nothing extra.
const pageSize = 4096

// touch reads one byte of every page of b (a view of the mapped file), so
// the pages are in memory before the executor needs them, and turns the
// fault of a page past the end of a truncated file (SIGBUS) or an I/O error
// into a *gguf.FaultError instead of a crash.
func touch(b []byte) error {
	return gguf.CatchFault(func() {
		var sum byte
		for i := 0; i < len(b); i += pageSize {
			sum += b[i]
		}
		if len(b) > 0 {
			sum += b[len(b)-1]
		}
		sink.Add(uint32(sum))
	})
}

// sink keeps the compiler from dropping touch's reads.
var sink atomic.Uint32

// locate names the model file in a *gguf.FaultError raised reading its
// mapping (and, where the fault has an address, the offset in it).
func (s *System) locate(err error) error {
	if err != nil && !s.cfg.File.Locate(err) {
		var fe *gguf.FaultError
		if errors.As(err, &fe) && fe.File == "" {
			fe.File = s.cfg.File.Path
		}
	}
	return err
}
