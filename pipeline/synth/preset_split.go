package synth

func init() {
	// The 70B's blocks, 100 of them (~88B parameters): at Q8_0 ~93 GB, a
	// model no single 80 GB GPU holds (the 70B itself at Q8_0, ~75 GB,
	// fits one 80 GiB card), for the test of a model split over two GPUs
	// because it needs them (bench/multigpu.sh).
	s := Presets["llama3-70b"]
	s.Layers = 100
	Presets["llama3-70b-100l"] = s
}
