package cpu

// dotF32 and axpyF32 are the float32 vector loops of attention; the
// architecture file may point them at assembly.
var (
	dotF32  = dotF32Go
	axpyF32 = axpyF32Go
)

// asmEnabled reports whether the architecture file installed assembly
// kernels (logged by tests and benchmarks).
var asmEnabled bool
