package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/forge-llm/forge/gguf/testmodels"
)

// TestSplitFlags: --device takes a list of GPUs or gpu:all, --split needs
// such a device and one share per GPU, serve refuses --batch-seqs with a
// split; each mistake is named before anything loads.
func TestSplitFlags(t *testing.T) {
	model := testmodels.Path(t, "stories260K-Q4_K_M.gguf")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "-m", model, "--device", "gpu:0,x"}, "--device"},
		{[]string{"run", "-m", model, "--device", "cpu", "--split", "1,1"}, "needs --device gpu:N,M"},
		{[]string{"run", "-m", model, "--device", "gpu:0,1", "--split", "1,1,1"}, "3 shares for 2 GPUs"},
		{[]string{"run", "-m", model, "--device", "gpu:0,1", "--split", "1,-1"}, "--split"},
		{[]string{"bench", "load", "-m", model, "--device", "cpu", "--split", "1,1"}, "needs --device gpu:N,M"},
		{[]string{"bench", "load", "-m", model, "--device", "gpu:0,1", "--split", "2,1,1"}, "3 shares for 2 GPUs"},
		{[]string{"serve", "--device", "gpu:0;1"}, "--device"},
		{[]string{"serve", "--device", "gpu:0,1", "--batch-seqs", "4"}, "continuous batching runs on one device"},
		{[]string{"serve", "--device", "gpu:all", "--split", "1,1", "--batch-seqs", "4"}, "continuous batching runs on one device"},
	} {
		var stdout, stderr bytes.Buffer
		err := newApp(&stdout, &stderr).Run(append([]string{"forge"}, c.args...))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("forge %v: %v, want an error containing %q", c.args, err, c.want)
		}
	}
	for _, d := range []string{"gpu:0,1", "gpu:all", "gpu:1,0,3"} {
		if err := checkDevice(d); err != nil || !deviceFlag.MatchString(d) {
			t.Errorf("--device %s refused: %v", d, err)
		}
	}
}
