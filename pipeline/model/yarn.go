package model

import (
	"encoding/binary"
	"math"

	"github.com/forge-llm/forge/gguf"
	"github.com/forge-llm/forge/kernels"
)

// YaRN (gpt-oss's context extension) as llama.cpp applies it, in terms of
// the ops every backend has. For frequency pair k of a rotation of Dim
// dimensions, ggml rotates by
//
//	θ_k = p·base^(-2k/Dim) · (s·(1-r_k) + r_k)      s = 1/factor
//
// where the ramp r_k is 1 for the fast pairs (below YaRN's low correction
// dimension: extrapolated, unchanged), 0 for the slow ones (above the high
// one: interpolated by s) and linear between; and it multiplies cos and
// sin by m = 1 + 0.1·ln(factor), which scales every rotated query and key
// by m. So the pairs' frequencies are RoPE's with divisors
// 1/(s·(1-r_k) + r_k) (kernels.Rope.Freqs, yarnFreqs), and m scales each
// attention score by m² (Config.AttnScale, set by the architecture; the
// whole head must be rotated for that to hold).

// YaRN's β: the wavelengths, in rotations over the original context, that
// bound the ramp (llama.cpp's defaults, which no GGUF key overrides).
const yarnBetaFast, yarnBetaSlow = 32, 1

// yarnCorrDims is YaRN's ramp's low and high pair index, as ggml computes
// them in float32: the dimension whose wavelength fits β rotations into
// the original context, floored (β fast) and ceiled (β slow), clamped to
// [0, dim-1].
func yarnCorrDims(dim, origCtx int, base float32) (lo, hi float32) {
	corr := func(beta float32) float32 {
		return float32(dim) * float32(math.Log(float64(float32(origCtx)/(beta*2*math.Pi)))) / (2 * float32(math.Log(float64(base))))
	}
	lo = float32(math.Floor(float64(corr(yarnBetaFast))))
	hi = float32(math.Ceil(float64(corr(yarnBetaSlow))))
	return max(0, lo), min(float32(dim-1), hi)
}

// yarnDivisors are the Dim/2 frequency divisors of YaRN with the given
// factor over origCtx positions.
func yarnDivisors(dim, origCtx int, base, factor float32) []float32 {
	lo, hi := yarnCorrDims(dim, origCtx, base)
	s := 1 / factor
	d := make([]float32, dim/2)
	for k := range d {
		y := (float32(k) - lo) / max(0.001, hi-lo)
		r := 1 - min(1, max(0, y))
		d[k] = 1 / (s*(1-r) + r)
	}
	return d
}

// yarnMScale is YaRN's magnitude correction of the rotated values.
func yarnMScale(factor float32) float32 {
	if factor <= 1 {
		return 1
	}
	return 1 + 0.1*float32(math.Log(float64(factor)))
}

// yarnFreqs is c's YaRN divisors as an F32 weight on the host, for
// kernels.Rope.Freqs; nil without YaRN. (A backend that keeps its weights
// on a device has none of it: the architectures with YaRN run on the CPU.)
func yarnFreqs(c Config) *kernels.Weight {
	if c.YaRNFactor <= 0 {
		return nil
	}
	d := yarnDivisors(c.Rope.Dim, c.YaRNOrigCtx, c.Rope.Base, c.YaRNFactor)
	b := make([]byte, 4*len(d))
	for i, v := range d {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return &kernels.Weight{Name: "yarn_freqs", Type: gguf.TypeF32, Cols: len(d), Rows: 1, Host: b}
}
