package main

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/creack/pty"

	"github.com/forge-llm/forge/gguf/testmodels"
)

// ansi matches the terminal control sequences mpb draws with.
var ansi = regexp.MustCompile(`\x1b\[[0-9;?]*[A-Za-z]`)

// TestRunTerminal runs `forge run` (this test binary acting as forge) in a
// pseudo-terminal with a throttled disk, so the load takes about a second,
// and checks the captured screen output: --progress auto chose the live
// display, which redrew the read bar with several different byte counts
// and the layer strip in several states, showed the moment the model was
// ready, then the generated text and the statistics line.
func TestRunTerminal(t *testing.T) {
	cmd := exec.Command(os.Args[0], "run", "-m", testmodels.Path(t, "stories260K-Q4_K_M.gguf"),
		"-p", "Once upon a time", "-n", "16", "--temp", "0", "--threads", "2",
		"--throttle", "300KB", "--readers", "1")
	cmd.Env = append(os.Environ(), asMainEnv+"=1")
	tty, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 40, Cols: 160})
	if err != nil {
		t.Fatal(err)
	}
	var screen bytes.Buffer
	io.Copy(&screen, tty) // until the child exits (EIO on Linux)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("forge run: %v\n%s", err, screen.String())
	}
	tty.Close()
	out := screen.String()
	plain := ansi.ReplaceAllString(out, "\n")

	if !strings.Contains(plain, "loading ") || !strings.Contains(plain, "llama, 5 layers") {
		t.Errorf("no header line in:\n%s", plain)
	}
	// The read bar: "read [===…] 123 kB / 290 kB · …" redrawn as bytes
	// arrive.
	reads := map[string]bool{}
	for _, m := range regexp.MustCompile(`read\s.*?\s([0-9.]+ k?B) / 290 kB`).FindAllStringSubmatch(plain, -1) {
		reads[m[1]] = true
	}
	if len(reads) < 3 {
		t.Errorf("read bar drawn with %d distinct byte counts (%v), want ≥ 3", len(reads), reads)
	}
	strips := map[string]bool{}
	for _, m := range regexp.MustCompile(`layers\s+(G\S \S{5})`).FindAllStringSubmatch(plain, -1) {
		strips[m[1]] = true
	}
	t.Logf("read bar byte counts %v; strip states %v", reads, strips)
	if len(strips) < 2 || !strips["G█ █████"] {
		t.Errorf("layer strip states %v: want several, ending fully resident", strips)
	}
	if !strings.Contains(plain, "loading the embedding and head…") || !regexp.MustCompile(`ready at [0-9.]+m?s`).MatchString(plain) {
		t.Errorf("the strip did not show the load, then the ready moment:\n%s", plain)
	}
	want := expectedText(t)[:20]
	if !strings.Contains(plain, want) {
		t.Errorf("generated text %q not on the screen:\n%s", want, plain)
	}
	stats := regexp.MustCompile(`load: ready [0-9.]+m?s · all resident [0-9.]+m?s · first token [0-9.]+m?s · prompt 5 tok [0-9.]+ tok/s · decode 15 tok [0-9.]+ tok/s · read 290 kB \([0-9.]+ [kM]B/s\) · placed 290 kB · peak RSS [0-9.]+ MiB · device peak [0-9.]+ [KM]iB · stop max_tokens`)
	if !stats.MatchString(plain) {
		t.Errorf("no statistics line in:\n%s", plain)
	}
	// The text comes after the display, the statistics after the text.
	if i, j, k := strings.LastIndex(plain, "ready at"), strings.Index(plain, want), strings.Index(plain, "load: ready"); !(i < j && j < k) {
		t.Errorf("display at %d, text at %d, statistics at %d: out of order", i, j, k)
	}
}
