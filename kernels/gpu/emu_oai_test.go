package gpu

import (
	"encoding/binary"
	"math"
	"math/rand/v2"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
)

// randomSinks is a host F32 weight of one random sink logit per head, in
// [-2, 3): some below the heads' scores, some above (the kernels' two
// branches of folding a sink in).
func randomSinks(rng *rand.Rand, heads int) *kernels.Weight {
	b := make([]byte, 4*heads)
	for h := range heads {
		binary.LittleEndian.PutUint32(b[4*h:], math.Float32bits(float32(rng.Float64()*5-2)))
	}
	return &kernels.Weight{Name: "sinks", Type: gguf.TypeF32, Cols: heads, Rows: 1, Host: b}
}

// emuSinks is the kernel argument for at's sinks: a buffer of the job
// holding them, or null.
func emuSinks(job *emuJob, at kernels.Attn) emuArg {
	if at.Sinks == nil {
		return eNull()
	}
	return eP(job.bytes(at.Sinks.Host), 0)
}
