package dequant

import (
	"fmt"
	"runtime"
	"sync"

	"github.com/forge-llm/forge/gguf"
)

// minBlocksPerWorker keeps tiny tensors on one goroutine: starting a
// goroutine costs about a microsecond, the time to decode ~2 KiB.
const minBlocksPerWorker = 64

// ParallelToFloat32 is ToFloat32 split across workers goroutines (workers
// ≤ 0 means runtime.GOMAXPROCS(0)). Each worker decodes one contiguous
// range of whole blocks, so the result is identical to ToFloat32's.
func ParallelToFloat32(t gguf.Type, src []byte, dst []float32, workers int) error {
	dec := decoderFor(t)
	if dec == nil {
		return fmt.Errorf("dequant: parallel to float32: type %s is not supported", t)
	}
	need, err := checkSizes("parallel to float32", t, len(src), len(dst))
	if err != nil {
		return err
	}
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	bs, bb := blockShape[t].size, blockShape[t].bytes
	nblocks := len(dst) / bs
	workers = min(workers, max(1, nblocks/minBlocksPerWorker))
	if workers <= 1 {
		dec(src[:need], dst)
		return nil
	}
	per := (nblocks + workers - 1) / workers
	var wg sync.WaitGroup
	for b0 := 0; b0 < nblocks; b0 += per {
		b1 := min(b0+per, nblocks)
		wg.Add(1)
		go func() {
			defer wg.Done()
			dec(src[b0*bb:b1*bb], dst[b0*bs:b1*bs])
		}()
	}
	wg.Wait()
	return nil
}
