package cpu

// dotF32 and axpyF32 are the float32 vector loops of attention; the
// architecture file may point them at assembly.
var (
	dotF32  = dotF32Go
	axpyF32 = axpyF32Go
	// scoresF32 and axpyRowsF32 run dotF32 and axpyF32 over a run of
	// keys or values stride floats apart (a head's slice of consecutive
	// cache rows) in one call: the same arithmetic per row, without a call
	// and slice checks per position.
	scoresF32   = scoresF32Go
	axpyRowsF32 = axpyRowsF32Go
	// siluMul and expShift are SiLUMul's and softmax's exponential loops
	// (math.Exp in float64, rounded to float32).
	siluMul  = siluMulGo
	expShift = expShiftGo
)

// asmEnabled reports whether the architecture file installed assembly
// kernels (logged by tests and benchmarks).
var asmEnabled bool
