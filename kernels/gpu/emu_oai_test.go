package gpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
	"github.com/forge-llm/forge/kernels/conformance"
	"github.com/forge-llm/forge/kernels/cpu"
	"github.com/forge-llm/forge/rocm"
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

// TestEmuSwiGLUOAI: oai.cu's swiglu_oai at both widths, launched as
// SwiGLUOAI launches it, against the CPU backend's SwiGLUOAI, on values
// that cross the clamps (gate and up spread over ±20, limit 7).
func TestEmuSwiGLUOAI(t *testing.T) {
	rng := emuRNG(t)
	const n = 5000
	for _, ed := range emuDevices {
		warp := ed.dev.Warp
		g, u := conformance.RandomVector(rng, n, 8), conformance.RandomVector(rng, n, 8)
		var job emuJob
		dst := job.zeros(4*n, true)
		job.launch("swiglu_oai", grid1(n), rocm.D1(256), eP(dst, 0), eP(job.f32(g), 0), eP(job.f32(u), 0), eI(n),
			eF(1.702), eF(7))
		res := runEmu(t, warp, &job)
		cpuRef(t, func(b *cpu.Backend) {
			dt, _ := b.Alloc(n)
			if err := b.SwiGLUOAI(dt, cpuTensor(t, b, g), cpuTensor(t, b, u), n, 1.702, 7); err != nil {
				t.Fatal(err)
			}
			emuCheck(t, fmt.Sprintf("warp %d: swiglu_oai", warp), res.f32(dst), cpuRead(t, b, dt), 1e-6)
		})
	}
}
