package rocm

// PreloadCompiler loads the run-time compiler (nvrtc or hiprtc) of the
// backend OpenAny would pick (the first whose driver library loads),
// without initialising a driver: a worker's first Compiler needs it even
// when every kernel comes from the disk cache (the cache key holds the
// compiler's version), and loading it takes tens of milliseconds in a
// fresh process. Callers start it next to Open so that the two overlap.
// Errors are left for NewCompiler to report.
func PreloadCompiler() {
	for _, b := range candidates() {
		if _, err := openDriverLibrary(b); err == nil {
			_, _ = openRTC(b)
			return
		}
	}
}
