package main

import (
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf/testmodels"
)

// TestRunTuningFlags: --gpu-upload and --no-graph (the options that
// replaced FORGE_GPU_UPLOAD and FORGE_NO_GRAPH) are taken by forge run,
// leave a CPU run's greedy text as it is, and a malformed --gpu-upload is
// refused naming the flag and the setting, as is a malformed --gpu-mmq by
// run, bench gen and perplexity.
func TestRunTuningFlags(t *testing.T) {
	m := testmodels.Path(t, "stories260K-Q4_K_M.gguf")
	args := append([]string{"run", "-m", m, "--device", "cpu", "-p", "Once upon a time", "--progress", "plain"}, greedy...)
	out, _, err := forgeCLI(t, nil, append(args, "--gpu-upload", "st=4,rn=8,rs=2", "--no-graph", "--gpu-mmq", "q4_k=p")...)
	if err != nil {
		t.Fatal(err)
	}
	if want := expectedText(t) + "\n"; out != want {
		t.Errorf("with --gpu-upload, --no-graph and --gpu-mmq: %q, want %q", out, want)
	}
	ppl := []string{"perplexity", "-m", m, "-f", testmodels.Path(t, "story.txt"), "-c", "128", "--device", "cpu"}
	for _, cmd := range [][]string{args, {"bench", "gen", "-m", m, "--device", "cpu", "-p", "4", "-n", "2", "-r", "1"}, ppl} {
		_, _, err = forgeCLI(t, nil, append(cmd, "--gpu-mmq", "q4_k=x")...)
		if err == nil || !strings.Contains(err.Error(), `--gpu-mmq "q4_k=x"`) || !strings.Contains(err.Error(), `mmq setting "q4_k=x"`) {
			t.Errorf("%s with a malformed --gpu-mmq: %v, want it refused naming the flag and the setting", cmd[0], err)
		}
	}
	_, _, err = forgeCLI(t, nil, append(args, "--expert-profiles", m)...)
	if err == nil || !strings.Contains(err.Error(), "--expert-profiles "+m+": not a directory") {
		t.Errorf("--expert-profiles naming a file: %v, want it refused naming the flag", err)
	}
	_, _, err = forgeCLI(t, nil, append(args, "--gpu-upload", "st=4,zz=1")...)
	if err == nil || !strings.Contains(err.Error(), `--gpu-upload "st=4,zz=1"`) || !strings.Contains(err.Error(), `unknown upload setting "zz=1"`) {
		t.Errorf("malformed --gpu-upload: %v, want it refused naming the flag and the setting", err)
	}
}
