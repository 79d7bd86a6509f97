package kernels

import "math"

// First is the first position the token at position pos attends to: 0, or
// with a sliding window the oldest position inside it.
func (a Attn) First(pos int) int {
	if a.Window > 0 && pos-a.Window+1 > 0 {
		return pos - a.Window + 1
	}
	return 0
}

// Cap applies the score soft-cap (Softcap·tanh(s/Softcap)) to a scaled
// score; s itself without one.
func (a Attn) Cap(s float32) float32 {
	if a.Softcap > 0 {
		return a.Softcap * float32(math.Tanh(float64(s/a.Softcap)))
	}
	return s
}

// Plain reports whether the attention is the causal one over every earlier
// position, with no window, no soft-cap and no sinks (what every backend's
// fast kernels compute).
func (a Attn) Plain() bool { return a.Window <= 0 && a.Softcap <= 0 && a.Sinks == nil }
